"""The budget as a promise: priority order, floors before deferral, what is deferred, the deadline while
trials run, and a real sweep whose deferred trials the next run does, and nothing else."""

import json
import re

import pytest

from sweeps import budget, deferral
from sweeps.spaces import PROFILES
from trials import groups
from trials.config import Stack, TrialConfig, Workload

from test_budget import MODELS, _costs, _plan


def _config(model: str, precision: str = "fp32", group: str = "baseline") -> TrialConfig:
    return TrialConfig(group=group, model=model, stack=Stack(precision), workload=Workload("prose", 1, 8))


def test_every_block_gets_its_first_cell_before_any_block_gets_its_second():
    """Round r of the priority order holds the r-th cell of every (group, model) block, in its space's
    order: every chart has a bar for every model before any curve gets a second point."""
    configs = _plan()
    ordered = deferral.priority_order(configs)
    blocks = {(c.group, c.model) for c in configs}
    first_round = ordered[:len(blocks)]
    assert {(c.group, c.model) for c in first_round} == blocks
    for group, model in blocks:
        mine = [c.config_hash for c in configs if (c.group, c.model) == (group, model)]
        assert [c.config_hash for c in ordered if (c.group, c.model) == (group, model)] == mine   # space order kept


def test_the_serving_groups_shipped_weights_come_before_its_other_stacks(real_models):
    configs = groups.get("serving").plan(list(real_models), PROFILES["quick"], "cpu")
    ordered = deferral.priority_order(configs)
    models = {c.model for c in configs}
    assert len(models) == 2
    from trials import engines

    for c in ordered[:2 * 2]:                   # both models' shipped weights at each slot count, first
        assert c.stack.precision == engines.get(c.stack.engine).shipped(c.entry()), c.stack.label
    assert {c.model for c in ordered[:2]} == models


def test_workloads_reach_their_floors_before_any_trial_is_deferred():
    """A budget the plan fits at some level defers nothing; one below the floors' estimate gets the
    floors (the last level) and defers the lowest-priority trials, the rest within the budget."""
    configs = _plan()
    costs = _costs(configs)
    floors = budget.fit(configs, costs, budget_s=1.0, workers=2)
    assert floors.level == len(budget.LEVELS) - 1
    fitting = budget.fit(configs, costs, budget_s=floors.estimate_s / 2 * 1.01, workers=2)
    seconds = budget.trial_estimates(fitting.configs, costs)
    roomy = deferral.defer(fitting.configs, seconds, fitting.budget_s * 2, workers=2)
    assert not roomy.deferred and len(roomy.run) == len(configs)

    seconds = budget.trial_estimates(floors.configs, costs)
    half = floors.estimate_s / 2
    chosen = deferral.defer(floors.configs, seconds, half, workers=2)
    assert chosen.deferred and chosen.run
    assert chosen.load_s() <= half
    assert {c.config_hash for c in chosen.run} | {c.config_hash for c in chosen.deferred} == \
        {c.config_hash for c in floors.configs}
    keys = deferral.priority_keys(floors.configs)
    assert keys[chosen.run[0].config_hash] <= min(keys[c.config_hash] for c in chosen.deferred)
    per_group = chosen.per_group(chosen.deferred)
    assert sum(n for n, _ in per_group.values()) == len(chosen.deferred)
    lines = deferral.describe_deferred(per_group, "make run")
    assert lines[0].startswith(f"Deferred to the next run: {len(chosen.deferred)} trial(s)") and "make run" in lines[-1]


def test_a_trial_that_holds_its_node_takes_every_workers_share_and_work_beside_takes_its_own():
    plain = _config("tiny-gqa")
    held = TrialConfig(group="serving", model="tiny-gqa", stack=Stack("f16", engine="llama_server"),
                       workload=Workload("prose", 1, 8))
    assert deferral.worker_seconds(plain, 10.0, 2) == 10.0 and deferral.worker_seconds(held, 10.0, 2) == 20.0
    seconds = {plain.config_hash: 10.0, held.config_hash: 10.0}
    chosen = deferral.defer([plain, held], seconds, capacity_s=25.0, workers=2)
    assert [c.config_hash for c in chosen.run] == [plain.config_hash]           # 10 + 20 > 25
    chosen = deferral.defer([plain, held], seconds, capacity_s=35.0, workers=2, beside_s=10.0)
    assert len(chosen.run) == 1 and len(chosen.deferred) == 1                   # the zoo's training took 10
    assert deferral.defer([plain, held], seconds, None, workers=2).deferred == []   # no budget: nothing deferred


def test_the_deadline_starts_only_what_ends_in_time_corrected_by_what_finished_took():
    from sweeps.staged import StagedSearcher

    small, large, other = _config("tiny-gqa"), _config("tiny-mha"), _config("tiny-gqa", "bf16")
    deadline = deferral.Deadline(100.0, {small.config_hash: 10.0, large.config_hash: 200.0, other.config_hash: 30.0})
    deadline.start(now=0.0)
    assert deadline.admits(small, now=50.0) and not deadline.admits(large, now=50.0)
    assert deadline.deferred == [large]
    deadline.finished(small, 20.0)                       # twice its estimate
    assert deadline.ratio() == 2.0 and deadline.estimate(other) == 60.0
    assert not deadline.admits(other, now=50.0)          # 60 s left? no: 50

    deadline = deferral.Deadline(100.0, {small.config_hash: 10.0, large.config_hash: 200.0})
    searcher = StagedSearcher([large, small], deadline=deadline)
    deadline.start()
    handed = TrialConfig.from_dict(searcher.suggest("0")["trial"])
    assert handed.config_hash == small.config_hash and deadline.deferred == [large]
    unbounded = deferral.Deadline(None, {})
    unbounded.start()
    assert unbounded.admits(large) and unbounded.left_s() is None


def test_deferred_trials_start_after_the_planned_ones_only_while_time_is_left():
    """A run whose planned trials took less than estimated offers the plan's deferred trials (standby),
    in priority order, each only where its estimate ends within the budget; the rest stay deferred."""
    from ray.tune.search import Searcher

    from sweeps.staged import StagedSearcher

    planned, fits, too_long = _config("tiny-gqa"), _config("tiny-mha"), _config("tiny-gqa", "bf16")
    deadline = deferral.Deadline(100.0, {planned.config_hash: 10.0, fits.config_hash: 50.0, too_long.config_hash: 500.0})
    started = []
    searcher = StagedSearcher([planned], deadline=deadline, standby=[too_long, fits], on_standby=started.append)
    deadline.start()
    assert TrialConfig.from_dict(searcher.suggest("0")["trial"]).config_hash == planned.config_hash
    assert started == []                                 # nothing from standby while a planned trial is queued
    assert TrialConfig.from_dict(searcher.suggest("1")["trial"]).config_hash == fits.config_hash
    assert started == [fits] and deadline.deferred == [too_long] and searcher.standby == []
    assert searcher.suggest("2") == Searcher.FINISHED
    unbounded = StagedSearcher([planned], standby=[fits])          # no budget: no standby (nothing is deferred)
    unbounded.suggest("0")
    assert unbounded.suggest("1") == Searcher.FINISHED


def test_a_trial_that_holds_the_node_is_admitted_only_if_it_ends_in_time_after_the_running_ones():
    """A server trial waits for the running trials before it starts: its admission counts that wait
    (their corrected estimates less what they have run), and a trial's own limit is what is left
    when it starts, not when it was handed out."""
    from sweeps.trainable import time_left

    plain = _config("tiny-gqa")
    server = TrialConfig(group="serving", model="tiny-gqa", stack=Stack("f16", engine="llama_server"),
                         workload=Workload("prose", 1, 8))
    deadline = deferral.Deadline(100.0, {plain.config_hash: 60.0, server.config_hash: 50.0})
    deadline.start(now=0.0)
    deadline.running("t0", plain, now=0.0)
    assert deadline.wait_s(now=20.0) == 40.0
    assert not deadline.admits(server, now=20.0)          # 40 s of waiting + 50 s > 80 s left? 90 > 80
    assert deadline.admits(plain, now=20.0)               # a plain trial takes the other worker now
    deadline.finished(plain, 60.0, "t0")
    assert deadline.wait_s(now=20.0) == 0.0 and deadline.admits(server, now=20.0)
    fresh = deferral.Deadline(100.0, {})
    fresh.start()
    assert time_left(None) is None and time_left(0.0) == 0.0 and 90 < time_left(fresh.ends_at()) <= 100


FLOOR_SWEEP = """models: [tiny-gqa, tiny-mha]
groups: [baseline, batching]
profile: {base: quick, prompts_per_type: 1, max_new_tokens: 16, repeats: 3, baseline: {precisions: [fp32, bf16]},
          batching: {batch_sizes: [1, 2, 4, 8]}}
"""


@pytest.mark.cold          # three sweeps of its own: with the fault tests (make test-faults, .ci/run)
def test_a_sweep_past_its_budget_defers_and_the_next_runs_exactly_what_it_deferred(tiny_zoo, tmp_path):
    """A sweep file already at the workloads' floors, a budget of a quarter of its estimate: the first
    run defers the lowest-priority trials (those it could not start in time, standby included), says
    so per group and with the command, and stays near its budget; the command again (with the time
    they need) runs exactly the deferred ones; a third plans 0."""
    import os

    import tracking
    from conftest import run_sweep

    (tmp_path / "sweep.yaml").write_text(FLOOR_SWEEP)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "LLM_SWEEPS_CALIBRATION": str(tmp_path / "calibration.json")}
    common = ["--sweep", str(tmp_path / "sweep.yaml"), "--workers", "1", "--tracking-uri", uri]
    dry = run_sweep(*common, "--budget", "10h", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    total_min = float(re.search(r"Estimated: ~([\d.]+) min of wall time", dry.stdout)[1])
    budget_s = max(3, round(total_min * 60 * 0.25))     # a quarter: deferred however fast this machine runs them

    first = run_sweep(*common, "--budget", f"{budget_s}s", "--summary-json", str(tmp_path / "one.json"), env=env)
    log = first.stdout[-4000:] + first.stderr[-3000:]
    assert first.returncode == 0, log
    one = json.loads((tmp_path / "one.json").read_text())
    deferred = sum(d["trials"] for d in one["deferred"].values())
    assert deferred > 0 and one["finished"] > 0 and one["failed"] == 0, log
    assert f"Deferred to the next run: {deferred} trial(s)" in first.stdout and "the same command again" in first.stdout
    assert one["tune_s"] <= 1.5 * budget_s + 15, (one["tune_s"], budget_s)     # Tune's start-up is not a trial's
    assert one["estimates"] and all(row["measured_s"] > 0 for row in one["estimates"].values())
    from dashboard.app import deferred_line

    assert f"deferred {deferred} trial(s) to the next run" in deferred_line(uri)       # the page says it too
    frames = {g: tracking.runs_frame(uri, g) for g in ("baseline", "batching")}
    runs_after_first = {g: set(f["run_id"]) if "run_id" in f else set() for g, f in frames.items()}

    second = run_sweep(*common, "--budget", "10h", "--summary-json", str(tmp_path / "two.json"), env=env)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-3000:]
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["finished"] == deferred and two["skipped"] == one["finished"] and not two["deferred"], two
    for group, before in runs_after_first.items():
        frame = tracking.runs_frame(uri, group)
        assert before <= set(frame["run_id"])                           # nothing measured again
        assert frame["tags.config_hash"].is_unique
    assert deferred_line(uri) == ""

    third = run_sweep(*common, "--budget", f"{budget_s}s", "--dry-run", env=env)
    planned = one["finished"] + deferred
    assert f"total: {planned} trials, {planned} already finished" in third.stdout, third.stdout[-3000:]


def test_a_trial_that_holds_its_node_waits_while_the_zoo_holds_a_core():
    """While the later stage builds beside the trials, a node-holding trial stays queued and the next one
    starts (one waiting for the zoo's core would stall the rest: nothing passes it once handed out);
    once the zoo's trials arrive it is handed out in its turn."""
    from sweeps.staged import StagedSearcher

    held = TrialConfig(group="serving", model="tiny-gqa", stack=Stack("f16", engine="llama_server"),
                       workload=Workload("prose", 1, 8))
    plain = _config("tiny-gqa")
    ready: list = [None]
    searcher = StagedSearcher([held, plain], lambda: ready[0])
    assert TrialConfig.from_dict(searcher.suggest("0")["trial"]).config_hash == plain.config_hash
    assert searcher.suggest("1") is None                                  # only the held one: ask again
    ready[0] = []
    assert TrialConfig.from_dict(searcher.suggest("2")["trial"]).config_hash == held.config_hash


def test_nothing_passes_a_node_holding_trial_until_it_completes():
    """Ray does not grant a waiting whole-node request before later one-core ones (a 2-CPU trial waited
    behind eight 1-CPU ones, each in a fresh worker, in a real Tune run), so once a node-holding trial is
    handed out the searcher hands out nothing else until Tune says it completed."""
    from sweeps.staged import StagedSearcher

    held = TrialConfig(group="serving", model="tiny-gqa", stack=Stack("f16", engine="llama_server"),
                       workload=Workload("prose", 1, 8))
    first, after = _config("tiny-gqa"), _config("tiny-mha")
    searcher = StagedSearcher([first, held, after])
    assert TrialConfig.from_dict(searcher.suggest("0")["trial"]).config_hash == first.config_hash
    assert TrialConfig.from_dict(searcher.suggest("1")["trial"]).config_hash == held.config_hash
    assert searcher.suggest("2") is None and searcher.suggest("2") is None    # waits for trial 1, not passes it
    searcher.on_trial_complete("0")
    assert searcher.suggest("2") is None                                      # trial 0 ending is not enough
    searcher.on_trial_complete("1", error=True)                               # failed or not, it has ended
    assert TrialConfig.from_dict(searcher.suggest("2")["trial"]).config_hash == after.config_hash
