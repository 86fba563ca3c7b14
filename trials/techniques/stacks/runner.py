"""Optimization stacks: techniques combined in ONE trial, compared with the same model's plain stack.

A stack here is weight precision + KV-cache quantization + speculation + compiled decoding (+ batch
size), loaded and generated together through the one measurement loop: the weights come quantized
from ``loading.load``, and ``generate()`` gets every technique's arguments at once (the engine's
``prepare``: the quantized cache, the draft model or prompt lookup, the static cache and compile
config: the engine's ``Backend.prepare``). A combination's number is never a sum or
product of separate trials.

Each trial is compared with two references, both measured once per worker, model and workload (and
reused for ``REFERENCE_MAX_AGE_S``, said in the tags):

* the **baseline**: the design's base stack (the fast precision on this device, full cache, no
  speculation, batch 1): ``speedup_vs_baseline`` and ``memory_vs_baseline`` (tag ``baseline_source``);
* the **quality reference**: the reference precision (fp32 on CPU) with the full cache, greedy:
  ``fidelity_token_match`` and ``lossless`` against its outputs, and, where weights or cache are
  quantized, the KL divergence of teacher-forced next-token distributions (tag ``reference_source``).

Speculation alone must be lossless against the base precision's greedy output; a quantized stack
need not, and says by how much it is not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trials.config import Runtime, Stack, TrialConfig
from trials import engines
from trials.loop import Measured, TrialResult, compare_outputs, finish, measure, trial_prompts
from trials.measurement.hardware import fast_precision
from trials.measurement import quality
from trials.models import loading
from trials.models.registry import reference_precision
from trials.prompts import Prompt
from trials.stats.factorial import FACTOR_TAG, stack_factors
from trials.techniques.kv_cache.space import check_model
from trials.worker import WORKER

REFERENCE_MAX_AGE_S = 30 * 60


@dataclass
class Baseline:
    tok_per_s: float
    peak_memory_bytes: float
    outputs: dict[str, list[int]]


def base_stack(config: TrialConfig) -> Stack:
    """The design's base: the fast precision on this device (``hardware.fast_precision``, as the
    stacks space plans it), full cache, no speculation, batch 1."""
    return Stack(precision=fast_precision(config.device))


def _variant(config: TrialConfig, stack: Stack) -> TrialConfig:
    return replace(config, group="stacks", stack=stack)


def _summary(config: TrialConfig, loaded: loading.LoadedModel, measured: Measured) -> Baseline:
    result = finish(config, Runtime(), loaded, measured)
    return Baseline(result.metrics["tok_per_s"], result.metrics["peak_memory_bytes"], measured.outputs())


def baseline(config: TrialConfig, prompts: list[Prompt], own: Baseline | None) -> tuple[Baseline, str]:
    """The base stack's throughput, peak memory and outputs: this trial's own numbers (``own``) when
    it is the base stack, else this worker's recent measurement, else measured now (full repeats)."""
    plain = _variant(config, base_stack(config))
    memo = WORKER.memo("stacks.baseline", max_age_s=REFERENCE_MAX_AGE_S)
    if own is not None:
        return memo.put(plain.config_hash, config.config_hash, own), "this trial"

    def make() -> Baseline:
        base = loading.load(plain.entry(), plain.stack.precision, plain.device)
        return _summary(plain, base, measure(plain, base, prompts, generate_kwargs={}))

    return memo.get(plain.config_hash, config.config_hash, make)


def reference(config: TrialConfig, prompts: list[Prompt]) -> tuple[quality.Reference, str]:
    """The reference precision's greedy outputs and teacher-forced predictions (full cache)."""
    plain = _variant(config, Stack(precision=reference_precision(config.entry(), config.device)))

    def make() -> quality.Reference:
        loaded = loading.load(plain.entry(), plain.stack.precision, plain.device)
        measured = measure(plain, loaded, prompts, generate_kwargs={}, repeats=1)
        return quality.Reference(plain.stack.precision, measured.outputs(),
                                 *engines.backend(plain.stack).teacher_forced(plain, loaded, prompts, plain.stack))

    return quality.reference("stacks.reference", plain.config_hash, config.config_hash, make,
                             max_age_s=REFERENCE_MAX_AGE_S)


def run_stack(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """One combined stack: measured once through the loop, against the baseline and the reference."""
    stack = config.stack
    if stack.engine != engines.DEFAULT:
        return run_on_other_engine(config, runtime)
    backend = engines.backend(stack)
    loaded, prompts = backend.load(config)
    check_model(config, loaded.model.config)       # a cache the quantized backend cannot hold: why
    prepared = backend.prepare(config, loaded, prompts)
    measured = measure(config, loaded, prompts, generate_kwargs=prepared.kwargs)
    engine_metrics, engine_tags = backend.trial_facts(config, loaded, measured, prompts, prepared)
    ref, ref_source = reference(config, prompts)
    metrics = compare_outputs(measured.outputs(), ref.outputs)
    quantized = stack.kv_bits != 16 or stack.precision != reference_precision(config.entry(), config.device)
    if quantized:
        logprobs, targets = engines.backend(stack).teacher_forced(config, loaded, prompts, stack)
        scores = quality.teacher_forced_metrics(ref.logprobs, logprobs, targets)
        metrics.update({k: scores[k] for k in ("kl_divergence", "kl_divergence_max", "teacher_forced_top1_match",
                                                "teacher_forced_tokens", "perplexity", "reference_perplexity",
                                                "perplexity_ratio", "perplexity_delta")})
    metrics.update(engine_metrics)
    tags = {**engine_tags, "stack_name": stack.design_name, "reference_source": ref_source,
            "reference_precision": reference_precision(config.entry(), config.device),
            "parts": describe(config, engine_tags.get("compile_method", "")), "user_code": prepared.code}
    if stack.speculation != "none":
        tags["proposer"] = stack.draft_model or "prompt lookup"
    tags.update({f"{FACTOR_TAG}{name}": str(int(on)) for name, on in stack_factors(stack).items()})
    result = finish(config, runtime, loaded, measured, metrics=metrics, tags=tags)
    m = result.metrics
    own = Baseline(m["tok_per_s"], m["peak_memory_bytes"], measured.outputs())
    base, result.tags["baseline_source"] = baseline(config, prompts, own if stack == base_stack(config) else None)
    m["lossless_vs_baseline"] = compare_outputs(measured.outputs(), base.outputs)["lossless"]
    m["baseline_tok_per_s"] = base.tok_per_s
    m["speedup_vs_baseline"] = m["tok_per_s"] / base.tok_per_s
    m["memory_vs_baseline"] = m["peak_memory_bytes"] / base.peak_memory_bytes
    return result


def run_on_other_engine(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """A cell of the design's engine level (another engine than the default): measured as the engines
    group measures it (the same loop, fed the transformers tokenizer's ids, fidelity and KL against
    the reference precision), then compared with the design's base stack on the default engine, as
    every other cell is."""
    from trials.techniques.engines.runner import run_engine_trial

    result = run_engine_trial(config, runtime)
    tokenizer_source = loading.load(config.entry(), reference_precision(config.entry(), config.device), config.device)
    prompts = trial_prompts(config, tokenizer_source)
    base, result.tags["baseline_source"] = baseline(config, prompts, None)
    m = result.metrics
    m["lossless_vs_baseline"] = compare_outputs({o["prompt_id"]: o["token_ids"] for o in result.raw["outputs"]}, base.outputs)["lossless"]
    m["baseline_tok_per_s"] = base.tok_per_s
    m["speedup_vs_baseline"] = m["tok_per_s"] / base.tok_per_s
    m["memory_vs_baseline"] = m["peak_memory_bytes"] / base.peak_memory_bytes
    result.tags.update({"stack_name": config.stack.design_name, "parts": describe(config),
                        **({"proposer": "prompt lookup"} if config.stack.speculation != "none" else {}),
                        **{f"{FACTOR_TAG}{name}": str(int(on)) for name, on in stack_factors(config.stack).items()}})
    return result


def describe(config: TrialConfig, compile_method: str = "") -> str:
    """The stack's parts in words, for the hover and the best-stack card."""
    s = config.stack
    word = engines.get(s.engine).weight_word
    parts = [f"{s.precision} {word}"] if s.engine == engines.DEFAULT else [f"{s.engine}: {s.precision} {word}"]
    parts.append("full KV cache" if s.kv_bits == 16 else f"{s.kv_bits}-bit KV cache ({s.kv_backend})")
    if s.speculation == "draft":
        parts.append(f"draft {s.draft_model}, k={s.num_draft_tokens}")
    elif s.speculation == "prompt_lookup":
        parts.append(f"prompt lookup, k={s.num_draft_tokens}")
    if s.batch_size != 1:
        parts.append(f"batch {s.batch_size}")
    if s.compile:
        parts.append(compile_method or "compiled decoding")
    return "; ".join(parts)
