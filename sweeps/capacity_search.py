"""Which served configuration to measure next: a stock Ray Tune searcher over the serving knobs.

One capacity trial costs minutes (single-stream probe, then doubling and bisecting the Poisson rate),
so a budget holds a handful of them, against a grid of weights x KV type x slots x ``-b`` x threads
that is tens to hundreds of points. Optuna's TPE (through Ray Tune's ``OptunaSearch``) learns from
each measured point which knobs matter; the SLO enters twice: as a graded objective (``slo_margin``:
the capacity when > 0, else how far the single stream misses) and as constraints (each single-stream
p95 over its limit, minus one; feasible when <= 0), so TPE ranks an infeasible point by how far it
misses instead of lumping it with the rest. The first proposals open the search (``openers``): each
knob's first choice (the profile lists the server's defaults first), a reference for every later
point, then each knob changed alone, skipping what the store has measured; where one knob decides
(weights whose single stream misses the TTFT limit), the search finds it there, not by TPE's random
start. ``--search grid`` keeps the exhaustive walk.

Ray's ``OptunaSearch`` only calls ``study.tell``; Optuna >= 5 reads constraints from
``Trial.set_constraint`` (its ``constraints_func`` argument is deprecated), so ``_ConstrainedOptuna``
sets them from the Tune result just before the tell, and adds the store's points with theirs.

Never twice: TPE samples categorical knobs and may propose a point already measured (in the store or
in this search). Such a proposal is not run: the study is told the known value and constraints (the
Optuna FAQ's answer to duplicates: the measurement it already has), and asked again. After
``REPEATS_BEFORE_RANDOM`` repeats in a row the next point is an untried one drawn with the search's
seed (enqueued, so the study still records it), and the log says so. Once every point is known the
search ends (``Searcher.FINISHED``).

Warm start doubles as resume: ``warm_start`` turns the store's finished capacity runs of the model
under the same SLO into evaluated points, so a second run, or a run after a crash, measures only new
ones. (The searcher has no Tune checkpoint of its own; Tune logs once that it skips saving it.)

Use it with ``TuneConfig(search_alg=searcher, num_samples=-1, max_concurrent_trials=1)``: the
searcher ends the search (``max_trials`` proposals, every point known, or ``admits()`` False).
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
import pandas as pd
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from trials.measurement.point_names import SINGLE

log = logging.getLogger(__name__)

METRIC = "slo_margin"                      # the graded objective, maximized (the capacity contract)
RATIOS = ("ttft_ratio", "tpot_ratio")      # single-stream p95 / its limit, read from the Tune result
SEARCHES = ("optuna", "grid")
DEFAULT_STEP_TOKENS = 2048                 # llama-server's -b when the knob is 0
DEFAULT_ATTAINMENT = 0.9
N_STARTUP_TRIALS = 4                       # random proposals before TPE models (none after a warm start of >= 4)
REPEATS_BEFORE_RANDOM = 25                 # repeated proposals in a row before an untried point is drawn
# Where a knob's value is in a capacity run's row: the knob as asked (a param) first, else as in effect (a metric).
FRAME_COLUMNS = {"precision": ("precision",), "kv_bits": ("kv_bits",), "slots": ("batch_size", "parallel_slots"),
                 "step_tokens": ("step_tokens", "server_step_tokens"), "threads": ("threads", "server_threads")}


@dataclass
class Proposal:
    """One point of the search: ``index`` is its 1-based order in this search (0: from the store),
    logged by the trial as ``search_index``, the search-trace chart's x."""

    index: int
    trial_id: str
    knobs: dict[str, Any]
    slo_margin: float | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    state: str = "running"                 # running | complete | pruned (no slo_margin) | failed (raised)

    @property
    def feasible(self) -> bool:
        """Measured, and each single-stream p95 within its limit (a ratio not reported counts as within)."""
        return self.state == "complete" and all(r <= 1.0 for r in self.ratios.values())


def warm_start(frame, model: str, slo, knobs: Mapping[str, list] | None = None
               ) -> tuple[list[dict], list[float], list[dict[str, float]]]:
    """The store's finished capacity runs of ``model`` under ``slo`` as evaluated points.

    ``frame``: ``tracking.runs_frame(uri, "capacity")``. ``slo``: a ``Load`` (``ttft_slo_s``,
    ``tpot_slo_s``, ``attainment``) or a mapping with the metric names (``ttft_slo_s``, ``tpot_slo_s``,
    ``attainment_target``). Returns ``(points, rewards, constraints)``: knob dicts, their ``slo_margin``,
    and their single-stream ratios ``{"ttft_ratio": p95/limit, "tpot_ratio": ...}`` (empty where the
    run has none). With ``knobs``, each value is mapped into the choices (an ``-b`` of 2048 is the
    default, 0, where 0 is a choice) and rows outside them are dropped. A configuration measured more
    than once counts by its latest run, as the charts do.
    """
    ttft_slo, tpot_slo, attainment = _slo_values(slo)
    names = list(knobs) if knobs is not None else list(FRAME_COLUMNS)
    if frame is None or frame.empty or METRIC not in frame:
        return [], [], []
    rows = frame
    for column, wanted in (("status", "FINISHED"), ("model", model)):
        if column in rows:
            rows = rows[rows[column] == wanted]
    same_slo = [_same(row, "ttft_slo_s", ttft_slo) and _same(row, "tpot_slo_s", tpot_slo)
                and _same(row, "attainment_target", attainment, missing_ok=True) for _, row in rows.iterrows()]
    rows = rows.loc[same_slo]
    if "end_time" in rows:
        rows = rows.sort_values("end_time", kind="stable")
    latest: dict[tuple, tuple[dict, float, dict]] = {}
    for _, row in rows.iterrows():
        margin = _number(row.get(METRIC))
        point = _point(row, names, knobs)
        if margin is None or point is None:
            continue
        ratios = {name: value for name, value in (
            ("ttft_ratio", _ratio(row.get(SINGLE.metric("ttft_s_p95")), ttft_slo)),
            ("tpot_ratio", _ratio(row.get(SINGLE.metric("tpot_s_p95")), tpot_slo))) if value is not None}
        latest[_key(point)] = (point, margin, ratios)
    points, rewards, constraints = (list(column) for column in zip(*latest.values())) if latest else ([], [], [])
    return points, rewards, constraints


class CapacitySearcher(Searcher):
    """Proposes served configurations (one Tune trial each) from ``knobs`` (name -> choices; a knob
    with one choice is fixed), by Optuna's TPE under the SLO constraints or, ``search="grid"``, by
    walking ``itertools.product`` of the choices in the order given (list each knob's default first).

    ``make_trial(knobs, index)`` returns a trial's Tune config; ``index`` is the proposal's 1-based
    order in this search (log it as ``search_index``). ``max_trials`` caps the proposals; ``admits()``,
    asked before each, ends the search when False (a budget guard); ``warm``: ``warm_start``'s
    ``(points, rewards, constraints)``, never proposed again. ``trace`` lists this search's proposals
    with their results; ``best()`` is the best feasible point, store included.
    """

    def __init__(self, knobs: Mapping[str, list], make_trial: Callable[[dict, int], dict], *,
                 search: str = "optuna", max_trials: int, seed: int = 0,
                 admits: Callable[[], bool] | None = None,
                 warm: tuple[list, list, list] | None = None,
                 n_startup_trials: int = N_STARTUP_TRIALS):
        super().__init__(metric=METRIC, mode="max")
        if search not in SEARCHES:
            raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {search!r}")
        if not isinstance(max_trials, int) or max_trials < 1:
            raise ValueError(f"max_trials must be an integer >= 1, got {max_trials!r}")
        self.knobs = _checked(knobs)
        self.search = search
        self.max_trials = max_trials
        self._make_trial = make_trial
        self._admits = admits
        self._random = random.Random(seed)
        self.trace: list[Proposal] = []
        self.finished = False
        self._by_id: dict[str, Proposal] = {}
        self._known: dict[tuple, Proposal] = {}          # every point measured, store and this search
        self._free = [name for name, choices in self.knobs.items() if len(choices) > 1]
        self._optuna = None
        if search == "optuna" and self._free:
            optuna.logging.set_verbosity(optuna.logging.WARNING)     # not a line per study it creates
            space = {name: optuna.distributions.CategoricalDistribution(self.knobs[name]) for name in self._free}
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials, multivariate=True)
            self._optuna = _ConstrainedOptuna(space=space, metric=METRIC, mode="max", sampler=sampler)
            self._inner: dict[str, str] = {}             # Tune's trial id -> the study's (repeats get their own)
            self._asked = 0
        for point, reward, ratios in zip(*(warm or ([], [], []))):
            self._add_warm(point, reward, ratios)
        if self._optuna is not None:
            for knobs in self.openers():                 # the defaults, then each knob changed alone
                if _key(knobs) not in self._known:
                    self._optuna.enqueue(self._params(knobs))

    def openers(self) -> list[dict]:
        """What the search proposes before TPE chooses: every knob's first choice (the server's
        defaults: a reference for the rest), then each free knob changed alone, the rest at their
        first: one change per knob, in the order the knobs are listed, before any knob's next choice
        (a short search tries every knob once). What an engineer tries by hand, and where a single
        knob decides (weights the single stream cannot serve), found in a few trials."""
        first = {name: choices[0] for name, choices in self.knobs.items()}
        changes = [[{**first, name: choice} for choice in self.knobs[name][1:]] for name in self._free]
        return [first] + [knobs for turn in itertools.zip_longest(*changes) for knobs in turn if knobs is not None]

    # Tune's side -----------------------------------------------------------------------------------

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        """The metric and mode are the contract's; a Tune ``param_space`` would bypass the knobs."""
        return metric in (None, METRIC) and mode in (None, "max") and not config

    def suggest(self, trial_id: str) -> dict | str | None:
        """The next trial's config, or ``FINISHED`` (for good: a budget that said no stays spent)."""
        if self.finished or len(self.trace) >= self.max_trials:
            self.finished = True
            return Searcher.FINISHED
        if self._admits is not None and not self._admits():
            log.info("capacity search: the budget admits no further trial after %d", len(self.trace))
            self.finished = True
            return Searcher.FINISHED
        knobs = self._next_optuna(trial_id) if self._optuna is not None else self._next_untried(grid=True)
        if knobs is None:
            log.info("capacity search: every one of the %d configurations is measured", len(self._known))
            self.finished = True
            return Searcher.FINISHED
        proposal = Proposal(len(self.trace) + 1, trial_id, knobs)
        self.trace.append(proposal)
        self._by_id[trial_id] = proposal
        self._known[_key(knobs)] = proposal
        return self._make_trial(dict(knobs), proposal.index)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        proposal = self._by_id.get(trial_id)
        if proposal is None or proposal.state != "running":
            return
        proposal.slo_margin = None if error else _number((result or {}).get(METRIC))
        proposal.ratios = {} if error else _ratios(result or {})
        proposal.state = "failed" if error else "complete" if proposal.slo_margin is not None else "pruned"
        if self._optuna is not None:
            self._tell(trial_id, proposal)

    # the searcher's own --------------------------------------------------------------------------

    def best(self) -> Proposal | None:
        """The feasible point with the highest ``slo_margin``, this search's or the store's."""
        feasible = [p for p in self._known.values() if p.feasible]
        return max(feasible, key=lambda p: p.slo_margin) if feasible else None

    def grid_size(self) -> int:
        return math.prod(len(choices) for choices in self.knobs.values())

    def _add_warm(self, point: Mapping, reward: float, ratios: Mapping[str, float]) -> None:
        knobs = _in_space(point, self.knobs)
        if knobs is None or _key(knobs) in self._known:
            return
        known = Proposal(0, "store", knobs, float(reward), dict(ratios), "complete")
        self._known[_key(knobs)] = known
        if self._optuna is not None:
            self._optuna.add_measured(self._params(knobs), known.slo_margin, _constraints(known.ratios))

    def _next_optuna(self, trial_id: str) -> dict | None:
        for _ in range(REPEATS_BEFORE_RANDOM):
            knobs = self._ask(trial_id)
            repeat = self._known.get(_key(knobs))
            if repeat is None:
                return knobs
            log.debug("capacity search: TPE repeated %s; told its known result", knobs)
            self._tell(trial_id, repeat)
        knobs = self._next_untried(grid=False)
        if knobs is not None:
            log.info("capacity search: TPE repeated known points %d times in a row; drew untried %s",
                     REPEATS_BEFORE_RANDOM, knobs)
            self._optuna.enqueue(self._params(knobs))
            asked = self._ask(trial_id)
            assert asked == knobs, (asked, knobs)
        return knobs

    def _ask(self, trial_id: str) -> dict:
        self._asked += 1
        inner = f"{trial_id}#{self._asked}"
        self._inner[trial_id] = inner
        params = self._optuna.suggest(inner)
        return {name: params[name] if name in params else choices[0] for name, choices in self.knobs.items()}

    def _tell(self, trial_id: str, measured: Proposal) -> None:
        """A failed (raised) or still running point is told FAIL, which TPE ignores; one that ended
        without ``slo_margin`` PRUNED, which TPE ranks below every measured point."""
        result = {} if measured.slo_margin is None else {METRIC: measured.slo_margin, **measured.ratios}
        self._optuna.on_trial_complete(self._inner.pop(trial_id), result,
                                       error=measured.state in ("failed", "running"))

    def _next_untried(self, grid: bool) -> dict | None:
        untried = (dict(zip(self.knobs, values)) for values in itertools.product(*self.knobs.values()))
        untried = [knobs for knobs in untried if _key(knobs) not in self._known]
        if not untried:
            return None
        return untried[0] if grid else self._random.choice(untried)

    def _params(self, knobs: Mapping) -> dict:
        return {name: knobs[name] for name in self._free}


class _ConstrainedOptuna(OptunaSearch):
    """Ray's ``OptunaSearch`` telling Optuna the SLO constraints too (each single-stream ratio - 1)."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        trial = self._ot_trials.get(trial_id)
        if trial is not None and result and not error:
            for name, value in _constraints(_ratios(result)).items():
                trial.set_constraint(name, value)
        super().on_trial_complete(trial_id, result, error)

    def add_measured(self, params: dict, value: float, constraints: dict[str, float]) -> None:
        self._ot_study.add_trial(optuna.trial.create_trial(
            value=value, params=params, distributions=self._space, constraints=constraints))

    def enqueue(self, params: dict) -> None:
        self._ot_study.enqueue_trial(params)


# helpers -------------------------------------------------------------------------------------------

def _checked(knobs: Mapping[str, list]) -> dict[str, list]:
    if not knobs:
        raise ValueError("the capacity search needs at least one knob")
    out = {}
    for name, choices in knobs.items():
        choices = [_plain(c) for c in choices]
        if not choices or len(set(choices)) != len(choices):
            raise ValueError(f"knob {name!r} needs one or more distinct choices, got {choices!r}")
        out[name] = choices
    return out


def _plain(value):
    """numpy scalars and integral floats as Python ints (Optuna's choices and the keys compare them)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _key(knobs: Mapping) -> tuple:
    return tuple(sorted((name, _plain(value)) for name, value in knobs.items()))


def _in_space(point: Mapping, knobs: Mapping[str, list]) -> dict | None:
    """``point`` in the knobs' choices (the default ``-b`` 2048 as 0 where 0 is a choice), or None."""
    out = {}
    for name, choices in knobs.items():
        if name not in point:
            return None
        value = _plain(point[name])
        if value not in choices and name == "step_tokens" and value == DEFAULT_STEP_TOKENS and 0 in choices:
            value = 0
        if value not in choices:
            return None
        out[name] = value
    return out


def _point(row, names: list[str], knobs: Mapping[str, list] | None) -> dict | None:
    point = {}
    for name in names:
        values = [row.get(column) for column in FRAME_COLUMNS.get(name, (name,))]
        values = [v for v in values if not _missing(v)]
        if not values:
            return None
        value = values[0]
        if isinstance(value, str) and name != "precision":
            try:
                value = float(value)
            except ValueError:
                pass
        point[name] = _plain(value)
    return _in_space(point, knobs) if knobs is not None else point


def _missing(value) -> bool:
    return value is None or (isinstance(value, str) and not value) or (pd.api.types.is_scalar(value) and pd.isna(value))


def _slo_values(slo) -> tuple[float, float, float]:
    get = slo.get if isinstance(slo, Mapping) else (lambda name, default=None: getattr(slo, name, default))
    attainment = get("attainment_target", None)
    attainment = get("attainment", DEFAULT_ATTAINMENT) if attainment is None else attainment
    return float(get("ttft_slo_s")), float(get("tpot_slo_s")), float(attainment)


def _same(row, column: str, wanted: float, missing_ok: bool = False) -> bool:
    value = _number(row.get(column))
    if value is None:
        return missing_ok
    return math.isclose(value, wanted, rel_tol=1e-6)


def _number(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _ratio(p95, limit: float) -> float | None:
    p95 = _number(p95)
    return None if p95 is None or limit <= 0 else p95 / limit


def _ratios(result: Mapping) -> dict[str, float]:
    return {name: value for name in RATIOS if (value := _number(result.get(name))) is not None}


def _constraints(ratios: Mapping[str, float]) -> dict[str, float]:
    """Optuna's convention: feasible when every value <= 0."""
    return {name: ratio - 1.0 for name, ratio in ratios.items()}
