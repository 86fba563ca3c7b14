"""The sweep's plan beyond each technique's own search space: which models run by default, and the
order trials run in.

Each technique plans its own trials (``trials.techniques.<name>.space``, named by its spec);
``run_order`` is breadth-first: every chart group's smallest model first, then the next model of
every group, so that the dashboard has something in every section early. Profiles size the
workload: ``quick`` fits a 2-core CPU in minutes, ``full`` is for GPU clusters. They are files,
``sweeps/profiles/<name>.yaml`` (``sweeps.sizing`` says what they hold), read by the sweep-file loader
(``sweeps.sweepfile``). ``PROFILES`` is re-exported here for the spaces' callers.
"""

from __future__ import annotations

from trials.config import TrialConfig
from trials.errors import ConfigError
from trials.models import pypi, zoo
from trials.models.registry import ModelEntry, zoo_targets


def default_models(device: str) -> list[str]:
    """The zoo's targets and the real models from PyPI (``trials.models.pypi``): both exist offline,
    on any machine."""
    return [*zoo_targets("full"), *pypi.MODELS]


def _parameters(entry: ModelEntry) -> int:
    """Parameter count from the zoo's or the converted real model's card; 0 where unknown without
    loading (hub models, local folders)."""
    try:
        if entry.source == "zoo":
            return int(zoo.load_card(entry.location)["parameters"])
        if entry.source == "pypi":
            return int(pypi.load_card(entry.location)["parameters"])
    except (FileNotFoundError, KeyError, ConfigError):
        pass
    return 0


def run_order(configs: list[TrialConfig]) -> list[TrialConfig]:
    """Breadth-first: round r runs every group's r-th smallest model, group after group, so that each
    chart group has data for one model early and the dashboard is worth opening while the sweep runs.
    A (group, model) block keeps its space's order (reference stacks first) and a round's trials share
    one model, so a worker's cached model serves consecutive trials."""
    sizes = {c.model: _parameters(c.entry()) for c in configs}
    group_order = {g: i for i, g in enumerate(dict.fromkeys(c.group for c in configs))}
    ranks: dict[tuple[str, str], int] = {}
    for group in group_order:
        mine = sorted({c.model for c in configs if c.group == group}, key=lambda m: (sizes[m], m))
        ranks.update({(group, model): rank for rank, model in enumerate(mine)})
    return sorted(configs, key=lambda c: (ranks[(c.group, c.model)], group_order[c.group]))


def __getattr__(name: str):
    """``PROFILES``: the built-in profiles (``sweeps.sweepfile.profiles()``), for the spaces' callers."""
    if name == "PROFILES":
        from sweeps.sweepfile import profiles
        return profiles()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
