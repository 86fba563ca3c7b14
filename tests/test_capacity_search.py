"""The capacity search (sweeps.capacity_search) on a synthetic served model whose capacity is known at
every configuration: search beside grid, warm start from a store's frame, the SLO constraints, the
budget guard. The search runs on the Searcher directly (suggest / on_trial_complete, as Tune calls
them: 128 trials in about a second); one small search runs through real Ray Tune."""

from __future__ import annotations

import hashlib
import itertools
import math

import optuna
import pandas as pd
import pytest

from sweeps.capacity_search import CapacitySearcher, Proposal, warm_start

KNOBS = {"precision": ["q8_0", "q4_0"], "kv_bits": [16, 8], "slots": [1, 2, 4],
         "step_tokens": [0, 64, 128, 256], "threads": [2, 1]}
SLO = {"ttft_slo_s": 0.5, "tpot_slo_s": 0.05, "attainment_target": 0.9}
GRID = [dict(zip(KNOBS, values)) for values in itertools.product(*KNOBS.values())]


def served(knobs: dict) -> dict:
    """A 2-core server's single-stream p95s and capacity (req/s) under SLO, in the contract's terms.

    Single stream: q8_0 decodes slower than q4_0, one thread slower than two, an 8-bit KV cache a
    little slower; a small ``-b`` (tokens per step; 0 = 2048) splits the prompt over steps (TTFT up).
    The slow corner misses the SLO alone: negative ``slo_margin``, a ratio > 1. Under load: slots add
    throughput (an 8-bit cache more, less to read), but every slot's token waits for the prompt
    tokens in its step: the ITL stall grows with slots and ``-b`` and eats the TPOT room, while a
    small ``-b`` costs prefill efficiency. So two slots want the default ``-b`` and four want 128.
    A fixed +-2 % per configuration stands in for measurement noise."""
    q8, kv8, slots, threads = knobs["precision"] == "q8_0", knobs["kv_bits"] == 8, knobs["slots"], knobs["threads"]
    b = knobs["step_tokens"] or 2048
    tpot = 0.030 * (1.35 if q8 else 1.0) * (1.0 if threads == 2 else 1.6) * (1.05 if kv8 else 1.0)
    ttft = 0.18 * (1.3 if q8 else 1.0) * (1.0 if threads == 2 else 1.8) * (1 + 32 / b)
    ratios = {"ttft_ratio": ttft / SLO["ttft_slo_s"], "tpot_ratio": tpot / SLO["tpot_slo_s"]}
    if max(ratios.values()) > 1:
        return {"slo_margin": 1 - max(ratios.values()), "capacity_rps": 0.0, **ratios}
    itl = tpot * (1 + 0.04 * (slots - 1)) + 0.0015 * (slots - 1) * min(b, 256) / 64
    room = 1 / (1 + math.exp((itl / SLO["tpot_slo_s"] - 0.95) / 0.06))
    noise = int(hashlib.sha256(repr(sorted(knobs.items())).encode()).hexdigest(), 16) % 1000 / 1000 - 0.5
    capacity = (1 / (ttft + 24 * tpot) * slots ** (0.82 if kv8 else 0.72) * b / (b + 40) * room
                * (1 + 0.04 * noise))
    return {"slo_margin": capacity, "capacity_rps": capacity, **ratios}


def make_trial(knobs: dict, index: int) -> dict:
    return {"knobs": knobs, "search_index": index}


def drive(searcher: CapacitySearcher, measure=served) -> list[dict]:
    """Tune's loop, one trial at a time: suggest until FINISHED, report each result."""
    results = []
    for n in itertools.count():
        config = searcher.suggest(f"trial_{n}")
        if config == CapacitySearcher.FINISHED:
            return results
        result = measure(config["knobs"])
        results.append({**(result or {}), **config})
        searcher.on_trial_complete(f"trial_{n}", result, error=result is None)


def keys(points) -> list[tuple]:
    return [tuple(sorted(p.items())) for p in points]


def capacity_frame(points: list[dict], model: str = "m", **overrides) -> pd.DataFrame:
    """A ``runs_frame`` of finished capacity runs: knobs as params/metrics under the contract's names."""
    rows = []
    for i, knobs in enumerate(points):
        measured = served(knobs)
        rows.append({"run_id": f"r{i}", "status": "FINISHED", "group": "capacity", "model": model,
                     "precision": knobs["precision"], "kv_bits": knobs["kv_bits"], "batch_size": knobs["slots"],
                     "server_step_tokens": knobs["step_tokens"] or 2048, "server_threads": knobs["threads"],
                     "slo_margin": measured["slo_margin"], "capacity_rps": measured["capacity_rps"],
                     "c1_ttft_s_p95": measured["ttft_ratio"] * SLO["ttft_slo_s"],
                     "c1_tpot_s_p95": measured["tpot_ratio"] * SLO["tpot_slo_s"],
                     "end_time": pd.Timestamp("2026-12-08", tz="UTC") + pd.Timedelta(minutes=i),
                     **SLO, **overrides})
    return pd.DataFrame(rows)


# --- (a) search beside grid ---------------------------------------------------------------------

def test_the_search_reaches_the_grids_best_in_a_third_of_its_trials():
    grid = drive(CapacitySearcher(KNOBS, make_trial, search="grid", max_trials=1000))
    assert keys(r["knobs"] for r in grid) == keys(GRID)          # every point once, in product order, then FINISHED
    assert [r["search_index"] for r in grid] == list(range(1, 97))
    best = max(r["slo_margin"] for r in grid)
    budget = len(GRID) // 3
    for seed in range(5):
        found = drive(CapacitySearcher(KNOBS, make_trial, max_trials=budget, seed=seed))
        assert len(found) == budget and len(set(keys(r["knobs"] for r in found))) == budget
        assert max(r["slo_margin"] for r in found) >= 0.95 * best, f"seed {seed}"


def test_the_search_is_deterministic_under_its_seed():
    first, again = (drive(CapacitySearcher(KNOBS, make_trial, max_trials=12, seed=7)) for _ in range(2))
    assert keys(r["knobs"] for r in first) == keys(r["knobs"] for r in again)


def test_the_first_proposal_is_every_knobs_first_choice_unless_the_store_has_it():
    first = {name: choices[0] for name, choices in KNOBS.items()}
    assert drive(CapacitySearcher(KNOBS, make_trial, max_trials=1, seed=3))[0]["knobs"] == first
    warm = warm_start(capacity_frame([first]), "m", SLO, KNOBS)
    proposed = drive(CapacitySearcher(KNOBS, make_trial, max_trials=3, seed=3, warm=warm))
    assert first not in [r["knobs"] for r in proposed]


def test_the_search_opens_with_the_defaults_then_each_knob_changed_alone():
    """Before TPE: the defaults, then each knob changed alone with the rest at their defaults: every
    knob's second choice in the knobs' order, then every knob's third, and so on, so that a short
    search tries each knob once (what the store measured is skipped)."""
    first = {name: choices[0] for name, choices in KNOBS.items()}
    depth = max(len(choices) for choices in KNOBS.values())
    alone = [{**first, name: choices[i]} for i in range(1, depth) for name, choices in KNOBS.items() if i < len(choices)]
    assert len(alone) > len(KNOBS) and alone[1][list(KNOBS)[1]] != first[list(KNOBS)[1]]     # breadth first
    proposed = drive(CapacitySearcher(KNOBS, make_trial, max_trials=1 + len(alone), seed=5))
    assert [r["knobs"] for r in proposed] == [first, *alone]
    warm = warm_start(capacity_frame([alone[0]]), "m", SLO, KNOBS)
    proposed = drive(CapacitySearcher(KNOBS, make_trial, max_trials=len(alone), seed=5, warm=warm))
    assert [r["knobs"] for r in proposed] == [first, *alone[1:]]


def test_a_fixed_knob_stays_fixed_and_a_small_space_ends_when_every_point_is_known():
    knobs = {**KNOBS, "precision": ["q4_0"], "kv_bits": [8], "threads": [2]}    # 3 x 4 = 12 points
    found = drive(CapacitySearcher(knobs, make_trial, max_trials=50, seed=1))
    assert len(found) == 12 and len(set(keys(r["knobs"] for r in found))) == 12
    assert {(r["knobs"]["precision"], r["knobs"]["kv_bits"], r["knobs"]["threads"]) for r in found} == {("q4_0", 8, 2)}
    single = drive(CapacitySearcher({"slots": [2]}, make_trial, max_trials=5), lambda k: served({**GRID[0], **k}))
    assert [r["knobs"] for r in single] == [{"slots": 2}]


# --- (b) warm start -------------------------------------------------------------------------------

def test_warm_start_reads_the_models_finished_runs_under_the_same_slo():
    measured = GRID[::8]                                         # 12 points, the default -b among them
    frame = pd.concat([
        capacity_frame(measured),
        capacity_frame(GRID[1:3], model="other"),
        capacity_frame(GRID[3:5], tpot_slo_s=0.1),               # another SLO
        capacity_frame(GRID[5:7], attainment_target=0.95),
        capacity_frame(GRID[7:8], status="FAILED"),
        capacity_frame([{**GRID[9], "slots": 8}]),               # outside the knobs' choices
    ], ignore_index=True)
    stale = capacity_frame(measured[:1]).assign(slo_margin=9.9, end_time=pd.Timestamp("2026-01-01", tz="UTC"))
    points, rewards, constraints = warm_start(pd.concat([stale, frame]), "m", SLO, KNOBS)

    assert sorted(keys(points)) == sorted(keys(measured))        # 2048 read back as the default, 0
    assert rewards == pytest.approx([served(p)["slo_margin"] for p in points])      # the latest run counts
    assert constraints == [pytest.approx({k: served(p)[k] for k in ("ttft_ratio", "tpot_ratio")}) for p in points]
    assert warm_start(frame, "nobody", SLO, KNOBS) == ([], [], [])
    assert warm_start(pd.DataFrame(), "m", SLO, KNOBS) == ([], [], [])


@pytest.mark.parametrize("search", ["optuna", "grid"])
def test_a_warm_search_never_remeasures_the_store_and_starts_from_its_best(search):
    measured = GRID[::8]
    warm = warm_start(capacity_frame(measured), "m", SLO, KNOBS)
    searcher = CapacitySearcher(KNOBS, make_trial, search=search, max_trials=40, seed=3, warm=warm)
    feasible = [served(p) for p in measured if max(served(p)["ttft_ratio"], served(p)["tpot_ratio"]) <= 1]
    store_best = max(r["slo_margin"] for r in feasible)
    assert searcher.best().slo_margin == pytest.approx(store_best) and searcher.best().index == 0

    found = drive(searcher)
    proposed = keys(r["knobs"] for r in found)
    assert len(found) == 40 and len(set(proposed)) == 40
    assert not set(proposed) & set(keys(measured))
    assert [p.index for p in searcher.trace] == list(range(1, 41))
    assert searcher.best().slo_margin >= store_best


def test_warm_points_reach_optuna_with_their_constraints():
    measured = GRID[:6] + GRID[-6:]                  # one thread misses the SLO, two meet it: both sides
    warm = warm_start(capacity_frame(measured), "m", SLO, KNOBS)
    searcher = CapacitySearcher(KNOBS, make_trial, max_trials=4, warm=warm)
    study = searcher._optuna._ot_study
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]     # the openers
    assert len(complete) == 12 and len(waiting) == len(study.trials) - 12
    for trial, knobs in zip(complete, measured):
        assert trial.constraints == pytest.approx({"ttft_ratio": served(knobs)["ttft_ratio"] - 1,
                                                   "tpot_ratio": served(knobs)["tpot_ratio"] - 1})


# --- (c) constraint margins ------------------------------------------------------------------------

def test_infeasible_proposals_carry_their_ratios_and_the_best_is_feasible():
    searcher = CapacitySearcher(KNOBS, make_trial, max_trials=32, seed=0)
    drive(searcher)
    infeasible = [p for p in searcher.trace if not p.feasible]
    assert infeasible, "the search should have tried the slow corner"
    for proposal in infeasible:
        assert proposal.slo_margin < 0 and max(proposal.ratios.values()) > 1
    best = searcher.best()
    assert best.feasible and max(best.ratios.values()) <= 1 and best.slo_margin > 0
    told = {tuple(sorted(t.params.items())): t for t in searcher._optuna._ot_study.trials}
    for proposal in searcher.trace:
        trial = told[tuple(sorted(proposal.knobs.items()))]
        assert trial.constraints == pytest.approx({k: r - 1 for k, r in proposal.ratios.items()})
        assert (max(trial.constraints.values()) <= 0) == proposal.feasible


def test_a_failed_or_unreported_trial_is_told_not_crashed_and_not_proposed_again():
    def flaky(knobs):
        if knobs["slots"] == 4 and knobs["threads"] == 1:
            return None                                           # the trial raised
        if knobs["slots"] == 2 and knobs["threads"] == 1:
            return {"capacity_rps": 0.0}                          # ended without its objective
        return served(knobs)

    searcher = CapacitySearcher(KNOBS, make_trial, max_trials=60, seed=2)
    found = drive(searcher, flaky)
    assert len(found) == 60 and len(set(keys(r["knobs"] for r in found))) == 60
    states = {p.state for p in searcher.trace}
    assert {"failed", "pruned", "complete"} <= states
    by_state = {s: {p.index for p in searcher.trace if p.state == s} for s in states}
    study_states = {t.state for t in searcher._optuna._ot_study.trials}
    assert {optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED} <= study_states
    assert all(p.slo_margin is None for p in searcher.trace if p.index in by_state["failed"] | by_state["pruned"])


# --- (d) the budget guard ---------------------------------------------------------------------------

def test_a_budget_that_admits_no_more_ends_the_search_and_keeps_its_trials():
    admitted = iter([True, True, True, False, True])
    searcher = CapacitySearcher(KNOBS, make_trial, max_trials=32, seed=0, admits=lambda: next(admitted))
    found = drive(searcher)
    assert len(found) == 3 and [p.index for p in searcher.trace] == [1, 2, 3]
    assert all(p.state == "complete" for p in searcher.trace)
    assert searcher.suggest("later") == CapacitySearcher.FINISHED


def test_bad_knobs_are_refused():
    for knobs, mode in (({}, "optuna"), ({"slots": []}, "optuna"), ({"slots": [1, 1]}, "grid"), (KNOBS, "random")):
        with pytest.raises(ValueError):
            CapacitySearcher(knobs, make_trial, search=mode, max_trials=3)


# --- through real Ray Tune ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_ray():
    import sys

    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers cannot import tests/
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def tune_trial(config: dict) -> None:
    from ray import tune

    tune.report({**served(config["knobs"]), "search_index": config["search_index"]})


def test_a_warm_budgeted_search_through_ray_tune(local_ray, tmp_path):
    """Warm from a store, TPE from the first trial (warm points >= its startup count), cut by the
    budget guard after 4 trials; Tune sees every trial's objective, ratios and search_index."""
    from ray import tune

    measured = GRID[::12]
    holder: list[CapacitySearcher] = []
    searcher = CapacitySearcher(KNOBS, make_trial, max_trials=32, seed=0,
                                warm=warm_start(capacity_frame(measured), "m", SLO, KNOBS),
                                admits=lambda: len(holder[0].trace) < 4)
    holder.append(searcher)
    tuner = tune.Tuner(tune_trial, tune_config=tune.TuneConfig(
        search_alg=searcher, num_samples=-1, max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="search", verbose=0))
    results = tuner.fit()

    assert not results.errors and len(results) == 4
    frame = results.get_dataframe().sort_values("search_index")
    assert frame["search_index"].tolist() == [1, 2, 3, 4]
    assert {"slo_margin", "ttft_ratio", "tpot_ratio"} <= set(frame.columns)
    knobs = [{k: row[f"config/knobs/{k}"] for k in KNOBS} for _, row in frame.iterrows()]
    assert keys(knobs) == keys(p.knobs for p in searcher.trace)
    assert not set(keys(knobs)) & set(keys(measured))
    assert all(isinstance(p, Proposal) and p.state == "complete" for p in searcher.trace)


def test_the_replay_over_a_measured_grid_reaches_its_best_within_a_third_of_it():
    """benchmarks/search_vs_grid.py --replay: the search answered by a grid store's measurements."""
    from benchmarks.search_vs_grid import replay

    frame = capacity_frame(GRID)
    frame["search_index"], frame["stack"] = range(1, len(GRID) + 1), [repr(k) for k in GRID]
    frame["capacity_rps_low"] = frame["capacity_rps"] * 0.95
    (row,) = replay(frame, seeds=3)
    assert row["grid_points"] == len(GRID) and row["grid_best_rps"] == frame["capacity_rps"].max()
    assert len(row["trials_to_reach"]) == 3 and all(row["trials_to_reach"])
    assert row["median_to_reach"] <= len(GRID) // 3
