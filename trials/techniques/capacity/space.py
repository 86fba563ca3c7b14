"""The capacity group's space: per real model (where the profile says so), on llama-server, the
knobs of one served configuration and their choices (``knobs``): the profile's ``weights`` (the
model's shipped type first, where it ships one), its ``caches`` that the engine keeps and the model
can hold (``full``: the 16-bit cache), ``parallel`` slots, ``step_tokens`` (``-b``; 0: the server's
default) and ``threads`` (those this machine has). ``plan`` is their full grid (``--search grid``);
the capacity search (``sweeps.capacity_search``) proposes points of the same space one at a time and
makes each a trial with ``make_config``.
"""

from __future__ import annotations

import itertools
import logging
import os

from trials import engines as engine_registry
from trials.config import Load, Stack, TrialConfig, parse_cache
from trials.models.registry import BUILT_IN, Catalogue, model_config
from trials.techniques import planning
from trials.techniques.capacity.spec import KNOBS as SERVER_KNOBS, NAME

log = logging.getLogger(__name__)
KNOBS = ("precision", "kv_bits", "slots", "step_tokens", "threads")


def load_of(settings: dict) -> Load:
    return Load(requests=settings["requests_per_point"], warmup=settings["warmup_requests"],
                ttft_slo_s=settings["ttft_slo_ms"] / 1000, tpot_slo_s=settings["tpot_slo_ms"] / 1000,
                attainment=float(settings.get("attainment", 0.9)))


def knobs(engine, entry, settings: dict, device: str) -> dict[str, list]:
    """Each knob's choices for ``entry`` on ``engine``, in the profile's order (the first choice of each
    is the search's first proposal and the grid's first trial)."""
    shipped = engine.shipped(entry) or engine.base(device)
    weights = [w for w in dict.fromkeys([shipped, *settings.get("weights", [])]) if w in engine.precisions]
    caches = []
    for name in settings.get("caches") or ["full"]:
        parsed = parse_cache(name)
        if parsed is None or (parsed[0] != 16 and (parsed[1] not in engine.kv_caches
                                                   or parsed[0] not in engine.kv_caches[parsed[1]])):
            continue
        stack = Stack(engine=engine.name, precision=shipped, kv_bits=parsed[0], kv_backend=parsed[1])
        refused = engine.model_refusal(entry.name, model_config(entry), stack)
        if refused:
            log.info("capacity: the %s cache left out for %s: %s", name, entry.name, refused)
            continue
        caches.append(parsed[0])
    cores = os.cpu_count() or 1
    threads = [t for t in dict.fromkeys(settings.get("threads") or [0]) if t <= cores] or [0]
    # in the order the search opens with them (``CapacitySearcher.openers``): the weights, which decide
    # whether a single stream can meet the TTFT limit at all, then -b, the prefill stall this group is about
    return {"precision": weights, "step_tokens": list(dict.fromkeys(settings["step_tokens"])),
            "kv_bits": list(dict.fromkeys(caches)) or [16], "slots": list(dict.fromkeys(settings["parallel"])),
            "threads": threads}


def make_config(entry, engine_name: str, point: dict, settings: dict, device: str,
                catalogue: Catalogue = BUILT_IN) -> TrialConfig:
    """The trial that measures one point of the space (a dict of ``KNOBS``)."""
    backend = "none" if point["kv_bits"] == 16 else "ggml"
    stack = Stack(engine=engine_name, precision=point["precision"], kv_bits=point["kv_bits"], kv_backend=backend,
                  batch_size=point["slots"], step_tokens=point["step_tokens"], threads=point["threads"])
    return planning.config(catalogue, NAME, entry, stack, device=device, workload=planning.workload(settings),
                           repeats=1, load=load_of(settings))


def point_of(config: TrialConfig) -> dict:
    stack = config.stack
    return {"precision": stack.precision, "kv_bits": stack.kv_bits, "slots": stack.batch_size,
            "step_tokens": stack.step_tokens, "threads": stack.threads}


def searched(models: list[str], profile, device: str, catalogue: Catalogue = BUILT_IN):
    """(entry, engine, settings, knobs) per model whose configurations are searched on this device."""
    out = []
    for entry in planning.targets(models, catalogue):
        settings = profile.settings(NAME, entry, device)
        if settings.get("real_models_only") and entry.source == "zoo":
            continue
        chosen = [engine_registry.get(n) for n in settings.get("servers") or engine_registry.servers()]
        here = [e for e in chosen if e.serves and device in e.devices and e.installed()
                and all(k in e.server_knobs for k in SERVER_KNOBS)]
        if not here:
            log.info("capacity: %s left out on %s: no installed server engine takes %s", entry.name, device,
                     " and ".join(SERVER_KNOBS))
            continue
        out += [(entry, engine, settings, knobs(engine, entry, settings, device)) for engine in here]
    return out


def plan(models: list[str], profile, device: str, catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """The full grid of every searched model's knobs, defaults first."""
    configs = []
    for entry, engine, settings, choices in searched(models, profile, device, catalogue):
        for values in itertools.product(*(choices[k] for k in KNOBS)):
            configs.append(make_config(entry, engine.name, dict(zip(KNOBS, values)), settings, device, catalogue))
    return configs
