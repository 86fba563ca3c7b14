"""Weight quantization: what fewer bits per weight buy in speed and memory, and cost in quality.

Decode reads every weight once per token, so fewer bytes per weight should decode faster and fit in
less memory, at some perplexity cost. Whether it is faster depends on the kernels (bitsandbytes int8
dequantizes on every matmul and is often slower than 16-bit at batch 1), and how much memory it saves
depends on how much of the model is quantized (embeddings and norms are not), so every chart is
measured, per model, under a model selector:

1. Speed vs quality: decode tok/s against held-out perplexity; Pareto-optimal precisions (no other
   precision is both faster and at least as good, or better and at least as fast) are ringed and joined.
2. Perplexity per precision (lower is better), the reference precision's as a dashed line.
3. Decode throughput per precision, whiskers the 95 % interval over repeats.
4. Memory: real weight storage and the peak during decode (bars), with the nominal prediction
   (quantized weights x bits + the rest unquantized) and what ``get_memory_footprint()`` claims (marks).

Above them one chart of every model: speed-up against perplexity change, each relative to the same
model's reference precision. The caption checks the expected ordering for every model (8-bit within
``INT8_TOLERANCE`` of bf16; 4-bit at or above 8-bit) and names every break rather than hiding it.
Numbers come from ``trials.techniques.quantization.runner`` via one query, ``tracking.runs_frame``.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from dashboard.sections.common import (TEMPLATE, MB, PROVENANCE, PROVENANCE_HOVER, Hover, WHISKERS, count_range, device_names, has,
                                       latest, precision_order, spread_error_bars)
from trials.config import FOUR_BIT_WEIGHTS, PRECISIONS
from trials.techniques.quantization.space import GPTQ_EXTRA

GROUP = "quantization"
TITLE = "Quantization — bf16 / 8-bit / 4-bit"
BLURB = ("Fewer bits per weight: how much faster and smaller does each model get, and what does "
         "it cost in perplexity?")
DEEP_DIVE_TITLE = "Per model: speed, quality and memory by precision"
OVERVIEW_ID = "quantization-overview"
PARETO_ID, PERPLEXITY_ID = "quantization-pareto", "quantization-perplexity"
THROUGHPUT_ID, MEMORY_ID = "quantization-throughput", "quantization-memory"

INT8_TOLERANCE = 0.02          # "8-bit within a small delta of bf16": relative perplexity change
COLORS = dict(zip(PRECISIONS, qualitative.Plotly))
LAYOUT = dict(template=TEMPLATE, margin=dict(l=60, r=20, t=60, b=50), height=420)
QUALITY = PROVENANCE + Hover(
    ("perplexity", "perplexity", "perplexity", "{:.3f}"),
    ("reference", "reference", lambda row: _reference(row), "{}"),
    ("token_match", "token match vs reference", "fidelity_token_match", "{:.1%}"),
)
QUALITY_HOVER = QUALITY.lines("perplexity", "reference", "token_match")


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Latest run per model, precision and device; ``label`` names the precision (and device)."""
    rows = latest(frame, ["model", "precision", "device"])
    multi_device = "device" in rows.columns and rows["device"].nunique() > 1
    rows["label"] = rows["precision"] + (" (" + rows["device"] + ")" if multi_device else "")
    return rows


def _ordered(rows: pd.DataFrame) -> pd.DataFrame:
    order = precision_order(rows["precision"])
    return rows.assign(_o=rows["precision"].map(order.index)).sort_values(["_o", "label"]).drop(columns="_o")


def _num(row: pd.Series, column: str) -> float | None:
    value = pd.to_numeric(row.get(column), errors="coerce")
    return None if pd.isna(value) else float(value)


def _reference(row: dict) -> str | None:
    ref = _num(row, "reference_perplexity")
    return None if ref is None else f"{ref:.3f} ({row.get('tags.reference_precision') or 'reference'})"


def _customdata(rows: pd.DataFrame) -> list[list[str]]:
    return QUALITY.rows(rows)


def pareto_optimal(rows: pd.DataFrame, x: str = "perplexity", y: str = "tok_per_s") -> list[bool]:
    """Per row: no other row has ``x`` at most and ``y`` at least as good, and one strictly better."""
    points = list(zip(rows[x].astype(float), rows[y].astype(float)))
    return [not any(px <= qx and py >= qy and (px < qx or py > qy) for px, py in points)
            for qx, qy in points]


# ------------------------------------------------------------------------------ overview

def _relative(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with ``speedup`` and ``perplexity_change_pct`` against their model's reference run."""
    if "tags.reference_precision" not in rows.columns:
        return rows.iloc[0:0]
    parts = []
    for (_, _), part in rows.groupby(["model", "device"]):
        reference = part[part["precision"] == part["tags.reference_precision"]]
        if reference.empty:
            continue
        base = float(reference["tok_per_s"].iloc[0])
        parts.append(part.assign(speedup=part["tok_per_s"].astype(float) / base,
                                 perplexity_change_pct=100 * (part["perplexity_ratio"].astype(float) - 1)))
    return pd.concat(parts) if parts else rows.iloc[0:0]


def overview(rows: pd.DataFrame) -> go.Figure:
    relative = _relative(rows)
    figure = go.Figure()
    references = set(relative.get("tags.reference_precision", pd.Series(dtype=str)).dropna())
    for precision in precision_order(relative["precision"]) if not relative.empty else []:
        part = relative[relative["precision"] == precision]
        figure.add_trace(go.Scatter(   # reference points all sit at (0, 1): no labels there
            name=precision, x=[float(v) for v in part["perplexity_change_pct"]],
            y=[float(v) for v in part["speedup"]],
            mode="markers" if precision in references else "markers+text", text=list(part["model"]),
            textposition="top center", marker=dict(size=11, color=COLORS.get(precision)),
            customdata=_customdata(part),
            hovertemplate=f"<b>%{{text}}</b> · {precision}<br>perplexity change: %{{x:+.2f}}%<br>"
                          "speed-up vs reference: %{y:.2f}x<br>" + QUALITY_HOVER + PROVENANCE_HOVER
                          + "<extra></extra>"))
    figure.add_hline(y=1, line_dash="dot", line_color="#888")
    figure.add_vline(x=0, line_dash="dot", line_color="#888")
    figure.update_layout(title="Every model: speed-up against perplexity change, vs its reference precision",
                         xaxis_title="perplexity change vs reference (%, lower is better)",
                         yaxis_title="decode speed-up vs reference (x)", legend_title="precision",
                         **LAYOUT)
    return figure


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, "model", "precision", "tok_per_s", "perplexity"):
        return []
    return [(OVERVIEW_ID, overview(_rows(frame)))]


# ------------------------------------------------------------------------------ per model

def deep_dive_models(frame: pd.DataFrame) -> list[str]:
    if not has(frame, "model", "precision", "tok_per_s", "perplexity"):
        return []
    return sorted(frame["model"].dropna().unique())


def _category_axis(figure: go.Figure, rows: pd.DataFrame) -> None:
    figure.update_xaxes(categoryorder="array", categoryarray=list(rows["label"]), title="precision")


def pareto(rows: pd.DataFrame, model: str) -> go.Figure:
    figure = go.Figure()
    for _, part in rows.groupby("label", sort=False):
        precision = part["precision"].iloc[0]
        ys = [float(v) for v in part["tok_per_s"]]
        figure.add_trace(go.Scatter(
            name=part["label"].iloc[0], x=[float(v) for v in part["perplexity"]], y=ys,
            mode="markers+text", text=list(part["label"]), textposition="top center",
            error_y=spread_error_bars(part, "tok_per_s", ys),
            marker=dict(size=12, color=COLORS.get(precision)), customdata=_customdata(part),
            hovertemplate="<b>%{text}</b><br>perplexity: %{x:.3f}<br>tok/s: %{y:.1f}<br>"
                          + QUALITY_HOVER + PROVENANCE_HOVER + "<extra></extra>"))
    front = rows[pareto_optimal(rows)].sort_values("perplexity")
    figure.add_trace(go.Scatter(
        name="Pareto-optimal", x=[float(v) for v in front["perplexity"]],
        y=[float(v) for v in front["tok_per_s"]], mode="lines+markers", text=list(front["label"]),
        line=dict(color="#444", dash="dash"),
        marker=dict(size=22, symbol="circle-open", color="#444", line=dict(width=2)),
        hovertemplate="<b>%{text}</b> is Pareto-optimal<extra></extra>"))
    figure.update_layout(title=f"{model}: speed vs quality (up and left is better)",
                         xaxis_title="held-out perplexity (lower is better)",
                         yaxis_title="decode tok/s (higher is better)", legend_title="precision",
                         **LAYOUT)
    return figure


def perplexity_chart(rows: pd.DataFrame, model: str) -> go.Figure:
    ratios = [_num(row, "perplexity_ratio") for _, row in rows.iterrows()]
    figure = go.Figure(go.Scatter(
        name="perplexity", x=list(rows["label"]), y=[float(v) for v in rows["perplexity"]],
        mode="markers+text", text=["" if r is None else f"{100 * (r - 1):+.2f}%" for r in ratios],
        textposition="top center", customdata=_customdata(rows),
        marker=dict(size=14, color=[COLORS.get(p) for p in rows["precision"]]),
        hovertemplate="<b>%{x}</b><br>perplexity: %{y:.3f} (%{text} vs reference)<br>"
                      + QUALITY_HOVER + PROVENANCE_HOVER + "<extra></extra>"))
    reference = rows[rows["precision"] == rows.get("tags.reference_precision")]
    if not reference.empty:
        figure.add_hline(y=float(reference["perplexity"].iloc[0]), line_dash="dash", line_color="#888",
                         annotation_text=f"reference ({reference['precision'].iloc[0]})",
                         annotation_position="bottom right")
    _category_axis(figure, rows)
    figure.update_layout(title=f"{model}: held-out perplexity (lower is better)",
                         yaxis_title="perplexity", showlegend=False, **LAYOUT)
    return figure


def throughput_chart(rows: pd.DataFrame, model: str) -> go.Figure:
    ys = [float(v) for v in rows["tok_per_s"]]
    figure = go.Figure(go.Bar(
        name="tok/s", x=list(rows["label"]), y=ys, error_y=spread_error_bars(rows, "tok_per_s", ys),
        marker_color=[COLORS.get(p) for p in rows["precision"]], customdata=_customdata(rows),
        hovertemplate="<b>%{x}</b><br>tok/s: %{y:.1f}<br>" + QUALITY_HOVER + PROVENANCE_HOVER
                      + "<extra></extra>"))
    _category_axis(figure, rows)
    figure.update_layout(title=f"{model}: decode throughput (higher is better)", yaxis_title="tok/s",
                         showlegend=False, **LAYOUT)
    return figure


def memory_chart(rows: pd.DataFrame, model: str) -> go.Figure:
    figure = go.Figure()
    custom = _customdata(rows)
    bars = (("weights_bytes", "weights (real storage)"), ("peak_memory_bytes", "peak during decode"))
    marks = (("weights_bytes_nominal", "nominal: bits x weights", "line-ew-open"),
             ("hf_memory_footprint_bytes", "get_memory_footprint() claims", "x-thin-open"))
    for column, name in bars:
        if column in rows.columns:
            figure.add_trace(go.Bar(
                name=name, x=list(rows["label"]), y=[float(v) / MB for v in rows[column]], offsetgroup=column,
                customdata=custom, hovertemplate=f"<b>%{{x}}</b><br>{name}: %{{y:.2f}} MB<br>"
                                                 + PROVENANCE_HOVER + "<extra></extra>"))
    for column, name, symbol in marks:
        if column in rows.columns and rows[column].notna().any():
            figure.add_trace(go.Scatter(
                name=name, x=list(rows["label"]), y=[float(v) / MB for v in rows[column]],
                mode="markers", marker=dict(symbol=symbol, size=26, line=dict(width=3)),
                offsetgroup="weights_bytes",          # over the real-storage bar they predict
                hovertemplate=f"<b>%{{x}}</b><br>{name}: %{{y:.2f}} MB<extra></extra>"))
    _category_axis(figure, rows)
    figure.update_layout(title=f"{model}: device memory", yaxis_title="MB", barmode="group",
                         scattermode="group",
                         legend_title="", **LAYOUT)
    return figure


def deep_dive(frame: pd.DataFrame, model: str) -> list[tuple[str, go.Figure]]:
    if not has(frame, "model", "precision", "tok_per_s", "perplexity"):
        return []
    rows = _ordered(_rows(frame[frame["model"] == model]))
    if rows.empty:
        return []
    return [(PARETO_ID, pareto(rows, model)), (PERPLEXITY_ID, perplexity_chart(rows, model)),
            (THROUGHPUT_ID, throughput_chart(rows, model)), (MEMORY_ID, memory_chart(rows, model))]


# ------------------------------------------------------------------------------ caption

def ordering_breaks(rows: pd.DataFrame) -> list[str]:
    """Where a model's perplexities break the expected order: int8 within ``INT8_TOLERANCE`` of
    bf16, every 4-bit precision at or above int8."""
    breaks = []
    for (model, device), part in rows.groupby(["model", "device"]):
        ppl = dict(zip(part["precision"], part["perplexity"].astype(float)))
        if "int8" in ppl and "bf16" in ppl and abs(ppl["int8"] / ppl["bf16"] - 1) > INT8_TOLERANCE:
            breaks.append(f"{model}: int8 perplexity {ppl['int8']:.3f} is more than "
                          f"{INT8_TOLERANCE:.0%} away from bf16's {ppl['bf16']:.3f}")
        for four in FOUR_BIT_WEIGHTS:
            if four in ppl and "int8" in ppl and ppl[four] < ppl["int8"]:
                breaks.append(f"{model}: {four} perplexity {ppl[four]:.3f} is below int8's "
                              f"{ppl['int8']:.3f}")
    return breaks


def caption(frame: pd.DataFrame) -> str:
    if not has(frame, "model", "precision", "tok_per_s", "perplexity"):
        return ""
    rows = _rows(frame)
    methods: dict[str, list[str]] = {}
    if "tags.perplexity_method" in rows.columns:
        for (model, how), _ in rows.dropna(subset=["tags.perplexity_method"]).groupby(["model", "tags.perplexity_method"]):
            methods.setdefault(how, []).append(model)
    method = "; ".join(f"{how} ({', '.join(sorted(models))})" for how, models in methods.items()) or "n/a"
    references = ", ".join(sorted(set(rows.get("tags.reference_precision", pd.Series(dtype=str))
                                      .dropna()))) or "n/a"
    text = (f"Perplexity: {method}; {count_range(rows, 'perplexity_tokens')} scored tokens, the same "
            f"tokens for every precision of a model. Throughput: median decode tok/s over "
            f"{count_range(rows, 'repeats')} repeats, {WHISKERS}, batch "
            f"{count_range(rows, 'batch_size')}, {count_range(rows, 'max_new_tokens')} greedy tokens "
            f"per prompt. Quality and token match are against each model's reference precision "
            f"({references}); quantized layers compute in its dtype. Memory: real storage, with "
            f"quantizer scales; peak = weights + what decoding added. Device: {device_names(rows)}. "
            "Latest run per model and precision; hover a point for where it came from. ")
    if "gptq" not in set(rows["precision"].astype(str)):
        text += f"No GPTQ runs: GPTQ is planned only where its optional extra is installed ({GPTQ_EXTRA}). "
    breaks = ordering_breaks(rows)
    if not breaks:
        return text + (f"Ordering check passed for every model: int8 within {INT8_TOLERANCE:.0%} of "
                       "bf16, 4-bit at or above int8.")
    return text + ("Ordering check, broken and shown as measured: " + "; ".join(breaks) + ". "
                   "Perplexity here is deterministic (the same windows, same weights: a rerun gives "
                   "the same number), so a break is not timing noise; on small, undertrained models "
                   "quantization error can move perplexity either way by a fraction of a percent.")


def report(frame: pd.DataFrame) -> list[str]:
    if frame.empty:
        return []
    lines = ["| model | precision | perplexity (x reference) | weights MiB | tok/s |", "| --- | --- | --- | --- | --- |"]
    for (model, precision), part in frame.groupby(["model", "precision"]):
        row = part.sort_values("start_time").iloc[-1]
        lines.append(f"| {model} | {precision} | {row['perplexity']:.2f} ({row['perplexity_ratio']:.3f}) | "
                     f"{row['weights_bytes'] / 2**20:.2f} | {row['tok_per_s']:.0f} |")
    return lines
