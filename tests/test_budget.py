"""Sizing a sweep to the machine: calibration (real, on the tiny zoo), estimates, shrinking to a budget."""

import json

import pytest
import torch

from sweeps import budget
from sweeps.spaces import PROFILES
from trials import groups
from trials.measurement.hardware import cpu_profile, precision_is_native
from trials.models.registry import get_model

MODELS = ["tiny-mha", "tiny-gqa"]


def _plan():
    return [c for name in groups.implemented() for c in groups.get(name).plan(MODELS, PROFILES["quick"], "cpu")]


def _costs(configs, decode_s=0.01, emulated_factor=20.0):
    """Step costs as a calibration would report them (input data for the estimate, not a mock)."""
    costs = {}
    for model, precision in budget.pairs_needed(configs):
        factor = 1.0 if precision_is_native(precision, "cpu") else emulated_factor
        costs[(model.name, precision)] = budget.StepCost(decode_s * factor, decode_s * factor / 20, 0.5)
    return costs


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("90s", 90), ("1.5h", 5400), ("45", 2700),
                                          ("none", None), ("0", None)])
def test_parse_budget(text, seconds):
    assert budget.parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5m", "m"])
def test_parse_budget_rejects_bad_input(text):
    with pytest.raises(ValueError, match="budget"):
        budget.parse_budget(text)


def test_generous_budget_keeps_the_profile_as_written():
    configs = _plan()
    fitted = budget.fit(configs, _costs(configs), budget_s=10 ** 7, workers=2, emulated_cap_s=10 ** 7)
    assert fitted.level == 0 and not any(e[1] for e in fitted.emulated)
    assert [c.config_hash for c in fitted.configs] == [c.config_hash for c in configs]


def test_tight_budget_shrinks_workloads_never_the_set_of_trials():
    configs = _plan()
    costs = _costs(configs)
    unscaled = budget.estimate_seconds(configs, costs)
    fitted = budget.fit(configs, costs, budget_s=unscaled / 2 / 4, workers=2)
    assert fitted.level > 0
    assert fitted.estimate_s < unscaled
    assert len(fitted.configs) == len(configs)
    identity = lambda c: (c.group, c.model, c.stack, c.workload.context_tokens, c.workload.prompt_set)
    assert [identity(c) for c in fitted.configs] == [identity(c) for c in configs]
    for before, after in zip(configs, fitted.configs):
        assert after.workload.max_new_tokens <= before.workload.max_new_tokens
        assert after.workload.max_new_tokens >= min(before.workload.max_new_tokens,
                                                    budget.MIN_NEW_TOKENS_EMULATED)
        assert 1 <= after.workload.prompts_per_type <= before.workload.prompts_per_type
        assert min(before.repeats, budget.MIN_REPEATS) <= after.repeats <= before.repeats


def test_estimate_falls_with_every_level():
    configs = _plan()
    costs = _costs(configs)
    estimates = [budget.estimate_seconds([budget.shrink(c, level) for c in configs], costs)
                 for level in range(len(budget.LEVELS))]
    assert all(b <= a for a, b in zip(estimates, estimates[1:]))
    # compiled stacks pay their compile time (the stacks spec's COMPILE_S) at any workload: the rest shrinks 4x
    scaling = [c for c in configs if not c.stack.compile]
    first, last = (budget.estimate_seconds([budget.shrink(c, level) for c in scaling], costs)
                   for level in (0, len(budget.LEVELS) - 1))
    assert last < first / 4


def test_emulated_precision_trials_shrink_to_their_cap():
    configs = _plan()
    costs = _costs(configs, emulated_factor=50.0)
    emulated = [c for c in configs if not precision_is_native(c.stack.precision, "cpu")]
    if not emulated:
        pytest.skip("every planned precision is native on this CPU")
    cap = max(budget.trial_seconds(budget.shrink(c, len(budget.LEVELS) - 1, True), costs) for c in emulated)
    fitted = budget.fit(configs, costs, budget_s=10 ** 7, workers=2, emulated_cap_s=cap)
    assert fitted.level == 0                         # the native trials keep the profile as written
    assert {c.config_hash for c, _, _ in fitted.emulated} <= {c.config_hash for c in fitted.configs}
    assert len(fitted.emulated) == len(emulated)
    assert all(seconds <= cap + 1e-9 for _, _, seconds in fitted.emulated)


def test_quantization_trials_shrink_their_perplexity_windows_too():
    from trials.techniques.quantization.runner import perplexity_method

    config = next(c for c in _plan() if c.group == "quantization")
    shrunk = budget.shrink(config, 3)
    default = perplexity_method(config.entry()).windows
    assert 0 < shrunk.workload.eval_windows < default
    assert perplexity_method(config.entry(), shrunk.workload.eval_windows).windows == shrunk.workload.eval_windows


def test_a_stack_on_another_engine_scores_the_same_windows_in_the_stacks_and_engines_groups():
    """The stacks group's cells on llama.cpp are measured as the engines group measures them: at every
    level their quality rests on the engines group's perplexity windows (they scored the method's full
    16 windows at every level before, 4x the engines group's at the floors)."""
    plan = _plan()
    engines_group = {(c.model, c.stack.label): c for c in plan if c.group == "engines"}
    cells = [c for c in plan if c.group == "stacks" and (c.model, c.stack.label) in engines_group
             and c.stack.engine != "transformers"]
    if not cells:
        pytest.skip("no second engine installed here (pip install -e '.[llama]')")
    for level in (0, 2, len(budget.LEVELS) - 1):
        for cell in cells:
            twin = engines_group[(cell.model, cell.stack.label)]
            assert (budget.shrink(cell, level).workload.eval_windows
                    == budget.shrink(twin, level).workload.eval_windows), (level, cell.stack.label)
    default_engine = [c for c in plan if c.group == "stacks" and c.stack.engine == "transformers"]
    assert all(budget.shrink(c, len(budget.LEVELS) - 1).workload.eval_windows == 0 for c in default_engine)


def test_calibration_measures_real_models_and_caches_per_machine(tiny_zoo, tmp_path, monkeypatch):
    monkeypatch.setenv(budget.CACHE_ENV_VAR, str(tmp_path / "calibration.json"))
    pairs = {(get_model("tiny-gqa"), "fp32"), (get_model("tiny-draft"), "fp32")}
    first = budget.calibrate(pairs, "cpu", threads=1)
    assert set(first) == {("tiny-gqa", "fp32"), ("tiny-draft", "fp32")}
    for cost in first.values():
        assert cost.decode_s > 0 and cost.prefill_token_s > 0 and cost.load_s >= 0
    stored = json.loads((tmp_path / "calibration.json").read_text())["entries"]
    assert sorted(key.split("|")[0] for key in stored) == ["tiny-draft", "tiny-gqa"]
    assert all(cpu_profile().model in key and f"torch={torch.__version__}" in key for key in stored)
    assert budget.calibrate(pairs, "cpu", threads=1) == first          # from the cache, unchanged
    again = budget.calibrate(pairs, "cpu", threads=1, recalibrate=True)
    assert again.keys() == first.keys() and again != first             # measured afresh


def test_the_calibration_table_keeps_its_columns_for_long_model_names():
    """A hub id or a real model's name is longer than the zoo's: it must not run into its precision."""
    long = "smollm2-135m-instruct-with-a-longer-name"
    table = budget.format_calibration({(long, "fp32"): budget.StepCost(0.03, 0.015, 1.1),
                                       ("zoo-gqa", "fp32"): budget.StepCost(0.005, 0.0003, 0.0)}, "cpu")
    header, *rows = table.splitlines()
    column = header.index("precision")
    assert all(row[column:].startswith("fp32") and row[column - 1] == " " for row in rows), table


def test_the_zoos_trials_join_the_queue_in_run_order_the_moment_they_are_sized():
    """``StagedSearcher``: until the later stage is ready Tune gets the first stage's trials (and None,
    'ask again', once they run out); when it is ready its trials merge with those not yet handed out,
    in the sweep's order, instead of waiting for the first stage to drain."""
    from ray.tune.search import Searcher

    from sweeps.staged import StagedSearcher
    from trials.config import Stack, TrialConfig, Workload

    def config(model: str) -> TrialConfig:
        return TrialConfig(group="baseline", model=model, stack=Stack("fp32"), workload=Workload("prose", 1, 8))

    ready: list = [None]
    first = [config(m) for m in ("smollm2-135m-instruct", "gemma-3-270m", "smollm2-135m-instruct")]
    searcher = StagedSearcher(first, lambda: ready[0], order=lambda cs: sorted(cs, key=lambda c: c.model != "zoo-mha"))
    handed = [TrialConfig.from_dict(searcher.suggest(str(i))["trial"]).model for i in range(2)]
    assert handed == ["smollm2-135m-instruct", "gemma-3-270m"]
    ready[0] = [config("zoo-mha"), config("zoo-mha")]             # the build returned: sized
    handed = [TrialConfig.from_dict(searcher.suggest(str(i))["trial"]).model for i in range(2, 5)]
    assert handed == ["zoo-mha", "zoo-mha", "smollm2-135m-instruct"]
    assert searcher.suggest("5") == Searcher.FINISHED

    waiting = StagedSearcher([], lambda: None)
    assert waiting.suggest("0") is None                               # nothing yet: Tune asks again


RERUN_SWEEP = """models: [tiny-gqa]
groups: [baseline]
profile: {base: quick, prompts_per_type: 1, max_new_tokens: 32, repeats: 3, baseline: {precisions: [fp32]}}
"""


def _main(argv: list[str], capsys) -> tuple[int, str]:
    """``sweeps/full.py``'s main in this process: (exit code, stdout and stderr)."""
    from sweeps.full import main

    code = main(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_rerun_sizes_its_trials_as_its_store_recorded_whatever_recalibrated_in_between(
        tiny_zoo, tmp_path, monkeypatch, capsys, caplog):
    """The main job, another sweep of one's own recalibrating on the same machine, the main job again:
    nothing is measured again. The main job (a real sweep: Ray, a sqlite store) keeps the step costs
    it sized with in its store; the other sweep's --recalibrate goes to its own cache file and its dry
    run creates no store; and even where the main job's own cache is measured again (here: steps 10^4
    times slower, as a busy machine might measure them; a fresh store shows they size other
    workloads), the rerun takes the store's record and plans 0 to run, with or without built models."""
    import argparse
    import logging
    import os

    import tracking
    from conftest import run_sweep
    from sweeps import record
    from trials.models import zoo

    cache = tmp_path / "calibration.json"
    monkeypatch.setenv(budget.CACHE_ENV_VAR, str(cache))
    (tmp_path / "main.yaml").write_text(RERUN_SWEEP)
    (tmp_path / "mine.yaml").write_text(RERUN_SWEEP)
    for folder in ("main", "mine", "fresh"):
        (tmp_path / folder).mkdir()
    uri = f"sqlite:///{tmp_path / 'main' / 'mlflow.db'}"
    main_args = ["--sweep", str(tmp_path / "main.yaml"), "--budget", "1m", "--workers", "1", "--tracking-uri", uri]
    done = run_sweep(*main_args, env=dict(os.environ), timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "chose the profile as written" in done.stdout, done.stdout
    main_cache = budget.cache_file(record.purpose(argparse.Namespace(sweep=str(tmp_path / "main.yaml"))))
    assert "Calibration: 1 step cost(s) measured 20" in done.stdout and f"1 from this machine's {main_cache}" in done.stdout
    [kept] = tracking.sweep_records(uri)
    assert kept["budget_s"] == 60 and list(kept["calibration"]) == list(json.loads(main_cache.read_text())["entries"])

    # another sweep of one's own: --budget 6m, its own store, --recalibrate (a dry run: it calibrates all the same)
    before = main_cache.read_bytes()
    mine = tmp_path / "mine" / "mlflow.db"
    code, out = _main(["--sweep", str(tmp_path / "mine.yaml"), "--budget", "6m", "--recalibrate",
                       "--tracking-uri", f"sqlite:///{mine}", "--dry-run"], capsys)
    assert code == 0 and "--recalibrate: step costs measured afresh" in out, out
    assert main_cache.read_bytes() == before and not mine.exists()

    # the main job's own calibration measured again, and slower: on a store without a record it sizes other workloads
    data = json.loads(before)
    for entry in data["entries"].values():
        entry["decode_s"], entry["prefill_token_s"] = entry["decode_s"] * 1e4, entry["prefill_token_s"] * 1e4
    main_cache.write_text(json.dumps(data))
    fresh = tmp_path / "fresh" / "mlflow.db"
    code, out = _main([*main_args[:-1], f"sqlite:///{fresh}", "--dry-run"], capsys)
    assert code == 0 and "chose level" in out and f"1 from this machine's {main_cache}" in out, out
    assert not fresh.exists()

    # the main job again: the store's record sizes it; nothing to run, nothing calibrated
    caplog.set_level(logging.INFO, logger="sweeps.budget")
    caplog.clear()
    code, out = _main([*main_args, "--dry-run"], capsys)
    assert code == 0 and "chose the profile as written" in out and "total: 1 trials, 1 already finished" in out, out
    assert f"1 as this store's record of sweep {kept['sweep_id']} keeps them" in out, out
    assert not [r for r in caplog.records if "calibrating" in r.getMessage()]
    # ... without built models too (the record's key needs only the zoo's recipe)
    monkeypatch.setenv(zoo.ZOO_ENV_VAR, str(tmp_path / "no-zoo"))
    code, out = _main([*main_args, "--dry-run"], capsys)
    assert code == 0 and "total: 1 trials, 1 already finished" in out, out
    # ... where nothing knows a step cost and the model is not built, the dry run times its architecture
    # with random weights (trials.models.zoo.stand_in) and sizes the plan all the same, writing no store
    monkeypatch.setenv(budget.CACHE_ENV_VAR, str(tmp_path / "no-calibration.json"))
    code, out = _main([*main_args[:-1], f"sqlite:///{fresh}", "--dry-run"], capsys)
    assert code == 0 and "the plan before --budget shrinks it" not in out and "chose the profile as written" in out, out
    assert "tiny-gqa" in out.split("Calibration (what one step costs here")[1] and not fresh.exists()
    assert not zoo.is_built("tiny-gqa")
    # another budget, --rerun: each says in one line that it measures again
    monkeypatch.setenv(budget.CACHE_ENV_VAR, str(cache))
    code, out = _main([*main_args, "--budget", "5m", "--dry-run"], capsys)
    assert "budget 5 min, not the 60 s this store's last sweep of this kind" in out, out
    code, out = _main([*main_args, "--rerun", "--dry-run"], capsys)
    assert "--rerun: every planned trial is measured again" in out and "total: 1 trials, 0 already finished" in out


def test_each_groups_estimate_is_within_a_quarter_of_a_recorded_make_run():
    """Four ``make run``s on a 2-core AMD EPYC (AVX-512): three from a fresh clone and "make run 2" on
    make run 1's store, recorded with ``python -m benchmarks.estimate_vs_measured ... --save``: their
    trials, each one's measured time and the step costs each run read. Estimated as the run estimated them (priority order, two workers,
    each worker's start, references and loaded models, fresh workers after a node-holding trial), each
    group's trials, those beside the llama.cpp tools' build included, agree with what they took within 25 %."""
    from pathlib import Path

    from benchmarks.estimate_vs_measured import AGREE, per_group

    recorded = json.loads((Path(__file__).parent / "data" / "recorded_sweeps.json").read_text())
    rows = per_group(recorded)
    assert {group for _, group in rows} == set(groups.implemented())
    far = {key: round(row["measured_s"] / row["estimated_s"], 2) for key, row in rows.items()
           if abs(row["measured_s"] / row["estimated_s"] - 1) > AGREE}
    assert not far, f"measured/estimated outside 1 +- {AGREE}: {far}"


def test_a_capacity_trial_near_the_ttft_limit_is_charged_its_search_by_the_chance_it_runs_one():
    """The single stream decides whether a capacity trial searches at all; its prefill-based prediction
    is uncertain near the limit, so the estimate weights the search by the chance it runs."""
    from trials.techniques.capacity.spec import TTFT_SPREAD, feasible_chance

    assert feasible_chance(0.5, 0.5) == 0.5
    assert feasible_chance(0.5 * (1 - TTFT_SPREAD), 0.5) == 1.0 and feasible_chance(0.1, 0.5) == 1.0
    assert feasible_chance(0.5 * (1 + TTFT_SPREAD), 0.5) == 0.0 and feasible_chance(5.0, 0.5) == 0.0
    assert feasible_chance(0.45, 0.5) > feasible_chance(0.55, 0.5)


def test_a_search_s_proposal_is_priced_by_its_own_configuration(real_models):
    """A searched slot runs what its search proposes, known only while the sweep runs: its estimate is
    the proposal's own (one slot starts its search lower and serves one request at a time), none where
    its weights' step was never calibrated (the sweep then keeps the slot's)."""
    from dataclasses import replace

    slot = groups.get("capacity").plan(["smollm2-135m-instruct"], PROFILES["quick"], "cpu")[0]
    costs = _costs([slot])
    one_slot, four_slots = (replace(slot, stack=replace(slot.stack, batch_size=n)) for n in (1, 4))
    assert budget.priced_alone(one_slot, costs) != budget.priced_alone(four_slots, costs)
    assert all(budget.priced_alone(c, costs) == budget.trial_seconds(c, costs) > 0 for c in (one_slot, four_slots))
    uncalibrated = replace(slot, stack=replace(slot.stack, precision="q8_0"))     # the plan calibrated only its slot's weights
    assert budget.priced_alone(uncalibrated, costs) is None


def test_perplexity_is_charged_at_the_scored_prefill_and_generation_at_the_last_position_one():
    """A prefill that scores every position (perplexity windows) pays the output layer per token, a
    generation's pays it once: Gemma-3's 262,144-row output layer makes the first ~2x the second. An
    older record, without the scored figure, charges its one prefill for both."""
    from dataclasses import replace

    plan = _plan()
    costs = _costs(plan)
    scored = {key: replace(cost, scored_token_s=10 * cost.prefill_token_s) for key, cost in costs.items()}
    quantization = next(c for c in plan if c.group == "quantization")
    baseline = next(c for c in plan if c.group == "baseline")
    assert budget.trial_seconds(quantization, scored) > budget.trial_seconds(quantization, costs)
    assert budget.trial_seconds(baseline, scored) == budget.trial_seconds(baseline, costs)
    assert all(cost.scored_s == cost.prefill_token_s for cost in costs.values())
