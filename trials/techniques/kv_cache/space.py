"""The kv_cache group's search space (its spec: ``trials.techniques.kv_cache.spec``)."""

from __future__ import annotations

import logging

from trials.config import Stack, TrialConfig, parse_cache
from trials.errors import ConfigError
from trials.measurement.kv_footprint import KVFootprint, KVFootprintError, kv_footprint
from trials.models.registry import BUILT_IN, Catalogue, ModelEntry, max_positions, model_config
from trials.techniques import planning
from trials.techniques.kv_cache.spec import NAME

log = logging.getLogger(__name__)


def cache_refusal(model: str, footprint: KVFootprint, stack: Stack) -> str | None:
    """Why ``model`` (its KV footprint) cannot hold ``stack``'s quantized cache, or None: transformers'
    QuantizedCache takes full-attention layers only, and the backend packs whole groups of a row."""
    if stack.kv_bits == 16:
        return None
    kinds = sorted({g.kind for g in footprint.groups if g.kind not in ("full", "sliding")})
    if kinds:
        return (f"{model}: transformers' QuantizedCache takes full-attention layers (and sliding ones "
                f"kept in full precision beside them); this model has {', '.join(kinds)} layers")
    row = footprint.groups[0].elements_per_token // 2        # K (or V) elements per token and layer
    if row % stack.kv_group_size:
        return (f"{model}: kv_group_size {stack.kv_group_size} does not divide a token's K/V row of "
                f"{row} elements (kv_heads x head_dim); {stack.kv_backend} needs every cache length "
                f"to split into whole groups")
    return None


def check_model(config: TrialConfig, model_config) -> KVFootprint:
    """The model's footprint, or ``ConfigError`` when its KV cache cannot be measured against it."""
    try:
        footprint = kv_footprint(model_config, mla="expanded")
    except KVFootprintError as exc:
        raise ConfigError(f"{config.model}: the KV footprint calculator cannot model it: {exc}") from None
    if reason := cache_refusal(config.model, footprint, config.stack):
        raise ConfigError(reason)
    return footprint


def kv_group_size(entry: ModelEntry) -> int:
    """64 (transformers' default), or the largest power of two below it that divides a token's K/V
    row (kv_heads x head_dim) where the config is on disk: the quantized cache needs whole groups."""
    try:
        row = kv_footprint(model_config(entry), mla="expanded").groups[0].elements_per_token // 2
    except Exception:                # a hub model not on disk: the default, checked when it loads
        return 64
    return next((size for size in (64, 32, 16, 8) if row % size == 0), 64)


def plan_time_refusal(entry: ModelEntry, stack: Stack) -> str | None:
    """``cache_refusal`` at plan time, where the model's config is on disk (else the trial says it)."""
    config = model_config(entry) if stack.kv_bits != 16 else None
    if config is None:
        return None
    try:
        return cache_refusal(entry.name, kv_footprint(config, mla="expanded"), stack)
    except (KVFootprintError, KeyError, TypeError, ValueError):
        return None                               # the trial's own check says why, with the model loaded


def kv_caches(settings: dict) -> list[tuple[int, str]]:
    """(bits, backend) of the profile's caches, in its order (the full-precision cache first)."""
    return [parse_cache(name) for name in settings["caches"]]


def kv_weight_precision(device: str) -> str:
    """bf16 weights, so that the full-precision cache is the 16-bit one -- where bf16 is native.
    On a CPU that emulates bf16 (AVX2-only), every step would measure the emulation (~20x slower),
    so the group runs fp32 weights there and its full-precision reference cache is fp32: the
    compression ratios are then against 32-bit, and every run says so (``precision``,
    ``kv_cache_dtype_bits``, ``kv_cache_method``)."""
    from trials.measurement.hardware import fast_precision

    return fast_precision(device)


def plan(models: list[str], profile, device: str,
         catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target's cache at the profile's precisions over its contexts (those that fit the model's
    positions; the others are left out, said in the log), in ``kv_weight_precision`` weights."""
    precision = kv_weight_precision(device)
    configs = []
    for entry in planning.targets(models, catalogue):
        settings = profile.settings(NAME, entry, device)
        limit = max_positions(entry)
        refused: dict[str, set[str]] = {}
        group_size = kv_group_size(entry)
        for context in settings["contexts"]:
            if limit is not None and context + settings["max_new_tokens"] > limit:
                log.warning("kv_cache: %s: context %d + %d new tokens is past its %d positions: left out",
                            entry.name, context, settings["max_new_tokens"], limit)
                continue
            workload = planning.workload(settings, context_tokens=context)
            for bits, backend in kv_caches(settings):
                stack = Stack(precision=precision, kv_bits=bits, kv_backend=backend,
                              **({"kv_group_size": group_size} if bits != 16 else {}))
                if reason := plan_time_refusal(entry, stack):
                    refused.setdefault(reason, set()).add(stack.label)
                    continue
                configs.append(planning.config(catalogue, NAME, entry, stack, device=device,
                                               workload=workload, repeats=settings["repeats"]))
        for reason, labels in refused.items():
            log.warning("kv_cache: %s: refused at plan time: %s (%s)", entry.name, ", ".join(sorted(labels)), reason)
    return configs
