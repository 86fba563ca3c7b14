"""Capacity under an SLO, per model: the most requests per second each served configuration sustains
with at least 90 % of its requests within both the TTFT and the TPOT limit, and how the search found it.

Each capacity run (``trials/techniques/capacity/runner.py``) served one configuration (weights, KV
cache type, slots ``-np``, tokens per scheduling step ``-b``, threads) and probed Poisson rates:
doubled from its single-stream rate (half of it with one slot), then bisected to 10 % (``trials.stats.capacity``). Every
probe is in the frame as ``p{i}_*`` metrics, so the charts need no artifact. Four charts:

1. capacity per configuration, sorted, one panel per model: whiskers from the highest probe whose
   attainment interval lies wholly above the target (``capacity_rps_low``) to the lowest failing
   probe (``capacity_rps_high``); a search cut short by the budget is a lower bound (an open arrow
   pointing up the axis, no upper whisker); infeasible and skipped configurations sit at 0, named;
2. attainment (share of requests within both limits, bootstrap 95 % interval) against offered rate,
   one line per configuration, filled where the probe passed, the target dotted;
3. the search trace: the best capacity found so far against trials run, the search (Optuna through
   Ray Tune) beside the grid, one line per model and search;
4. p95 inter-token latency against ``-b``: measured at the capacity probe beside the step-time
   model's prediction at the same rate (``trials.stats.step_time``), the TPOT limit dashed; a ``-b``
   skipped before any load (predicted to miss the TPOT limit) marked at the limit.

Hover gives the run's numbers, status and note, the server's command line and the run (a click opens it).
"""

from __future__ import annotations

import re

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from dashboard.sections.common import PROVENANCE, PROVENANCE_HOVER, TEMPLATE, Hover, device_names, has, latest
from trials.measurement import point_names
from trials.techniques.capacity.spec import SPEC

GROUP = SPEC.name
TITLE = SPEC.title
BLURB = ("Served by llama-server, which configuration of weights, KV cache, slots, tokens per step (-b) and "
         "threads sustains the most requests per second with 90 % of requests within the TTFT and TPOT limits, "
         "and how quickly does a search find it beside the full grid?")
EVERY_RUN = True             # the search trace draws every trial; the other charts take each configuration's latest
MEASURED_BY = "capacity_rps"  # infeasible and skipped runs hold 0: charted, named
CAPACITY_ID, ATTAINMENT_ID, SEARCH_ID, ITL_ID = ("capacity-rps", "capacity-attainment", "capacity-search",
                                                 "capacity-itl")
KEYS = ["model", "stack", "device"]
NEEDED = ("model", "stack", "capacity_rps")
STEP = re.compile(r"\+step\d+")
DEFAULT_STEP_TOKENS = 2048
COLORS = qualitative.Plotly
MODEL_COLORS = qualitative.D3
LIMIT_COLOR = "#c0392b"
STATUSES = {      # capacity_status -> (legend words, marker symbol)
    "measured": ("measured", "circle"),
    "lower_bound": ("lower bound (the budget ran out)", "triangle-right-open"),
    "infeasible": ("infeasible (one request at a time misses)", "x-thin-open"),
    "skipped": ("skipped (-b predicted to miss the TPOT limit)", "circle-x-open"),
}
ROW_PX, GAP_PX, MARGIN_PX = 34, 110, 140        # the capacity chart: per configuration, between panels, margins


def _number(value) -> float:
    return float(pd.to_numeric(pd.Series([value]), errors="coerce").iloc[0])


def _column(rows: pd.DataFrame, name: str) -> pd.Series:
    return pd.to_numeric(rows[name], errors="coerce") if name in rows.columns else pd.Series(float("nan"), index=rows.index)


def _status(row) -> str:
    status = row.get("tags.capacity_status")
    if isinstance(status, str) and status in STATUSES:
        return status
    return "measured" if _number(row.get("capacity_rps")) > 0 else "infeasible"


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The latest run per model and configuration, with its status and the -b in effect."""
    rows = latest(frame, KEYS)
    rows = rows[_column(rows, "capacity_rps").notna()].reset_index(drop=True)
    if rows.empty:
        return rows
    rows["model"], rows["stack"] = rows["model"].astype(str), rows["stack"].astype(str)
    rows["_status"] = [_status(r) for r in rows.to_dict("records")]
    step = _column(rows, "server_step_tokens")
    if "step_tokens" in rows.columns:
        given = pd.to_numeric(rows["step_tokens"], errors="coerce")
        step = step.fillna(given.where(given > 0, DEFAULT_STEP_TOKENS))
    rows["_step"] = step
    rows["_family"] = [STEP.sub("", s) for s in rows["stack"]]
    return rows


def _text(value, fmt: str = "{:.3g}") -> str:
    number = _number(value)
    return "n/a" if pd.isna(number) else fmt.format(number)


def _interval(row: dict) -> str:
    status = row.get("_status") or _status(row)
    if status in ("infeasible", "skipped"):
        return f"none: {STATUSES[status][0]}"
    low, high = _number(row.get("capacity_rps_low")), _number(row.get("capacity_rps_high"))
    return f"[{_text(low)}, {'open: a lower bound' if pd.isna(high) else _text(high)}] req/s"


CAPACITY = PROVENANCE + Hover(
    ("status", "status", lambda r: r.get("_status"), "{}"),
    ("note", "why", "tags.capacity_note", "{}"),
    ("interval", "interval", _interval, "{}"),
    ("attainment", "within the SLO at it", "capacity_attainment", lambda v: f"{float(v):.0%}"),
    ("probes", "probes", "capacity_probes", "{:.0f}"),
    ("single", "single stream", "single_stream_rps", "{:.3g} req/s"),
    ("outside", "CPU taken outside the trial", "outside_cpu_cores", "{:.2f} cores"),
    ("search", "search", lambda r: _search_name(r), "{}"),
    ("command", "server", "tags.server_command", "{}"),
)


def _colors(values) -> dict[str, str]:
    return {v: COLORS[i % len(COLORS)] for i, v in enumerate(sorted(set(values)))}


def _model_colors(models) -> dict[str, str]:
    return {m: MODEL_COLORS[i % len(MODEL_COLORS)] for i, m in enumerate(sorted(set(models)))}


# ------------------------------------------------------------------------------ 1. capacity per configuration

def capacity_figure(rows: pd.DataFrame) -> go.Figure:
    """Capacity per configuration, one panel (row) per model, highest at the top; whiskers from
    ``capacity_rps_low`` to ``capacity_rps_high``; a lower bound an open arrow with only its lower
    whisker; infeasible and skipped configurations at 0, their status in the legend and the hover."""
    models = sorted(rows["model"].unique())
    counts = [int((rows["model"] == m).sum()) + 1 for m in models]
    plots_px = ROW_PX * sum(counts)
    height = MARGIN_PX + plots_px + GAP_PX * (len(models) - 1)
    figure = make_subplots(rows=len(models), cols=1, subplot_titles=models, row_heights=counts,
                           vertical_spacing=GAP_PX / (height - MARGIN_PX) if len(models) > 1 else 0.0)
    colors = _model_colors(models)
    for index, model in enumerate(models, start=1):
        mine = rows[rows["model"] == model].assign(_cap=lambda f: _column(f, "capacity_rps").clip(lower=0),
                                                   _margin=lambda f: _column(f, "slo_margin").fillna(-1e9))
        order = mine.sort_values(["_cap", "_margin", "stack"], ascending=[True, True, False])["stack"].tolist()
        for status, (words, symbol) in STATUSES.items():
            part = mine[mine["_status"] == status]
            if part.empty:
                continue
            part = part.assign(_order=part["stack"].map({s: i for i, s in enumerate(order)})).sort_values("_order")
            xs = [float(v) for v in part["_cap"]]
            low = _column(part, "capacity_rps_low").clip(lower=0)
            high = _column(part, "capacity_rps_high")
            error = None
            if status in ("measured", "lower_bound"):
                error = dict(type="data", symmetric=False, color=colors[model],
                             array=[0.0 if pd.isna(h) else max(0.0, float(h) - x) for h, x in zip(high, xs)],
                             arrayminus=[0.0 if pd.isna(lo) else max(0.0, x - float(lo)) for lo, x in zip(low, xs)])
            figure.add_trace(go.Scatter(
                name=f"{model} · {words}", legendgroup=model, x=xs, y=list(part["stack"]),
                mode="markers" if status in ("measured", "lower_bound") else "markers+text",
                text=[status] * len(part), textposition="middle right",
                error_x=error, marker=dict(symbol=symbol, size=11, color=colors[model], line=dict(width=2)),
                customdata=CAPACITY.rows(part),
                hovertemplate=(f"<b>%{{y}}</b> · {model}<br>capacity %{{x:.3g}} req/s<br>"
                               + CAPACITY.lines("status", "note", "interval", "attainment", "probes", "single",
                                                "outside", "command") + PROVENANCE_HOVER + "<extra></extra>")),
                row=index, col=1)
        suffix = "" if index == 1 else str(index)
        figure.layout[f"yaxis{suffix}"].update(type="category", categoryorder="array", categoryarray=order,
                                               title_text="configuration (stack)")
        top = float(pd.concat([mine["_cap"], _column(mine, "capacity_rps_high")]).max()) or 1.0
        figure.layout[f"xaxis{suffix}"].update(range=[-0.04 * top, 1.06 * top])     # a point at 0 drawn whole
    figure.update_xaxes(title_text="capacity (req/s with ≥ target share of requests within the SLO)")
    figure.update_layout(title="Capacity per configuration, sorted (whiskers: the probes bracketing it; "
                               "open arrow: a lower bound)", template=TEMPLATE, height=height,
                         legend=dict(title_text="model · status", groupclick="toggleitem"), margin=dict(l=60, r=20, t=80, b=60))
    return figure


# ------------------------------------------------------------------------------ 2. attainment vs offered rate

def probes(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, probe): the run's columns and the probe's ``p{i}_*`` metrics without their prefix."""
    out = []
    for run in rows.to_dict("records"):
        for point, values in point_names.split(run, point_names.PROBE).items():
            if "offered_rps" in values and "slo_attainment" in values:
                out.append({**run, **{f"probe_{k}": v for k, v in values.items()}, "probe": point.number})
    return pd.DataFrame(out)


def _probe_text(part: pd.DataFrame) -> list[str]:
    texts = []
    for row in part.to_dict("records"):
        passed = _number(row.get("probe_passed")) == 1
        low, high = _number(row.get("probe_slo_attainment_low")), _number(row.get("probe_slo_attainment_high"))
        extra = ""
        if _number(row.get("probe_repeated")) == 1:
            extra += " · run again: disturbed by processes outside the trial"
        cores = _number(row.get("probe_outside_cpu_cores"))
        if not pd.isna(cores):
            extra += f" · {cores:.2f} cores taken outside the trial"
        interval = "" if pd.isna(low) or pd.isna(high) else f" (95 %: {low:.0%}–{high:.0%})"
        texts.append(f"probe {row['probe']}: {'passes' if passed else 'misses'}{interval}{extra}")
    return texts


def _panels(models: list[str], **kwargs) -> go.Figure:
    return make_subplots(rows=1, cols=len(models), subplot_titles=models, **kwargs)


def attainment_figure(pts: pd.DataFrame, models: list[str]) -> go.Figure:
    """Per model, each configuration's probes: share within both limits against offered rate, whiskers
    the bootstrap interval, filled where the probe passed (its share at or above the target), the
    target dotted."""
    figure = _panels(models, shared_yaxes=True)
    colors, shown = _colors(pts["stack"]), set()
    for col, model in enumerate(models, start=1):
        mine = pts[pts["model"] == model]
        for stack in sorted(mine["stack"].unique()):
            part = mine[mine["stack"] == stack].assign(
                _rate=lambda f: _column(f, "probe_offered_rps")).sort_values("_rate")
            ys = _column(part, "probe_slo_attainment")
            low, high = _column(part, "probe_slo_attainment_low"), _column(part, "probe_slo_attainment_high")
            passed = _column(part, "probe_passed").fillna(0) == 1
            figure.add_trace(go.Scatter(
                name=stack, legendgroup=stack, showlegend=stack not in shown, x=list(part["_rate"]), y=list(ys),
                mode="lines+markers", line=dict(color=colors[stack]),
                error_y=dict(type="data", symmetric=False, array=list((high - ys).clip(lower=0).fillna(0)),
                             arrayminus=list((ys - low).clip(lower=0).fillna(0))),
                marker=dict(symbol=["circle" if p else "circle-open" for p in passed], size=9),
                text=_probe_text(part), customdata=CAPACITY.rows(part),
                hovertemplate=(f"<b>%{{fullData.name}}</b> · {model}<br>%{{text}}<br>within both limits: %{{y:.0%}}<br>"
                               "offered %{x:.3g} req/s<br>" + CAPACITY.lines("status", "command")
                               + PROVENANCE_HOVER + "<extra></extra>")), row=1, col=col)
            shown.add(stack)
        if len(mine):
            target = float(_column(mine, "attainment_target").fillna(0.9).max())
            top = float(_column(mine, "probe_offered_rps").max())
            low_rate = float(_column(mine, "probe_offered_rps").min())
            figure.add_trace(go.Scatter(
                name=f"target: {target:.0%} within the SLO", legendgroup="target", showlegend=col == 1,
                x=[low_rate, top], y=[target, target], mode="lines", line=dict(color=LIMIT_COLOR, dash="dot"),
                hovertemplate=f"target: {target:.0%} of requests within both limits<extra></extra>"), row=1, col=col)
    figure.update_xaxes(title_text="offered rate (requests/s, Poisson)")
    figure.update_yaxes(title_text="requests within both limits (%)", tickformat=".0%")
    figure.update_layout(title="Share of requests within both limits vs offered rate (filled: the probe passed; "
                               "whiskers: bootstrap 95 %)", template=TEMPLATE, height=440, legend_title="stack",
                         margin=dict(l=60, r=20, t=80, b=50))
    return figure


# ------------------------------------------------------------------------------ 3. the search trace

def _search_name(row: dict) -> str:
    search = row.get("tags.search")
    return str(search) if isinstance(search, str) and search else "grid"


SEARCH_WORDS = {"grid": "grid (every configuration)", "optuna": "search (Optuna)"}


def search_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Every finished run of each (model, search), the newest search id of each, in the order run:
    ``_trial`` (``search_index``, else the start order) and ``_best`` (the best capacity so far)."""
    rows = frame[_column(frame, "capacity_rps").notna()].copy()
    if rows.empty or "model" not in rows.columns:
        return rows
    rows["model"], rows["stack"] = rows["model"].astype(str), rows["stack"].astype(str)
    rows["_search"] = [_search_name(r) for r in rows.to_dict("records")]
    rows["_status"] = [_status(r) for r in rows.to_dict("records")]
    ids = rows["tags.search_id"].fillna("").astype(str) if "tags.search_id" in rows.columns else pd.Series("", index=rows.index)
    rows["_search_id"] = ids
    if "start_time" in rows.columns:
        rows = rows.sort_values("start_time", kind="stable")
    out = []
    for _, part in rows.groupby(["model", "_search"], sort=True):
        part = part[part["_search_id"] == part["_search_id"].iloc[-1]].copy()   # the newest search
        index = _column(part, "search_index")
        part["_trial"] = index if index.notna().all() else list(range(1, len(part) + 1))
        part = part.sort_values("_trial", kind="stable")
        part["_best"] = _column(part, "capacity_rps").clip(lower=0).fillna(0).cummax()
        out.append(part)
    return pd.concat(out, ignore_index=True) if out else rows.iloc[0:0]


def search_figure(runs: pd.DataFrame, models: list[str]) -> go.Figure:
    """Best capacity so far against trials, per model: the search beside the grid (one line each)."""
    figure = _panels(models)
    colors = _model_colors(models)
    for col, model in enumerate(models, start=1):
        mine = runs[runs["model"] == model]
        for search, part in mine.groupby("_search", sort=True):
            name = f"{model} · {SEARCH_WORDS.get(search, search)}"
            own = [f"trial {int(t)}: {s}, capacity {_text(c)} req/s ({st})"
                   for t, s, c, st in zip(part["_trial"], part["stack"], part["capacity_rps"], part["_status"])]
            figure.add_trace(go.Scatter(
                name=name, legendgroup=name, x=[float(v) for v in part["_trial"]], y=[float(v) for v in part["_best"]],
                mode="lines+markers", line=dict(color=colors[model], dash="solid" if search != "grid" else "dot",
                                                shape="hv"),
                marker=dict(symbol="circle" if search != "grid" else "square-open", size=7),
                text=own, customdata=CAPACITY.rows(part),
                hovertemplate=(f"<b>{name}</b><br>%{{text}}<br>best so far: %{{y:.3g}} req/s<br>"
                               + PROVENANCE_HOVER + "<extra></extra>")), row=1, col=col)
    most = int(runs["_trial"].max()) if len(runs) else 1
    figure.update_xaxes(title_text="trials run (in the order run)", tick0=1, dtick=max(1, round(most / 8)),
                        range=[0.5, most + 0.5])
    figure.update_yaxes(title_text="best capacity so far (req/s)", rangemode="tozero")
    figure.update_layout(title="The search trace: best capacity found so far vs trials, search beside grid",
                         template=TEMPLATE, height=420, legend_title="model · search",
                         margin=dict(l=60, r=20, t=80, b=50))
    return figure


# ------------------------------------------------------------------------------ 4. p95 ITL vs -b

def itl_figure(rows: pd.DataFrame, models: list[str]) -> go.Figure:
    """Per model and configuration family (the stack without its -b), p95 ITL at the capacity probe
    against -b, measured (solid) beside predicted at the same rate (dashed); skipped -b marked at the
    TPOT limit."""
    figure = _panels(models, shared_yaxes=True)
    colors = _colors(rows["_family"])
    for col, model in enumerate(models, start=1):
        mine = rows[rows["model"] == model].sort_values("_step")
        for family, part in mine.groupby("_family", sort=True):
            for column, words, dash, symbol in (("itl_s_p95", "measured", "solid", "circle"),
                                                ("itl_s_p95_predicted", "predicted", "dash", "diamond-open")):
                ys = _column(part, column)
                keep = part[ys.notna()]
                if keep.empty:
                    continue
                figure.add_trace(go.Scatter(
                    name=f"{model} · {family} · {words}", legendgroup=f"{model}|{family}",
                    x=[float(v) for v in keep["_step"]], y=[float(v) for v in ys[ys.notna()]],
                    mode="lines+markers", line=dict(color=colors[family], dash=dash),
                    marker=dict(symbol=symbol, size=9), text=list(keep["stack"]), customdata=CAPACITY.rows(keep),
                    hovertemplate=(f"<b>%{{text}}</b> · {model}<br>-b %{{x:.0f}} tokens per step<br>p95 ITL {words}: "
                                   "%{y:.4f} s at the capacity probe<br>" + CAPACITY.lines("status", "note", "command")
                                   + PROVENANCE_HOVER + "<extra></extra>")), row=1, col=col)
        limit = float(_column(mine, "tpot_slo_s").max()) if len(mine) else float("nan")
        skipped = mine[mine["_status"] == "skipped"]
        if len(skipped) and not pd.isna(limit):
            figure.add_trace(go.Scatter(
                name=f"{model} · skipped -b (predicted to miss the TPOT limit)", legendgroup=f"{model}|skipped",
                x=[float(v) for v in skipped["_step"]], y=[limit] * len(skipped), mode="markers",
                marker=dict(symbol="x", size=12, color=LIMIT_COLOR, line=dict(width=2)),
                text=list(skipped["stack"]), customdata=CAPACITY.rows(skipped),
                hovertemplate=("<b>%{text}</b>: skipped before any load<br>-b %{x:.0f}<br>"
                               + CAPACITY.lines("note", "command") + PROVENANCE_HOVER + "<extra></extra>")),
                row=1, col=col)
        if not pd.isna(limit):
            figure.add_hline(y=limit, line_dash="dash", line_color=LIMIT_COLOR, row=1, col=col,
                             annotation_text="TPOT limit")
    steps = sorted({int(v) for v in rows["_step"].dropna()})
    figure.update_xaxes(title_text="-b: tokens per scheduling step", matches="x", tickvals=steps,
                        ticktext=[str(v) for v in steps])
    figure.update_yaxes(title_text="p95 inter-token latency (s)")
    figure.update_layout(title="p95 inter-token latency vs -b at the capacity probe: measured (solid) and "
                               "predicted from the step time (dashed)", template=TEMPLATE, height=440,
                         legend_title="model · configuration", margin=dict(l=60, r=20, t=80, b=50))
    return figure


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, *NEEDED):
        return []
    rows = _rows(frame)
    if rows.empty:
        return []
    models = sorted(rows["model"].unique())
    out = [(CAPACITY_ID, capacity_figure(rows))]
    pts = probes(rows)
    if not pts.empty:
        out.append((ATTAINMENT_ID, attainment_figure(pts, sorted(pts["model"].unique()))))
    runs = search_runs(frame)
    if not runs.empty:
        out.append((SEARCH_ID, search_figure(runs, sorted(runs["model"].unique()))))
    if _column(rows, "itl_s_p95").notna().any() or _column(rows, "itl_s_p95_predicted").notna().any():
        out.append((ITL_ID, itl_figure(rows, models)))
    return out


def caption(frame: pd.DataFrame) -> str:
    if not has(frame, *NEEDED):
        return ""
    rows = _rows(frame)
    if rows.empty:
        return ""

    def span(column: str, fmt: str = "{:g}") -> str:
        values = sorted({float(v) for v in _column(rows, column).dropna()})
        return "?" if not values else (fmt.format(values[0]) if len(values) == 1 else
                                       f"{fmt.format(values[0])}–{fmt.format(values[-1])}")
    counts = rows["_status"].value_counts()
    said = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items())
    return (f"Each configuration served by llama-server on 127.0.0.1 and probed with seeded Poisson arrivals "
            f"({span('load_requests')} requests per probe after {span('load_warmup')} warm-up): doubled from half "
            f"its single-stream rate, then bisected to 10 %. Capacity: the highest rate at which at least "
            f"{span('attainment_target', '{:.0%}')} of requests meet both TTFT ≤ {span('ttft_slo_s')} s and time per "
            f"output token ≤ {span('tpot_slo_s')} s; whiskers: from the highest probe whose bootstrap 95 % interval "
            f"lies wholly above the target to the lowest probe that missed. Configurations: {said}. "
            f"Device: {device_names(rows)}.")


def report(frame: pd.DataFrame) -> list[str]:
    """Per model, each configuration's capacity with its interval (best first), how it ended, the
    single-stream p95s against the SLO, and the p95 ITL at the capacity beside the step curve's
    prediction for its -b; the results page's table (``llm-report``)."""
    if not has(frame, *NEEDED):
        return []
    rows = _rows(frame)
    lines = ["| model | configuration | status | capacity req/s [interval] | within the SLO at it | "
             "single stream p95 TTFT / TPOT (ms) | p95 ITL at it: measured / predicted (ms) | probes | search |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows.sort_values(["model", "capacity_rps"], ascending=[True, False]).to_dict("records"):
        attained = _number(row.get("capacity_attainment"))
        single = " / ".join(_text(1000 * _number(row.get(point_names.SINGLE.metric(name))), "{:.0f}")
                            for name in ("ttft_s_p95", "tpot_s_p95"))
        itl = (f"{_text(1000 * _number(row.get('itl_s_p95')), '{:.0f}')} / "
               f"{_text(1000 * _number(row.get('itl_s_p95_predicted')), '{:.0f}')}")
        interval = _interval(row).replace(" req/s", "") if row["_status"] not in ("infeasible", "skipped") else ""
        lines.append(f"| {row['model']} | {row['stack']} | {row['_status']} | {_text(row.get('capacity_rps'))} "
                     f"{interval} | {'n/a' if pd.isna(attained) else f'{attained:.0%}'} | "
                     f"{single} | {itl} | {_text(row.get('capacity_probes'), '{:.0f}')} | {_search_name(row)} |")
    return lines
