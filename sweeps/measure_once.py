"""Measure once: a measurement that several chart groups plan runs once, and each of them charts it.

Two groups may plan the same trial but for its group: same model, stack, workload, repeats, seed and
device (``TrialConfig.measurement_hash``), e.g. a stack of the stacks design that the engines group
also compares across engines. Measured twice, one stack would show two tok/s on one page and cost
the budget twice. So the plan keeps one trial per measurement, in the first group in page order that
``hosts_shared_runs`` (``trials.techniques.spec.Technique``); every other group planning it that
declares ``shared_numbers`` drops its copy and is named in the kept trial's ``also_charted_by``.
The trial's runner measures, each such group adds its own numbers to the same run
(``trials.run.run_trial``), and the run's ``charted_by`` tag lets every group's readers see it as
theirs (``tracking``). A group that declares neither keeps its own trial.
"""

from __future__ import annotations

from dataclasses import replace

from trials import groups
from trials.config import TrialConfig


def fold(trials: dict[str, list[TrialConfig]]) -> dict[str, list[TrialConfig]]:
    """``trials`` (by group) with each shared measurement planned once, in its host group's list."""
    order = {name: i for i, name in enumerate(groups.NAMES)}
    same: dict[str, list[TrialConfig]] = {}
    for configs in trials.values():
        for config in configs:
            same.setdefault(config.measurement_hash, []).append(config)
    kept: dict[int, TrialConfig] = {}          # id of a host's config -> it, charted by its guests too
    dropped: set[int] = set()
    for configs in same.values():
        hosts = [c for c in configs if groups.get(c.group).hosts_shared_runs]
        if not hosts:
            continue
        host = min(hosts, key=lambda c: order[c.group])
        guests = [c for c in configs if c.group != host.group and groups.get(c.group).shared_numbers]
        names = tuple(sorted({c.group for c in guests}, key=order.get))
        if names:
            kept[id(host)] = replace(host, also_charted_by=names)
            dropped.update(id(c) for c in guests)
    return {group: [kept.get(id(c), c) for c in configs if id(c) not in dropped]
            for group, configs in trials.items()}


def describe(trials: dict[str, list[TrialConfig]]) -> str:
    """One line per host group saying which of its trials other groups chart too; "" when none."""
    lines = []
    for group, configs in trials.items():
        shared = [c for c in configs if c.also_charted_by]
        if shared:
            others = sorted({g for c in shared for g in c.also_charted_by}, key=groups.NAMES.index)
            lines.append(f"measured once: {len(shared)} {group} trial(s) also planned by {', '.join(others)} (the same "
                         "model, stack and workload): one run each, charted by both")
    return "\n".join(lines)
