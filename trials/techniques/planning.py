"""What every technique's search space shares: targets of a model list, a profile's workload, a
config that carries the declared models it names (``trials.models.registry.Catalogue``).

A search space is a function ``plan(models, profile, device, catalogue) -> list[TrialConfig]`` in its
technique's folder (``space.py``). Spaces are explicit lists rather than Ray Tune samplers: every
chart needs a specific grid, the plan can be printed before anything runs (``--dry-run``), and each
config's hash can be checked against the store so that finished work is skipped. A space reads its
settings with ``profile.settings(name, entry, device)`` (``sweeps.sizing.Profile``).
"""

from __future__ import annotations

from trials.config import Stack, TrialConfig, Workload
from trials.models.registry import Catalogue, ModelEntry


def planned_precisions(precisions: list[str], device: str) -> list[str]:
    """The profile's precisions, fp16 left out on a CPU (emulated there, and no user's CPU target)."""
    return [p for p in precisions if device == "cuda" or p != "fp16"]


def workload(settings: dict, **extra) -> Workload:
    return Workload(settings["prompt_set"], settings["prompts_per_type"], settings["max_new_tokens"], **extra)


def targets(models: list[str], catalogue: Catalogue) -> list[ModelEntry]:
    return [entry for entry in map(catalogue.get, models) if entry.role == "target"]


def config(catalogue: Catalogue, group: str, entry: ModelEntry, stack: Stack, **fields) -> TrialConfig:
    """A trial of ``entry`` under ``stack``, carrying the declared entries it names."""
    return TrialConfig(group=group, model=entry.name, stack=stack,
                       declared=catalogue.declared_for(entry.name, stack.draft_model), **fields)
