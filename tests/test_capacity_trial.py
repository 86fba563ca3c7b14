"""A capacity trial end to end: a real llama-server on SmolLM2's shipped Q4_1, driven by the real load
generator, its step curve measured by the real llama-bench.

A small load (a few requests a probe: the suite checks the path, the profiles send 20 and more) and
a loose SLO, so that the search finds a rate; then the three ways a trial ends without one: a limit
the single stream misses (infeasible), a budget that ends before the first probe (a lower bound),
and a ``-b`` its step curve says cannot meet the TPOT limit (skipped, no server started). After
every test no llama-server process is left.
"""

from __future__ import annotations

import math

import pytest

from conftest import assert_none_left, children_running
from trials.config import Load, Runtime, Stack, TrialConfig, Workload
from trials.run import run_trial

SMOL = "smollm2-135m-instruct"
WORKLOAD = Workload("mixed", 1, 16)
LOOSE = Load(requests=6, warmup=1, ttft_slo_s=3.0, tpot_slo_s=0.3, attainment=0.8)


def servers_left():
    return children_running(lambda line: "llama-server" in " ".join(line[:1]))


@pytest.fixture(autouse=True)
def no_server_left():
    yield
    assert_none_left(servers_left, "a llama-server process")


def config(load: Load = LOOSE, **stack) -> TrialConfig:
    fields = {"engine": "llama_server", "precision": "q4_1", "batch_size": 2, "step_tokens": 64, "threads": 1, **stack}
    return TrialConfig("capacity", SMOL, Stack(**fields), WORKLOAD, repeats=1, load=load)


@pytest.fixture(scope="module")
def measured(real_models):
    result = run_trial(config(), Runtime(num_threads=2))
    assert result.status == "FINISHED", result.error
    return result


def test_a_configuration_s_capacity_is_searched_probe_by_probe(measured):
    """Single stream first, then Poisson probes that double and bisect; each probe's attainment with
    its interval, kept as metrics and in the artifact; the predicted p95 ITL beside the measured one;
    the command line carries -b and the threads."""
    m, tags, raw = measured.metrics, measured.tags, measured.raw
    assert tags["capacity_status"] in ("measured", "lower_bound"), tags["capacity_note"]
    probes = raw["probes"]
    assert len(probes) == m["capacity_probes"] >= 2
    assert [p["point"] for p in raw["points"]][0] == "c1"
    for i, probe in enumerate(probes, start=1):
        assert m[f"p{i}_offered_rps"] == probe["rate"]
        assert m[f"p{i}_slo_attainment_low"] <= m[f"p{i}_slo_attainment"] <= m[f"p{i}_slo_attainment_high"]
        assert m[f"p{i}_passed"] == float(m[f"p{i}_slo_attainment"] >= LOOSE.attainment)
        assert m[f"p{i}_itl_s_p95_predicted"] > 0 and not math.isnan(m[f"p{i}_outside_cpu_cores"])
    assert probes[0]["rate"] == pytest.approx(m["single_stream_rps"])     # two slots: from the single-stream rate
    passing = [p["rate"] for p in probes if p["passed"]]
    assert m["capacity_rps"] == (max(passing) if passing else 0.0)
    if m["capacity_rps"] > 0:
        assert m["capacity_attainment"] >= LOOSE.attainment
        assert m["itl_s_p95_predicted"] > 0 and m["itl_s_p95"] > 0
    assert m["step_per_token_s"] > 0 and m["server_step_tokens"] == 64 and m["server_threads"] == 1
    # the server's own work per step, beyond llama-bench's compute, from its single stream's median ITL
    assert m["server_step_overhead_s"] == pytest.approx(max(0.0, m["c1_itl_s_p50"] - m["step_fixed_s"] - m["step_per_token_s"]))
    assert "--batch-size 64" in tags["user_code"] and "--threads 1" in tags["user_code"]
    requests = [r for p in raw["points"] for r in p["requests"]]
    assert all(r["output_tokens"] == WORKLOAD.max_new_tokens for r in requests if not r["error"])
    stopped = [p for p in probes if p["stopped"]]             # a probe that could no longer pass stopped
    assert all(not p["passed"] and p["attainment"] < LOOSE.attainment for p in stopped)
    assert all(r["error"].startswith("stopped: ") for r in requests if r["error"])
    assert "outside_cpu_cores" in m and tags["noisy_neighbour"] in ("True", "False")


def test_a_limit_the_single_stream_misses_is_infeasible_and_says_by_how_much(real_models):
    strict = Load(requests=4, warmup=1, ttft_slo_s=0.001, tpot_slo_s=0.3)
    result = run_trial(config(strict), Runtime(num_threads=2))
    assert result.status == "FINISHED", result.error
    assert result.tags["capacity_status"] == "infeasible" and result.metrics["capacity_rps"] == 0
    assert "one request at a time already misses" in result.tags["capacity_note"]
    assert "limit 1)" in result.tags["capacity_note"] and result.raw["probes"] == []
    assert result.metrics["slo_margin"] < 0 and result.metrics["ttft_ratio"] > 1


def test_a_budget_that_ends_before_a_probe_gives_a_lower_bound(real_models):
    from trials.techniques.capacity.runner import STOP_MARGIN_S

    result = run_trial(config(), Runtime(num_threads=2, time_limit_s=STOP_MARGIN_S + 1))
    assert result.status == "FINISHED", result.error
    assert result.tags["capacity_status"] == "lower_bound"
    assert "cut short by the budget" in result.tags["capacity_note"] and "lower bound" in result.tags["capacity_note"]
    assert math.isnan(result.metrics["capacity_rps_high"])


def test_a_step_size_that_cannot_meet_the_tpot_limit_is_skipped_before_any_load(real_models):
    tight = Load(requests=4, warmup=1, ttft_slo_s=3.0, tpot_slo_s=0.0005)
    result = run_trial(config(tight), Runtime(num_threads=2))
    assert result.status == "FINISHED", result.error
    assert result.tags["capacity_status"] == "skipped" and result.raw["points"] == []
    assert "ms" in result.tags["capacity_note"] and result.metrics["slo_margin"] < 0
