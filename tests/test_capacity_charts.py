"""The capacity section's four charts and the serving section's legends, from synthetic runs.

Capacity runs are logged through the real tracking API into a fresh sqlite store, following the
capacity group's metric and tag contract (``trials/techniques/capacity``): two real models, every
status (measured, lower bound, infeasible, skipped), probes ``p{i}_*``, measured and predicted ITL
per ``-b``, a search beside a grid. The figure functions are called directly on the frame the page
reads (no browser): each chart's traces, whiskers from the intervals, the lower bound marked, and
every line named in a legend. Serving runs of two models with different stacks check that every
stack of both is named in the serving charts' legends.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

import tracking
from trials.config import Load, Stack, TrialConfig, Workload
from trials.loop import TrialResult

GEMMA, SMOL = "gemma-3-270m", "smollm2-135m-instruct"
LOAD = Load(requests=20, warmup=2, ttft_slo_s=0.5, tpot_slo_s=0.05)
ORIGIN = {GEMMA: "4-bit-derived (GGUF Q4_K_M)", SMOL: "4-bit-derived (GGUF Q4_1)"}
NAN = math.nan


def _stack(precision: str, slots: int = 1, step: int = 0, kv: int = 16) -> Stack:
    return Stack(engine="llama_server", precision=precision, batch_size=slots, step_tokens=step,
                 kv_bits=kv, kv_backend="ggml" if kv != 16 else "none")


def _probes(rates_and_shares) -> dict[str, float]:
    """``p{i}_*`` metrics of probes (rate, share within the SLO), the interval +-5 points, passed at 90 %."""
    out = {}
    for i, (rate, share) in enumerate(rates_and_shares, start=1):
        out.update({f"p{i}_offered_rps": rate, f"p{i}_slo_attainment": share,
                    f"p{i}_slo_attainment_low": max(0.0, share - 0.05), f"p{i}_slo_attainment_high": min(1.0, share + 0.05),
                    f"p{i}_passed": float(share >= 0.9), f"p{i}_repeated": float(i == 2),
                    f"p{i}_outside_cpu_cores": 0.2 if i == 2 else 0.0,
                    f"p{i}_itl_s_p95": 0.01 * i, f"p{i}_itl_s_p95_predicted": 0.012 * i})
    return out


# (model, stack, status, capacity, low, high, probes, measured ITL, predicted ITL, search, search index)
RUNS = [
    (SMOL, _stack("q4_1", 2), "measured", 1.2, 1.0, 1.35, [(0.5, 1.0), (1.0, 0.95), (1.35, 0.7), (1.2, 0.92)],
     0.040, 0.045, "optuna", 1),
    (SMOL, _stack("q4_1", 2, step=128), "measured", 1.6, 1.4, 1.8, [(0.6, 1.0), (1.2, 1.0), (2.4, 0.3), (1.8, 0.8),
                                                                    (1.6, 0.93)], 0.020, 0.018, "optuna", 2),
    (SMOL, _stack("q4_1", 4, step=256, kv=8), "lower_bound", 0.8, 0.6, NAN, [(0.4, 1.0), (0.8, 0.95)],
     0.030, 0.028, "optuna", 3),
    (SMOL, _stack("q8_0", 1, step=64), "skipped", 0.0, 0.0, NAN, [], NAN, NAN, "optuna", 4),
    (SMOL, _stack("q4_1", 2), "measured", 1.1, 0.9, 1.3, [(0.5, 1.0), (1.1, 0.91)], 0.041, 0.045, "grid", 1),
    (SMOL, _stack("q4_1", 2, step=128), "measured", 1.5, 1.3, 1.7, [(0.7, 1.0), (1.5, 0.9)], 0.021, 0.018, "grid", 2),
    (GEMMA, _stack("q4_k_m", 1), "infeasible", 0.0, 0.0, NAN, [], NAN, NAN, "optuna", 1),
    (GEMMA, _stack("q4_0", 2, step=128), "measured", 0.3, 0.25, 0.34, [(0.2, 1.0), (0.4, 0.5), (0.3, 0.9)],
     0.045, 0.05, "optuna", 2),
    (GEMMA, _stack("q4_0", 2, step=512), "measured", 0.2, 0.18, 0.22, [(0.2, 0.91), (0.4, 0.2)],
     0.06, 0.055, None, None),          # a grid run from before the tags: the grid, in start order
]


def capacity_result(model, stack, status, cap, low, high, probes, itl, predicted, search, index,
                    tags: dict | None = None) -> TrialResult:
    """One capacity run's result as the capacity group's contract logs it (``RUNS``' fields)."""
    config = TrialConfig("capacity", model, stack, Workload("mixed", 1, 16), repeats=1, load=LOAD)
    metrics = {"capacity_rps": cap, "capacity_rps_low": low, "capacity_rps_high": high,
               "capacity_probes": float(len(probes)), "attainment_target": 0.9, "ttft_slo_s": 0.5,
               "tpot_slo_s": 0.05, "server_step_tokens": float(stack.step_tokens or 2048),
               "parallel_slots": float(stack.batch_size), "server_threads": 2.0, "single_stream_rps": 0.6,
               "slo_margin": cap if cap > 0 else -0.8, "outside_cpu_cores": 0.05, **_probes(probes)}
    if status in ("measured", "lower_bound"):
        metrics.update(capacity_attainment=0.92, capacity_attainment_low=0.85, capacity_attainment_high=0.97,
                       itl_s_p95=itl, itl_s_p95_predicted=predicted)
    tags = {**(tags or {}), "capacity_status": status, "capacity_note": f"synthetic {status}",
            "server_command": f"llama-server --model '<{model}>.{stack.precision}.gguf' --parallel {stack.batch_size}"}
    tags.setdefault("weights_origin", ORIGIN[model])
    if search:
        tags.update(search=search, search_id=f"{model}-{search}")
        metrics["search_index"] = float(index)
    return TrialResult(config, "FINISHED", metrics=metrics, tags=tags)


def log_capacity_runs(uri: str) -> list[str]:
    """The runs above, logged in order through the real tracking API; their run ids."""
    return [tracking.log_trial(uri, capacity_result(*run)) for run in RUNS]


def capacity_like(served: TrialResult) -> TrialResult:
    """A measured capacity run of a served run's model and stack, with its tags (its weights' origin,
    its machine): a real model's run in every group without a second server."""
    tags = {k: v for k, v in served.tags.items() if k not in ("config_hash", "subject_hash", "model", "group")}
    return capacity_result(served.config.model, served.config.stack, "measured", 1.0, 0.8, 1.2,
                           [(0.5, 1.0), (1.0, 0.93), (1.2, 0.6)], 0.03, 0.032, "grid", 1, tags=tags)


@pytest.fixture(scope="module")
def capacity_store(tmp_path_factory) -> str:
    uri = tracking.resolve_uri(f"sqlite:///{tmp_path_factory.mktemp('capacity-charts')}/mlflow.db")
    tracking.prepare_store(uri)
    log_capacity_runs(uri)
    return uri


@pytest.fixture(scope="module")
def charts(capacity_store) -> dict:
    from dashboard.sections import capacity

    return dict(capacity.figures(tracking.runs_frame(capacity_store, "capacity")))


def unnamed_lines(figure) -> list[str]:
    """Traces a reader cannot find in the legend: no name, or neither shown nor in a shown legend group."""
    shown = [t for t in figure.data if t.showlegend is not False and t.name]
    groups = {t.legendgroup for t in shown if t.legendgroup}
    return [f"{t.name!r} (group {t.legendgroup!r})" for t in figure.data
            if not t.name or (t.showlegend is False and t.legendgroup not in groups)]


def _by_name(figure) -> dict:
    return {t.name: t for t in figure.data}


def test_the_section_is_the_groups_and_draws_four_charts(charts):
    from dashboard.sections import all_sections, capacity
    from trials import groups

    assert capacity in all_sections() and capacity.TITLE == groups.get("capacity").title
    assert list(charts) == [capacity.CAPACITY_ID, capacity.ATTAINMENT_ID, capacity.SEARCH_ID, capacity.ITL_ID]
    for cid, figure in charts.items():
        assert figure.layout.title.text, cid
        assert not unnamed_lines(figure), (cid, unnamed_lines(figure))
        assert all(t.showlegend is not False or t.legendgroup for t in figure.data), cid


def test_capacity_per_configuration_sorted_with_intervals_and_a_lower_bound(charts):
    from dashboard.sections import capacity

    figure = charts[capacity.CAPACITY_ID]
    assert [a.text for a in figure.layout.annotations][:2] == [GEMMA, SMOL]       # one panel per model
    traces = _by_name(figure)
    measured = traces[f"{SMOL} · {capacity.STATUSES['measured'][0]}"]
    # the latest run per configuration (the grid's rerun of q4_1+b2 and of +step128), sorted by capacity
    assert list(measured.y) == ["llama_server:q4_1+b2", "llama_server:q4_1+b2+step128"]
    assert list(measured.x) == [1.1, 1.5]
    assert list(measured.error_x.arrayminus) == pytest.approx([0.2, 0.2])
    assert list(measured.error_x.array) == pytest.approx([0.2, 0.2])
    bound = traces[f"{SMOL} · {capacity.STATUSES['lower_bound'][0]}"]
    assert bound.marker.symbol.endswith("-open") and "triangle-right" in bound.marker.symbol
    assert list(bound.x) == [0.8] and list(bound.error_x.array) == [0.0]        # no upper whisker: open
    assert list(bound.error_x.arrayminus) == pytest.approx([0.2])
    skipped = traces[f"{SMOL} · {capacity.STATUSES['skipped'][0]}"]
    infeasible = traces[f"{GEMMA} · {capacity.STATUSES['infeasible'][0]}"]
    for trace, status in ((skipped, "skipped"), (infeasible, "infeasible")):
        assert list(trace.x) == [0.0]
        row = trace.customdata[0]
        assert status in row and f"synthetic {status}" in row
    axis = figure.layout.yaxis2             # SmolLM2's panel: lowest first, so the highest is on top
    assert list(axis.categoryarray) == ["llama_server:q8_0+step64", "llama_server:q4_1+kv8-ggml+b4+step256",
                                        "llama_server:q4_1+b2", "llama_server:q4_1+b2+step128"]
    # the real models' 4-bit-derived weights said where the numbers appear (the provenance hover)
    assert "4-bit-derived (GGUF Q4_1)" in measured.customdata[0][3]
    assert "--parallel 2" in measured.customdata[0][-1]


def test_attainment_against_offered_rate_per_configuration_with_the_target(charts):
    from dashboard.sections import capacity

    figure = charts[capacity.ATTAINMENT_ID]
    lines = [t for t in figure.data if not t.name.startswith("target")]
    assert {t.name for t in lines} == {"llama_server:q4_1+b2", "llama_server:q4_1+b2+step128",
                                       "llama_server:q4_1+kv8-ggml+b4+step256", "llama_server:q4_0+b2+step128",
                                       "llama_server:q4_0+b2+step512"}
    step128 = next(t for t in lines if t.name == "llama_server:q4_1+b2+step128")
    assert list(step128.x) == [0.7, 1.5] and list(step128.y) == [1.0, 0.9]      # the latest run, by rate
    assert list(step128.marker.symbol) == ["circle", "circle"]
    gemma = next(t for t in lines if t.name == "llama_server:q4_0+b2+step128")
    assert list(gemma.x) == [0.2, 0.3, 0.4] and list(gemma.marker.symbol) == ["circle", "circle", "circle-open"]
    assert list(gemma.error_y.array) == pytest.approx([0.0, 0.05, 0.05])
    assert list(gemma.error_y.arrayminus) == pytest.approx([0.05, 0.05, 0.05])
    assert any("run again" in t for t in gemma.text)
    targets = [t for t in figure.data if t.name.startswith("target")]
    assert len(targets) == 2 and all(list(t.y) == [0.9, 0.9] for t in targets)
    assert sum(t.showlegend is not False for t in targets) == 1


def test_the_search_trace_puts_the_search_beside_the_grid(charts):
    from dashboard.sections import capacity

    traces = _by_name(charts[capacity.SEARCH_ID])
    assert set(traces) == {f"{SMOL} · search (Optuna)", f"{SMOL} · grid (every configuration)",
                           f"{GEMMA} · search (Optuna)", f"{GEMMA} · grid (every configuration)"}
    search = traces[f"{SMOL} · search (Optuna)"]
    assert list(search.x) == [1, 2, 3, 4] and list(search.y) == [1.2, 1.6, 1.6, 1.6]   # best so far
    assert list(traces[f"{SMOL} · grid (every configuration)"].y) == [1.1, 1.5]
    assert list(traces[f"{GEMMA} · search (Optuna)"].y) == [0.0, 0.3]
    assert list(traces[f"{GEMMA} · grid (every configuration)"].x) == [1]       # untagged: start order


def test_p95_itl_against_step_tokens_measured_beside_predicted(charts):
    from dashboard.sections import capacity

    traces = _by_name(charts[capacity.ITL_ID])
    measured = traces[f"{SMOL} · llama_server:q4_1+b2 · measured"]
    predicted = traces[f"{SMOL} · llama_server:q4_1+b2 · predicted"]
    assert list(measured.x) == [128, 2048] and list(measured.y) == [0.021, 0.041]
    assert list(predicted.x) == [128, 2048] and list(predicted.y) == [0.018, 0.045]
    assert predicted.line.dash == "dash" and measured.legendgroup == predicted.legendgroup
    gemma = traces[f"{GEMMA} · llama_server:q4_0+b2 · measured"]
    assert list(gemma.x) == [128, 512]
    skipped = traces[f"{SMOL} · skipped -b (predicted to miss the TPOT limit)"]
    assert list(skipped.x) == [64] and list(skipped.y) == [0.05]


def test_no_capacity_runs_no_charts_and_the_page_says_what_to_run(tmp_path, capacity_store):
    from dashboard.sections import capacity
    from page import Page

    assert capacity.figures(pd.DataFrame()) == []
    assert capacity.figures(pd.DataFrame({"model": ["m"], "stack": ["s"]})) == []
    uri = tracking.resolve_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tracking.prepare_store(uri)
    assert "python sweeps/full.py --groups capacity" in Page(uri).text("capacity-empty")
    page = Page(capacity_store)
    assert {capacity.CAPACITY_ID, capacity.ATTAINMENT_ID, capacity.SEARCH_ID, capacity.ITL_ID} <= set(page.graph_ids())
    # the app's frame holds every run (``EVERY_RUN``): the grid's rerun of a configuration hides none
    # of the search's trials; runs without a tok/s are charted (``MEASURED_BY``)
    search = {t["name"]: t for t in page.figure(capacity.SEARCH_ID)["traces"]}[f"{SMOL} · search (Optuna)"]
    assert search["x"] == [1, 2, 3, 4]
    assert "infeasible" in json.dumps(page.figure(capacity.CAPACITY_ID)["traces"])
    assert "4-bit-derived" in page.text("capacity-real-models")
    assert "Poisson" in page.text("capacity-caption")


# ------------------------------------------------------------------------------ serving legends

SERVED = {GEMMA: [Stack(engine="llama_server", precision="q4_0"), Stack(engine="llama_server", precision="q4_0", batch_size=2)],
          SMOL: [Stack(engine="llama_server", precision="q4_1"),
                 Stack(engine="llama_server", precision="q4_1", batch_size=2, kv_bits=8, kv_backend="ggml")]}


def _served_metrics(slots: int) -> dict[str, float]:
    out = {"single_stream_rps": 1.0, "ttft_slo_s": 0.5, "tpot_slo_s": 0.05, "roofline_tok_per_s": 200.0,
           "weights_bytes": 1e8, "decode_bytes_per_step": 1.2e8, "memory_bandwidth_bytes_per_s": 1e10,
           "parallel_slots": float(slots)}
    for i, rate in enumerate((0.5, 2.0), start=1):
        out.update({f"r{i}_offered_rps": rate, f"r{i}_ttft_s_p95": 0.1 * i, f"r{i}_ttft_s_p95_low": 0.08 * i,
                    f"r{i}_ttft_s_p95_high": 0.12 * i, f"r{i}_itl_s_p95": 0.02 * i, f"r{i}_goodput_rps": rate / i})
    for n in (1, 2):
        out[f"c{n}_output_tok_per_s"] = 20.0 * n
    return out


def test_every_stack_of_every_served_model_is_named_in_each_serving_legend(tmp_path):
    from dashboard.sections import serving

    uri = tracking.resolve_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tracking.prepare_store(uri)
    for model, stacks in SERVED.items():
        for stack in stacks:
            config = TrialConfig("serving", model, stack, Workload("mixed", 1, 16), repeats=1,
                                 load=Load(rates=(0.5, 2.0), concurrency=(1, 2), requests=6))
            tracking.log_trial(uri, TrialResult(config, "FINISHED", metrics=_served_metrics(stack.batch_size)))
    labels = {s.label for stacks in SERVED.values() for s in stacks}
    assert "llama_server:q4_1" in labels
    for cid, figure in serving.figures(tracking.runs_frame(uri, "serving")):
        assert not unnamed_lines(figure), (cid, unnamed_lines(figure))
        in_legend = {t.name for t in figure.data if t.showlegend is not False}
        assert labels <= in_legend, (cid, labels - in_legend)


def test_the_results_page_table_lists_every_configuration_best_first(capacity_store):
    from dashboard.sections import capacity

    lines = capacity.report(tracking.runs_frame(capacity_store, capacity.GROUP))
    rows = [line for line in lines[2:] if line.startswith("| ")]
    assert lines[0].startswith("| model | configuration | status | capacity req/s [interval]") and rows
    for model in {row.split(" | ")[0][2:] for row in rows}:
        mine = [float(row.split(" | ")[3].split()[0]) for row in rows if row.startswith(f"| {model} |")]
        assert mine == sorted(mine, reverse=True)
    assert any("lower bound" in row for row in rows) and any("infeasible" in row for row in rows)
    assert not any("infeasible" in row and "lower bound" in row for row in rows)
