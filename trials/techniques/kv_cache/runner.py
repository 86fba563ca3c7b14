"""KV-cache quantization, measured: memory, speed and fidelity of transformers' QuantizedCache.

The cache grows by ``2 x layers x kv_heads x head_dim`` elements per token, so at long contexts or
large batches it, not the weights, fills memory. transformers' ``QuantizedCache`` (KIVI-style)
stores it in 8/4/2 bits, group-wise, with one of two backends: HQQ (8/4/2 bits) or optimum-quanto
(4/2 bits). ``generate(cache_implementation="quantized", cache_config=...)`` is all a stack changes
(the engine's arguments, ``trials.engines.transformers``); timing and memory come from the shared loop (``trials.loop.measure``).

How that cache stores what it holds (read from transformers' ``QuantizedLayer``, checked by walking
the real tensors, ``trials.measurement.instruments.kv_cache_bytes``): the prompt is quantized whole at prefill;
every decoded token then goes to a full-precision *residual* window, and when the window reaches
``residual_length`` tokens the whole cache is de-quantized, joined and re-quantized. So after ``n``
decode steps, ``n mod residual_length`` tokens are in full precision and the rest in ``nbits``.
Each K and V tensor of a layer (``batch x kv_heads x tokens x head_dim`` elements) is cut into
groups of ``q_group_size`` elements; every group keeps a scale and a zero point (quanto: a shift) in
the model's dtype. HQQ packs the codes exactly (``group_size * nbits / 8`` bytes per group); quanto
packs the ``(groups, group_size)`` codes along the groups axis, ``8 / nbits`` groups per byte row, so
its row count rounds up. ``expected_bytes`` adds these up -- the full-precision formula of
``trials.measurement.kv_footprint`` at ``nbits`` for the quantized tokens, the scales and zeros, quanto's row
padding, and the formula at full precision for the residual window -- and each trial logs it as
``kv_cache_bytes_expected`` beside the measured ``kv_cache_bytes`` (and ``kv_cache_bytes_exact``,
the same cache unquantized).

Fidelity, against the full-precision cache on the same prompts in the same worker (the reference is
measured once per model and workload and reused; the tag ``reference_source`` says by which trial):

* greedy outputs token for token (``trials.loop.compare_outputs``): ``fidelity_token_match``,
  ``first_divergence_token``. Brittle on small models, whose near-tied logits flip on tiny errors,
  and one early flip changes everything after it;
* teacher-forced, which does not compound: each prompt's last ``max_new_tokens`` tokens (real text,
  see ``trials.prompts.extend_to_tokens``) are fed one at a time after its prefix was pre-filled
  into the cache under test, so every prediction reads the (quantized) cache exactly as decoding
  does. Per position we compare the next-token distribution with the full-precision cache's:
  ``kl_divergence`` (KL(full || quantized), nats per token, mean), ``teacher_forced_top1_match``
  (share of positions whose most likely token is the same), and the perplexity of the true tokens,
  ``perplexity`` beside ``reference_perplexity``, with ``perplexity_delta`` = their difference.

Bad input fails before anything is generated, with one line: a bit width a backend cannot pack is a
``ConfigError`` at config time (``trials.config.Stack``, from each engine's ``kv_caches``); a backend package missing on
this worker, an architecture the footprint calculator cannot model, layers QuantizedCache refuses
(sliding windows, MLA) or a group size that does not divide a token's K or V row are ``ConfigError``s
in the trial, which the sweep records as a FAILED run with that reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from trials import engines
from trials.config import Runtime, Stack, TrialConfig
from trials.engines.transformers.kv_cache import HYBRID_NOTE, has_sliding_layers
from trials.loop import Measured, TrialResult, compare_outputs, finish, measure, trial_prompts
from trials.measurement import quality
from trials.measurement.kv_footprint import KVFootprint
from trials.models import loading
from trials.prompts import Prompt
from trials.techniques.kv_cache.space import check_model


# ------------------------------------------------------------------------------ expected bytes

def residual_tokens(cached_tokens: int, prompt_tokens: int, residual_length: int) -> int:
    """Tokens in the full-precision window after decoding ``cached - prompt`` tokens one by one."""
    decoded = max(0, cached_tokens - prompt_tokens)
    return decoded % residual_length if residual_length > 1 else 0


@dataclass(frozen=True)
class ExpectedBytes:
    """The expected cache bytes, part by part (see the module docstring)."""

    quantized_tokens: int
    residual_tokens: int
    codes: int           # the formula at nbits for the quantized tokens
    scales_zeros: int    # one scale and one zero per group, in the model's dtype
    padding: int         # quanto's rounding up of packed rows
    residual: int        # the formula at full precision for the residual window
    sliding: int = 0     # sliding-window layers, kept in full precision beside quantized ones (hybrid)

    @property
    def total(self) -> int:
        return self.codes + self.scales_zeros + self.padding + self.residual + self.sliding


def expected_bytes(footprint: KVFootprint, stack: Stack, cached_tokens: int, prompt_tokens: int,
                   batch: int, dtype_bits: int) -> ExpectedBytes:
    """What the stack's cache should hold after prefilling ``prompt_tokens`` and growing to
    ``cached_tokens`` (per sequence, ``batch`` sequences), derived from how the backends store."""
    if stack.kv_bits == 16:
        return ExpectedBytes(0, cached_tokens, 0, 0, 0,
                             footprint.held_bytes(cached_tokens, batch, dtype_bits))
    residual = residual_tokens(cached_tokens, prompt_tokens, stack.kv_residual_length)
    quantized = cached_tokens - residual
    full = replace(footprint, groups=tuple(g for g in footprint.groups if g.kind != "sliding"))
    sliding = replace(footprint, groups=tuple(g for g in footprint.groups if g.kind == "sliding"))
    scales = padding = 0
    for group in full.groups:
        per_tensor = group.elements_per_token // 2 * group.tokens_cached(quantized) * batch
        groups = math.ceil(per_tensor / stack.kv_group_size)
        tensors = 2 * group.layers                            # K and V of every layer
        scales += tensors * 2 * groups * dtype_bits // 8
        if stack.kv_backend == "quanto":
            per_row = 8 // stack.kv_bits
            padding += tensors * (-groups % per_row) * stack.kv_group_size // per_row
    return ExpectedBytes(quantized, residual, full.total_bytes(quantized, batch, stack.kv_bits),
                         scales, padding, full.total_bytes(residual, batch, dtype_bits),
                         sliding.held_bytes(cached_tokens, batch, dtype_bits) if sliding.groups else 0)


# ------------------------------------------------------------------------------ the reference

def reference(config: TrialConfig, loaded: loading.LoadedModel, prompts: list[Prompt],
              measured: Measured | None = None) -> tuple[quality.Reference, str]:
    """The full-precision cache's outputs and teacher-forced predictions on this trial's prompts:
    ``measured`` when the trial is itself the full-precision stack, else the one this worker measured
    recently, else measured now (one pass; its timing is not used). Only the latest is kept (memory)."""
    plain = replace(config, stack=Stack(precision=config.stack.precision))

    def make(measured: Measured | None = None) -> quality.Reference:
        if measured is None:
            measured = measure(plain, loaded, prompts, repeats=1, generate_kwargs={})
        return quality.Reference(plain.stack.precision, measured.outputs(),
                                 *engines.backend(plain.stack).teacher_forced(config, loaded, prompts, plain.stack))

    return quality.reference("kv_cache.reference", plain.config_hash, config.config_hash, make,
                             make(measured) if measured is not None else None, keep_latest=True)


# ------------------------------------------------------------------------------ the trial

def byte_metrics(footprint: KVFootprint, config: TrialConfig, loaded: loading.LoadedModel,
                 measured: Measured) -> dict[str, float]:
    """Expected bytes of the cache the trial measured (the same record ``finish`` reports)."""
    biggest = max(measured.repeats[0], key=lambda b: b.kv_cache_tokens)
    dtype_bits = torch.finfo(next(loaded.model.parameters()).dtype).bits
    expected = expected_bytes(footprint, config.stack, biggest.kv_cache_tokens, biggest.prompt_tokens,
                              len(biggest.prompt_ids), dtype_bits)
    return {"kv_cache_bytes_expected": float(expected.total),
            "kv_cache_bytes_expected_codes": float(expected.codes),
            "kv_cache_bytes_expected_scales": float(expected.scales_zeros + expected.padding),
            "kv_cache_bytes_expected_residual": float(expected.residual),
            "kv_cache_bytes_expected_sliding": float(expected.sliding),
            "kv_cache_quantized_tokens": float(expected.quantized_tokens),
            "kv_cache_residual_tokens": float(expected.residual_tokens),
            "kv_cache_bytes_per_token_exact": float(footprint.bytes_per_token_uncapped(dtype_bits)),
            "kv_cache_dtype_bits": float(dtype_bits)}


def run_kv_cache(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """The stack's cache and the full-precision one on the same prompts: bytes, speed, fidelity."""
    stack = config.stack                 # no speculation: the group's guard
    loaded = loading.load(config.entry(), stack.precision, config.device)
    footprint = check_model(config, loaded.model.config)
    prompts = trial_prompts(config, loaded)
    prepared = engines.backend(config.stack).prepare(config, loaded, prompts)
    measured = measure(config, loaded, prompts, generate_kwargs=prepared.kwargs)
    ref, source = reference(config, loaded, prompts, measured if stack.kv_bits == 16 else None)
    if stack.kv_bits == 16:
        logprobs, targets = ref.logprobs, ref.targets
    else:
        logprobs, targets = engines.backend(stack).teacher_forced(config, loaded, prompts, stack)
    metrics = {**compare_outputs(measured.outputs(), ref.outputs),
               **quality.teacher_forced_metrics(ref.logprobs, logprobs, targets),
               **byte_metrics(footprint, config, loaded, measured)}
    result = finish(config, runtime, loaded, measured, metrics=metrics,
                    tags={"reference_source": source, "kv_cache_method": _method(stack, loaded),
                          "user_code": prepared.code})
    measured_bytes, expected = result.metrics["kv_cache_bytes"], metrics["kv_cache_bytes_expected"]
    result.metrics["kv_cache_bytes_vs_expected"] = measured_bytes / expected if expected else 1.0
    if result.metrics.get("kv_cache_bytes_exact"):
        result.metrics["kv_cache_compression"] = result.metrics["kv_cache_bytes_exact"] / measured_bytes
    return result


def _method(stack: Stack, loaded: loading.LoadedModel) -> str:
    dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
    if stack.kv_bits == 16:
        return f"DynamicCache (full precision: {dtype}, the weights' dtype)"
    method = (f"QuantizedCache {stack.kv_backend} {stack.kv_bits}-bit, group {stack.kv_group_size}, "
              f"residual {stack.kv_residual_length} in {dtype}")
    return f"{method}; {HYBRID_NOTE}" if has_sliding_layers(loaded.model) else method
