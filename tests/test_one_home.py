"""Ideas with one home each: a served run's point names (written by the runners, read by every
reader) and the latest run per key (every reader of a store's runs)."""

from __future__ import annotations

import math

import pandas as pd

from trials.measurement import point_names
from trials.measurement.point_names import Point
from trials.stats.runs import latest


def test_point_names_round_trip_and_split_a_run_by_point():
    for point in (point_names.SINGLE, point_names.concurrency(8), point_names.rate(3), point_names.probe(12),
                  point_names.probe(2, repeat=True)):
        assert point_names.parse(point.metric("ttft_s_p95")) == (point, "ttft_s_p95")
    assert point_names.SINGLE.metric("ttft_s_p95") == "c1_ttft_s_p95" and point_names.probe(2, True).name == "p2r"
    for column in ("tok_per_s", "c1", "x1_ttft", "r2r_ttft_s_p95", "capacity_rps"):
        assert point_names.parse(column) is None, column
    run = {"c1_ttft_s_p95": 0.2, "c4_ttft_s_p95": 0.5, "r2_offered_rps": 1.0, "r10_offered_rps": 4.0,
           "r2_ttft_s_p95": math.nan, "p1_slo_attainment": 0.95, "p1r_slo_attainment": 0.7, "tok_per_s": 9.0}
    assert point_names.split(run, point_names.RATE) == {Point("r", 2): {"offered_rps": 1.0},
                                                        Point("r", 10): {"offered_rps": 4.0}}
    assert list(point_names.split(run)) == [Point("c", 1), Point("c", 4), Point("p", 1), Point("r", 2), Point("r", 10)]
    assert point_names.split(run, point_names.PROBE, repeats=True)[Point("p", 1, True)] == {"slo_attainment": 0.7}


def test_latest_keeps_the_most_recently_started_run_per_key():
    frame = pd.DataFrame({"run_id": ["a", "b", "c", "d"], "stack": ["x", "x", "y", "y"],
                          "status": ["FINISHED", "FINISHED", "FINISHED", "FAILED"],
                          "start_time": pd.to_datetime(["2026-12-07 10:00", "2026-12-07 09:00",
                                                        "2026-12-07 08:00", "2026-12-07 11:00"])})
    assert list(latest(frame, "stack")["run_id"]) == ["a", "d"]
    assert list(latest(frame, ["stack"], finished=True)["run_id"]) == ["c", "a"]
    assert list(latest(frame, ["stack", "not a column"])["run_id"]) == ["a", "d"]
    assert list(latest(frame.drop(columns="start_time"), "stack")["run_id"]) == ["b", "d"]   # frame order
    assert len(latest(frame, "not a column")) == 4
