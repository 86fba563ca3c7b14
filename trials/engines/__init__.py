"""Inference engines, one folder each (``trials/engines/<name>/``): a torch-free ``spec.SPEC``
(``trials.engines.spec.Engine``) and a ``backend`` module that loads a model under a stack,
generates greedily with per-token stamps, scores teacher-forced windows and says how a user turns
the same stack on in their code. Nothing outside an engine's folder names it.

``ENGINES``: every folder's spec, plus the modules named in ``$LLM_SWEEPS_ENGINES`` (comma-separated,
each with a ``SPEC``: an engine of one's own, with no line changed here), found on first use.
``DEFAULT``: the engine a stack runs on unless it says otherwise, the base level of every
engine comparison.
"""

from __future__ import annotations

import functools
import importlib

from trials.errors import ConfigError

DEFAULT = "transformers"
PLUGINS_ENV = "LLM_SWEEPS_ENGINES"


@functools.cache
def _discover() -> dict:
    import sys

    from trials.engines.spec import Engine
    from trials.plugins import discover

    found: dict[str, Engine] = {}
    for name, spec in discover(sys.modules[__name__], PLUGINS_ENV, "engine", Engine):
        lacking = spec.lacks()
        if lacking:
            kind = "ServerBackend" if spec.serves else "Backend"
            raise ConfigError(f"engine {spec.name!r} ({name}): its backend {spec.backend} lacks "
                              f"{', '.join(lacking)} (trials.engines.spec.{kind})")
        found[spec.name] = spec
    ordered = {DEFAULT: found.pop(DEFAULT)} if DEFAULT in found else {}
    return {**ordered, **dict(sorted(found.items()))}


def __getattr__(name: str):
    if name == "ENGINES":
        return _discover()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def default_spec():
    """The default engine's declaration, without discovering the others (what module constants need)."""
    return importlib.import_module(f"{__name__}.{DEFAULT}.spec").SPEC


def get(name: str):
    """The engine called ``name`` (one error line naming the valid ones otherwise)."""
    engines = _discover()
    if name not in engines:
        raise ConfigError(f"unknown engine {name!r}; valid: {', '.join(engines)}")
    return engines[name]


def backend(stack):
    """The backend module of ``stack``'s engine (``trials.engines.spec.Backend``), in a worker."""
    return get(stack.engine).runs()


def in_process() -> dict:
    """The engines a trial runs inside its worker (every engine but the servers, ``Engine.serves``)."""
    return {name: engine for name, engine in _discover().items() if not engine.serves}


def servers() -> dict:
    """The engines that run as a server process (the serving group's)."""
    return {name: engine for name, engine in _discover().items() if engine.serves}


def kv_caches() -> dict[str, tuple[int, ...]]:
    """Every engine's quantized KV caches: backend -> the bits it packs."""
    return {backend_: bits for engine in _discover().values() for backend_, bits in engine.kv_caches.items()}


def weight_types() -> tuple[str, ...]:
    """Every engine's weight types, each once."""
    return tuple(dict.fromkeys(p for engine in _discover().values() for p in engine.precisions))
