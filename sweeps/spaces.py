"""Which trials exist: one search space per chart group (each group's declaration in
``trials.groups`` names its function here).

A search space is a function ``(models, profile, device) -> list[TrialConfig]``. Spaces are explicit
lists rather than Ray Tune samplers: every chart needs a specific grid, the plan can be printed
before anything runs (``--dry-run``), and each config's hash can be checked against the store so
that finished work is skipped. ``run_order`` is breadth-first: every chart group's smallest model
first, then the next model of every group, so that the dashboard has something in every section
early.

Profiles size the workload: ``quick`` fits a 2-core CPU in minutes, ``full`` is for GPU clusters.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from trials import pypi_models, zoo
from trials.config import Stack, TrialConfig, Workload
from trials.errors import ConfigError
from trials.kv_footprint import kv_footprint
from trials.registry import get_model, zoo_targets


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Profile:
    name: str
    prompts_per_type: int
    max_new_tokens: int
    repeats: int

    def workload(self, prompt_set: str = "mixed") -> Workload:
        return Workload(prompt_set, self.prompts_per_type, self.max_new_tokens)


PROFILES = {
    "quick": Profile("quick", prompts_per_type=4, max_new_tokens=128, repeats=3),
    "full": Profile("full", prompts_per_type=8, max_new_tokens=128, repeats=5),
}

# Real pretrained models (PyPI's SmolLM2-135M and Gemma-3-270M, local folders, hub ids) cost 10-20x a
# zoo model per token on a CPU, so the quick profile gives them smaller workloads, group by group
# (every chart keeps them; each run's workload says what it measured): one prompt per type, fewer
# new tokens, two KV-cache contexts (256 and 1,024: past Gemma-3's 512-token window), a shorter
# batch ladder. On CUDA and in the full profile they get the profile as written.
REAL_QUICK = Profile("quick", prompts_per_type=1, max_new_tokens=32, repeats=3)
REAL_QUICK_EVAL_WINDOWS = 8            # perplexity windows of 256 tokens (quantization group)
REAL_QUICK_SPECULATIVE_TOKENS = 64     # speculation needs some length to pay back its first round


def is_real(model: str) -> bool:
    """A real pretrained model (not the project's own zoo)."""
    return get_model(model).source != "zoo"


def _sized(model: str, profile: Profile, device: str) -> Profile:
    """The profile a model gets: ``REAL_QUICK`` for real models in the quick profile on CPU."""
    return REAL_QUICK if profile.name == "quick" and device == "cpu" and is_real(model) else profile


def default_models(device: str) -> list[str]:
    """The zoo's targets and the real models from PyPI (``trials.pypi_models``): both exist offline,
    on any machine."""
    return [*zoo_targets("full"), *pypi_models.MODELS]


def baseline(models: list[str], profile: Profile, device: str) -> list[TrialConfig]:
    """Each target at full and half precision, batch 1: the reference every other group compares to."""
    precisions = ["bf16", "fp32"] if device == "cpu" else ["bf16", "fp16", "fp32"]
    return [TrialConfig(group="baseline", model=model, device=device,
                        stack=Stack(precision=precision), workload=_sized(model, profile, device).workload(),
                        repeats=_sized(model, profile, device).repeats)
            for model in models if get_model(model).role == "target"
            for precision in precisions]


def quantization(models: list[str], profile: Profile, device: str) -> list[TrialConfig]:
    """Each target at every weight precision, reference precision first (fp16 on CUDA only).

    GPTQ is always planned: without its optional extra those trials fail at once with the install
    line, and the sweep goes on. Each trial also scores perplexity and (once per worker and model)
    runs the reference precision, so the quick profile halves prompts and new tokens to keep the
    group at a few minutes on two CPU cores.
    """
    precisions = ["fp32", "bf16", "int8", "nf4", "gptq"] if device == "cpu" \
        else ["fp32", "bf16", "fp16", "int8", "nf4", "gptq"]
    def workload(model: str) -> Workload:
        sized = _sized(model, profile, device)
        if sized is REAL_QUICK:
            return replace(sized.workload(), eval_windows=REAL_QUICK_EVAL_WINDOWS)
        if profile.name == "quick":
            return Workload("mixed", max(1, profile.prompts_per_type // 2), profile.max_new_tokens // 2)
        return profile.workload()

    return [TrialConfig(group="quantization", model=model, device=device,
                        stack=Stack(precision=precision), workload=workload(model),
                        repeats=_sized(model, profile, device).repeats)
            for model in models if get_model(model).role == "target"
            for precision in precisions]


# The quick ladder stops where one CPU thread stops gaining (`python benchmarks/report.py` prints
# where each model's tok/s stops rising, from a store's batching runs; README, "Why the sizes").
BATCH_LADDERS = {"quick": (1, 2, 4, 8, 16, 32), "full": (1, 2, 4, 8, 16, 32, 64, 128)}
REAL_QUICK_LADDER = (1, 2, 4, 8, 16)


def batching(models: list[str], profile: Profile, device: str) -> list[TrialConfig]:
    """Each target's batch ladder, smallest first (an OOM on CUDA ends the ladder), at fp32 so that
    batched greedy outputs can be required to equal batch 1's; only the batch size changes."""
    return [TrialConfig(group="batching", model=model, device=device,
                        stack=Stack(precision="fp32", batch_size=size),
                        workload=_sized(model, profile, device).workload(),
                        repeats=_sized(model, profile, device).repeats)
            for model in models if get_model(model).role == "target"
            for size in (REAL_QUICK_LADDER if _sized(model, profile, device) is REAL_QUICK
                         else BATCH_LADDERS[profile.name])]


# KV-cache precisions: the full-precision cache first (the reference the others are compared to,
# reused by a worker's next trials), then HQQ 8/4/2 and quanto 4/2 (quanto cannot pack 8 bits).
KV_STACKS = ((16, "none"), (8, "hqq"), (4, "hqq"), (2, "hqq"), (4, "quanto"), (2, "quanto"))
# Per profile: contexts (prompt tokens) and the workload at each. The quick profile fits the zoo
# (4096 positions) and a 2-core CPU: two prose prompts (the type whose next word is least certain,
# so the most sensitive to cache error), 32 new tokens, 2 repeats. HQQ trials cost about twice the
# others (its quantizer optimizes every group at prefill); `python benchmarks/report.py` prints the
# seconds per backend and context from a store (README, "Why the sizes").
KV_SIZING = {
    "quick": dict(contexts=(256, 1024, 2048), prompt_set="prose", prompts_per_type=2,
                  max_new_tokens=32, repeats=2),
    "full": dict(contexts=(512, 1024, 2048, 3072, 8192, 16384, 32768), prompt_set="mixed", prompts_per_type=2,
                 max_new_tokens=128, repeats=3),
    "real-quick": dict(contexts=(256, 1024), prompt_set="prose", prompts_per_type=1,
                       max_new_tokens=16, repeats=2),
}


def _max_positions(model: str) -> int | None:
    """The model's ``max_position_embeddings`` where its config is on disk (zoo, local folder)."""
    entry = get_model(model)
    if entry.source == "hub":
        return None
    path = Path(entry.path()) / "config.json"
    return json.loads(path.read_text()).get("max_position_embeddings") if path.is_file() else None


def kv_weight_precision(device: str) -> str:
    """bf16 weights, so that the full-precision cache is the 16-bit one -- where bf16 is native.
    On a CPU that emulates bf16 (AVX2-only), every step would measure the emulation (~20x slower),
    so the group runs fp32 weights there and its full-precision reference cache is fp32: the
    compression ratios are then against 32-bit, and every run says so (``precision``,
    ``kv_cache_dtype_bits``, ``kv_cache_method``)."""
    from trials.hardware import fast_precision

    return fast_precision(device)


def kv_cache(models: list[str], profile: Profile, device: str) -> list[TrialConfig]:
    """Each target's cache at 16/8/4/2 bits over a range of contexts (those that fit the model's
    positions), in ``kv_weight_precision`` weights."""
    precision = kv_weight_precision(device)
    configs = []
    for model in models:
        if get_model(model).role != "target":
            continue
        sizing = KV_SIZING["real-quick" if _sized(model, profile, device) is REAL_QUICK else profile.name]
        limit = _max_positions(model)
        for context in sizing["contexts"]:
            if limit is not None and context + sizing["max_new_tokens"] > limit:
                continue
            workload = Workload(sizing["prompt_set"], sizing["prompts_per_type"],
                                sizing["max_new_tokens"], context_tokens=context)
            configs += [TrialConfig(group="kv_cache", model=model, device=device,
                                    stack=Stack(precision=precision, kv_bits=bits, kv_backend=backend),
                                    workload=workload, repeats=sizing["repeats"])
                        for bits, backend in KV_STACKS]
    return configs


# Speculative decoding, per profile: draft k values, prompt-lookup k values, and the workload. Every
# prompt type is in (acceptance differs by type: drafts on code, lookup on copy-heavy text); the
# quick profile halves the prompts and repeats to keep the group at minutes on two CPU cores.
SPECULATIVE_SIZING = {
    "quick": dict(draft_k=(1, 2, 4, 6), lookup_k=(4,), prompts_per_type=2, repeats=2),
    "full": dict(draft_k=(1, 2, 3, 4, 6, 8), lookup_k=(2, 4, 8), prompts_per_type=8, repeats=5),
    "real-quick": dict(draft_k=(2, 4), lookup_k=(4,), prompts_per_type=1, repeats=2),
}


def speculative(models: list[str], profile: Profile, device: str) -> list[TrialConfig]:
    """Each target with its registry draft at every k, then prompt lookup; batch 1, greedy.

    Each trial also measures (once per worker and model) the no-speculation baseline of the same
    prompts, so there is no separate baseline trial. A target without a draft gets prompt lookup
    only (said in the log); drafts given in ``--models`` are skipped (they are proposers, not targets).
    """
    precision = "fp32" if device == "cpu" else "bf16"
    configs = []
    for model in models:
        entry = get_model(model)
        if entry.role != "target":
            continue
        real = _sized(model, profile, device) is REAL_QUICK
        sizing = SPECULATIVE_SIZING["real-quick" if real else profile.name]
        workload = Workload("mixed", sizing["prompts_per_type"],
                            REAL_QUICK_SPECULATIVE_TOKENS if real else profile.max_new_tokens)
        if entry.default_draft is None:
            log.info("speculative: %s has no draft model in the registry: prompt lookup only", model)
        stacks = [Stack(precision=precision, speculation="draft", draft_model=entry.default_draft,
                        num_draft_tokens=k) for k in sizing["draft_k"] if entry.default_draft]
        stacks += [Stack(precision=precision, speculation="prompt_lookup", num_draft_tokens=k)
                   for k in sizing["lookup_k"]]
        configs += [TrialConfig(group="speculative", model=model, device=device, stack=stack,
                                workload=workload, repeats=sizing["repeats"]) for stack in stacks]
    return configs


# The stacks group: per target, the 2^4 design over weights (the fast precision on this device /
# NF4), the KV cache (full / 4-bit quanto, the faster of the two 4-bit backends), speculation (off /
# the target's draft at its best k, or prompt lookup where it has no draft) and compiled decoding
# (off / static cache + torch.compile), each combination ONE trial at batch 1, base stack first (the
# others reuse its numbers in a worker). Combinations that cannot run (a quantized cache with
# speculation or compile; speculation with compile: Stack.validate and the group's guard say why)
# are refused here, with the reason in the log; trials.factorial leaves their interactions out.
STACKS_KV = (4, "quanto")
STACKS_DRAFT_K = 3
STACKS_BATCH = 4


def _kv_group_size(model: str) -> int:
    """64 (transformers' default), or the largest power of two below it that divides a token's K/V
    row (kv_heads x head_dim) where the config is on disk: the quantized cache needs whole groups."""
    try:
        row = kv_footprint(model).groups[0].elements_per_token // 2
    except Exception:                # a hub model not on disk: the default, checked when it loads
        return 64
    return next((size for size in (64, 32, 16, 8) if row % size == 0), 64)


def best_draft_k(model: str, draft: str, uri: str | None) -> tuple[int, str]:
    """(k, why): the k with the highest measured tok/s among the store's speculative runs of this
    target and draft (latest run per k), else ``STACKS_DRAFT_K``."""
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
    return STACKS_DRAFT_K, "the default: no speculative runs of this target and draft in the store"


def stacks(models: list[str], profile: Profile, device: str, uri: str | None = None) -> list[TrialConfig]:
    """The factorial core of the stacks group (``trials.factorial`` estimates the effects from it).
    Speculation uses the target's draft at its best k from the speculative group in ``uri`` where
    there is one (run ``--groups speculative,stacks`` to get it), else ``STACKS_DRAFT_K``."""
    from trials.hardware import fast_precision      # torch: only when the group is planned

    base = fast_precision(device)
    configs = []
    for model in models:
        entry = get_model(model)
        if entry.role != "target":
            continue
        workload = profile.workload()
        if _sized(model, profile, device) is REAL_QUICK:
            workload = REAL_QUICK.workload()
        elif profile.name == "quick":
            workload = Workload("mixed", max(1, profile.prompts_per_type // 2), profile.max_new_tokens // 2)
        if entry.default_draft:
            k, why = best_draft_k(model, entry.default_draft, uri)
            log.info("stacks: %s speculates with %s at k=%d (%s)", model, entry.default_draft, k, why)
            spec = dict(speculation="draft", draft_model=entry.default_draft, num_draft_tokens=k)
        else:
            spec = dict(speculation="prompt_lookup", num_draft_tokens=STACKS_DRAFT_K)
        kv4 = dict(kv_bits=STACKS_KV[0], kv_backend=STACKS_KV[1], kv_group_size=_kv_group_size(model))
        refused: dict[str, list[str]] = {}
        # Real models on a CPU's quick profile: compiled decoding (~40 s of compiling per trial) joins
        # the base stack only, so its main effect is measured but not its interactions.
        cells = list(itertools.product((False, True), repeat=4))
        if _sized(model, profile, device) is REAL_QUICK:
            cells = [c for c in cells if not c[3] or not any(c[:3])]
        for weights, kv, speculation, compile_ in cells:
            try:
                stack = Stack(precision="nf4" if weights else base, compile=compile_,
                              **(kv4 if kv else {}),
                              **(spec if speculation else {}))
                configs.append(TrialConfig(group="stacks", model=model, device=device, stack=stack,
                                           workload=workload, repeats=max(2, profile.repeats)))
            except ConfigError as exc:          # a combination that cannot run: say which and why
                parts = ["nf4"] * weights + ["kv4"] * kv + ["spec"] * speculation + ["compile"] * compile_
                refused.setdefault(str(exc), []).append("+".join(parts))
        for reason, names in refused.items():
            log.warning("stacks: %s: refused at plan time: %s (%s)", model, ", ".join(names), reason)
        # beside the design, the batch: aggregate tok/s of STACKS_BATCH rows per step, plain and with
        # the smallest weights and cache (speculation and compile stay at batch 1 here)
        for extra in (Stack(precision=base, batch_size=STACKS_BATCH),
                      Stack(precision="nf4", batch_size=STACKS_BATCH, **kv4)):
            configs.append(TrialConfig(group="stacks", model=model, device=device, stack=extra,
                                       workload=workload, repeats=max(2, profile.repeats)))
    return configs


def _parameters(model: str) -> int:
    """Parameter count from the zoo's or the converted real model's card; 0 where unknown without
    loading (hub models, local folders)."""
    entry = get_model(model)
    try:
        if entry.source == "zoo":
            return int(zoo.load_card(entry.location)["parameters"])
        if entry.source == "pypi":
            return int(pypi_models.load_card(entry.location)["parameters"])
    except (FileNotFoundError, KeyError, ConfigError):
        pass
    return 0


def run_order(configs: list[TrialConfig]) -> list[TrialConfig]:
    """Breadth-first: round r runs every group's r-th smallest model, group after group, so that each
    chart group has data for one model early and the dashboard is worth opening while the sweep runs.
    A (group, model) block keeps its space's order (reference stacks first) and a round's trials share
    one model, so a worker's cached model serves consecutive trials."""
    sizes = {model: _parameters(model) for model in {c.model for c in configs}}
    group_order = {g: i for i, g in enumerate(dict.fromkeys(c.group for c in configs))}
    ranks: dict[tuple[str, str], int] = {}
    for group in group_order:
        mine = sorted({c.model for c in configs if c.group == group}, key=lambda m: (sizes[m], m))
        ranks.update({(group, model): rank for rank, model in enumerate(mine)})
    return sorted(configs, key=lambda c: (ranks[(c.group, c.model)], group_order[c.group]))
