"""Serving under load, per model: how each stack behind a real server holds up as requests arrive faster.

Each serving run (``trials/techniques/serving/runner.py``) measured one stack behind its server at a
ladder of points: closed-loop concurrency levels (``c<N>_``) and seeded Poisson arrivals at multiples
of the stack's own single-stream rate (``r<i>_``). Four charts, one panel per model, one line per
stack:

1. p95 time to first token vs offered rate (whiskers: bootstrap 95 % interval; a hollow marker where
   the point had fewer requests than a p95 needs and shows the largest value), the SLO dashed: the
   knee is where queueing starts;
2. p95 inter-token latency vs offered rate, the TPOT limit dashed;
3. goodput (requests per second within both limits) vs offered rate, the offered rate dotted;
4. output tokens per second vs requests in flight (closed loop): what the parallel slots buy, each
   stack's decode-only bandwidth bound dashed beside it (``roofline_tok_per_s``; log scale).

Hover gives the point's numbers, the server's command line and the run (a click opens it).
"""

from __future__ import annotations


import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from dashboard.sections.common import PROVENANCE, PROVENANCE_HOVER, TEMPLATE, Hover, device_names, has, latest
from trials.measurement import point_names

GROUP = "serving"
TITLE = "Serving under load — requests per second within a latency SLO"
BLURB = ("Behind a real server with continuous batching, how many requests per second does each stack "
         "sustain before time to first token and time per token leave the SLO?")
TTFT_ID, ITL_ID, GOODPUT_ID, SLOTS_ID = "serving-ttft", "serving-itl", "serving-goodput", "serving-slots"
KEYS = ["model", "stack", "device"]
NEEDED = ("model", "stack", "single_stream_rps")
COLORS = qualitative.Plotly
SERVING = PROVENANCE + Hover(("command", "server", "tags.server_command", "{}"))


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    if "roofline_output_tok_per_s" in frame.columns:      # the bound's name in stores written before 2026-12-07
        old = pd.to_numeric(frame["roofline_output_tok_per_s"], errors="coerce")
        frame = frame.assign(roofline_tok_per_s=frame["roofline_tok_per_s"].fillna(old)
                             if "roofline_tok_per_s" in frame.columns else old)
    rows = latest(frame, KEYS)
    return rows[pd.to_numeric(rows.get("single_stream_rps"), errors="coerce").notna()].reset_index(drop=True)


def points(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, point): the run's columns and the point's metrics without their prefix."""
    out = []
    for run in rows.to_dict("records"):
        for point, values in point_names.split(run, point_names.CONCURRENCY + point_names.RATE).items():
            kind = "rate" if point.kind == point_names.RATE else "concurrency"
            level = float(point.number) if kind == "concurrency" else float(values.get("offered_rps", float("nan")))
            out.append({**run, **values, "point": point.name, "kind": kind, "level": level})
    return pd.DataFrame(out)


def _hover(part: pd.DataFrame, y_title: str, y: str, fmt: str) -> tuple[list, str]:
    custom = SERVING.rows(part)
    template = (f"<b>%{{fullData.name}}</b> · %{{text}}<br>{y_title}: %{{y:{fmt}}}<br>"
                "offered %{x:.2f} req/s<br>" + SERVING.lines("command")
                + PROVENANCE_HOVER + "<extra></extra>")
    return custom, template


def _panel_figure(pts: pd.DataFrame, models: list[str], kind: str, y: str, title: str, y_title: str,
                  fmt: str, limit: str | None = None, diagonal: bool = False, log_y: bool = False,
                  bound: str | None = None) -> go.Figure:
    figure = make_subplots(rows=1, cols=len(models), subplot_titles=models, shared_yaxes=True)
    stacks = sorted(pts["stack"].astype(str).unique())
    colors = {s: COLORS[i % len(COLORS)] for i, s in enumerate(stacks)}
    named: set[str] = set()          # a stack's first line in any panel names it in the legend (one model's
    #                                  stacks need not be another's: each model's own lines are named too)
    for col, model in enumerate(models, start=1):
        mine = pts[(pts["model"] == model) & (pts["kind"] == kind)]
        for stack in stacks:
            part = mine[mine["stack"] == stack].sort_values("level")
            if part.empty or y not in part.columns:
                continue
            ys = pd.to_numeric(part[y], errors="coerce")
            error = None
            if f"{y}_low" in part.columns:
                low, high = pd.to_numeric(part[f"{y}_low"], errors="coerce"), pd.to_numeric(part[f"{y}_high"], errors="coerce")
                error = dict(type="data", symmetric=False, array=list((high - ys).fillna(0)),
                             arrayminus=list((ys - low).fillna(0)))
            exact = pd.to_numeric(part.get(f"{y}_exact", pd.Series(1, index=part.index)), errors="coerce").fillna(1)
            custom, template = _hover(part, y_title, y, fmt)
            figure.add_trace(go.Scatter(
                name=stack, legendgroup=stack, showlegend=stack not in named, x=list(part["level"]), y=list(ys),
                mode="lines+markers", error_y=error, line=dict(color=colors[stack]),
                marker=dict(symbol=["circle" if e else "circle-open" for e in exact], size=8),
                text=[f"{p} ({'exact' if e else 'largest value: too few requests for this percentile'})"
                      for p, e in zip(part["point"], exact)],
                customdata=custom, hovertemplate=template), row=1, col=col)
            named.add(stack)
        if bound and bound in mine.columns and len(mine):
            _bounds(figure, mine, bound, colors, col)
        if limit and limit in mine.columns and len(mine):
            figure.add_hline(y=float(pd.to_numeric(mine[limit], errors="coerce").max()), line_dash="dash",
                             line_color="#c0392b", row=1, col=col, annotation_text="SLO")
        if diagonal and len(mine):
            top = float(mine["level"].max())
            figure.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", line=dict(dash="dot", color="#999"),
                                        name="offered", legendgroup="offered", showlegend="offered" not in named,
                                        hoverinfo="skip"), row=1, col=col)
            named.add("offered")
    x_title = "offered rate (requests/s, Poisson)" if kind == "rate" else "requests in flight (closed loop)"
    figure.update_xaxes(title_text=x_title)
    figure.update_yaxes(title_text=y_title)
    if log_y:
        figure.update_yaxes(type="log")
    figure.update_layout(title=title, template=TEMPLATE, height=440, legend_title="stack",
                         margin=dict(l=60, r=20, t=80, b=50))
    return figure


def _bounds(figure: go.Figure, mine: pd.DataFrame, bound: str, colors: dict, col: int) -> None:
    """Each stack's predicted bound, dashed beside its measured line: with n requests in flight, min(n,
    slots) sequences decode, and a step reads the weights once and each one's KV cache at the mean
    context (``trials.stats.theory``), at the run's logged copy bandwidth; at the slots it is the run's
    ``bound`` (``roofline_tok_per_s``)."""
    from trials.stats.theory import decode_step_bytes, roofline_tok_per_s

    needed = (bound, "weights_bytes", "decode_bytes_per_step", "memory_bandwidth_bytes_per_s", "parallel_slots")
    for _, part in mine.groupby("run_id" if "run_id" in mine.columns else "stack", sort=False):
        run = part.iloc[0].to_dict()
        number = {k: pd.to_numeric(pd.Series([run.get(k)]), errors="coerce").iloc[0]
                  for k in (*needed, "roofline_ratio")}
        if any(pd.isna(number[k]) for k in needed):
            continue
        slots = int(number["parallel_slots"])
        per_slot = (number["decode_bytes_per_step"] - number["weights_bytes"]) / slots
        levels = sorted(float(v) for v in part["level"].dropna().unique())
        ys = [roofline_tok_per_s(min(int(n), slots), number["memory_bandwidth_bytes_per_s"],
                                 decode_step_bytes(number["weights_bytes"], per_slot, 1.0, rows=min(int(n), slots)))
              for n in levels]
        served = "" if pd.isna(number["roofline_ratio"]) else \
            f"<br>most output tok/s served: {number['roofline_ratio']:.0%} of the bound at {slots} slots"
        figure.add_trace(go.Scatter(
            name=f"{run['stack']} roofline", legendgroup=str(run["stack"]), showlegend=False,
            x=levels, y=ys, mode="lines+markers", marker=dict(symbol="line-ew", size=10),
            line=dict(color=colors.get(run["stack"], "#999"), dash="dash", width=1),
            hovertemplate=(f"<b>{run['stack']}</b>: bandwidth bound %{{y:.0f}} tok/s at %{{x}} in flight<br>"
                           f"min(in flight, {slots} slots) sequences decoding: the weights once and each one's KV "
                           f"cache at the mean context, at this machine's copy bandwidth (prefill and the "
                           f"server's own work only lower it){served}<extra></extra>")),
            row=1, col=col)


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, *NEEDED):
        return []
    rows = _rows(frame)
    pts = points(rows)
    if pts.empty:
        return []
    models = sorted(pts["model"].astype(str).unique())
    return [
        (TTFT_ID, _panel_figure(pts, models, "rate", "ttft_s_p95", "p95 time to first token vs offered rate",
                                "p95 TTFT (s)", ".3f", limit="ttft_slo_s", log_y=True)),
        (ITL_ID, _panel_figure(pts, models, "rate", "itl_s_p95", "p95 inter-token latency vs offered rate",
                               "p95 ITL (s)", ".4f", limit="tpot_slo_s")),
        (GOODPUT_ID, _panel_figure(pts, models, "rate", "goodput_rps", "Goodput (requests/s within the SLO) vs offered rate",
                                   "goodput (req/s)", ".2f", diagonal=True)),
        (SLOTS_ID, _panel_figure(pts, models, "concurrency", "output_tok_per_s",
                                 "Output tokens/s vs requests in flight (the stack's slots: bN in its name; "
                                 "dashed: its bandwidth bound)", "output tok/s", ".1f",
                                 bound="roofline_tok_per_s", log_y="roofline_tok_per_s" in pts.columns)),
    ]


def caption(frame: pd.DataFrame) -> str:
    if not has(frame, *NEEDED):
        return ""
    rows = _rows(frame)
    if rows.empty:
        return ""

    def span(column: str, fmt: str = "{:g}") -> str:
        values = sorted({float(v) for v in pd.to_numeric(rows.get(column), errors="coerce").dropna()})
        return "?" if not values else (fmt.format(values[0]) if len(values) == 1 else
                                       f"{fmt.format(values[0])}–{fmt.format(values[-1])}")
    return (f"Each stack behind llama.cpp's own server (or another server engine) on 127.0.0.1, driven by one asyncio "
            f"client streaming /v1/completions: warm-up excluded, then {span('load_requests')} requests per point "
            f"(p95 needs 20, p99 100: below that the largest value, hollow marker), one at a time, then closed-loop "
            f"concurrency levels, then seeded Poisson arrivals at multiples of the stack's own single-stream rate "
            f"(x {', '.join(rows['load_rates'].dropna().astype(str).unique()) if 'load_rates' in rows else '?'}). "
            f"{span('max_new_tokens')} new tokens per "
            f"request, greedy, end of sequence suppressed, prompt cache off. SLO: TTFT ≤ {span('ttft_slo_s')} s, "
            f"time per output token ≤ {span('tpot_slo_s')} s. Whiskers: bootstrap 95 % intervals. Device: "
            f"{device_names(rows)}. Token parity with the in-process engine: {span('parity_token_match', '{:.2f}')}.")


def report(frame: pd.DataFrame) -> list[str]:
    """Per model and stack: single-stream rate, saturation, sustainable rate under the SLO, goodput, and
    the served time to first token one request at a time beside the same weights' in-process one
    (measured in the same trial, after the load: what the server's HTTP and scheduling add), and the most
    output tok/s served beside the bandwidth bound with every slot decoding (``roofline_tok_per_s``)."""
    if not has(frame, *NEEDED):
        return []
    rows = _rows(frame)
    lines = ["| model | stack | single stream req/s | saturates at req/s | sustainable within SLO req/s | max goodput req/s | "
             "p50 TTFT at the lowest rate (s) | p50 TTFT one at a time: served / in-process (s) | "
             "most output tok/s: served / roofline | parity |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows.sort_values(["model", "stack"]).to_dict("records"):
        def number(column: str, fmt: str = "{:.2f}") -> str:
            value = pd.to_numeric(pd.Series([row.get(column)]), errors="coerce").iloc[0]
            return "n/a" if pd.isna(value) else fmt.format(value)
        lines.append(f"| {row['model']} | {row['stack']} | {number('single_stream_rps')} | {number('saturation_rps')} | "
                     f"{number('sustainable_rps')} | {number('goodput_rps_max')} | {number('ttft_s_p50_lowest_rate', '{:.3f}')} | "
                     f"{number(point_names.SINGLE.metric('ttft_s_p50'), '{:.3f}')} / {number('in_process_ttft_s_p50', '{:.3f}')} "
                     f"(x{number('ttft_served_vs_in_process')}) | {number('output_tok_per_s_max', '{:.1f}')} / "
                     f"{number('roofline_tok_per_s', '{:.0f}')} | {number('parity_token_match')} |")
    return lines
