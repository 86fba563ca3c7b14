"""The speculative group's search space (its spec: ``trials.techniques.speculative.spec``)."""

from __future__ import annotations

import logging

from trials.config import Stack, TrialConfig
from trials.models.registry import BUILT_IN, Catalogue
from trials.techniques import planning
from trials.techniques.speculative.spec import NAME

log = logging.getLogger(__name__)


def plan(models: list[str], profile, device: str,
         catalogue: Catalogue = BUILT_IN) -> list[TrialConfig]:
    """Each target with its registry draft at every k, then prompt lookup; batch 1, greedy.

    Each trial also measures (once per worker and model) the no-speculation baseline of the same
    prompts, so there is no separate baseline trial. A target without a draft gets prompt lookup
    only (said in the log); drafts given in ``--models`` are skipped (they are proposers, not targets).
    """
    precision = "fp32" if device == "cpu" else "bf16"
    configs = []
    for entry in planning.targets(models, catalogue):
        settings = profile.settings(NAME, entry, device)
        if entry.default_draft is None:
            log.info("speculative: %s has no draft model in the registry: prompt lookup only", entry.name)
        stacks = [Stack(precision=precision, speculation="draft", draft_model=entry.default_draft,
                        num_draft_tokens=k) for k in settings["draft_k"] if entry.default_draft]
        stacks += [Stack(precision=precision, speculation="prompt_lookup", num_draft_tokens=k)
                   for k in settings["lookup_k"]]
        configs += [planning.config(catalogue, NAME, entry, stack, device=device,
                                    workload=planning.workload(settings), repeats=settings["repeats"])
                    for stack in stacks]
    return configs
