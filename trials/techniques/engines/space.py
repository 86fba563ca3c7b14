"""The engines group's search space (its spec: ``trials.techniques.engines.spec``).

For each target, on the same workload, on every engine that runs on this device (each from its
own declaration, ``trials.engines.spec.Engine``): its 16-bit base, the type the model ships in where
the engine runs that file as it is, and the profile's ``weights`` it loads; on the base, the
profile's quantized ``caches`` it keeps (left out, with the reason, where the model cannot hold
them: ``Engine.model_refusal``) and prompt lookup with ``lookup_k`` tokens. So each effect (4-bit vs
16-bit weights, an 8- or 4-bit cache vs 16, prompt lookup vs none) is measured on every engine from
its own base. A sweep file's ``profile: {engines: {engines: [...]}}`` picks the engines.
"""

from __future__ import annotations

import logging

from trials import engines as engine_registry
from trials.config import Stack, TrialConfig, parse_cache
from trials.models.registry import BUILT_IN, Catalogue, model_config
from trials.techniques import planning
from trials.techniques.engines.spec import NAME

log = logging.getLogger(__name__)


def engine_stacks(engine, entry, settings: dict, device: str, profile: str = "default") -> list[Stack]:
    """One engine's stacks for one model: weights, then caches and prompt lookup on its base. The
    weights and caches beyond its base are its own (``Engine.levels``) unless the profile or the
    sweep file names them (``weights``, ``caches``: every engine's names in one list)."""
    from trials.techniques.kv_cache.space import kv_group_size

    base = engine.base(device)
    shipped = engine.shipped(entry)
    def chosen(knob: str) -> tuple[str, ...]:           # the profile's list (every engine's names), else its own
        given = settings.get(knob)
        return tuple(given) if given is not None else engine.levels_for(profile, knob)

    weights = [w for w in (shipped, base, *chosen("weights")) if w in engine.precisions]
    stacks = [Stack(engine=engine.name, precision=w) for w in dict.fromkeys(weights)]
    for parsed in (parse_cache(name) for name in chosen("caches")):
        if parsed is None or parsed[1] not in engine.kv_caches:
            continue
        bits, backend = parsed
        group = {"kv_group_size": kv_group_size(entry)} if engine.cache_group_size else {}
        stack = Stack(engine=engine.name, precision=base, kv_bits=bits, kv_backend=backend, **group)
        refused = engine.model_refusal(entry.name, model_config(entry), stack)
        if refused is None:
            stacks.append(stack)
        else:
            log.info("engines: the %d-bit cache left out on %s: %s", bits, engine.name, refused)
    if "prompt_lookup" in engine.proposers:
        stacks.append(Stack(engine=engine.name, precision=base, speculation="prompt_lookup",
                            num_draft_tokens=settings["lookup_k"]))
    return stacks


def plan(models: list[str], profile, device: str,
         catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    configs = []
    for entry in planning.targets(models, catalogue):
        settings = profile.settings(NAME, entry, device)
        chosen = [engine_registry.get(name) for name in settings.get("engines") or engine_registry.in_process()]
        here = [e for e in chosen if device in e.devices]
        if len(here) < 2 and len(chosen) >= 2:
            log.info("engines: %s left out on %s: only %s runs there", entry.name, device,
                     ", ".join(e.name for e in here) or "no engine")
            continue
        workload = planning.workload(settings, eval_windows=settings.get("eval_windows", 0))
        configs += [planning.config(catalogue, NAME, entry, stack, device=device, workload=workload,
                                    repeats=settings["repeats"])
                    for engine in here for stack in engine_stacks(engine, entry, settings, device, profile.base)]
    return configs
