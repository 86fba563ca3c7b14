"""The batching group's search space (its spec: ``trials.techniques.batching.spec``)."""

from __future__ import annotations

from trials.config import Stack, TrialConfig
from trials.models.registry import BUILT_IN, Catalogue
from trials.techniques import planning
from trials.techniques.batching.spec import NAME


def plan(models: list[str], profile, device: str,
         catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target's batch ladder, smallest first (an OOM on CUDA ends the ladder), at fp32 so that
    batched greedy outputs can be required to equal batch 1's; only the batch size changes."""
    configs = []
    for entry in planning.targets(models, catalogue):
        settings = profile.settings(NAME, entry, device)
        configs += [planning.config(catalogue, NAME, entry, Stack(precision="fp32", batch_size=size),
                                    device=device, workload=planning.workload(settings),
                                    repeats=settings["repeats"])
                    for size in sorted(settings["batch_sizes"])]
    return configs
