"""Which trials exist: one search space per chart group (each group's declaration in
``trials.groups`` names its function here).

A search space is a function ``(models, profile, device, catalogue) -> list[TrialConfig]``: the
catalogue (``trials.models.registry.Catalogue``) resolves the names, a sweep file's own models too, and each
config carries the declared entries it uses. Spaces are explicit
lists rather than Ray Tune samplers: every chart needs a specific grid, the plan can be printed
before anything runs (``--dry-run``), and each config's hash can be checked against the store so
that finished work is skipped. ``run_order`` is breadth-first: every chart group's smallest model
first, then the next model of every group, so that the dashboard has something in every section
early.

Profiles size the workload: ``quick`` fits a 2-core CPU in minutes, ``full`` is for GPU clusters.
They are files, ``sweeps/profiles/<name>.yaml`` (``sweeps.sizing`` says what they hold), read by
the sweep-file loader (``sweeps.sweepfile``). A space reads its settings with
``profile.settings(group, model, device)``. ``PROFILES`` is re-exported here for the spaces' callers.
"""

from __future__ import annotations

import itertools
import logging

from sweeps.sizing import Profile, parse_cache
from sweeps.sweepfile import PROFILES  # noqa: F401  (re-exported: the spaces' callers take it from here)
from trials.models import pypi
from trials.models import zoo
from trials.config import Stack, TrialConfig, Workload
from trials.errors import ConfigError
from trials.measurement.kv_footprint import kv_footprint
from trials.models.registry import BUILT_IN, Catalogue, ModelEntry, max_positions, zoo_targets


log = logging.getLogger(__name__)


def _planned_precisions(precisions: list[str], device: str) -> list[str]:
    """The profile's precisions, fp16 left out on a CPU (emulated there, and no user's CPU target)."""
    return [p for p in precisions if device == "cuda" or p != "fp16"]


def default_models(device: str) -> list[str]:
    """The zoo's targets and the real models from PyPI (``trials.models.pypi``): both exist offline,
    on any machine."""
    return [*zoo_targets("full"), *pypi.MODELS]


def _workload(settings: dict, **extra) -> Workload:
    return Workload(settings["prompt_set"], settings["prompts_per_type"], settings["max_new_tokens"], **extra)


def _targets(models: list[str], catalogue: Catalogue) -> list[ModelEntry]:
    return [entry for entry in map(catalogue.get, models) if entry.role == "target"]


def _config(catalogue: Catalogue, group: str, entry: ModelEntry, stack: Stack, **fields) -> TrialConfig:
    """A trial of ``entry`` under ``stack``, carrying the declared entries it names."""
    return TrialConfig(group=group, model=entry.name, stack=stack,
                       declared=catalogue.declared_for(entry.name, stack.draft_model), **fields)


def baseline(models: list[str], profile: Profile, device: str,
             catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target at the profile's precisions, batch 1: the reference every other group compares to."""
    configs = []
    for entry in _targets(models, catalogue):
        settings = profile.settings("baseline", entry, device)
        configs += [_config(catalogue, "baseline", entry, Stack(precision=precision), device=device,
                            workload=_workload(settings), repeats=settings["repeats"])
                    for precision in _planned_precisions(settings["precisions"], device)]
    return configs


def quantization(models: list[str], profile: Profile, device: str,
                 catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target at every weight precision of the profile, reference precision first.

    GPTQ is planned wherever the profile lists it: without its optional extra those trials fail at
    once with the install line, and the sweep goes on. Each trial also scores perplexity and (once per
    worker and model) runs the reference precision.
    """
    configs = []
    for entry in _targets(models, catalogue):
        settings = profile.settings("quantization", entry, device)
        workload = _workload(settings, eval_windows=settings.get("eval_windows", 0))
        configs += [_config(catalogue, "quantization", entry, Stack(precision=precision), device=device,
                            workload=workload, repeats=settings["repeats"])
                    for precision in _planned_precisions(settings["precisions"], device)]
    return configs


def batching(models: list[str], profile: Profile, device: str,
             catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target's batch ladder, smallest first (an OOM on CUDA ends the ladder), at fp32 so that
    batched greedy outputs can be required to equal batch 1's; only the batch size changes."""
    configs = []
    for entry in _targets(models, catalogue):
        settings = profile.settings("batching", entry, device)
        configs += [_config(catalogue, "batching", entry, Stack(precision="fp32", batch_size=size),
                            device=device, workload=_workload(settings), repeats=settings["repeats"])
                    for size in sorted(settings["batch_sizes"])]
    return configs


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


def kv_cache(models: list[str], profile: Profile, device: str,
             catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target's cache at the profile's precisions over its contexts (those that fit the model's
    positions; the others are left out, said in the log), in ``kv_weight_precision`` weights."""
    precision = kv_weight_precision(device)
    configs = []
    for entry in _targets(models, catalogue):
        settings = profile.settings("kv_cache", entry, device)
        limit = max_positions(entry)
        for context in settings["contexts"]:
            if limit is not None and context + settings["max_new_tokens"] > limit:
                log.warning("kv_cache: %s: context %d + %d new tokens is past its %d positions: left out",
                            entry.name, context, settings["max_new_tokens"], limit)
                continue
            workload = _workload(settings, context_tokens=context)
            configs += [_config(catalogue, "kv_cache", entry,
                                Stack(precision=precision, kv_bits=bits, kv_backend=backend),
                                device=device, workload=workload, repeats=settings["repeats"])
                        for bits, backend in kv_caches(settings)]
    return configs


def speculative(models: list[str], profile: Profile, device: str,
                catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target with its registry draft at every k, then prompt lookup; batch 1, greedy.

    Each trial also measures (once per worker and model) the no-speculation baseline of the same
    prompts, so there is no separate baseline trial. A target without a draft gets prompt lookup
    only (said in the log); drafts given in ``--models`` are skipped (they are proposers, not targets).
    """
    precision = "fp32" if device == "cpu" else "bf16"
    configs = []
    for entry in _targets(models, catalogue):
        settings = profile.settings("speculative", entry, device)
        if entry.default_draft is None:
            log.info("speculative: %s has no draft model in the registry: prompt lookup only", entry.name)
        stacks = [Stack(precision=precision, speculation="draft", draft_model=entry.default_draft,
                        num_draft_tokens=k) for k in settings["draft_k"] if entry.default_draft]
        stacks += [Stack(precision=precision, speculation="prompt_lookup", num_draft_tokens=k)
                   for k in settings["lookup_k"]]
        configs += [_config(catalogue, "speculative", entry, stack, device=device,
                            workload=_workload(settings), repeats=settings["repeats"]) for stack in stacks]
    return configs


# The stacks group: per target, the 2^4 design over weights (the fast precision on this device /
# NF4), the KV cache (full / the profile's 4-bit cache: quanto, the faster of the two 4-bit
# backends), speculation (off / the target's draft at its best k, or prompt lookup where it has no
# draft) and compiled decoding (off / static cache + torch.compile), each combination ONE trial at
# batch 1, base stack first (the others reuse its numbers in a worker). Combinations that cannot run
# (a quantized cache with speculation or compile; speculation with compile; compile of quantized
# weights, which transformers decodes uncompiled: Stack.validate and the
# group's guard say why) are refused here, with the reason in the log; trials.stats.factorial leaves their
# interactions out. Beside the design, the profile's batch size, plain and with the smallest weights
# and cache.


def _kv_group_size(model: ModelEntry) -> int:
    """64 (transformers' default), or the largest power of two below it that divides a token's K/V
    row (kv_heads x head_dim) where the config is on disk: the quantized cache needs whole groups."""
    try:
        row = kv_footprint(model.path()).groups[0].elements_per_token // 2
    except Exception:                # a hub model not on disk: the default, checked when it loads
        return 64
    return next((size for size in (64, 32, 16, 8) if row % size == 0), 64)


def best_draft_k(model: str, draft: str, uri: str | None, default: int) -> tuple[int, str]:
    """(k, why): the k with the highest measured tok/s among the store's speculative runs of this
    target and draft (latest run per k), else ``default`` (the profile's ``stacks.draft_k``)."""
    frame = None
    if uri is not None:
        import tracking

        frame = tracking.runs_frame(uri, "speculative")
    if frame is not None and not frame.empty and {"model", "draft_model", "num_draft_tokens"} <= set(frame):
        mine = frame[(frame["model"] == model) & (frame["draft_model"] == draft)]
        if not mine.empty:
            mine = mine.sort_values("start_time").drop_duplicates("num_draft_tokens", keep="last")
            best = mine.loc[mine["tok_per_s"].idxmax()]
            return int(best["num_draft_tokens"]), (f"the best of k={sorted(int(k) for k in mine['num_draft_tokens'])} "
                                                   f"in the store's speculative runs")
    return default, "the profile's stacks.draft_k: no speculative runs of this target and draft in the store"


def stacks(models: list[str], profile: Profile, device: str, uri: str | None = None,
           catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """The factorial core of the stacks group (``trials.stats.factorial`` estimates the effects from it).
    Speculation uses the target's draft at its best k from the speculative group in ``uri`` where
    there is one (run ``--groups speculative,stacks`` to get it), else the profile's
    ``stacks.draft_k``."""
    from trials.measurement.hardware import fast_precision      # torch: only when the group is planned

    base = fast_precision(device)
    configs = []
    for entry in _targets(models, catalogue):
        model = entry.name
        settings = profile.settings("stacks", entry, device)
        workload, repeats = _workload(settings), settings["repeats"]
        if entry.default_draft:
            k, why = best_draft_k(model, entry.default_draft, uri, settings["draft_k"])
            log.info("stacks: %s speculates with %s at k=%d (%s)", model, entry.default_draft, k, why)
            spec = dict(speculation="draft", draft_model=entry.default_draft, num_draft_tokens=k)
        else:
            spec = dict(speculation="prompt_lookup", num_draft_tokens=settings["draft_k"])
        bits, backend = parse_cache(settings["kv_cache"])
        kv4 = dict(kv_bits=bits, kv_backend=backend, kv_group_size=_kv_group_size(entry))
        refused: dict[str, list[str]] = {}
        cells = list(itertools.product((False, True), repeat=4))
        if not settings["compile_interactions"]:   # compiled decoding joins the base stack only:
            cells = [c for c in cells if not c[3] or not any(c[:3])]   # its main effect, no interactions
        for weights, kv, speculation, compile_ in cells:
            try:
                stack = Stack(precision="nf4" if weights else base, compile=compile_,
                              **(kv4 if kv else {}),
                              **(spec if speculation else {}))
                configs.append(_config(catalogue, "stacks", entry, stack, device=device,
                                       workload=workload, repeats=repeats))
            except ConfigError as exc:          # a combination that cannot run: say which and why
                parts = ["nf4"] * weights + ["kv4"] * kv + ["spec"] * speculation + ["compile"] * compile_
                refused.setdefault(str(exc), []).append("+".join(parts))
        for reason, names in refused.items():
            log.warning("stacks: %s: refused at plan time: %s (%s)", model, ", ".join(names), reason)
        # beside the design, the batch: aggregate tok/s of batch_size rows per step, plain and with
        # the smallest weights and cache (speculation and compile stay at batch 1 here)
        for extra in (Stack(precision=base, batch_size=settings["batch_size"]),
                      Stack(precision="nf4", batch_size=settings["batch_size"], **kv4)):
            configs.append(_config(catalogue, "stacks", entry, extra, device=device,
                                   workload=workload, repeats=repeats))
    return configs


def _parameters(entry: ModelEntry) -> int:
    """Parameter count from the zoo's or the converted real model's card; 0 where unknown without
    loading (hub models, local folders)."""
    try:
        if entry.source == "zoo":
            return int(zoo.load_card(entry.location)["parameters"])
        if entry.source == "pypi":
            return int(pypi.load_card(entry.location)["parameters"])
    except (FileNotFoundError, KeyError, ConfigError):
        pass
    return 0


def run_order(configs: list[TrialConfig]) -> list[TrialConfig]:
    """Breadth-first: round r runs every group's r-th smallest model, group after group, so that each
    chart group has data for one model early and the dashboard is worth opening while the sweep runs.
    A (group, model) block keeps its space's order (reference stacks first) and a round's trials share
    one model, so a worker's cached model serves consecutive trials."""
    sizes = {c.model: _parameters(c.entry()) for c in configs}
    group_order = {g: i for i, g in enumerate(dict.fromkeys(c.group for c in configs))}
    ranks: dict[tuple[str, str], int] = {}
    for group in group_order:
        mine = sorted({c.model for c in configs if c.group == group}, key=lambda m: (sizes[m], m))
        ranks.update({(group, model): rank for rank, model in enumerate(mine)})
    return sorted(configs, key=lambda c: (ranks[(c.group, c.model)], group_order[c.group]))
