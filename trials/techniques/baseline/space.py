"""The baseline group's search space (its spec: ``trials.techniques.baseline.spec``)."""

from __future__ import annotations

from trials.config import Stack, TrialConfig
from trials.models.registry import BUILT_IN, Catalogue
from trials.techniques import planning
from trials.techniques.baseline.spec import NAME


def plan(models: list[str], profile, device: str,
         catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target at the profile's precisions, batch 1: the reference every other group compares to."""
    configs = []
    for entry in planning.targets(models, catalogue):
        settings = profile.settings(NAME, entry, device)
        configs += [planning.config(catalogue, NAME, entry, Stack(precision=precision), device=device,
                                    workload=planning.workload(settings), repeats=settings["repeats"])
                    for precision in planning.planned_precisions(settings["precisions"], device)]
    return configs
