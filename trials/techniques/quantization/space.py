"""The quantization group's search space (its spec: ``trials.techniques.quantization.spec``)."""

from __future__ import annotations

from trials.config import Stack, TrialConfig
from trials.models.registry import BUILT_IN, Catalogue
from trials.techniques import planning
from trials.techniques.quantization.spec import NAME


def plan(models: list[str], profile, device: str,
         catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target at every weight precision of the profile, reference precision first.

    GPTQ is planned wherever the profile lists it: without its optional extra those trials fail at
    once with the install line, and the sweep goes on. Each trial also scores perplexity and (once per
    worker and model) runs the reference precision.
    """
    configs = []
    for entry in planning.targets(models, catalogue):
        settings = profile.settings(NAME, entry, device)
        workload = planning.workload(settings, eval_windows=settings.get("eval_windows", 0))
        configs += [planning.config(catalogue, NAME, entry, Stack(precision=precision), device=device,
                                    workload=workload, repeats=settings["repeats"])
                    for precision in planning.planned_precisions(settings["precisions"], device)]
    return configs
