"""A searched group in the sweep (``sweeps.searches``): the capacity group's grid becomes search slots,
fewer where the store already holds searched runs; each slot is handed out as the search's proposal,
with its place in the search and the time the budget leaves it; ``--search grid`` keeps the grid."""

from __future__ import annotations

import pytest

import tracking
from sweeps.deferral import Deadline
from sweeps.full import parse_args
from sweeps.plan import chosen_profile, plan
from sweeps.searches import Searches
from sweeps.trainable import time_left
from trials.config import TrialConfig
from trials.loop import TrialResult

REAL = ("smollm2-135m-instruct", "gemma-3-270m")


def args_for(*extra: str):
    return parse_args(["--groups", "capacity", "--models", ",".join(REAL), *extra])


def searched_run(config: TrialConfig, margin: float) -> TrialResult:
    load = config.load
    metrics = {"slo_margin": margin, "capacity_rps": max(margin, 0.0), "ttft_slo_s": load.ttft_slo_s,
               "tpot_slo_s": load.tpot_slo_s, "attainment_target": load.attainment, "c1_ttft_s_p95": 0.2,
               "c1_tpot_s_p95": 0.02, "server_step_tokens": float(config.stack.step_tokens or 2048),
               "server_threads": 2.0, "parallel_slots": float(config.stack.batch_size), "tok_per_s": 1.0}
    return TrialResult(config, "FINISHED", metrics=metrics, tags={"search": "optuna", "capacity_status": "measured"})


def test_the_grid_becomes_search_slots_and_a_store_s_searched_runs_count(tmp_path, real_models):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.prepare_store(uri)
    grid = plan(args_for("--search", "grid"), "cpu", uri)["capacity"]
    profile = chosen_profile(args_for(), "cpu")
    wanted = profile.settings("capacity", grid[0].entry(), "cpu")["search_trials"]
    per_model = {m: [c for c in grid if c.model == m] for m in REAL}
    assert all(len(configs) > 3 * wanted for configs in per_model.values())      # a search is a third of it, at most
    slots = plan(args_for(), "cpu", uri)["capacity"]
    assert {m: sum(c.model == m for c in slots) for m in REAL} == {m: wanted for m in REAL}
    for config in per_model[REAL[0]][:2]:        # two searched runs of SmolLM2 under the same SLO
        tracking.log_trial(uri, searched_run(config, 1.5))
    slots = plan(args_for(), "cpu", uri)["capacity"]
    assert sum(c.model == REAL[0] for c in slots) == wanted - 2
    assert not {c.config_hash for c in slots} & {c.config_hash for c in per_model[REAL[0]][:2]}


def test_a_slot_is_handed_out_as_the_search_s_proposal_with_its_place_and_time(tmp_path, real_models):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.prepare_store(uri)
    args = args_for()
    slots = [c for c in plan(args, "cpu", uri)["capacity"] if c.model == REAL[0]]
    measured = slots[0]
    tracking.log_trial(uri, searched_run(measured, 2.0))          # the store's: never proposed again
    # priced by its own slots and -b (a stand-in for the budget's cost model); where the pricer knows no
    # step cost (None), as its slot was planned
    pricer = lambda c: None if c.stack.batch_size == 2 else 10.0 * c.stack.batch_size + c.stack.step_tokens / 1000
    deadline = Deadline(600.0, {c.config_hash: 100.0 for c in slots}, pricer=pricer)
    deadline.start()
    searches = Searches("optuna", uri, "sweep-1", chosen_profile(args, "cpu"), "cpu")
    seen = set()
    for i, slot in enumerate(slots[1:3], start=1):
        handed = searches.hand_out(f"t{i}", slot, deadline)
        proposed = TrialConfig.from_dict(handed["trial"])
        assert proposed.group == "capacity" and proposed.model == REAL[0]
        assert proposed.config_hash not in seen | {measured.config_hash}
        seen.add(proposed.config_hash)
        assert handed["search"] == "optuna" and handed["search_index"] == i + 1     # after the store's one
        assert handed["search_id"] == f"sweep-1:{REAL[0]}" and 0 < time_left(handed["budget_ends_at"]) <= 600
        assert deadline.seconds[proposed.config_hash] == (pricer(proposed) or 100.0)
        searches.complete(f"t{i}", {"slo_margin": 1.0 + i, "ttft_ratio": 0.5, "tpot_ratio": 0.5})
    searcher = searches.searchers[("capacity", REAL[0])]
    assert searcher.best().slo_margin == 3.0


def test_grid_mode_hands_out_the_planned_configuration_itself(tmp_path, real_models):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = args_for("--search", "grid")
    grid = plan(args, "cpu", uri)["capacity"]
    searches = Searches("grid", uri, "sweep-2", chosen_profile(args, "cpu"), "cpu")
    handed = [searches.hand_out(f"t{i}", c, None) for i, c in enumerate(grid[:2])]
    assert [TrialConfig.from_dict(h["trial"]).config_hash for h in handed] == [c.config_hash for c in grid[:2]]
    assert [h["search_index"] for h in handed] == [1, 2] and all(h["search"] == "grid" for h in handed)


@pytest.mark.parametrize("bad", ["--search=random"])
def test_an_unknown_search_is_one_line(bad, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--groups", "capacity", bad])
    assert "invalid choice: 'random'" in capsys.readouterr().err
