"""The quantization group's search space (its spec: ``trials.techniques.quantization.spec``)."""

from __future__ import annotations

import importlib.util
import logging

from trials.config import Stack, TrialConfig
from trials.models.registry import BUILT_IN, Catalogue
from trials.techniques import planning
from trials.techniques.quantization.spec import NAME

log = logging.getLogger(__name__)
GPTQ_EXTRA = "pip install -e '.[gptq]' (GPTQModel; it installs torch>=2.14.1 with CUDA libraries, ~6 GB)"


def gptq_installed() -> bool:
    return importlib.util.find_spec("gptqmodel") is not None


def plan(models: list[str], profile, device: str,
         catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target at every weight precision of the profile, reference precision first.

    GPTQ is planned where its optional extra is installed (where the sweep plans: on a cluster, install
    it on the head too); without it GPTQ is left out, said once with the install line. Each trial
    also scores perplexity and (once per worker and model) runs the reference precision.
    """
    configs, left_out = [], []
    for entry in planning.targets(models, catalogue):
        settings = profile.settings(NAME, entry, device)
        workload = planning.workload(settings, eval_windows=settings.get("eval_windows", 0))
        for precision in planning.planned_precisions(settings["precisions"], device):
            if precision == "gptq" and not gptq_installed():
                left_out.append(entry.name)
                continue
            configs.append(planning.config(catalogue, NAME, entry, Stack(precision=precision), device=device,
                                           workload=workload, repeats=settings["repeats"]))
    if left_out:
        log.warning("quantization: gptq not planned for %s: GPTQ needs the optional extra: %s",
                    ", ".join(left_out), GPTQ_EXTRA)
    return configs
