"""Each engine's trials are sized from that engine's own step: llama.cpp times its GGUF of the trial's
type (the tiny zoo's, converted by llama.cpp's converter), its server reads the same step, and the
calibration cache keeps it under its engine beside the default engine's entries of the old shape."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sweeps import budget
from sweeps.spaces import PROFILES
from trials import groups
from trials.config import Load, Stack, TrialConfig, Workload
from trials.models.registry import get_model

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make setup installs it)")

LLAMA = budget.step_label("llama_cpp", "f16")


@pytest.fixture
def fresh(tiny_zoo, tmp_path, monkeypatch):
    """A calibration cache and GGUF folder of this test's own."""
    from trials.engines.llama_cpp import gguf

    monkeypatch.setenv(budget.CACHE_ENV_VAR, str(tmp_path / "calibration.json"))
    monkeypatch.setenv(gguf.GGUF_DIR_ENV, str(tmp_path / "gguf"))
    return tmp_path / "calibration.json"


def _calibrations(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("calibrating")]


def test_an_engine_measured_pair_is_keyed_and_cached_per_engine(fresh, caplog):
    """tiny-gqa on transformers (fp32) and on llama.cpp (its F16 GGUF): two measurements, two cache
    entries; the default engine's key keeps the shape every older cache holds, llama.cpp's names its
    engine and the binding's version. A second calibration reads both back, measuring nothing."""
    import llama_cpp

    model = get_model("tiny-gqa")
    pairs = {(model, "fp32"), (model, LLAMA)}
    with caplog.at_level("INFO", logger="sweeps.budget"):
        first = budget.calibrate(pairs, "cpu", threads=1)
    assert set(first) == {("tiny-gqa", "fp32"), ("tiny-gqa", LLAMA)}
    assert all(c.decode_s > 0 and c.prefill_token_s > 0 and c.load_s >= 0 for c in first.values())
    # transformers times a prefill scoring every position apart (perplexity); llama.cpp's keeps the last only
    assert first[("tiny-gqa", "fp32")].scored_token_s > 0 and first[("tiny-gqa", LLAMA)].scored_token_s is None
    stored = json.loads(fresh.read_text())["entries"]
    [own] = [key for key in stored if f"|{LLAMA}|" in key]
    [default] = [key for key in stored if key != own]
    assert own.endswith(f"|llama_cpp={llama_cpp.__version__}")
    assert default.split("|")[:3] == ["tiny-gqa", "fp32", "cpu"] and "llama_cpp" not in default
    caplog.clear()
    with caplog.at_level("INFO", logger="sweeps.budget"):
        assert budget.calibrate(pairs, "cpu", threads=1) == first
    assert not _calibrations(caplog)


def test_a_llama_cpp_trial_reads_llama_cpps_step_and_its_server_the_same(tiny_zoo):
    """A llama.cpp trial of the engines group is estimated from llama.cpp's step at its own type (not
    transformers' fp32 step, which only its reference run reads), and a served trial on llama.cpp's
    server from the same llama.cpp step: its estimate follows that step and ignores fp32's."""
    [engines_trial] = [c for c in groups.get("engines").plan(["tiny-gqa"], PROFILES["quick"], "cpu")
                       if c.stack.engine == "llama_cpp" and c.stack.label == "llama_cpp:q8_0"]
    served = TrialConfig("serving", "tiny-gqa", Stack(precision="f16", batch_size=4, engine="llama_server"),
                         Workload("mixed", prompts_per_type=1, max_new_tokens=32),
                         load=Load(rates=(0.5, 1, 2, 4), concurrency=(1, 4), requests=20, warmup=2))
    assert budget.calibrated_as(engines_trial) == budget.step_label("llama_cpp", "q8_0")
    assert budget.calibrated_as(served) == LLAMA
    model = get_model("tiny-gqa")
    assert (model, budget.step_label("llama_cpp", "q8_0")) in budget.pairs_needed([engines_trial])
    assert budget.pairs_needed([served]) == {(model, LLAMA)}

    step = budget.StepCost(0.002, 0.0005, 0.1)
    costs = {("tiny-gqa", "fp32"): budget.StepCost(0.05, 0.01, 1.0), ("tiny-gqa", LLAMA): step,
             ("tiny-gqa", budget.step_label("llama_cpp", "q8_0")): step}
    slower_fp32 = {**costs, ("tiny-gqa", "fp32"): budget.StepCost(0.5, 0.1, 1.0)}
    slower_llama = {**costs, ("tiny-gqa", LLAMA): replace(step, decode_s=0.02, prefill_token_s=0.005)}
    assert budget.trial_seconds(served, slower_fp32) == budget.trial_seconds(served, costs)
    assert budget.trial_seconds(served, slower_llama) > 5 * budget.trial_seconds(served, costs) / 2
    slower_q8 = {**costs, ("tiny-gqa", budget.step_label("llama_cpp", "q8_0")): replace(step, decode_s=0.02)}
    assert budget.trial_seconds(engines_trial, slower_q8) > budget.trial_seconds(engines_trial, costs)


def test_a_damaged_entry_is_measured_again_and_an_old_record_sizes_as_it_did(fresh, caplog):
    """An entry of another shape under llama.cpp's key (an older format, a hand edit) is measured
    again and replaced. A store record from before engines measured their own steps sized llama.cpp
    trials from the fp32 reference step: a rerun reads that step for them (same workloads, same
    configs), while a record of this shape is read as it is."""
    model = get_model("tiny-gqa")
    budget.calibrate({(model, "fp32"), (model, LLAMA)}, "cpu", threads=1)
    entries = json.loads(fresh.read_text())["entries"]
    [own] = [key for key in entries if f"|{LLAMA}|" in key]
    [reference] = [key for key in entries if key != own]
    fresh.write_text(json.dumps({"format": budget.CALIBRATION_FORMAT,
                                 "entries": {**entries, own: {"decode_ms": 3.0}}}))
    with caplog.at_level("INFO", logger="sweeps.budget"):
        again = budget.calibrate({(model, LLAMA)}, "cpu", threads=1)
    assert _calibrations(caplog) and again[("tiny-gqa", LLAMA)].decode_s > 0
    assert budget.StepCost(**json.loads(fresh.read_text())["entries"][own]) == again[("tiny-gqa", LLAMA)]
    # a cached entry from before the scored prefill was timed apart: its prefill scored every position
    older = {k: v for k, v in entries[reference].items() if k != "scored_token_s"}
    fresh.write_text(json.dumps({"format": budget.CALIBRATION_FORMAT, "entries": {**entries, reference: older}}))
    caplog.clear()
    with caplog.at_level("INFO", logger="sweeps.budget"):
        remeasured = budget.calibrate({(model, "fp32")}, "cpu", threads=1)
    assert _calibrations(caplog) and remeasured[("tiny-gqa", "fp32")].scored_token_s > 0

    sized = {"decode_s": 0.25, "prefill_token_s": 0.05, "load_s": 1.0, "measured_at": "then"}
    old_record = budget.legacy_entries({reference: sized})
    caplog.clear()
    with caplog.at_level("INFO", logger="sweeps.budget"):
        costs = budget.calibrate({(model, LLAMA)}, "cpu", threads=1, recorded=old_record)
    assert costs == {("tiny-gqa", LLAMA): budget.StepCost(**sized)} and not _calibrations(caplog)
    new_record = {own: {**sized, "decode_s": 0.125}, **old_record}
    assert budget.calibrate({(model, LLAMA)}, "cpu", threads=1, recorded=new_record)[("tiny-gqa", LLAMA)].decode_s == 0.125
