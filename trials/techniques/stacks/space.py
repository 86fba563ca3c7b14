"""The stacks group's search space (its spec: ``trials.techniques.stacks.spec``).

Per target, the 2^4 design over weights (the fast precision on this device / NF4), the KV cache (full
/ the profile's 4-bit cache: quanto, the faster of the two 4-bit backends), speculation (off / the
target's draft at its best k, or prompt lookup where it has no draft) and compiled decoding (off /
static cache + torch.compile), each combination ONE trial at batch 1, base stack first (the others
reuse its numbers in a worker). Combinations that cannot run (a quantized cache with speculation or
compile; speculation with compile; compile of quantized weights, which transformers decodes
uncompiled: ``Stack.validate`` and the group's guard say why) are refused here, with the reason in the
log; ``trials.stats.factorial`` leaves their interactions out. Beside the design, the profile's
batch size, plain and with the smallest weights and cache.

The fifth factor is the engine: for every other engine installed here that runs on this device, the
same design's cells from its own 16-bit base (``engine_cells``: its 4-bit weights, its 4-bit cache,
prompt lookup; compiled decoding is the default engine's), so an optimization's effect is estimated
per engine against the default engine and the best-stack card chooses among all.
"""

from __future__ import annotations

import itertools
import logging

from trials import engines
from trials.config import Stack, TrialConfig, parse_cache
from trials.errors import ConfigError
from trials.models.registry import BUILT_IN, Catalogue
from trials.stats.runs import latest
from trials.techniques import planning
from trials.techniques.kv_cache.space import kv_group_size, plan_time_refusal
from trials.techniques.stacks.spec import NAME

log = logging.getLogger(__name__)


def best_draft_k(model: str, draft: str, runs, default: int) -> tuple[int, str]:
    """(k, why): the k this store's finished stacks runs of this target and draft already used (so a
    rerun plans the same configs and skips them), else the k with the highest measured tok/s among the
    store's speculative runs of this target and draft (latest run per k), else ``default`` (the
    profile's ``stacks.draft_k``). ``runs(group)``: the store's finished runs of a group as a frame
    (the driver's reader), or None."""
    columns = {"model", "draft_model", "num_draft_tokens"}
    stacks = runs(NAME) if runs is not None else None
    if stacks is not None and not stacks.empty and columns | {"start_time"} <= set(stacks):
        mine = stacks[(stacks["model"] == model) & (stacks["draft_model"] == draft)]
        if not mine.empty:
            k = int(mine.sort_values("start_time")["num_draft_tokens"].iloc[-1])
            return k, "the k this store's stacks runs already used (a new store takes the best measured k)"
    frame = runs("speculative") if runs is not None else None
    if frame is not None and not frame.empty and columns <= set(frame):
        mine = frame[(frame["model"] == model) & (frame["draft_model"] == draft)]
        if not mine.empty:
            mine = latest(mine, "num_draft_tokens")
            best = mine.loc[mine["tok_per_s"].idxmax()]
            return int(best["num_draft_tokens"]), (f"the best of k={sorted(int(k) for k in mine['num_draft_tokens'])} "
                                                   f"in the store's speculative runs")
    return default, "the profile's stacks.draft_k: no speculative runs of this target and draft in the store"


def plan(models: list[str], profile, device: str, catalogue: Catalogue = BUILT_IN,
         runs=None) -> list[TrialConfig]:
    """The factorial core of the stacks group (``trials.stats.factorial`` estimates the effects from it).
    Speculation uses the target's draft at its best k among the store's speculative runs (``runs``)
    where there are some (run ``--groups speculative,stacks`` to get them), else the profile's
    ``stacks.draft_k``."""
    from trials.measurement.hardware import fast_precision  # torch: only when the group is planned

    base = fast_precision(device)
    others = [e for e in engines.in_process().values() if e.name != engines.DEFAULT and device in e.devices]
    missing = [e for e in others if not e.installed()]
    configs = []
    for entry in planning.targets(models, catalogue):
        model = entry.name
        settings = profile.settings(NAME, entry, device)
        workload, repeats = planning.workload(settings), settings["repeats"]
        if entry.default_draft:
            k, why = best_draft_k(model, entry.default_draft, runs, settings["draft_k"])
            log.info("stacks: %s speculates with %s at k=%d (%s)", model, entry.default_draft, k, why)
            spec = dict(speculation="draft", draft_model=entry.default_draft, num_draft_tokens=k)
        else:
            spec = dict(speculation="prompt_lookup", num_draft_tokens=settings["draft_k"])
        bits, backend = parse_cache(settings["kv_cache"])
        kv4 = dict(kv_bits=bits, kv_backend=backend, kv_group_size=kv_group_size(entry))
        refused: dict[str, list[str]] = {}
        cells = list(itertools.product((False, True), repeat=4))
        if not settings["compile_interactions"]:   # compiled decoding joins the base stack only:
            cells = [c for c in cells if not c[3] or not any(c[:3])]   # its main effect, no interactions
        for weights, kv, speculation, compile_ in cells:
            try:
                stack = Stack(precision="nf4" if weights else base, compile=compile_,
                              **(kv4 if kv else {}),
                              **(spec if speculation else {}))
                if reason := plan_time_refusal(entry, stack):
                    raise ConfigError(reason)
                configs.append(planning.config(catalogue, NAME, entry, stack, device=device,
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
            configs.append(planning.config(catalogue, NAME, entry, extra, device=device,
                                           workload=workload, repeats=repeats))
        configs += [planning.config(catalogue, NAME, entry, stack, device=device, workload=workload,
                                    repeats=repeats)
                    for engine in others if engine not in missing
                    for stack in engine_cells(engine, entry, settings, device)]
    for engine in missing if configs else ():
        log.warning("stacks: the design's cells on %s not planned: its package %r is not installed "
                    "(make setup installs it)", engine.name, engine.package)
    return configs


def engine_cells(engine, entry, settings: dict, device: str) -> list[Stack]:
    """The engine factor's level for ``engine``: the same design from its own base, over the factors
    it takes: its 4-bit weights (the type a model ships in where that is 4-bit, what people deploy),
    its cache of the profile's ``kv_cache`` bits (where it packs them and the model can hold it) and
    prompt lookup (where it has it)."""
    from trials.models.registry import model_config

    base = engine.base(device)
    caches = [(16, "none")]
    bits = parse_cache(settings["kv_cache"])[0]          # the design's quantized cache, in bits
    backend = next((name for name, packs in engine.kv_caches.items() if bits in packs), None)
    if backend:
        probe = Stack(engine=engine.name, precision=base, kv_bits=bits, kv_backend=backend)
        refused = engine.model_refusal(entry.name, model_config(entry), probe)
        if refused is None:
            caches.append((bits, backend))
        else:
            log.info("stacks: %s: the %d-bit cache on %s left out: %s", entry.name, bits, engine.name, refused)
    lookups = [False] + ([True] if "prompt_lookup" in engine.proposers else [])
    lookup = dict(speculation="prompt_lookup", num_draft_tokens=settings["draft_k"])
    return [Stack(engine=engine.name, precision=weights, kv_bits=bits, kv_backend=backend,
                  **(lookup if speculation else {}))
            for weights in dict.fromkeys(w for w in (base, engine.four_bit_for(entry)) if w)
            for bits, backend in caches for speculation in lookups]
