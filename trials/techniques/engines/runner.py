"""The engines group: one stack on one engine, measured by the one loop, against transformers'
reference precision on the same prompt token ids.

A transformers trial loads through ``trials.models.loading`` and generates with the stack's
``generate()`` arguments; a llama.cpp trial opens the stack's GGUF (``trials.engines.llama_cpp``)
and generates from the transformers tokenizer's ids of the same prompts, so both engines decode
identical inputs. Both go through ``trials.loop.measure`` (warm-up, repeats, per-token stamps,
peak memory) and ``finish``; the group adds fidelity against the reference precision's greedy
outputs (measured once per worker, model and workload), and for llama.cpp its own counters, the
GGUF it ran, tokenizer parity and the target passes per new token under prompt lookup.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from trials.config import Runtime, Stack, TrialConfig
from trials.engines.llama_cpp import generation as llama_cpp
from trials.engines.llama_cpp.binding import require_llama_cpp
from trials.engines.llama_cpp.spec import NAME as LLAMA_CPP
from trials.engines.transformers.generation import prepare
from trials.loop import TrialResult, compare_outputs, finish, measure, trial_prompts
from trials.measurement.bandwidth import memory_bandwidth
from trials.models import loading
from trials.models.registry import perplexity_method, reference_precision
from trials.stats.theory import roofline_tok_per_s
from trials.techniques.engines import quality
from trials.worker import WORKER


@dataclass
class Reference:
    precision: str
    outputs: dict[str, list[int]]


def _reference(config: TrialConfig, prompts, this_trial: dict | None) -> tuple[Reference, str]:
    """transformers at the reference precision on the same prompts, greedy (measured or reused)."""
    precision = reference_precision(config.entry(), config.device)
    plain = replace(config, stack=Stack(precision=precision), repeats=1)
    memo = WORKER.memo("engines.reference", max_age_s=30 * 60)
    if this_trial is not None:
        return memo.put(plain.config_hash, config.config_hash, Reference(precision, this_trial)), "this trial"

    def make() -> Reference:
        loaded = loading.load(config.entry(), precision, config.device)
        return Reference(precision, measure(plain, loaded, prompts, generate_kwargs={}).outputs())

    return memo.get(plain.config_hash, config.config_hash, make)


def _llama_cpp_trial(config: TrialConfig, tokenizer_source: loading.LoadedModel):
    stack, workload = config.stack, config.workload
    prompts = trial_prompts(config, tokenizer_source)
    longest = max(len(llama_cpp.prompt_ids(tokenizer_source, p)) for p in prompts)
    n_ctx = -(-(longest + workload.max_new_tokens + stack.num_draft_tokens + 16) // 256) * 256
    loaded = llama_cpp.load(config, tokenizer_source.tokenizer, n_ctx)
    measured = measure(config, loaded, prompts, generate_kwargs={"kv_bits": stack.kv_bits})
    records = [r for rep in measured.repeats for r in rep]
    parity = [llama_cpp.own_ids(loaded, p) == llama_cpp.prompt_ids(loaded, p) for p in prompts]
    new = sum(r.new_tokens for r in records)
    metrics = {
        "tokenizer_parity": sum(parity) / len(parity),
        "llama_prompt_eval_ms": statistics.median(r.llama_perf["prompt_eval_ms"] for r in records),
        "llama_eval_ms": statistics.median(r.llama_perf["eval_ms"] for r in records),
        "llama_eval_tokens": statistics.median(r.llama_perf["eval_tokens"] for r in records),
        "n_ctx": float(n_ctx),
        "kv_cache_allocated_bytes": float(n_ctx * llama_cpp.kv_bytes_per_token(loaded, stack.kv_bits)),
        "model_load_s_gguf": loaded.load_s,
    }
    rates = [1000 * r.llama_perf["eval_tokens"] / r.llama_perf["eval_ms"] for r in records if r.llama_perf["eval_ms"] > 0]
    if rates:                                  # llama.cpp's own decode rate, beside ours
        metrics["llama_eval_tok_per_s"] = statistics.median(rates)
    if stack.speculation == "prompt_lookup":
        metrics["target_passes_per_token"] = sum(r.target_passes for r in records) / max(1, new - len(records))
        metrics["tokens_per_target_pass"] = 1 / metrics["target_passes_per_token"] if metrics["target_passes_per_token"] else 0.0
    import llama_cpp as binding

    tags = {"engine": LLAMA_CPP, "gguf_type": stack.precision, "gguf_file": loaded.card.get("file", ""),
            "gguf_origin": loaded.card.get("origin", ""), "llama_cpp_python": binding.__version__,
            "llama_cpp_system": binding.llama_print_system_info().decode(errors="replace")[:250],
            "kv_cache_type": llama_cpp.KV_TYPES[stack.kv_bits], "flash_attn": "True",
            "tokenizer_parity_prompts": ",".join(p.id for p, same in zip(prompts, parity) if not same) or "all",
            "kv_cache_bytes_method": "ggml block sizes x tokens held (llama.cpp allocates n_ctx tokens up front: "
                                     "kv_cache_allocated_bytes)",
            "user_code": llama_cpp.as_code(config, n_ctx)}
    return loaded, prompts, measured, metrics, tags


def run_engine_trial(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """One stack on its engine, and its greedy outputs against the reference precision's."""
    stack, entry = config.stack, config.entry()
    reference_precision_ = reference_precision(entry, config.device)
    if stack.engine == LLAMA_CPP:
        require_llama_cpp()
        tokenizer_source = loading.load(entry, reference_precision_, config.device)
        loaded, prompts, measured, metrics, tags = _llama_cpp_trial(config, tokenizer_source)
        this_trial = None
    else:
        loaded = loading.load(entry, stack.precision, config.device)
        prompts = trial_prompts(config, loaded)
        prepared = prepare(config, loaded, prompts)
        measured = measure(config, loaded, prompts, generate_kwargs=prepared.kwargs)
        metrics, tags = {}, {"engine": stack.engine, "user_code": prepared.code}
        plain = stack.precision == reference_precision_ and stack.kv_bits == 16 and stack.speculation == "none"
        this_trial = measured.outputs() if plain else None
    reference, source = _reference(config, prompts, this_trial)
    metrics.update(compare_outputs(measured.outputs(), reference.outputs))
    tags.update(reference_precision=reference.precision, reference_source=source)
    metrics_q, tags_q = _quality(config, loaded)
    metrics.update(metrics_q)
    tags.update(tags_q)
    result = finish(config, runtime, loaded, measured, metrics=metrics, tags=tags)
    _roofline(config, result)
    return result


def _roofline(config: TrialConfig, result: TrialResult) -> None:
    """The batch-1 bandwidth bound beside the measured tok/s: a decode step reads the weights once and
    the cache at the mean decode context (KV bytes per token from the cache the trial ended with), at
    the bandwidth of a large copy on this machine (``trials.measurement.bandwidth``). Prompt lookup can
    pass it: one target pass then emits several tokens."""
    m = result.metrics
    bandwidth, source = memory_bandwidth(config.device, config.config_hash)
    per_token = m["kv_cache_bytes"] / m["kv_cache_tokens"] if m.get("kv_cache_tokens") else 0.0
    step = m["weights_bytes"] + per_token * (m["prompt_tokens_mean"] + config.workload.max_new_tokens / 2)
    m.update(memory_bandwidth_bytes_per_s=bandwidth, decode_bytes_per_step=step,
             roofline_tok_per_s=roofline_tok_per_s(1, bandwidth, step))
    m["roofline_ratio"] = m["tok_per_s"] / m["roofline_tok_per_s"]
    result.tags["bandwidth_source"] = source


def _quality(config: TrialConfig, loaded) -> tuple[dict[str, float], dict[str, str]]:
    """Teacher-forced perplexity and KL against the reference precision on the model's perplexity
    windows: for plain stacks on both engines and llama.cpp's quantized caches (a window evaluated in
    one batch reads its K/V back from the cache). Not for prompt lookup (lossless: its quality is its
    base stack's) nor for transformers' quantized caches (they keep the last 128 tokens in full
    precision, so a 256-token window would not exercise them: the kv_cache group measures those by
    decoding through the cache)."""
    stack, entry = config.stack, config.entry()
    if stack.speculation != "none":
        return {}, {"quality_note": "prompt lookup is lossless: its teacher-forced quality is its base stack's"}
    if stack.engine != LLAMA_CPP and stack.kv_bits != 16:
        return {}, {"quality_note": "a transformers quantized cache keeps 128 tokens in full precision: the "
                                    "kv_cache group measures its KL by decoding through it"}
    method = perplexity_method(entry, config.workload.eval_windows)
    reference = loading.load(entry, reference_precision(entry, config.device), config.device)
    if stack.engine == LLAMA_CPP:
        import llama_cpp as binding

        kv_type = getattr(binding, f"GGML_TYPE_{llama_cpp.KV_TYPES[stack.kv_bits].upper()}")
        candidate = quality.llama_cpp_logits(str(loaded.path), method.context, kv_type, config.seed)
    elif stack.precision == reference.precision:
        candidate = None
    else:
        candidate = quality.transformers_logits(loaded.model)
    measured = quality.compare(reference.model, reference.tokenizer, method, candidate)
    tags = {"perplexity_method": method.describe(), "perplexity_corpus_hash": measured.corpus_hash}
    if measured.vocab_note:
        tags["quality_note"] = measured.vocab_note
    return measured.metrics(), tags
