"""Which trials exist: one search space per chart group.

A search space is a function ``(models, profile, device) -> list[TrialConfig]``. Spaces are explicit
lists rather than Ray Tune samplers: every chart needs a specific grid, the plan can be printed
before anything runs (``--dry-run``), and each config's hash can be checked against the store so
that finished work is skipped. ``run_order`` puts the biggest models first (longest trials first
keeps workers busy until the end instead of leaving one straggler) and keeps a model's trials
together so that a worker's cached model serves consecutive trials.

Profiles size the workload: ``quick`` fits a 2-core CPU in minutes, ``full`` is for GPU clusters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trials.config import Stack, TrialConfig, Workload
from trials.registry import get_model, zoo_targets


@dataclass(frozen=True)
class Profile:
    name: str
    prompts_per_type: int
    max_new_tokens: int
    repeats: int

    def workload(self, prompt_set: str = "mixed") -> Workload:
        return Workload(prompt_set, self.prompts_per_type, self.max_new_tokens)


PROFILES = {
    "quick": Profile("quick", prompts_per_type=4, max_new_tokens=128, repeats=3),
    "full": Profile("full", prompts_per_type=8, max_new_tokens=128, repeats=5),
}


def default_models(device: str) -> list[str]:
    """The zoo's targets: they exist offline, on any machine."""
    return zoo_targets("full")


def baseline(models: list[str], profile: Profile, device: str) -> list[TrialConfig]:
    """Each target at full and half precision, batch 1: the reference every other group compares to."""
    precisions = ["bf16", "fp32"] if device == "cpu" else ["bf16", "fp16", "fp32"]
    return [TrialConfig(group="baseline", model=model, device=device,
                        stack=Stack(precision=precision), workload=profile.workload(),
                        repeats=profile.repeats)
            for model in models if get_model(model).role == "target"
            for precision in precisions]


SPACES: dict[str, Callable[[list[str], Profile, str], list[TrialConfig]]] = {
    "baseline": baseline,
}


def _parameters(model: str) -> int:
    """Parameter count from the zoo's model card; 0 where unknown without loading (hub models)."""
    entry = get_model(model)
    if entry.source != "zoo":
        return 0
    from trials import zoo

    try:
        return int(zoo.load_card(entry.location)["parameters"])
    except (FileNotFoundError, KeyError):
        return 0


def run_order(configs: list[TrialConfig]) -> list[TrialConfig]:
    """Biggest models first (stable: a model's trials stay in their space's order, together)."""
    sizes = {model: _parameters(model) for model in {c.model for c in configs}}
    return sorted(configs, key=lambda c: -sizes[c.model])
