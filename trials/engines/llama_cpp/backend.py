"""The llama.cpp engine in a worker (``trials.engines.spec.Backend``): a stack's GGUF opened with
its cache type and proposer, fed the transformers tokenizer's ids of the same prompts (both engines
decode identical inputs), its own counters and build beside the loop's numbers, and its logits for
teacher-forced quality."""

from __future__ import annotations

import statistics

import numpy as np
import torch

from trials.config import TrialConfig
from trials.engines.llama_cpp import bench, build_flags, generation, tools
from trials.engines.llama_cpp.binding import require_llama_cpp, threads
from trials.engines.llama_cpp.generation import facts, generate_batch   # noqa: F401  (the interface)
from trials.engines.llama_cpp.spec import KV_TYPES, NAME
from trials.engines.llama_cpp.step_cost import measure as step_cost   # noqa: F401  (the interface)
from trials.engines.spec import Prepared
from trials.errors import ConfigError
from trials.loop import decode_rates, trial_prompts
from trials.models import loading
from trials.models.registry import reference_precision


def load(config: TrialConfig):
    """The stack's GGUF in a context that holds the longest prompt, the new tokens and a proposal."""
    require_llama_cpp()
    entry, stack, workload = config.entry(), config.stack, config.workload
    tokenizer_source = loading.load(entry, reference_precision(entry, config.device), config.device)
    prompts = trial_prompts(config, tokenizer_source)
    longest = max(len(generation.prompt_ids(tokenizer_source, p)) for p in prompts)
    n_ctx = -(-(longest + workload.max_new_tokens + stack.num_draft_tokens + 16) // 256) * 256
    return generation.load(config, tokenizer_source.tokenizer, n_ctx), prompts


def prepare(config: TrialConfig, loaded, prompts) -> Prepared:
    return Prepared({"kv_bits": config.stack.kv_bits}, generation.as_code(config, loaded.n_ctx))


def trial_facts(config: TrialConfig, loaded, measured, prompts, prepared: Prepared) -> tuple[dict[str, float], dict[str, str]]:
    """llama.cpp's own counters (prompt-eval and eval ms, its decode rate), tokenizer parity, the
    context it allocated, target passes under prompt lookup, and the GGUF and build it ran."""
    binding = require_llama_cpp()
    stack = config.stack
    records = [r for rep in measured.repeats for r in rep]
    parity = [generation.own_ids(loaded, p) == generation.prompt_ids(loaded, p) for p in prompts]
    new = sum(r.new_tokens for r in records)
    metrics = {
        "tokenizer_parity": sum(parity) / len(parity),
        "llama_prompt_eval_ms": statistics.median(r.llama_perf["prompt_eval_ms"] for r in records),
        "llama_eval_ms": statistics.median(r.llama_perf["eval_ms"] for r in records),
        "llama_eval_tokens": statistics.median(r.llama_perf["eval_tokens"] for r in records),
        "n_ctx": float(loaded.n_ctx),
        "kv_cache_allocated_bytes": float(loaded.n_ctx * generation.kv_bytes_per_token(loaded, stack.kv_bits)),
        "model_load_s_gguf": loaded.load_s,
    }
    rates = [1000 * r.llama_perf["eval_tokens"] / r.llama_perf["eval_ms"] for r in records if r.llama_perf["eval_ms"] > 0]
    if rates:                                  # llama.cpp's own decode rate, beside ours
        metrics["llama_eval_tok_per_s"] = statistics.median(rates)
    if stack.speculation == "prompt_lookup":
        metrics["target_passes_per_token"] = sum(r.target_passes for r in records) / max(1, new - len(records))
        metrics["tokens_per_target_pass"] = 1 / metrics["target_passes_per_token"] if metrics["target_passes_per_token"] else 0.0
    bench, bench_tags = cross_check(config, loaded, measured)
    metrics.update(bench)
    tags = {**bench_tags, "engine": NAME, "gguf_type": stack.precision, "gguf_file": loaded.card.get("file", ""),
            "gguf_origin": loaded.card.get("origin", ""),
            "weights_as_shipped": str(loaded.card.get("origin") == "shipped"),
            "llama_cpp_python": binding.__version__, "llama_cpp_build_flags": " ".join(build_flags.cmake_flags()),
            "llama_cpp_system": binding.llama_print_system_info().decode(errors="replace")[:250],
            "kv_cache_type": KV_TYPES[stack.kv_bits], "flash_attn": "True",
            "tokenizer_parity_prompts": ",".join(p.id for p, same in zip(prompts, parity) if not same) or "all",
            "kv_cache_bytes_method": "ggml block sizes x tokens held (llama.cpp allocates n_ctx tokens up front: "
                                     "kv_cache_allocated_bytes)"}
    return metrics, tags


def cross_check(config: TrialConfig, loaded, measured) -> tuple[dict[str, float], dict[str, str]]:
    """llama.cpp's own benchmark (``llama-bench``, built beside the binding from the same source and
    flags) on the same GGUF, cache type, threads, prompt length and new tokens, beside the loop's
    decode rate: ``llama_bench_tg_ratio`` = ours / its (1 where both measure the same thing; prompt
    lookup is not in llama-bench, so there the ratio is the speculation's gain over plain decoding)."""
    records = [r for rep in measured.repeats for r in rep]
    ours = statistics.median(decode_rates(measured.repeats))            # the loop's tok_per_s
    try:
        folder = tools.tools_dir(build=False)
        theirs = bench.llama_bench(loaded.path, threads(), prompt_tokens=round(statistics.mean(r.prompt_tokens for r in records)),
                                   gen_tokens=config.workload.max_new_tokens, repeats=max(2, config.repeats),
                                   cache_type=KV_TYPES[config.stack.kv_bits], flash_attn=True, folder=folder)
    except (ConfigError, tools.ToolError) as exc:
        return {}, {"llama_bench_error": str(exc).splitlines()[0][:300]}
    metrics = {k: float(v) for k, v in theirs.items() if k.endswith(("tok_per_s", "tok_per_s_std")) and v is not None}
    tags = {k: str(v)[:250] for k, v in theirs.items() if k not in metrics and v is not None}
    if metrics.get("llama_bench_tg_tok_per_s"):
        metrics["llama_bench_tg_ratio"] = ours / metrics["llama_bench_tg_tok_per_s"]
    if config.stack.speculation != "none":
        tags["llama_bench_note"] = "llama-bench decodes without prompt lookup: the ratio is the speculation's gain"
    return metrics, tags


def scorer(config: TrialConfig, loaded, context: int):
    """llama.cpp's logits for every position of a window (a second context with ``logits_all``, the
    stack's cache type: a window evaluated in one batch reads its K/V back from the cache)."""
    model = generation.open_llama(loaded.path, generation.llama_arguments(config.stack, context, scoring=True),
                                  config.seed)

    def logits(ids: list[int]) -> torch.Tensor:
        model.reset()
        model.eval(ids)
        return torch.from_numpy(np.array(model.scores[:len(ids)], dtype=np.float32))
    return logits


def teacher_forced(config: TrialConfig, loaded, prompts, stack) -> str:
    return ("llama.cpp is scored teacher-forced over the model's perplexity windows (its scorer, "
            "the engines group), not through a decoding cache")
