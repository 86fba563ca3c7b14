"""Compare two sweeps: per chart group, each configuration that ran in both, B against A.

Two sides are chosen by sweep id, git sha or machine (``BY``): two machines, two commits, before and
after an upgrade. A configuration is its ``config_hash`` (model, stack, workload, repeats, seed), so
only like is compared with like; on each side its most recent finished run counts. Each bar is the
ratio B / A of a metric; its whiskers span the ratio of the two runs' 95 % intervals over repeats
(min/max for a run that logged none), and it is highlighted when the two intervals do not overlap:
a change beyond the noise the runs measured. Where either run has no interval (one repeat) the
bar says so and is never highlighted.

Pure functions of frames (``tracking.RunsCache`` tables); the app lays them out.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.sections.common import TEMPLATE
from trials.stats.runs import latest

BY = {"sweep": "tags.sweep_id", "git sha": "tags.env.git_sha", "machine": "tags.env.host"}
METRICS = {"tok_per_s": ("throughput", "tok/s", True), "peak_memory_bytes": ("peak memory", "bytes", False),
           "ttft_s": ("time to first token", "s", False)}       # name -> (label, unit, higher is better)
CHANGED, SAME, UNKNOWN = "#d62728", "#9aa0a6", "#c7c7c7"


def sides(frames: dict[str, pd.DataFrame], by: str) -> list[dict]:
    """The values of ``by`` over every group's finished runs, newest first: value, label, runs."""
    column = BY[by]
    wanted = list(dict.fromkeys((column, "start_time", "tags.env.git_sha", "tags.env.host")))
    rows = [f[[c for c in wanted if c in f.columns]] for f in frames.values() if not f.empty and column in f.columns]
    if not rows:
        return []
    table = pd.concat(rows, ignore_index=True).dropna(subset=[column])
    table = table[table[column].astype(str) != ""]
    out = []
    for value, part in sorted(table.groupby(column), key=lambda kv: kv[1]["start_time"].max(), reverse=True):
        when = part["start_time"].max()
        sha = str(part["tags.env.git_sha"].iloc[-1])[:12] if "tags.env.git_sha" in part else "?"
        host = str(part["tags.env.host"].iloc[-1]) if "tags.env.host" in part else "?"
        out.append({"value": str(value), "runs": len(part),
                    "label": f"{value} · {len(part)} runs · {when:%Y-%m-%d %H:%M} · git {sha} · {host}"})
    return out


def _side(frame: pd.DataFrame, by: str, value: str) -> pd.DataFrame:
    column = BY[by]
    if frame.empty or column not in frame.columns or "tags.config_hash" not in frame.columns:
        return pd.DataFrame()
    mine = frame[frame[column].astype(str) == str(value)]
    return latest(mine, "tags.config_hash").set_index("tags.config_hash")


def _interval(rows: pd.DataFrame, metric: str) -> tuple[pd.Series, pd.Series]:
    low = rows.get(f"{metric}_ci_low", pd.Series(index=rows.index, dtype=float))
    high = rows.get(f"{metric}_ci_high", pd.Series(index=rows.index, dtype=float))
    low = pd.to_numeric(low, errors="coerce").fillna(pd.to_numeric(rows.get(f"{metric}_min"), errors="coerce"))
    high = pd.to_numeric(high, errors="coerce").fillna(pd.to_numeric(rows.get(f"{metric}_max"), errors="coerce"))
    return low, high


def compare(frame: pd.DataFrame, by: str, a: str, b: str, metric: str = "tok_per_s") -> pd.DataFrame:
    """One row per configuration in both A and B: label, a, b, ratio, its low/high, verdict."""
    left, right = _side(frame, by, a), _side(frame, by, b)
    both = left.index.intersection(right.index)
    if metric not in frame.columns or both.empty:
        return pd.DataFrame(columns=["label", "a", "b", "ratio", "ratio_low", "ratio_high", "verdict"])
    left, right = left.loc[both], right.loc[both]
    va, vb = (pd.to_numeric(s[metric], errors="coerce") for s in (left, right))
    (la, ha), (lb, hb) = _interval(left, metric), _interval(right, metric)
    has_interval = la.notna() & ha.notna() & lb.notna() & hb.notna() & (ha > la) & (hb > lb)
    apart = has_interval & ((hb < la) | (lb > ha))
    label = left["model"].astype(str) + " · " + left.get("stack", pd.Series("", index=both)).astype(str)
    for column in ("context_tokens", "batch_size", "num_draft_tokens"):
        if column in left.columns and left[column].notna().any() and left[column].nunique() > 1:
            label += " · " + column.split("_")[0] + " " + left[column].astype(str)
    table = pd.DataFrame({
        "label": label, "a": va, "b": vb, "ratio": vb / va,
        "ratio_low": (lb / ha).where(has_interval), "ratio_high": (hb / la).where(has_interval),
        "verdict": ["changed beyond the intervals" if x else ("within the intervals" if h else "no interval (one repeat)")
                    for x, h in zip(apart, has_interval)],
        "run_a": left["run_id"], "run_b": right["run_id"]}, index=both)
    return table.dropna(subset=["ratio"]).sort_values("label")


def figure(table: pd.DataFrame, group: str, metric: str, a: str, b: str) -> go.Figure:
    """Bars of B / A per configuration; highlighted where the change is beyond the intervals."""
    label, unit, _ = METRICS[metric]
    colors = [CHANGED if v.startswith("changed") else SAME if v.startswith("within") else UNKNOWN
              for v in table["verdict"]]
    fig = go.Figure(go.Bar(
        x=list(table["label"]), y=[float(v) for v in table["ratio"]], marker_color=colors,
        error_y=dict(type="data", symmetric=False,
                     array=[max(0.0, h - r) if pd.notna(h) else 0.0 for h, r in zip(table["ratio_high"], table["ratio"])],
                     arrayminus=[max(0.0, r - lo) if pd.notna(lo) else 0.0 for lo, r in zip(table["ratio_low"], table["ratio"])]),
        customdata=[[f"{x:.4g}", f"{y:.4g}", v, ra, rb] for x, y, v, ra, rb in
                    zip(table["a"], table["b"], table["verdict"], table["run_a"], table["run_b"])],
        hovertemplate=(f"<b>%{{x}}</b><br>B / A: %{{y:.3f}}<br>A: %{{customdata[0]}} {unit}<br>"
                       f"B: %{{customdata[1]}} {unit}<br>%{{customdata[2]}}<br>"
                       "runs: A %{customdata[3]}, B %{customdata[4]}<extra></extra>")))
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dot", width=1))
    changed = sum(v.startswith("changed") for v in table["verdict"])
    fig.update_layout(template=TEMPLATE, height=380, margin=dict(l=60, r=20, t=60, b=110),
                      title=f"{group}: {label} B / A ({changed} of {len(table)} changed beyond their 95 % intervals)",
                      xaxis_title="configuration (model · stack)", yaxis_title=f"{label} ratio B / A (x)",
                      showlegend=False)
    return fig
