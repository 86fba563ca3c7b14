"""What an engine declares about itself, torch-free: the weights it loads, the KV caches it keeps,
and the stacks it refuses (with the reason, at plan time).

Each engine folder (``trials/engines/<name>/``) has a ``spec.py`` whose ``SPEC`` is an ``Engine``;
``trials.engines.ENGINES`` collects them and ``trials.config.Stack.validate`` asks the stack's engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Engine:
    name: str                                   # ``Stack.engine``
    title: str                                  # how charts and cards name it
    precisions: tuple[str, ...]                 # the weights it loads (``Stack.precision``)
    kv_backends: tuple[str, ...]                # the quantized KV caches it keeps (``Stack.kv_backend``)
    guard: Callable[[object], str | None]       # why a stack cannot run on it, or None
    package: str                                # the Python package that runs it
    generation: str                             # its module: generate_batch(...) and facts(...)
    calibrated: bool = True                     # the budget calibrates its precisions' step costs; else
    #                                             it estimates from transformers' reference precision
    sixteen_bit: tuple[str, ...] = ()           # its 16-bit weights, the base of its effects (the first measured)
    four_bit: tuple[str, ...] = ()              # its 4-bit weights (a run of the shipped file preferred)
    color: str = "#888888"                      # its colour in every chart

    def module(self):
        """The engine's generation module (in a worker: it imports the engine's packages on use)."""
        import importlib

        return importlib.import_module(self.generation)

    def refusal(self, stack) -> str | None:
        """Why ``stack`` cannot run on this engine, or None."""
        if stack.precision not in self.precisions:
            return (f"unknown precision {stack.precision!r} for the {self.name} engine; valid: "
                    f"{', '.join(self.precisions)}")
        if stack.kv_backend != "none" and stack.kv_backend not in self.kv_backends:
            return (f"the {self.name} engine keeps no {stack.kv_backend!r} KV cache; its quantized "
                    f"caches: {', '.join(self.kv_backends) or 'none'}")
        return self.guard(stack)
