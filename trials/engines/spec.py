"""What an engine declares about itself, torch-free, and what it does in a worker.

Each engine folder (``trials/engines/<name>/``) has a ``spec.py`` whose ``SPEC`` is an ``Engine``:
the weights it loads, the KV caches it keeps and in how many bits, the proposers it speculates
with, the stacks and models it refuses (with the reason, at plan time), its colour. Its ``backend``
points at the module that runs it in a worker (``Backend``: load, generate, score, describe), so a
technique's runner asks the stack's engine instead of branching on its name. ``trials.engines``
discovers the folders (and the modules named in ``$LLM_SWEEPS_ENGINES``).

An engine whose backend times its own step (``Engine.measures_steps``: ``step_cost``) sizes its
trials from its own kernels: the budget calibrates its weights with it, and a server built on it
(``Engine.builds_on``) with the same measurement, instead of the default engine's reference step.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pathlib
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol


def _accept(*_args) -> str | None:
    return None


def _no_cost(*_args) -> float:
    return 0.0


@dataclass(frozen=True)
class Engine:
    name: str                                   # ``Stack.engine``
    title: str                                  # how charts and cards name it
    precisions: tuple[str, ...]                 # the weights it loads (``Stack.precision``)
    kv_caches: Mapping[str, tuple[int, ...]]    # its quantized KV caches (``Stack.kv_backend``) -> the bits each packs
    guard: Callable[[object], str | None]       # why a stack cannot run on it, or None
    package: str                                # the Python package that runs it (planned only where installed)
    backend: str                                # the module implementing ``Backend`` (imported in a worker)
    calibrated: bool = True                     # where neither it nor an engine it builds on measures its
    #                                             own steps: the budget times its precisions on the default
    #                                             engine; else the default engine's reference precision
    measures_steps: bool = False                # its backend times its own step (``Backend.step_cost``)
    sixteen_bit: tuple[str, ...] = ()           # its 16-bit weights, the base of its effects (the first native one)
    four_bit: tuple[str, ...] = ()              # its 4-bit weights
    cache_group_size: bool = False              # its quantized cache takes ``Stack.kv_group_size``
    cache_scored: bool = True                   # its quantized cache is exercised by a teacher-forced window
    speculates_on_quantized_cache: bool = True  # it rolls a quantized cache back after a rejected proposal
    proposers: tuple[str, ...] = ("prompt_lookup",)   # the speculation it runs (``Stack.speculation``)
    devices: tuple[str, ...] = ("cpu", "cuda")  # where the project measures it
    model_refusal: Callable[[str, dict | None, object], str | None] = _accept
    #                                             (model name, its config.json, stack): why the model cannot
    #                                             run the stack on this engine, or None (plan and run time)
    shipped: Callable[[object], str | None] = _accept   # (registry entry): the weight type a model ships
    #                                             in, where this engine runs the file as it is
    color: str = "#888888"                      # its colour in every chart
    weight_word: str = "weights"                # how its weight types are named ("GGUF weights")
    caption: str = ""                           # how the engine was measured, for chart captions
    benchmark: str = ""                         # its own benchmark tool, run beside each trial ("llama-bench")
    benchmark_ratio: str = ""                   # the metric: our decode rate / that tool's (1: they agree)
    benchmark_tolerance: float = 0.25           # the section flags a ratio further than this from 1
    benchmark_cost: Callable[[object, object], float] = _no_cost
    #                                             (config, ``sweeps.budget.Estimate``): seconds its benchmark
    #                                             beside a trial takes, for the budget
    version_tag: str = ""                       # the run tag that names its build or version
    as_code: str = ""                           # "module:function" (torch-free): (stack, reference
    #                                             precision) -> the stack as a user's code, for a run that
    #                                             recorded none (tag ``user_code``)
    serves: bool = False                        # a server process (its backend is a ``ServerBackend``):
    #                                             the serving group measures it, in-process groups do not
    builds_on: tuple[str, ...] = ()             # engines whose folders it uses (llama.cpp's server: its GGUFs)
    requires: tuple[str, ...] = ()              # other modules it needs beside ``package`` (a server's web stack)
    install: str = ""                           # how to install what it needs, for the plan's one line
    start_s: float = 5.0                        # a server's start (loading, first health answer), for the budget
    server_knobs: tuple[str, ...] = ()          # the ``Stack`` fields a server takes as options (``step_tokens``:
    #                                             tokens per scheduling step; ``threads``): the capacity group's knobs
    levels: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    #                                             per profile ("quick", "full"; "default": any other) what the
    #                                             engines group compares on it beyond its base and shipped
    #                                             weights: {"weights": (...), "caches": ("ggml8", ...)}; a
    #                                             profile's or sweep file's list replaces them
    machine_setup: tuple[str, ...] = ()         # ``python -m`` and its arguments: what its trials need built on
    #                                             this machine (llama.cpp's tools), which a local sweep builds
    #                                             beside its first trials (sweeps.setup_beside); its trials wait

    @property
    def kv_backends(self) -> tuple[str, ...]:
        return tuple(self.kv_caches)

    def runs(self) -> Backend:
        """The engine's backend module (in a worker: it imports the engine's packages on use)."""
        return importlib.import_module(self.backend)

    def code(self, stack, reference: str) -> str:
        """The stack as a user's code on this engine, without running it (``as_code``)."""
        if not self.as_code:
            return f"# the {self.name} engine renders no code without a run; rerun the trial to see it"
        module, _, function = self.as_code.partition(":")
        return getattr(importlib.import_module(module), function)(stack, reference)

    def missing(self) -> list[str]:
        """The modules it needs that this environment lacks (``package``, then ``requires``)."""
        return [name for name in (self.package, *self.requires) if importlib.util.find_spec(name) is None]

    def installed(self) -> bool:
        return not self.missing()

    def lacks(self) -> list[str]:
        """The names its ``backend`` module must define (``Backend``, or ``ServerBackend`` where it
        serves; ``step_cost`` where it ``measures_steps``; ``step_curve`` and ``user_command`` where a
        server takes ``server_knobs``) that the module's source does not: read, not imported, so the
        check needs none of the engine's packages. Empty when it defines them all."""
        protocol = ServerBackend if self.serves else Backend
        needed = [*protocol.__annotations__, *(n for n in vars(protocol) if not n.startswith("_"))]
        needed += ["step_cost"] if self.measures_steps else []
        needed += ["step_curve", "user_command"] if self.serves and self.server_knobs else []
        defined = _defined_names(self.backend)
        if defined is None:
            return [f"the module {self.backend} itself"]
        return [name for name in dict.fromkeys(needed) if name not in defined]

    def base(self, device: str) -> str:
        """Its 16-bit base precision on ``device``: the first of ``sixteen_bit`` that runs natively
        there (bf16 on a CPU that emulates it is skipped), else the last."""
        from trials.measurement.hardware import precision_is_native    # torch: only in a planner or worker

        return next((p for p in self.sixteen_bit if precision_is_native(p, device)), self.sixteen_bit[-1])

    def four_bit_for(self, entry) -> str | None:
        """The 4-bit weights of a model on this engine: the type it ships in where that is 4-bit here
        (what people deploy), else the engine's first 4-bit type; None where it has none."""
        shipped = self.shipped(entry)
        return shipped if shipped in self.four_bit else (self.four_bit[0] if self.four_bit else None)

    def levels_for(self, profile: str, knob: str) -> tuple[str, ...]:
        """Its own choices of ``knob`` (``weights``, ``caches``) under ``profile`` (a built-in profile's
        name), else under ``default``."""
        own = self.levels.get(profile) or self.levels.get("default") or {}
        return tuple(own.get(knob, ()))

    def refusal(self, stack) -> str | None:
        """Why ``stack`` cannot run on this engine, or None."""
        if stack.precision not in self.precisions:
            return (f"unknown precision {stack.precision!r} for the {self.name} engine; valid: "
                    f"{', '.join(self.precisions)}")
        if stack.kv_backend != "none" and stack.kv_backend not in self.kv_caches:
            return (f"the {self.name} engine keeps no {stack.kv_backend!r} KV cache; its quantized "
                    f"caches: {', '.join(self.kv_caches) or 'none'}")
        if stack.speculation != "none" and stack.speculation not in self.proposers:
            return (f"the {self.name} engine speculates with {', '.join(self.proposers) or 'nothing'}, "
                    f"not {stack.speculation!r}")
        return self.guard(stack)


def _defined_names(module: str) -> set[str] | None:
    """The names a module's source binds at its top level (definitions, assignments, imports, also
    inside a top-level ``if``/``try``), without running it; None where it has no Python source."""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return None
    names: set[str] = set()
    body = list(ast.parse(pathlib.Path(found.origin).read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            body += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return names


@dataclass(frozen=True)
class StepCost:
    """What a model costs on an engine in one weight type, at batch 1 on a trial's threads: what the
    budget estimates every trial from (``sweeps.budget``)."""

    decode_s: float          # one decode step (median of a few, with a KV cache)
    prefill_token_s: float   # per token of one prefill that keeps the last position's logits (as generation does)
    load_s: float
    measured_at: str = ""
    scored_token_s: float | None = None   # per token of a prefill that scores every position (perplexity,
                                          # training); None: not measured apart (older records measured that one)

    @property
    def scored_s(self) -> float:
        """Per token of a prefill that computes every position's logits: a large vocabulary's output
        layer (Gemma-3's 262,144 rows) then costs more than the rest of the model."""
        return self.prefill_token_s if self.scored_token_s is None else self.scored_token_s


class Backend(Protocol):
    """What a trial asks of an engine in a worker; each engine's ``backend`` module defines these.

    ``load(config)`` -> (loaded, prompts): the model under the stack and the workload's prompts (the
    same text, tokenized as the model's transformers tokenizer does, on every engine).
    ``prepare(config, loaded, prompts)`` -> ``Prepared``: what ``generate_batch`` gets, and the same
    stack as a user's code (built once, from one description: what ran is what is shown).
    ``generate_batch(loaded, batch, new_tokens, timer, kwargs)`` -> a record (``BatchRecord``'s
    fields): greedy, exactly ``new_tokens`` per row, each token stamped.
    ``facts(loaded, record)`` -> ``ModelFacts``: weights bytes, parameters, threads, exact KV bytes.
    ``trial_facts(config, loaded, measured, prompts, prepared)`` -> (metrics, tags): the engine's own counters
    and build beside the loop's numbers.
    ``scorer(config, loaded, context)`` -> a function (token ids -> fp32 logits per position) for
    teacher-forced quality, or a string saying why this stack is not scored that way.
    ``teacher_forced(config, loaded, prompts, stack)`` -> (log-probabilities, true tokens) per prompt:
    each prompt's last tokens fed one at a time through a cache of ``stack``'s kind, as decoding
    reads it; or a string saying why the engine does not score that way.
    ``step_cost(entry, precision, device, threads, prefill_tokens, decode_steps)`` -> ``StepCost``
    (only where ``Engine.measures_steps``): one prefill and a few decode steps at batch 1 on
    ``threads``, timed on the engine's own kernels, for the budget.
    """

    def load(self, config): ...
    def prepare(self, config, loaded, prompts): ...
    def generate_batch(self, loaded, batch, new_tokens, timer, generate_kwargs): ...
    def facts(self, loaded, record): ...
    def trial_facts(self, config, loaded, measured, prompts, prepared): ...
    def scorer(self, config, loaded, context): ...
    def teacher_forced(self, config, loaded, prompts, stack): ...


class ServerBackend(Protocol):
    """What the serving group asks of a server engine in a worker (``Engine.serves``).

    ``load(config)`` -> what the server runs (its files) and the workload's prompts: ``prompts`` (in
    the workload's order) and ``request_prompts`` (prompt id -> what a request sends as its ``prompt``:
    token ids or text). ``request_body(loaded)`` -> what every request adds to an OpenAI completion
    (greedy, exactly ``max_tokens``). ``STREAM_ENDS_WITH_DONE``: whether its streams end with
    ``data: [DONE]``. ``serve(config, loaded, threads)`` -> a context manager: the server started on
    127.0.0.1 on a free port, healthy, yielding a handle with ``url``, ``command`` and ``pid``; stopped, with
    its process group, and checked gone on the way out, whatever happened inside
    (``trials.engines.server_process``). ``parity(config, loaded, handle)`` -> metrics: the server's
    greedy tokens against the in-process ones of the engine it builds on. ``server_metrics(handle)`` ->
    the server's own counters. ``trial_facts(config, loaded, handle)`` -> ``ServerFacts``: its context,
    weights and cache bytes, files, build and command line.
    """

    STREAM_ENDS_WITH_DONE: bool

    def load(self, config): ...
    def request_body(self, loaded): ...
    def serve(self, config, loaded, threads): ...
    def parity(self, config, loaded, handle): ...
    def server_metrics(self, handle): ...
    def trial_facts(self, config, loaded, handle): ...


@dataclass
class ModelFacts:
    """What an in-process backend reports of the model it loaded (``Backend.facts``), under the names
    the loop logs for every engine: its weights' bytes and parameters, the threads it ran on, and the
    exact KV bytes of the cache a record ended with where the engine can compute them (else why not);
    ``metrics``: the engine's own (a GGUF's file bytes)."""

    weights_bytes: float
    num_parameters: float
    num_threads: float
    kv_cache_bytes_exact: float | None = None
    kv_cache_bytes_exact_missing: str = ""
    metrics: dict = field(default_factory=dict)

    def logged(self) -> tuple[dict[str, float], dict[str, str]]:
        """(metrics, tags) as the run keeps them."""
        out = {**self.metrics, "weights_bytes": float(self.weights_bytes),
               "num_parameters": float(self.num_parameters), "num_threads": float(self.num_threads)}
        if self.kv_cache_bytes_exact is not None:
            out["kv_cache_bytes_exact"] = float(self.kv_cache_bytes_exact)
        missing = {"kv_cache_bytes_exact_missing": self.kv_cache_bytes_exact_missing} \
            if self.kv_cache_bytes_exact_missing else {}
        return out, missing


@dataclass
class ServerFacts:
    """What a server backend reports of the server it ran (``ServerBackend.trial_facts``): what its KV
    cache holds and what its weights and cache take, where it can say, and its own metrics and tags
    (files, build, command line). ``logged`` adds what the runner knows itself (slots, threads, start)
    and names every shared metric once, for every server engine."""

    n_ctx: int                                        # tokens the server's KV cache holds, every slot's
    context_per_slot: int
    weights_bytes: float | None = None                # the roofline's numerator
    kv_cache_allocated_bytes: float | None = None     # the cache it allocated (n_ctx x bytes per token)
    metrics: dict = field(default_factory=dict)       # its own: gguf_file_bytes, ...
    tags: dict = field(default_factory=dict)

    def logged(self, stack, running) -> dict[str, float]:
        out = {**self.metrics, "n_ctx": float(self.n_ctx), "context_per_slot": float(self.context_per_slot),
               "parallel_slots": float(stack.batch_size), "server_threads": float(running.threads),
               "server_start_s": float(running.started_s)}
        out.update({name: float(value) for name, value in (("weights_bytes", self.weights_bytes),
                                                           ("kv_cache_allocated_bytes", self.kv_cache_allocated_bytes))
                    if value is not None})
        return out


@dataclass
class Prepared:
    kwargs: dict = field(default_factory=dict)   # what generate_batch gets on top of greedy decoding
    code: str = ""                               # the same stack as a user's code (the run's ``user_code`` tag)
    before: object = None                        # what the engine noted before the timed passes


@dataclass
class BatchRecord:
    """One batch's generation, as the loop reads it from every engine."""

    prompt_ids: list[str]
    prompt_tokens: int          # longest prompt in the batch (rows are left-padded to it)
    ttft_s: float
    decode_s: float
    new_tokens: int             # per row
    decode_tokens: int          # per row, after the first
    kv_cache_bytes: int
    kv_cache_tokens: int
    output_ids: list[list[int]]
    texts: list[str]
