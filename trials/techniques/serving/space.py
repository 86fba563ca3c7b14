"""The serving group's search space (its spec: ``trials.techniques.serving.spec``).

For each target (real models only where the profile says so), on every server engine that runs on
this device: the weights a model ships in (else the engine's 16-bit base) at each ``parallel`` slot
count, and at the most slots each of the profile's other ``weights``, its quantized ``caches`` on the
16-bit base (where the in-process engines group scores the same cache: the decision's quality budget
reads those scores; left out, with the reason, where the model cannot hold them), prompt lookup
with ``lookup_k`` tokens, and the 16-bit base drafted by each of the model's own lower-bit GGUFs in
``drafts`` with ``draft_k`` tokens (the same vocabulary by construction; greedy speculation keeps the
16-bit base's tokens, so its quality is the base's).
Every trial gets the same load: Poisson ``rates`` (multiples of the stack's own single-stream
capacity), closed-loop ``concurrency`` levels, ``requests_per_point`` each, and the SLO.
"""

from __future__ import annotations

import logging

from trials import engines as engine_registry
from trials.config import Load, Stack, TrialConfig, parse_cache
from trials.models.registry import BUILT_IN, Catalogue, model_config
from trials.techniques import planning
from trials.techniques.serving.spec import NAME

log = logging.getLogger(__name__)
DRAFT_K = 3          # tokens a draft proposes per round where the profile names none: llama-server's own default


def server_stacks(engine, entry, settings: dict, device: str) -> list[Stack]:
    shipped = engine.shipped(entry) or engine.base(device)
    sixteen = engine.base(device)
    slots = sorted(set(settings["parallel"]))
    most = slots[-1]
    stacks = [Stack(engine=engine.name, precision=shipped, batch_size=n) for n in slots]
    stacks += [Stack(engine=engine.name, precision=w, batch_size=most)
               for w in dict.fromkeys(settings.get("weights", [])) if w != shipped and w in engine.precisions]
    for bits, backend in (parse_cache(name) for name in settings.get("caches", []) if name != "full"):
        if backend not in engine.kv_caches or bits not in engine.kv_caches[backend]:
            continue
        stack = Stack(engine=engine.name, precision=sixteen, kv_bits=bits, kv_backend=backend, batch_size=most)
        refused = engine.model_refusal(entry.name, model_config(entry), stack)
        if refused is None:
            stacks.append(stack)
        else:
            log.info("serving: the %d-bit cache left out on %s: %s", bits, engine.name, refused)
    if settings.get("lookup_k") and "prompt_lookup" in engine.proposers:
        stacks.append(Stack(engine=engine.name, precision=shipped, speculation="prompt_lookup",
                            num_draft_tokens=settings["lookup_k"], batch_size=most))
    drafts = [w for w in dict.fromkeys(settings.get("drafts", [])) if w in engine.precisions and w != sixteen]
    if drafts and "draft" in engine.proposers:
        log.info("serving: %s drafts on %s with its own %s GGUF (a draft of the same vocabulary by construction)",
                 entry.name, engine.name, ", ".join(drafts))
        stacks += [Stack(engine=engine.name, precision=sixteen, speculation="draft", draft_model=entry.name,
                         draft_precision=w, num_draft_tokens=settings.get("draft_k") or DRAFT_K, batch_size=most)
                   for w in drafts]
    return stacks


def load_of(settings: dict) -> Load:
    return Load(rates=tuple(float(r) for r in settings["rates"]), concurrency=tuple(settings["concurrency"]),
                requests=settings["requests_per_point"], warmup=settings["warmup_requests"],
                ttft_slo_s=settings["ttft_slo_ms"] / 1000, tpot_slo_s=settings["tpot_slo_ms"] / 1000)


def say_missing(chosen, device: str, said: set[str]) -> None:
    """One line per chosen server engine that cannot run here: not installed (what it lacks and how to
    install it) or not measured on this device."""
    for engine in chosen:
        if engine.name in said:
            continue
        said.add(engine.name)
        if device not in engine.devices:
            log.info("serving: the %s engine is not measured on %s (only %s)", engine.name, device,
                     ", ".join(engine.devices))
        elif engine.missing():
            log.info("serving: the %s engine is left out: missing %s%s", engine.name, ", ".join(engine.missing()),
                     f" (install: {engine.install})" if engine.install else "")


def plan(models: list[str], profile, device: str, catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    configs, said = [], set()
    for entry in planning.targets(models, catalogue):
        settings = profile.settings(NAME, entry, device)
        if settings.get("real_models_only") and entry.source == "zoo":
            continue
        chosen = [engine_registry.get(n) for n in settings.get("servers") or engine_registry.servers()]
        say_missing(chosen, device, said)
        here = [e for e in chosen if e.serves and device in e.devices and e.installed()]
        if not here:
            log.info("serving: %s left out on %s: no server engine runs there (installed: %s)", entry.name, device,
                     ", ".join(e.name for e in chosen if e.installed()) or "none")
            continue
        workload = planning.workload(settings)
        configs += [planning.config(catalogue, NAME, entry, stack, device=device, workload=workload,
                                    repeats=1, load=load_of(settings))
                    for engine in here for stack in server_stacks(engine, entry, settings, device)]
    return configs
