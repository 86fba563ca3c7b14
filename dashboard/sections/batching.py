"""Static batching, across models: what a bigger batch buys, what each stream pays, where memory ends.

A decode step reads every weight once whatever the batch, so aggregate throughput climbs with batch
size until the step turns compute-bound, while each stream slows down and the KV cache grows with the
batch until the device runs out of memory. Three charts, one line per model:

1. aggregate decode tok/s vs batch size, with the bandwidth roofline of each model dashed beside it
   (``roofline_tok_per_s``: batch x measured memory bandwidth / bytes one step reads);
2. tok/s per stream vs batch size;
3. peak memory vs batch size, measured (solid) and predicted (dotted), with the memory budget or the
   device's memory as a horizontal line and an ``oom`` cross where a trial did not fit.

The frame holds every run of the group (``RUN_STATUS = None``): FINISHED runs draw the lines, FAILED
runs whose reason starts with ``oom`` mark the boundary. Numbers come from ``trials/techniques/batching/runner.py``.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from dashboard.sections.common import (MB, OOM, PROVENANCE_HOVER, count_range, device_names, finished_only, has,
                                       latest, oom_rows, points)

GROUP = "batching"
TITLE = "Static batching — across models"
BLURB = ("One weight read serves every row of a batch: how far does total throughput climb with "
         "batch size, what does each stream pay, and where does memory run out?")
RUN_STATUS = None          # FINISHED and FAILED runs: FAILED 'oom' runs mark the memory boundary
THROUGHPUT_ID, PER_STREAM_ID, MEMORY_ID = "batching-throughput", "batching-per-stream", "batching-memory"
KEYS = ["model", "precision", "batch_size", "device"]
COLORS = qualitative.Plotly


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The latest run per configuration, whatever its status, with a series name per model."""
    rows = latest(frame, KEYS)
    if "status" not in rows.columns:
        rows["status"] = "FINISHED"
    rows["series"] = rows["model"].astype(str)
    if "precision" in rows.columns and rows["precision"].nunique() > 1:
        rows["series"] += " " + rows["precision"].astype(str)
    for column in ("peak_memory_bytes", "predicted_peak_memory_bytes"):
        if column in rows.columns:
            rows[column.replace("_bytes", "_mib")] = pd.to_numeric(rows[column], errors="coerce") / MB
    return rows


def _colors(series: list[str]) -> dict[str, str]:
    return {s: COLORS[i % len(COLORS)] for i, s in enumerate(series)}


def _log2_axes(figure: go.Figure, log_y: bool) -> go.Figure:
    figure.update_xaxes(type="log", dtick=0.30102999566, tickformat="d")   # one tick per power of 2
    if log_y:
        figure.update_yaxes(type="log")
    return figure


def _recolor(figure: go.Figure, colors: dict[str, str]) -> None:
    for trace in figure.data:
        trace.update(line=dict(color=colors[trace.name]), marker=dict(color=colors[trace.name]))


def _roofline_traces(figure: go.Figure, rows: pd.DataFrame, order: list[str],
                     colors: dict[str, str]) -> None:
    for series in order:
        part = rows[rows["series"] == series].sort_values("batch_size")
        part = part[part["roofline_tok_per_s"].notna()]
        if part.empty:
            continue
        custom = [[f"{bw / 1e9:.1f} GB/s", f"{step / MB:.1f} MB", f"{ratio:.2f}"]
                  for bw, step, ratio in zip(part["memory_bandwidth_bytes_per_s"],
                                             part["decode_bytes_per_step"], part["roofline_ratio"])]
        figure.add_trace(go.Scatter(
            name=f"{series} roofline", x=[float(v) for v in part["batch_size"]],
            y=[float(v) for v in part["roofline_tok_per_s"]], mode="lines",
            line=dict(color=colors[series], dash="dash", width=1.5), customdata=custom,
            hovertemplate=(f"<b>{series} roofline</b><br>batch size: %{{x}}<br>ceiling: %{{y:.1f}} "
                           "tok/s<br>= batch x %{customdata[0]} / %{customdata[1]} per step"
                           "<br>measured / roofline: %{customdata[2]}<extra></extra>")))


def throughput_figure(rows: pd.DataFrame, order: list[str], colors: dict[str, str]) -> go.Figure:
    finished = finished_only(rows)
    figure = points(finished, x="batch_size", y="tok_per_s", series="series", series_order=order,
                    title="Aggregate decode throughput vs batch size (dashed: bandwidth roofline)",
                    x_title="batch size", y_title="tok/s (all streams)")
    _recolor(figure, colors)
    if "roofline_tok_per_s" in finished.columns:
        _roofline_traces(figure, finished, order, colors)
    return _log2_axes(figure, log_y=True)


def per_stream_figure(rows: pd.DataFrame, order: list[str], colors: dict[str, str]) -> go.Figure:
    figure = points(finished_only(rows), x="batch_size", y="per_stream_tok_per_s", series="series",
                    series_order=order, title="Per-stream decode throughput vs batch size",
                    x_title="batch size", y_title="tok/s per stream")
    _recolor(figure, colors)
    return _log2_axes(figure, log_y=False)


def _budget_lines(figure: go.Figure, rows: pd.DataFrame) -> None:
    for column, label in (("memory_budget_bytes", "memory budget"),
                          ("device_memory_bytes", "device memory")):
        if column not in rows.columns:
            continue
        for value in sorted(set(pd.to_numeric(rows[column], errors="coerce").dropna())):
            figure.add_hline(y=value / MB, line=dict(color="#c0392b", dash="dot", width=1.5))
            # annotations on a log axis take log10 coordinates (shapes take data values)
            figure.add_annotation(text=f"{label} {value / MB:.4g} MiB", x=0, xref="paper",
                                  xanchor="left", y=math.log10(value / MB), yref="y",
                                  yanchor="bottom", showarrow=False, font=dict(color="#c0392b"))


def _oom_height(part: pd.DataFrame) -> list[float]:
    """Where a cross sits: the measured peak if the trial ran, else its predicted peak."""
    nan = pd.Series(float("nan"), index=part.index)
    measured = part["peak_memory_mib"] if "peak_memory_mib" in part.columns else nan
    predicted = part["predicted_peak_memory_mib"] if "predicted_peak_memory_mib" in part.columns else nan
    return [float(v) for v in measured.fillna(predicted)]


def _oom_traces(figure: go.Figure, rows: pd.DataFrame, order: list[str],
                colors: dict[str, str]) -> None:
    failed = oom_rows(rows)
    for series in order:
        part = failed[failed["series"] == series].sort_values("batch_size")
        if part.empty:
            continue
        figure.add_trace(go.Scatter(
            name=f"{series} oom", x=[float(v) for v in part["batch_size"]],
            y=_oom_height(part), mode="markers+text", text=["oom"] * len(part),
            textposition="top center",
            marker=dict(symbol="x", size=14, color=colors[series], line=dict(width=2)),
            customdata=OOM.rows(part),
            hovertemplate=(f"<b>{series}: did not fit</b><br>batch size: %{{x}}<br>"
                           + OOM.lines("reason") + PROVENANCE_HOVER + "<extra></extra>")))


def memory_figure(rows: pd.DataFrame, order: list[str], colors: dict[str, str]) -> go.Figure:
    finished = finished_only(rows)
    figure = points(finished, x="batch_size", y="peak_memory_mib", series="series",
                    series_order=order, title="Peak memory vs batch size (dotted: predicted)",
                    x_title="batch size", y_title="peak memory (MiB)")
    _recolor(figure, colors)
    if "predicted_peak_memory_mib" in finished.columns:
        for series in order:
            part = finished[finished["series"] == series].sort_values("batch_size")
            figure.add_trace(go.Scatter(
                name=f"{series} predicted", x=[float(v) for v in part["batch_size"]],
                y=[float(v) for v in part["predicted_peak_memory_mib"]], mode="lines",
                line=dict(color=colors[series], dash="dot", width=1.5),
                hovertemplate=(f"<b>{series} predicted</b><br>batch size: %{{x}}<br>"
                               "weights + exact KV + activation estimate: %{y:.1f} MiB"
                               "<extra></extra>")))
    _oom_traces(figure, rows, sorted(colors), colors)
    _budget_lines(figure, rows)
    return _log2_axes(figure, log_y=True)


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, "model", "batch_size", "tok_per_s"):
        return []
    rows = _rows(frame)
    finished = finished_only(rows)
    if finished.empty:
        return []
    colors = _colors(sorted(rows["series"].unique()))
    order = sorted(finished["series"].unique())
    result = [(THROUGHPUT_ID, throughput_figure(rows, order, colors))]
    if "per_stream_tok_per_s" in finished.columns:
        result.append((PER_STREAM_ID, per_stream_figure(rows, order, colors)))
    if "peak_memory_mib" in finished.columns:
        result.append((MEMORY_ID, memory_figure(rows, order, colors)))
    return result


def caption(frame: pd.DataFrame) -> str:
    if not has(frame, "model", "batch_size", "tok_per_s"):
        return ""
    rows = _rows(frame)
    finished = finished_only(rows)
    if finished.empty:
        return ""
    matched = "n/a"
    if "outputs_match_batch1" in finished.columns:
        values = pd.to_numeric(finished["outputs_match_batch1"], errors="coerce")
        matched = f"{int((values == 1).sum())} of {len(values)}"
    ooms = oom_rows(rows)
    boundary = (f" {len(ooms)} configuration(s) did not fit (oom crosses)." if len(ooms) else "")
    return (f"Median over {count_range(finished, 'repeats')} repeats, greedy, "
            f"{count_range(finished, 'max_new_tokens')} new tokens per row; every prompt cut to the "
            f"same {count_range(finished, 'prompt_tokens')} tokens, so only the batch size changes. "
            f"Rows equal to the same prompt decoded alone (outputs_match_batch1 = 1): {matched} "
            f"trials.{boundary} Roofline: measured copy bandwidth / (weights + KV) bytes per decode "
            f"step. Device: {device_names(finished)}. Latest run per model and batch size; hover a "
            "point for where it came from.")


SATURATION_GAIN = 0.05        # a batch "stops gaining" when tok/s rises by less than this


def report(frame: pd.DataFrame) -> list[str]:
    """tok/s per batch size, and where one more doubling stops paying (what sizes the quick ladder)."""
    if frame.empty:
        return []
    lines = ["| model | tok/s by batch | stops gaining at |", "| --- | --- | --- |"]
    for model, part in frame.groupby("model"):
        by_batch = part.groupby("batch_size")["tok_per_s"].median().sort_index()
        ladder = ", ".join(f"{int(b)}: {v:.0f}" for b, v in by_batch.items())
        gains = by_batch.pct_change().dropna()
        flat = gains[gains < SATURATION_GAIN]
        stop = f"batch {int(flat.index[0])} (+{flat.iloc[0]:.1%})" if len(flat) else "not within the ladder"
        growth = by_batch.iloc[0] * by_batch.index / by_batch       # step cost at b over step cost at 1
        per_row = ((growth - 1) / (by_batch.index - 1)).iloc[1:].median() if len(by_batch) > 1 else float("nan")
        lines.append(f"| {model} | {ladder} | {stop}; decode step grows ~{per_row:.3f} per extra row |")
    return lines
