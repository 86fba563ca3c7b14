"""The engines group: one stack on its engine, measured by the one loop, against the default
engine's reference precision on the same prompt token ids.

The stack's engine (``trials.engines.backend``) loads the model under the stack and prepares its
arguments; every engine is fed the transformers tokenizer's ids of the same prompts, so all decode
identical inputs. The loop (``trials.loop.measure``: warm-up, repeats, per-token stamps, peak memory)
and ``finish`` are the same for all; the group adds fidelity against the reference precision's
greedy outputs (measured once per worker, model and workload), teacher-forced quality
(``trials.measurement.quality``, with the engine's ``scorer``), the engine's own counters and build
(its ``trial_facts``), and the batch-1 bandwidth roofline.
"""

from __future__ import annotations

from dataclasses import replace

from trials import engines
from trials.config import Runtime, Stack, TrialConfig
from trials.loop import TrialResult, compare_outputs, finish, measure
from trials.measurement import quality
from trials.measurement.bandwidth import memory_bandwidth
from trials.models import loading
from trials.models.registry import perplexity_method, reference_precision
from trials.stats.theory import decode_step_bytes, roofline_metrics


def _is_reference(config: TrialConfig) -> bool:
    s = config.stack
    return (s.engine == engines.DEFAULT and s.kv_bits == 16 and s.speculation == "none"
            and s.precision == reference_precision(config.entry(), config.device))


def _reference(config: TrialConfig, prompts, this_trial: dict | None) -> tuple[quality.Reference, str]:
    """The default engine at the reference precision on the same prompts, greedy (measured or reused)."""
    precision = reference_precision(config.entry(), config.device)
    plain = replace(config, stack=Stack(precision=precision), repeats=1)

    def make() -> quality.Reference:
        loaded = loading.load(config.entry(), precision, config.device)
        return quality.Reference(precision, measure(plain, loaded, prompts, generate_kwargs={}).outputs())

    return quality.reference("engines.reference", plain.config_hash, config.config_hash, make,
                             None if this_trial is None else quality.Reference(precision, this_trial))


def run_engine_trial(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """One stack on its engine, and its greedy outputs against the reference precision's."""
    backend = engines.backend(config.stack)
    loaded, prompts = backend.load(config)
    prepared = backend.prepare(config, loaded, prompts)
    measured = measure(config, loaded, prompts, generate_kwargs=prepared.kwargs)
    metrics, tags = backend.trial_facts(config, loaded, measured, prompts, prepared)
    tags["user_code"] = prepared.code
    reference, source = _reference(config, prompts, measured.outputs() if _is_reference(config) else None)
    metrics.update(compare_outputs(measured.outputs(), reference.outputs))
    tags.update(reference_precision=reference.precision, reference_source=source)
    metrics_q, tags_q = _quality(config, backend, loaded)
    metrics.update(metrics_q)
    tags.update(tags_q)
    result = finish(config, runtime, loaded, measured, metrics=metrics, tags=tags)
    roofline, bandwidth_tags = _roofline(config, result.metrics)
    result.metrics.update(roofline)
    result.tags.update(bandwidth_tags)
    return result


def numbers_on_shared_run(config: TrialConfig, result: TrialResult) -> tuple[dict[str, float], dict[str, str]]:
    """This group's numbers on a run another group's runner measured (the same stack, engine and
    workload, run once: ``sweeps.measure_once``), where that run lacks them: the roofline, and
    teacher-forced quality on the perplexity windows (the model comes from the worker's cache). The
    output comparison with the reference precision, the engine's counters and the user's code are
    every runner's already."""
    metrics, tags = {}, {}
    if "roofline_tok_per_s" not in result.metrics:
        metrics, tags = _roofline(config, result.metrics)
    if "perplexity_windows" not in result.metrics and "quality_note" not in result.tags:
        backend = engines.backend(config.stack)
        loaded, _ = backend.load(config)
        quality_metrics, quality_tags = _quality(config, backend, loaded)
        metrics.update(quality_metrics)
        tags.update(quality_tags)
    return metrics, tags


def _roofline(config: TrialConfig, m: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """The batch-1 bandwidth bound beside the measured tok/s (metrics ``m``): a decode step reads the
    weights once and the cache at the mean decode context (KV bytes per token from the cache the trial
    ended with), at the bandwidth of a large copy on this machine (``trials.measurement.bandwidth``).
    Prompt lookup can pass it: one target pass then emits several tokens."""
    bandwidth, source = memory_bandwidth(config.device, config.config_hash)
    per_token = m["kv_cache_bytes"] / m["kv_cache_tokens"] if m.get("kv_cache_tokens") else 0.0
    step = decode_step_bytes(m["weights_bytes"], per_token, m["prompt_tokens_mean"] + config.workload.max_new_tokens / 2)
    return roofline_metrics(m["tok_per_s"], 1, bandwidth, step), {"bandwidth_source": source}


def _quality(config: TrialConfig, backend, loaded) -> tuple[dict[str, float], dict[str, str]]:
    """Teacher-forced perplexity and KL against the reference precision on the model's perplexity
    windows, through the engine's ``scorer``. Not for speculation (lossless: its quality is its base
    stack's), nor where the engine says its stack cannot be scored that way."""
    stack, entry = config.stack, config.entry()
    if stack.speculation != "none":
        return {}, {"quality_note": "speculation is lossless: its teacher-forced quality is its base stack's"}
    method = perplexity_method(entry, config.workload.eval_windows)
    candidate = backend.scorer(config, loaded, method.context)
    if isinstance(candidate, str):
        return {}, {"quality_note": candidate}
    reference = loading.load(entry, reference_precision(entry, config.device), config.device)
    measured = quality.compare(reference.model, reference.tokenizer, method, candidate)
    tags = {"perplexity_method": method.describe(), "perplexity_corpus_hash": measured.corpus_hash}
    if measured.vocab_note:
        tags["quality_note"] = measured.vocab_note
    return measured.metrics(), tags
