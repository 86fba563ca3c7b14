"""Measure once: a measurement two groups plan (the stacks design's cells that the engines group also
compares across engines) is planned once, runs once, and is one MLflow run that both groups chart and
both skip next time (sweeps/measure_once.py, trials.run.add_shared_numbers, tracking's readers)."""

from __future__ import annotations

import argparse

import pytest

import tracking
from sweeps.budget import StepCost, estimate_seconds, pairs_needed
from sweeps.plan import chosen_profile, finished_configs, flat, is_finished, plan
from trials import groups
from trials.config import ConfigError, Stack, TrialConfig, Workload
from trials.loop import TrialResult
from trials.run import run_trial

SMOL = "smollm2-135m-instruct"
REAL = ["smollm2-135m-instruct", "gemma-3-270m"]
SKIP = argparse.Namespace(rerun=False, reuse=False)


def _args(models: list[str], names: str = "stacks,engines") -> argparse.Namespace:
    from sweeps.full import parse_args

    return parse_args(["--groups", names, "--models", ",".join(models)])


def _shared(stack: Stack = Stack("nf4"), **fields) -> TrialConfig:
    return TrialConfig("stacks", SMOL, stack, Workload("prose", 1, 4, eval_windows=1), repeats=2,
                       also_charted_by=("engines",), **fields)


@pytest.fixture
def uri(tmp_path):
    uri = tracking.resolve_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tracking.prepare_store(uri)
    return uri


def test_the_groups_that_chart_a_trial_leave_its_hash_alone():
    config = _shared()
    alone = TrialConfig("stacks", SMOL, Stack("nf4"), config.workload, repeats=2)
    assert config.config_hash == alone.config_hash and config.subject_hash == alone.subject_hash
    assert config.charts == ("stacks", "engines")
    assert config.charted_as("engines") == TrialConfig("engines", SMOL, Stack("nf4"), config.workload, repeats=2)
    assert config.measurement_hash == config.charted_as("engines").measurement_hash != config.config_hash
    assert TrialConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="other groups"):
        TrialConfig("stacks", SMOL, also_charted_by=("stacks",))
    with pytest.raises(ConfigError, match="unknown group"):
        TrialConfig("stacks", SMOL, also_charted_by=("nope",))
    with pytest.raises(ConfigError, match="engines group compares engines at batch 1"):
        TrialConfig("stacks", SMOL, Stack(batch_size=4), also_charted_by=("engines",))


def test_each_measurement_both_groups_plan_is_planned_once(real_models):
    """Per real model the stacks design and the engines group share six stacks (three per engine):
    each is planned once, in the stacks group, charted by the engines group too; the estimate counts
    it once."""
    args = _args(REAL)
    trials = plan(args, "cpu")
    alone = {g: groups.get(g).plan(REAL, chosen_profile(args, "cpu"), "cpu")
             for g in ("stacks", "engines")}
    measurements = [c.measurement_hash for c in flat(trials)]
    assert len(measurements) == len(set(measurements)), "a measurement planned twice"
    shared = [c for c in trials["stacks"] if c.also_charted_by]
    assert {c.also_charted_by for c in shared} == {("engines",)}
    assert len(shared) == 6 * len(REAL) and {c.stack.engine for c in shared} == {"transformers", "llama_cpp"}
    assert [c.config_hash for c in trials["stacks"]] == [c.config_hash for c in alone["stacks"]]
    assert len(trials["engines"]) == len(alone["engines"]) - len(shared)
    engines_alone = {c.config_hash for c in alone["engines"]}
    assert all(c.charted_as("engines").config_hash in engines_alone for c in shared)

    costs = {(m.name, p): StepCost(0.05, 0.005, 1.0) for m, p in pairs_needed(flat(alone))}
    once, twice = estimate_seconds(flat(trials), costs), estimate_seconds(flat(alone), costs)
    assert estimate_seconds(alone["stacks"], costs) < once < twice


def test_a_shared_run_is_one_run_both_groups_chart_and_skip(real_models, uri, monkeypatch):
    """The stacks runner measures NF4 on SmolLM2 once; the engines group's own numbers join that run
    (its roofline, its windowed quality, kept apart where the stacks runner scored the same name
    another way); both groups' frames hold the one run, and a second plan skips it, folded or not."""
    monkeypatch.setenv("LLM_SWEEPS_MODEL_CACHE", "3")   # NF4, the base and the reference: none loaded twice
    config = _shared()
    result = run_trial(config)
    assert result.status == "FINISHED", result.error
    assert {"roofline_tok_per_s", "perplexity_windows", "speedup_vs_baseline"} <= set(result.metrics)
    assert "engines.kl_divergence" in result.metrics       # prompts (stacks) vs perplexity windows (engines)
    assert result.tags["engines.measurement_source"].startswith("the stacks group's trial")
    run_id = tracking.log_trial(uri, result)

    stacks, engines = tracking.runs_frame(uri, "stacks"), tracking.runs_frame(uri, "engines")
    assert list(stacks["run_id"]) == list(engines["run_id"]) == [run_id]
    row = engines.iloc[0]
    assert row["tags.charted_by"] == "stacks,engines"
    assert row["tags.config_hash"] == config.charted_as("engines").config_hash
    assert stacks.iloc[0]["tags.config_hash"] == config.config_hash
    assert row["kl_divergence"] == result.metrics["engines.kl_divergence"] != stacks.iloc[0]["kl_divergence"]
    assert row["tags.measurement_source"] == result.tags["engines.measurement_source"]
    cache = tracking.RunsCache(uri)
    cache.refresh()
    assert list(cache.frame("engines", latest=True)["run_id"]) == [run_id]
    assert cache.frame("engines").iloc[0]["kl_divergence"] == row["kl_divergence"]
    from dashboard.sections import engines as section, stacks as design
    assert section.figures(engines) and design.figures(stacks)           # both sections draw it
    assert any("smollm2-135m-instruct" in line for line in section.report(engines))

    trials = {"stacks": [config], "engines": []}
    assert is_finished(config, finished_configs(trials, SKIP, uri))
    assert not is_finished(config, {"stacks": {config.config_hash}}), "finished only once every group has it"
    engines_alone = {"engines": [config.charted_as("engines")]}             # --groups engines on its own
    assert is_finished(config.charted_as("engines"), finished_configs(engines_alone, SKIP, uri))


def test_a_shared_run_replaces_an_older_run_of_the_same_cell(uri):
    """A store from before: the engines group's own run of a cell; then the shared run. The engines
    section charts the latest of the two; the store's finished hashes and sizes see both groups'."""
    config = _shared()
    old = TrialResult(config.charted_as("engines"), "FINISHED", metrics={"tok_per_s": 1.0, "kl_divergence": 0.5})
    new = TrialResult(config, "FINISHED", metrics={"tok_per_s": 2.0, "kl_divergence": 0.1,
                                                   "engines.kl_divergence": 0.2})
    tracking.log_trial(uri, old)
    tracking.log_trial(uri, new)
    cache = tracking.RunsCache(uri)
    cache.refresh()
    latest = cache.frame("engines", latest=True)
    assert list(latest["tok_per_s"]) == [2.0] and list(latest["kl_divergence"]) == [0.2]
    assert list(cache.frame("stacks")["kl_divergence"]) == [0.1] and cache.count() == 2
    assert tracking.finished_hashes(uri, "engines") == {config.charted_as("engines").config_hash}
    assert set(tracking.finished_subjects(uri, "engines")) == {config.charted_as("engines").subject_hash}
    assert sorted(tracking.runs_frame(uri, "engines")["tok_per_s"]) == [1.0, 2.0]
