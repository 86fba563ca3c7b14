"""The kv_cache group's search space (its spec: ``trials.techniques.kv_cache.spec``)."""

from __future__ import annotations

import logging

from trials.config import Stack, TrialConfig, parse_cache
from trials.models.registry import BUILT_IN, Catalogue, max_positions
from trials.techniques import planning
from trials.techniques.kv_cache.spec import NAME

log = logging.getLogger(__name__)


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
        for context in settings["contexts"]:
            if limit is not None and context + settings["max_new_tokens"] > limit:
                log.warning("kv_cache: %s: context %d + %d new tokens is past its %d positions: left out",
                            entry.name, context, settings["max_new_tokens"], limit)
                continue
            workload = planning.workload(settings, context_tokens=context)
            configs += [planning.config(catalogue, NAME, entry,
                                        Stack(precision=precision, kv_bits=bits, kv_backend=backend),
                                        device=device, workload=workload, repeats=settings["repeats"])
                        for bits, backend in kv_caches(settings)]
    return configs
