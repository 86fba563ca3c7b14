"""THE measurement loop: what every technique composes, and nothing technique-specific.

    load (``trials.models.loading.load``, cached per worker) -> warm up -> for each repeat, for each
    batch of prompts: the engine generates greedily a fixed number of tokens, stamping prefill (TTFT)
    and decode -> medians and spread over repeats, peak memory, real weight and KV-cache bytes

Every optimization changes only how the model is loaded or which arguments the engine's generation
gets (the stack's engine's ``Backend.prepare``, handed to ``measure`` as ``generate_kwargs``); the timing, counting and memory code below is shared
by all of them, so numbers of different optimizations are comparable. A technique's runner (``trials.groups``) composes the same pieces:
``loading.load`` -> ``measure`` -> ``compare_outputs`` -> ``finish``, and adds its own measurements.
Generation is greedy with ``min_new_tokens`` equal to ``max_new_tokens``: every configuration
produces the same number of tokens, and outputs of two configurations can be compared token for
token.

This module imports no technique: techniques import it (``trials.groups`` checks the layering).
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
import traceback
from dataclasses import dataclass, field

import torch

from trials.config import Runtime, TrialConfig
from trials import engines
from trials.engines.spec import BatchRecord
from trials.errors import ConfigError
from trials.measurement.energy import Energy, measure_energy
from trials.measurement.environment import environment_tags
from trials.measurement.latency import latency_metrics
from trials.measurement.hardware import precision_is_native
from trials.measurement.instruments import PeakMemory, TokenTimer, track_peak_memory
from trials.models import loading
from trials.prompts import Prompt, as_chat, extend_to_tokens, workload_prompts
from trials.stats.factorial import t_interval

WARMUP_TOKENS = 2


@dataclass
class TrialResult:
    """What a trial produced. ``metrics`` names carry their unit (``_s``, ``_bytes``, ``tok_per_s``)."""

    config: TrialConfig
    status: str                                   # "FINISHED" | "FAILED"
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    raw: dict = field(default_factory=dict)       # per-repeat numbers and generated texts
    error: str = ""

    def to_dict(self) -> dict:
        return {"config": self.config.to_dict(), "config_hash": self.config.config_hash,
                "status": self.status, "metrics": self.metrics, "tags": self.tags,
                "error": self.error, "raw": self.raw}


def _batches(prompts: list[Prompt], size: int) -> list[list[Prompt]]:
    return [prompts[i:i + size] for i in range(0, len(prompts), size)]


def _spread(values: list[float], name: str) -> dict[str, float]:
    return {name: statistics.median(values), f"{name}_min": min(values), f"{name}_max": max(values)}


def _repeat_statistics(throughput: list[float]) -> dict[str, float]:
    """The repeats' spread as a 95 % t-interval (two repeats or more), taken on log tok/s and
    mapped back, so it stays positive and matches how effects are estimated (``trials.stats.factorial``);
    and the mean and variance of log tok/s that those estimates combine."""
    logs = [math.log(t) for t in throughput]
    stats = {"tok_per_s_repeats": float(len(logs)), "log_tok_per_s_mean": statistics.mean(logs)}
    if len(logs) > 1:
        low, high = (math.exp(v) for v in t_interval(logs))
        stats.update(tok_per_s_ci_low=low, tok_per_s_ci_high=high,
                     log_tok_per_s_var=statistics.variance(logs))
    return stats


def energy_metrics(energy: Energy, repeats: list[list[BatchRecord]]) -> tuple[dict[str, float], dict[str, str]]:
    """Joules per generated token over the timed passes, where a counter measured them
    (``trials.measurement.energy``); else only the tag saying why not."""
    if energy.joules is None:
        return {}, {"energy_method": energy.method} if energy.method else {}
    tokens = sum(b.new_tokens * len(b.prompt_ids) for rep in repeats for b in rep)
    return ({"energy_j": energy.joules, "energy_j_per_output_token": energy.joules / tokens},
            {"energy_method": energy.method})


def decode_rates(repeats: list[list[BatchRecord]]) -> list[float]:
    """Each repeat's decode tok/s over all its batches (aggregate over a batch's rows): ``tok_per_s``
    is their median."""
    return [sum(b.decode_tokens * len(b.prompt_ids) for b in rep) / sum(b.decode_s for b in rep) for rep in repeats]


def _summarize(config: TrialConfig, loaded: loading.LoadedModel,
               repeats: list[list[BatchRecord]], added_peak_bytes: int) -> tuple[dict[str, float], dict[str, str]]:
    """The trial's metrics, and tags that explain any predicted value it could not compute."""
    batch_size = config.stack.batch_size
    throughput = decode_rates(repeats)
    records = [b for rep in repeats for b in rep]
    biggest = max(repeats[0], key=lambda b: b.kv_cache_tokens)
    facts, notes = engine(config).facts(loaded, biggest).logged()     # weights, parameters, exact KV bytes
    metrics = {
        **_spread(throughput, "tok_per_s"),
        **_repeat_statistics(throughput),
        **_spread([b.ttft_s for b in records], "ttft_s"),
        **_spread([b.decode_s / b.decode_tokens for b in records], "tpot_s"),
        **latency_metrics(records),
        "per_stream_tok_per_s": statistics.median(throughput) / batch_size,
        **facts,
        "peak_memory_bytes": facts["weights_bytes"] + added_peak_bytes,
        "kv_cache_bytes": biggest.kv_cache_bytes,
        "kv_cache_tokens": biggest.kv_cache_tokens,
        "prompt_tokens_mean": statistics.mean(b.prompt_tokens for b in repeats[0]),
        "new_tokens_per_prompt": config.workload.max_new_tokens,
        "num_prompts": sum(len(b.prompt_ids) for b in repeats[0]),
    }
    return metrics, notes


def engine(config: TrialConfig):
    """The backend of the stack's engine (``trials.engines.spec.Backend``): ``generate_batch`` and ``facts``."""
    return engines.backend(config.stack)


@dataclass
class Measured:
    """What the loop recorded for one stack on one prompt list."""

    repeats: list[list[BatchRecord]]    # repeats x batches
    warmup_s: float
    measured_s: float
    peak: PeakMemory
    energy: Energy = field(default_factory=Energy)
    timed_window: tuple[float, float] = (0.0, 0.0)   # wall clock (unix s) of the timed passes

    def outputs(self) -> dict[str, list[int]]:
        """prompt id -> generated token ids (first repeat; greedy, so every repeat is the same)."""
        return {pid: ids for b in self.repeats[0] for pid, ids in zip(b.prompt_ids, b.output_ids)}


def measure(config: TrialConfig, loaded: loading.LoadedModel, prompts: list[Prompt], *,
            generate_kwargs: dict, batch_size: int | None = None, repeats: int | None = None,
            probe=None) -> Measured:
    """THE loop: warm up every batch shape, then ``repeats`` timed passes over all prompts.

    ``generate_kwargs`` is what the stack adds to greedy ``generate()`` (``{}`` for none): the
    engine prepares it from the stack, so the loop never needs to know techniques.

    ``probe`` is an optional context manager entered around the timed passes only (e.g. counters of
    target and draft forward passes), so that warm-up never pollutes what it counts.
    """
    batches = _batches(prompts, batch_size or config.stack.batch_size)
    generate_batch = engine(config).generate_batch
    timer = TokenTimer()
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:  # every prompt shape once: lazy init and per-shape kernel choice
            generate_batch(loaded, batch, WARMUP_TOKENS, timer, generate_kwargs)
        warmup_s = time.perf_counter() - started
        with track_peak_memory(config.device) as peak, measure_energy(config.device) as energy, \
                probe or contextlib.nullcontext():
            timed_from = time.time()
            records = [[generate_batch(loaded, b, config.workload.max_new_tokens, timer, generate_kwargs)
                        for b in batches] for _ in range(repeats or config.repeats)]
            timed_to = time.time()
    return Measured(records, warmup_s, time.perf_counter() - started, peak, energy, (timed_from, timed_to))


def compare_outputs(outputs: dict[str, list[int]], reference: dict[str, list[int]]) -> dict[str, float]:
    """Greedy outputs against a reference run of the same prompts, token for token.

    ``fidelity_token_match``: share of generated tokens equal to the reference's at the same position.
    ``first_divergence_token``: the earliest position (over prompts) where any output differs from
    its reference, or the output length when none does; ``..._mean`` averages that per prompt.
    ``lossless``: 1 when every output equals its reference exactly.
    """
    same = total = 0
    divergences = []
    for pid, ref in reference.items():
        out = outputs[pid]
        length = max(len(out), len(ref))
        matches = [a == b for a, b in zip(out, ref)]
        same += sum(matches)
        total += length
        divergences.append(matches.index(False) if False in matches else min(len(out), len(ref)))
    return {"fidelity_token_match": same / total if total else 1.0,
            "first_divergence_token": float(min(divergences)),
            "first_divergence_token_mean": statistics.mean(divergences),
            "lossless": float(all(outputs[pid] == ref for pid, ref in reference.items()))}


def finish(config: TrialConfig, runtime: Runtime, loaded: loading.LoadedModel, measured: Measured,
           metrics: dict[str, float] | None = None, tags: dict[str, str] | None = None,
           raw: dict | None = None) -> TrialResult:
    """The trial's result: the loop's summary plus what the group measured on top."""
    summary, notes = _summarize(config, loaded, measured.repeats, measured.peak.added_bytes)
    energy, energy_tags = energy_metrics(measured.energy, measured.repeats)
    summary.update(energy)
    notes = {**notes, **energy_tags}
    summary.update(timed_start_unix=measured.timed_window[0], timed_end_unix=measured.timed_window[1])
    summary.update(model_load_s=0.0 if loaded.from_cache else loaded.load_s,
                   model_from_cache=float(loaded.from_cache), warmup_s=measured.warmup_s,
                   measured_s=measured.measured_s)
    summary.update(metrics or {})
    all_tags = {**environment_tags(config.device,
                                   runtime.git_sha if runtime.git_sha != "unknown" else None),
                "memory_method": measured.peak.method, **model_tags(config), **notes, **(tags or {})}
    all_raw = {
        "repeats": [[{k: v for k, v in b.__dict__.items() if k not in ("output_ids", "texts")}
                     for b in rep] for rep in measured.repeats],
        "outputs": [{"prompt_id": pid, "text": text, "token_ids": ids}
                    for b in measured.repeats[0]
                    for pid, text, ids in zip(b.prompt_ids, b.texts, b.output_ids)],
        **(raw or {}),
    }
    return TrialResult(config, "FINISHED", summary, all_tags, all_raw)


def model_tags(config: TrialConfig) -> dict[str, str]:
    """``precision_native`` False marks numbers taken in a precision this device only emulates
    (bf16 on an AVX2-only CPU): they describe the CPU's emulation more than the optimization.
    ``model_source`` and ``weights_origin`` say where the model came from, e.g. that a real model's
    weights are 4-bit-derived (dequantized GGUF), wherever its numbers appear."""
    entry = config.entry()
    tags = {"precision_native": str(precision_is_native(config.stack.precision, config.device)),
            "model_source": entry.source}
    if entry.weights_origin:
        tags["weights_origin"] = entry.weights_origin
    return tags


def trial_prompts(config: TrialConfig, loaded: loading.LoadedModel) -> list[Prompt]:
    """The workload's prompts, in a fixed order (the same for every stack of a model); with
    ``context_tokens`` each is extended to exactly that many tokens of the model's tokenizer.
    An instruct model (its registry entry's ``chat_template``) gets the short prompts through its chat
    template; long-context prompts stay raw text, so that they are exactly N tokens."""
    prompts = workload_prompts(config.workload.prompt_set, config.workload.prompts_per_type)
    if config.workload.context_tokens:
        return extend_to_tokens(prompts, loaded.tokenizer, config.workload.context_tokens)
    if config.entry().chat_template and getattr(loaded.tokenizer, "chat_template", None):
        return as_chat(prompts, loaded.tokenizer)
    return prompts


OOM = "oom"      # the reason every out-of-memory FAILED run starts with, in every group
CPU_ALLOCATION_FAILED = ("DefaultCPUAllocator: can't allocate memory", "not enough memory")


def free_memory(device: str) -> None:
    """Give back what a trial that ran out of memory left (call it outside the ``except`` block: the
    traceback's frames hold the tensors)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's (and any allocator's) ``torch.OutOfMemoryError``, Python's ``MemoryError``, and the
    CPU allocator's RuntimeError, which torch does not type."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and any(text in str(exc) for text in CPU_ALLOCATION_FAILED))


def failed_result(config: TrialConfig, exc: BaseException) -> TrialResult:
    """A FAILED result whose ``error`` is the one-line reason (type and message); ``oom: ...`` where
    the device or the host ran out of memory."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if is_out_of_memory(exc) and not reason.startswith(OOM):
        reason = f"{OOM}: {type(exc).__name__}: {reason[:300]}"
    elif not isinstance(exc, ConfigError):
        reason = f"{type(exc).__name__}: {reason}"
    return TrialResult(config, "FAILED", tags={**environment_tags(config.device), **model_tags(config)},
                       raw={"traceback": traceback.format_exception(exc)}, error=reason)
