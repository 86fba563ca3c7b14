"""Groups whose configurations are searched, not gridded (``Technique.search``: the capacity group).

With ``--search optuna`` (the default) such a group's grid is not run: per model, the sweep plans
``search_trials`` slots, less the searched runs the store already holds under the same SLO (a rerun
continues a search cut short and plans nothing once it is whole). A slot stands in for the trial
the search will propose when its turn comes: it is a point of the grid not measured yet, whose
estimated cost sizes the budget and whose place sets the priority, exactly as a gridded trial's.
When the Tune run reaches a slot, the model's searcher (``sweeps.capacity_search``: Optuna through
Ray Tune, warm-started from the store's finished runs) proposes the configuration that is run
instead, and each result goes back to it. ``--search grid`` runs the whole grid, as a plan.

Either way a searched trial carries the search's name, its index in the model's search and the time
the budget leaves it (a capacity search that would run past it stops at a lower bound).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict

import pandas as pd

from trials import groups
from trials.config import TrialConfig
from trials.techniques.spec import resolve

log = logging.getLogger("sweeps")
MODES = ("optuna", "grid")
SEED = 0


def searched(group: str) -> bool:
    return bool(groups.get(group).search)


def same_slo(frame: pd.DataFrame, config: TrialConfig) -> pd.Series:
    """The rows of ``frame`` measured under ``config``'s SLO and attainment target."""
    load = config.load
    match = pd.Series(True, index=frame.index)
    for column, value in (("ttft_slo_s", load.ttft_slo_s), ("tpot_slo_s", load.tpot_slo_s),
                          ("attainment_target", load.attainment)):
        match &= (pd.to_numeric(frame[column], errors="coerce") - value).abs() < 1e-9 if column in frame else False
    return match


def searched_so_far(frame: pd.DataFrame, config: TrialConfig) -> int:
    """Finished searched runs of ``config``'s model under its SLO."""
    if frame is None or frame.empty or "tags.search" not in frame:
        return 0
    rows = frame[(frame["model"] == config.model) & (frame["tags.search"] == "optuna")
                 & (frame.get("status", "FINISHED") == "FINISHED")]
    return int(same_slo(rows, config).sum()) if not rows.empty else 0


def plan_slots(trials: dict[str, list[TrialConfig]], profile, device: str, mode: str, runs=None,
               finished: set[str] | None = None) -> dict[str, list[TrialConfig]]:
    """Each searched group's grid replaced, per model, by its slots (``mode`` optuna; grid: unchanged)."""
    if mode == "grid":
        return trials
    out = dict(trials)
    for name, configs in trials.items():
        if not searched(name) or not configs:
            continue
        frame = runs(name) if runs is not None else None
        done = finished if finished is not None else set()
        slots = []
        by_model: dict[str, list[TrialConfig]] = defaultdict(list)
        for config in configs:
            by_model[config.model].append(config)
        for model, grid in by_model.items():
            wanted = profile.settings(name, grid[0].entry(), device)["search_trials"] - searched_so_far(frame, grid[0])
            fresh = [c for c in grid if c.config_hash not in done]
            slots += fresh[:max(0, wanted)]
            log.info("%s: %s searched in %d trial(s) of a %d-point space (%d more planned)", name, model,
                     profile.settings(name, grid[0].entry(), device)["search_trials"], len(grid), min(len(fresh), max(0, wanted)))
        out[name] = slots
    return out


class Searches:
    """The searched trials of one Tune run: which searcher proposes each slot's configuration, the
    searched trials' indices, and each result handed back to its searcher."""

    def __init__(self, mode: str, uri: str, sweep_id: str, profile, device: str, catalogue=None):
        self.mode, self.uri, self.sweep_id, self.profile, self.device = mode, uri, sweep_id, profile, device
        self.catalogue = catalogue
        self.searchers: dict[tuple[str, str], object] = {}
        self.owner: dict[str, tuple[str, str]] = {}
        self.index: Counter = Counter()

    def hand_out(self, trial_id: str, config: TrialConfig, deadline) -> dict | None:
        """The Tune config for ``config``'s turn: itself, or for a slot the search's proposal (None when
        the search has nothing left to propose: the slot is given up)."""
        if not searched(config.group):
            return {"trial": config.to_dict()}
        key = (config.group, config.model)
        run = config
        if self.mode != "grid":
            proposal = self._searcher(config).suggest(trial_id)
            if not isinstance(proposal, dict):
                log.info("%s: the search of %s has nothing more to propose; its slot is given up", *key)
                return None
            run = TrialConfig.from_dict(proposal["trial"])
            if deadline is not None:
                deadline.price(run, like=config)
            self.owner[trial_id] = key
        self.index[key] += 1
        return {"trial": run.to_dict(), "search": self.mode, "search_index": self.index[key],
                "search_id": f"{self.sweep_id}:{config.model}",
                "budget_ends_at": deadline.ends_at() if deadline is not None else None}

    def complete(self, trial_id: str, result: dict | None, error: bool = False) -> None:
        key = self.owner.pop(trial_id, None)
        if key is not None:
            self.searchers[key].on_trial_complete(trial_id, result, error=error)

    def _searcher(self, config: TrialConfig):
        key = (config.group, config.model)
        if key not in self.searchers:
            from sweeps.capacity_search import CapacitySearcher, warm_start
            import tracking

            space = resolve(groups.get(config.group).search)
            extra = {"catalogue": self.catalogue} if self.catalogue is not None else {}
            [(entry, engine, settings, choices)] = [s for s in space.searched([config.model], self.profile,
                                                                              self.device, **extra)]

            def make_trial(point: dict, index: int) -> dict:
                return {"trial": space.make_config(entry, engine.name, point, settings, self.device, **extra).to_dict()}

            frame = tracking.runs_frame(self.uri, config.group)
            warm = warm_start(frame, config.model, config.load, choices)
            trials = settings["search_trials"]
            # a handful of trials: the sampler learns from the second on (its default waits for 4 random ones)
            self.searchers[key] = CapacitySearcher(choices, make_trial, search="optuna", seed=SEED, warm=warm,
                                                   max_trials=trials, n_startup_trials=max(1, min(4, trials // 3)))
            self.index[key] = searched_so_far(frame, config)        # the search goes on where the store left it
        return self.searchers[key]
