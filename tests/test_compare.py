"""Compare two sweeps: runs logged through the real tracking API into a real sqlite store, two
sweeps with a known injected difference, compared as the dashboard compares them."""

import pytest

import tracking
from dashboard import compare
from trials.config import Stack, TrialConfig, Workload
from trials.loop import TrialResult


def _config(model: str) -> TrialConfig:
    return TrialConfig(group="baseline", model=model, stack=Stack(precision="fp32"),
                       workload=Workload("mixed", 1, 8), repeats=3)


def _log(uri, sweep, model, tok_per_s, half_width):
    metrics = {"tok_per_s": tok_per_s, "tok_per_s_ci_low": tok_per_s - half_width,
               "tok_per_s_ci_high": tok_per_s + half_width, "peak_memory_bytes": 1e6}
    tracking.log_trial(uri, TrialResult(_config(model), "FINISHED", metrics, tags={"env.host": f"host-{sweep}"}),
                       sweep_id=sweep)


@pytest.fixture
def two_sweeps(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking.prepare_store(uri)
    _log(uri, "before", "tiny-gqa", 100.0, 5.0)
    _log(uri, "before", "tiny-mha", 100.0, 5.0)
    _log(uri, "before", "zoo-gqa", 100.0, 5.0)
    _log(uri, "after", "tiny-gqa", 200.0, 5.0)          # doubled: beyond both intervals
    _log(uri, "after", "tiny-mha", 103.0, 5.0)          # within the noise
    runs = tracking.RunsCache(uri)
    runs.refresh()
    return runs


def test_a_known_difference_is_highlighted_and_noise_is_not(two_sweeps):
    frame = two_sweeps.frame("baseline")
    assert [s["value"] for s in compare.sides({"baseline": frame}, "sweep")] == ["after", "before"]
    table = compare.compare(frame, "sweep", "before", "after").set_index("label")
    assert sorted(table.index) == ["tiny-gqa · fp32", "tiny-mha · fp32"]       # only configs in both
    assert table.loc["tiny-gqa · fp32", "ratio"] == pytest.approx(2.0)
    assert table.loc["tiny-gqa · fp32", "verdict"] == "changed beyond the intervals"
    assert table.loc["tiny-gqa · fp32", "ratio_low"] == pytest.approx(195 / 105)
    assert table.loc["tiny-mha · fp32", "ratio"] == pytest.approx(1.03)
    assert table.loc["tiny-mha · fp32", "verdict"] == "within the intervals"
    fig = compare.figure(compare.compare(frame, "sweep", "before", "after"), "baseline", "tok_per_s", "before", "after")
    bar = fig.data[0]
    assert list(bar.marker.color) == [compare.CHANGED, compare.SAME]
    assert "1 of 2 changed" in fig.layout.title.text


def test_sides_by_machine_and_a_run_without_interval(two_sweeps, tmp_path):
    frame = two_sweeps.frame("baseline")
    assert {s["value"] for s in compare.sides({"baseline": frame}, "machine")} == {"host-before", "host-after"}
    uri = two_sweeps.uri
    tracking.log_trial(uri, TrialResult(_config("tiny-gqa"), "FINISHED", {"tok_per_s": 150.0}), sweep_id="one-repeat")
    two_sweeps.refresh()
    table = compare.compare(two_sweeps.frame("baseline"), "sweep", "before", "one-repeat")
    assert list(table["verdict"]) == ["no interval (one repeat)"]
