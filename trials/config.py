"""What one trial is: a frozen, validated config with a stable hash.

A trial = (model, group, optimization stack, workload, repeats, seed, device). Everything that can
change a measured number is in the config, so two configs with the same ``config_hash`` are the same
experiment: the sweep skips a config whose hash already has a FINISHED run. Things that do not change
what is measured (how many threads Ray granted, the git sha) travel separately as ``Runtime``.

Validation happens here, once, so that bad input fails before a sweep starts with one clear line.
Ray Tune hands plain dicts around; ``TrialConfig.from_dict`` / ``to_dict`` convert at that edge.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, replace

from trials import groups
from trials import engines
from trials.engines import DEFAULT as DEFAULT_ENGINE
from trials.errors import ConfigError
from trials.models.registry import ModelEntry, entry_from_dict, get_model, max_positions
from trials.prompts import PROMPT_SETS

PRECISIONS = engines.default_spec().precisions      # the default engine's weights (every engine's: its spec)
FOUR_BIT_WEIGHTS = engines.default_spec().four_bit  # the default engine's (its quantizers: trials.models.quantized_weights)


def four_bit_weights(stack) -> bool:
    """Whether the stack's weights are 4-bit on its engine (the stacks design's ``weights`` factor)."""
    return stack.precision in engines.get(stack.engine).four_bit




def parse_cache(name: str) -> tuple[int, str] | None:
    """``full`` -> (16, "none"); ``hqq4`` -> (4, "hqq"); None where the backend cannot pack it."""
    if name == "full":
        return 16, "none"
    backend = name.rstrip("0123456789")
    bits = name[len(backend):]
    packs = engines.kv_caches()
    if backend in packs and bits.isdigit() and int(bits) in packs[backend]:
        return int(bits), backend
    return None


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _int_at_least(value, low: int) -> bool:
    """An integer (not a bool: JSON ``true`` is no batch size) of at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


@dataclass(frozen=True)
class Stack:
    """The optimization stack: how the model is loaded and how it generates."""

    precision: str = "fp32"
    kv_bits: int = 16
    kv_backend: str = "none"          # "hqq" | "quanto" when kv_bits < 16
    kv_group_size: int = 64           # quantization group size of the KV cache
    kv_residual_length: int = 128     # most recent tokens kept in full precision
    speculation: str = "none"
    draft_model: str | None = None
    draft_precision: str | None = None   # the draft's weights, where an engine loads them at another type
    num_draft_tokens: int = 0            # (a served draft: a lower-bit GGUF of the target, llama_server)
    batch_size: int = 1
    compile: bool = False             # compiled decoding: a static cache + torch.compile (trials.engines.transformers.compiled)
    engine: str = DEFAULT_ENGINE      # who runs it (trials.engines: one folder per engine)
    step_tokens: int = 0              # a server's tokens per scheduling step (llama-server -b); 0: its default
    threads: int = 0                  # a server's threads (-t/-tb); 0: every core the trial holds

    def validate(self) -> None:
        known = engines.ENGINES
        _check(self.engine in known, f"unknown engine {self.engine!r}; valid: {', '.join(known)}")
        refusal = known[self.engine].refusal(self)
        _check(refusal is None, refusal or "")
        packs = engines.kv_caches()
        kv_bits = sorted({16, *(bits for packed in packs.values() for bits in packed)}, reverse=True)
        _check(self.kv_bits in kv_bits,
               f"unknown kv_bits {self.kv_bits!r}; valid: {', '.join(map(str, kv_bits))}")
        _check(self.kv_backend == "none" or self.kv_backend in packs,
               f"unknown kv_backend {self.kv_backend!r}; valid: none, {', '.join(packs)}")
        _check((self.kv_bits == 16) == (self.kv_backend == "none"),
               f"a quantized KV cache (kv_bits < 16) needs a kv_backend (the {self.engine} engine's: "
               f"{', '.join(known[self.engine].kv_caches) or 'none'}), and kv_bits 16 needs kv_backend 'none'")
        _check(self.kv_backend == "none" or self.kv_bits in packs[self.kv_backend],
               f"kv_backend {self.kv_backend!r} does not support kv_bits {self.kv_bits}; it supports "
               f"{', '.join(map(str, packs.get(self.kv_backend, ())))}")
        _check(_int_at_least(self.kv_group_size, 1),
               f"kv_group_size must be an integer >= 1, got {self.kv_group_size!r}")
        _check(_int_at_least(self.kv_residual_length, 0),
               f"kv_residual_length must be an integer >= 0, got {self.kv_residual_length!r}")
        speculation = ("none", *dict.fromkeys(p for engine in known.values() for p in engine.proposers))
        _check(self.speculation in speculation,
               f"unknown speculation {self.speculation!r}; valid: {', '.join(speculation)}")
        _check(_int_at_least(self.batch_size, 1),
               f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if self.speculation == "none":
            _check(self.draft_model is None and self.num_draft_tokens == 0,
                   "draft_model / num_draft_tokens are only meaningful with speculation")
        else:
            _check(_int_at_least(self.num_draft_tokens, 1),
                   f"speculation needs num_draft_tokens (k) >= 1, got {self.num_draft_tokens!r}")
        if self.speculation == "draft":
            _check(bool(self.draft_model), "speculation 'draft' needs a draft_model")
        else:
            _check(self.draft_precision is None, "draft_precision is only meaningful with a draft model")
        _check(isinstance(self.compile, bool), f"compile must be true or false, got {self.compile!r}")
        for name in ("step_tokens", "threads"):
            value = getattr(self, name)
            _check(_int_at_least(value, 0), f"{name} must be an integer >= 0 (0: the server's default), got {value!r}")
            _check(value == 0 or name in known[self.engine].server_knobs,
                   f"{name} is a server's option that the {self.engine} engine does not take "
                   f"(it takes: {', '.join(known[self.engine].server_knobs) or 'none'})")

    @property
    def design_name(self) -> str:
        """The stacks design's name for it, which its charts and a sweep file's ``stacks:`` use:
        ``fp32`` or ``bf16`` (a base), ``nf4``, ``kv4``, ``spec``, ``nf4+kv4+spec``, ``b4``, ``compile``;
        on another engine, its name first: ``llama_cpp:f16`` (its base), ``llama_cpp:q4_1+kv4+spec``."""
        engine = "" if self.engine == DEFAULT_ENGINE else f"{self.engine}:"
        parts = [self.precision] if four_bit_weights(self) else []
        if self.kv_bits != 16:
            parts.append(f"kv{self.kv_bits}")
        if self.speculation != "none":
            parts.append("spec")
        if self.batch_size != 1:
            parts.append(f"b{self.batch_size}")
        if self.compile:
            parts.append("compile")
        return engine + ("+".join(parts) or self.precision)

    @property
    def label(self) -> str:
        """Short human name of the stack, e.g. ``bf16`` or ``bf16+kv4+draft(k=4)+b8``; another engine
        than transformers first, e.g. ``llama_cpp:q4_1+kv8-ggml``."""
        parts = [self.precision if self.engine == DEFAULT_ENGINE else f"{self.engine}:{self.precision}"]
        if self.kv_bits != 16:
            parts.append(f"kv{self.kv_bits}-{self.kv_backend}")
        if self.speculation == "draft":
            weights = f"{self.draft_precision}," if self.draft_precision else ""
            parts.append(f"draft({weights}k={self.num_draft_tokens})")
        elif self.speculation == "prompt_lookup":
            parts.append(f"lookup(k={self.num_draft_tokens})")
        if self.batch_size != 1:
            parts.append(f"b{self.batch_size}")
        if self.compile:
            parts.append("compile")
        if self.step_tokens:
            parts.append(f"step{self.step_tokens}")
        if self.threads:
            parts.append(f"t{self.threads}")
        return "+".join(parts)


@dataclass(frozen=True)
class Workload:
    """Which prompts, how many of each type, and how many tokens to generate for each."""

    prompt_set: str = "mixed"
    prompts_per_type: int = 2
    max_new_tokens: int = 64
    context_tokens: int = 0           # 0: prompts as written; N: each prompt extended to N tokens
    eval_windows: int = 0             # perplexity windows (quantization); 0: the method's default

    def validate(self) -> None:
        _check(self.prompt_set in PROMPT_SETS,
               f"unknown prompt_set {self.prompt_set!r}; valid: {', '.join(PROMPT_SETS)}")
        _check(_int_at_least(self.prompts_per_type, 1),
               f"prompts_per_type must be an integer >= 1, got {self.prompts_per_type!r}")
        _check(_int_at_least(self.max_new_tokens, 2),
               f"max_new_tokens must be an integer >= 2, got {self.max_new_tokens!r}")
        _check(_int_at_least(self.context_tokens, 0),
               f"context_tokens must be an integer >= 0, got {self.context_tokens!r}")
        _check(_int_at_least(self.eval_windows, 0),
               f"eval_windows must be an integer >= 0, got {self.eval_windows!r}")


def _numbers(values, kind) -> tuple:
    """A list from JSON or YAML as the tuple a frozen config hashes (anything else left for validate)."""
    return tuple(values) if isinstance(values, (list, tuple)) and all(
        isinstance(v, kind) and not isinstance(v, bool) for v in values) else values


@dataclass(frozen=True)
class Load:
    """How a server is driven (the serving group; empty for every in-process group): Poisson arrivals
    at ``rates`` (multiples of the stack's single-stream capacity, measured in the trial, so that the
    ladder runs from well below to past what one stream sustains on any machine), closed-loop
    ``concurrency`` levels, ``requests`` per point after ``warmup`` requests, and the SLO its goodput
    counts against (a request is good when its TTFT and its time per output token are within it); the
    capacity group's rate is the highest at which ``attainment`` of the requests are good."""

    rates: tuple[float, ...] = ()
    concurrency: tuple[int, ...] = ()
    requests: int = 20
    warmup: int = 2
    ttft_slo_s: float = 0.5
    tpot_slo_s: float = 0.05
    attainment: float = 0.9          # capacity: the share of requests that must meet both limits

    def __post_init__(self) -> None:
        object.__setattr__(self, "rates", _numbers(self.rates, (int, float)))
        object.__setattr__(self, "concurrency", _numbers(self.concurrency, int))

    @property
    def empty(self) -> bool:
        return not self.rates and not self.concurrency

    def validate(self) -> None:
        _check(isinstance(self.rates, tuple) and all(0 < r <= 1000 for r in self.rates),
               f"load rates must be a list of positive numbers (multiples of single-stream capacity), got {self.rates!r}")
        _check(isinstance(self.concurrency, tuple) and all(_int_at_least(c, 1) for c in self.concurrency),
               f"load concurrency must be a list of integers >= 1, got {self.concurrency!r}")
        _check(_int_at_least(self.requests, 1), f"load requests must be an integer >= 1, got {self.requests!r}")
        _check(_int_at_least(self.warmup, 0), f"load warmup must be an integer >= 0, got {self.warmup!r}")
        for name in ("ttft_slo_s", "tpot_slo_s"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
                   f"load {name} must be a positive number of seconds, got {value!r}")
        _check(isinstance(self.attainment, (int, float)) and not isinstance(self.attainment, bool)
               and 0 < self.attainment <= 1, f"load attainment must be a share in (0, 1], got {self.attainment!r}")


@dataclass(frozen=True)
class TrialConfig:
    """One trial. Construct it and it is valid, or ``ConfigError`` says why not."""

    group: str
    model: str
    stack: Stack = field(default_factory=Stack)
    workload: Workload = field(default_factory=Workload)
    repeats: int = 3
    seed: int = 0
    device: str = "cpu"
    # The entries of the models this config names that are not built in (a sweep file's own): the
    # config carries them, so any process rebuilds it from its dict (the store, a worker, the page).
    declared: tuple[ModelEntry, ...] = ()
    load: Load = field(default_factory=Load)     # how a server is driven (the serving group only)
    # Other groups that chart this trial's run: each planned the same measurement, which runs once,
    # here (``sweeps.measure_once``). Not hashed: it changes who reads the run, not what it measures.
    also_charted_by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        group = groups.get(self.group)     # raises ConfigError naming the valid groups
        self._check_also_charted_by()
        _check(isinstance(self.declared, tuple) and all(isinstance(e, ModelEntry) for e in self.declared),
               "declared must be a tuple of ModelEntry")
        entry = self.entry()               # raises ConfigError naming the valid models
        devices = tuple(dict.fromkeys(d for engine in engines.ENGINES.values() for d in engine.devices))
        _check(self.device in devices,
               f"unknown device {self.device!r}; valid: {', '.join(devices)}")
        _check(_int_at_least(self.repeats, 1),
               f"repeats must be an integer >= 1, got {self.repeats!r}")
        self.stack.validate()
        group.check(self.stack)            # the group's stack guard (trials.groups)
        self.workload.validate()
        _check(isinstance(self.load, Load), "load must be a Load")
        self.load.validate()
        limit = max_positions(entry)
        context, new = self.workload.context_tokens, self.workload.max_new_tokens
        if context:
            _check(limit is None or context + new <= limit,
                   f"context_tokens {context} + max_new_tokens {new} is longer than {self.model}'s {limit} positions")
        else:                              # prompts as written: at least one token of prompt
            _check(limit is None or new < limit,
                   f"max_new_tokens {new} plus a prompt is longer than {self.model}'s {limit} positions")
        if self.stack.draft_model is not None:
            self.entry(self.stack.draft_model)    # a draft of another tokenizer family drafts across
            # tokenizers (transformers' universal assisted generation; trials.techniques.speculative.runner)

    def _check_also_charted_by(self) -> None:
        also = self.also_charted_by
        _check(isinstance(also, tuple) and all(isinstance(g, str) for g in also),
               "also_charted_by must be a tuple of group names")
        _check(self.group not in also and len(set(also)) == len(also),
               f"also_charted_by names other groups, each once, got {also!r} for group {self.group!r}")
        for name in also:
            groups.get(name).check(self.stack)     # each group that charts it accepts its stack

    @property
    def charts(self) -> tuple[str, ...]:
        """Every group that charts this trial's run: its own first, then ``also_charted_by``."""
        return (self.group, *self.also_charted_by)

    def charted_as(self, group: str) -> "TrialConfig":
        """The same trial as ``group`` plans it on its own (its ``config_hash`` is that group's)."""
        return replace(self, group=group, also_charted_by=())

    def entry(self, name: str | None = None) -> ModelEntry:
        """The registry entry of ``name`` (default: the target), declared or built in."""
        return get_model(name or self.model, self.declared)

    @property
    def config_hash(self) -> str:
        """Stable across processes and sessions: sha256 of the canonical JSON, 16 hex digits.

        Stack and workload fields at their default value are left out, so adding a field (with a
        default that keeps the old behaviour) does not change the hash of existing configs; nor do
        the groups that also chart the run (``also_charted_by``).
        """
        return _hash(self._canonical())

    @property
    def measurement_hash(self) -> str:
        """``config_hash`` less the group: equal for two groups' configs that measure the same thing
        (same model, stack, workload, repeats, seed, device), which then run once
        (``sweeps.measure_once``)."""
        data = self._canonical()
        del data["group"]
        return _hash(data)

    def _canonical(self) -> dict:
        data = self.to_dict()
        del data["also_charted_by"]
        for name, default in (("stack", Stack()), ("workload", Workload()), ("load", Load())):
            data[name] = {k: v for k, v in data[name].items() if v != getattr(default, k)}
        for name in ("declared", "load"):  # none: the hash configs always had
            if not data[name]:
                del data[name]
        return data

    @property
    def subject_hash(self) -> str:
        """``config_hash`` of the same trial at the default sizes (new tokens, prompts per type,
        perplexity windows, repeats): equal for two configs that measure the same thing (group, model,
        stack, device, seed, prompt set, context) at different sizes, so that a sweep can say a config
        was measured before at another workload (``--reuse``)."""
        sizes = Workload(prompt_set=self.workload.prompt_set, context_tokens=self.workload.context_tokens)
        return replace(self, workload=sizes, repeats=TrialConfig.__dataclass_fields__["repeats"].default).config_hash

    def describe_size(self) -> str:
        w = self.workload
        return size_text(w.max_new_tokens, w.prompts_per_type, self.repeats, w.context_tokens)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrialConfig":
        data = dict(data)
        _check(all(isinstance(data.get(k, {}), dict) for k in ("stack", "workload", "load")),
               "stack, workload and load must be mappings")
        stack = _build(Stack, data.pop("stack", {}))
        workload = _build(Workload, data.pop("workload", {}))
        load = _build(Load, data.pop("load", {}))
        declared = data.pop("declared", ()) or ()
        _check(isinstance(declared, (list, tuple)), "declared must be a list of model entries")
        also = data.pop("also_charted_by", ()) or ()
        _check(isinstance(also, (list, tuple)), "also_charted_by must be a list of group names")
        return _build(cls, data, stack=stack, workload=workload, load=load,
                      declared=tuple(entry_from_dict(e) for e in declared), also_charted_by=tuple(also))

    def flat_params(self) -> dict[str, str]:
        """The config as flat key -> string, the shape MLflow params and table columns want."""
        flat = {"group": self.group, "model": self.model, "repeats": self.repeats,
                "seed": self.seed, "device": self.device, "stack": self.stack.label}
        flat.update(asdict(self.stack))
        flat.update(asdict(self.workload))
        if not self.load.empty or groups.get(self.group).serving:     # a serving trial's load, each key prefixed
            flat.update({f"load_{k}": ",".join(map(str, v)) if isinstance(v, tuple) else v
                         for k, v in asdict(self.load).items()})
        if self.declared:                  # what rebuilds the config in another process
            flat["declared_models"] = json.dumps([asdict(e) for e in self.declared], sort_keys=True)
        return {k: "" if v is None else str(v) for k, v in flat.items()}


def _hash(data: dict) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def size_text(max_new_tokens, prompts_per_type, repeats, context_tokens) -> str:
    """A trial's size in words (``TrialConfig.describe_size``; a run's, from its params)."""
    context = f", context {context_tokens}" if context_tokens not in (0, "0", "", None) else ""
    return f"{max_new_tokens} new tokens x {prompts_per_type} prompt(s) per type x {repeats} repeats{context}"


def _build(cls, data: dict, **extra):
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    _check(not unknown, f"unknown {cls.__name__} field(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    try:
        return cls(**data, **extra)
    except TypeError as exc:
        raise ConfigError(f"bad {cls.__name__}: {exc}") from None


@dataclass(frozen=True)
class Runtime:
    """How a trial runs on this worker; does not change what is measured, so not hashed."""

    num_threads: int | None = None
    git_sha: str = "unknown"
    sweep_id: str = ""
    memory_budget_bytes: int | None = None   # emulate a device this size (trials.techniques.batching.runner): oom above it
    price_per_hour_usd: float | None = None  # the machine's price: each run logs $/1M output tokens (trials.measurement.cost)
    time_limit_s: float | None = None        # what the sweep's budget gives this trial (a capacity search stops short)
    sweep_pids: tuple[int, ...] = ()         # the sweep's own processes here (its raylet): not a noisy neighbour


# Sizes, for ``Runtime.memory_budget_bytes`` (``--memory-budget``) and messages.
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_memory_budget(text: str) -> int:
    """Bytes from ``"2GiB"``, ``"512MiB"``, ``"1.5GB"`` or ``"1073741824"``; ConfigError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS:
        raise ConfigError(f"memory budget {text!r} is not a size; use bytes or a number with "
                          "KiB/MiB/GiB/TiB or KB/MB/GB/TB, e.g. 2GiB")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise ConfigError(f"memory budget {text!r} must be at least 1 byte")
    return value


def human_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    exponent = min(3, int(math.log(n, 1024)))
    return f"{n / 1024 ** exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]}"
