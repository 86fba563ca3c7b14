"""Chart pieces every section shares: which run stands for a configuration, and where a number came from.

A throughput is only trusted when its origin is one hover away, so every bar and point carries the
same provenance (TTFT, time per output token, peak memory, device, git sha, config hash, run id) and
every bar shows the spread over repeats as its error bar. Reruns of a configuration are kept in the
store; a chart shows the most recent one.

Values reach plotly as plain lists, not numpy arrays, so the figure JSON holds plain numbers that the
browser (and the browser tests) can read back as they are.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from trials.config import PRECISIONS

MB = 1024 * 1024

PROVENANCE_HOVER = ("ttft_s: %{customdata[0]}<br>tpot_s: %{customdata[1]}<br>"
                    "peak memory: %{customdata[2]}<br>device: %{customdata[3]}<br>"
                    "git sha: %{customdata[4]}<br>config_hash: %{customdata[5]}<br>"
                    "repeats: %{customdata[6]} · run %{customdata[7]}")


def has(frame: pd.DataFrame, *columns: str) -> bool:
    """The frame has rows and every named column."""
    return not frame.empty and all(c in frame.columns for c in columns)


def latest(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per ``keys``: the most recently started run (reruns replace older numbers)."""
    keys = [k for k in keys if k in frame.columns]
    if "start_time" in frame.columns:
        frame = frame.sort_values("start_time", kind="stable")
    return frame.drop_duplicates(keys, keep="last").reset_index(drop=True)


def _value(row: pd.Series, column: str):
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _fmt(value, pattern: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else pattern.format(float(value) * scale)


def _short_sha(sha) -> str:
    if not sha:
        return "n/a"
    sha = str(sha)
    return sha[:12] + "-dirty" if sha.endswith("-dirty") else sha[:12]


def provenance(rows: pd.DataFrame) -> list[list[str]]:
    """Per row, the hover fields of ``PROVENANCE_HOVER``, already formatted."""
    data = []
    for _, row in rows.iterrows():
        sha = _value(row, "tags.env.git_sha")
        run_id = _value(row, "run_id")
        data.append([
            _fmt(_value(row, "ttft_s"), "{:.4f} s"),
            _fmt(_value(row, "tpot_s"), "{:.5f} s"),
            _fmt(_value(row, "peak_memory_bytes"), "{:.1f} MB", 1 / MB),
            str(_value(row, "tags.env.device_name") or _value(row, "device") or "n/a"),
            _short_sha(sha),
            str(_value(row, "tags.config_hash") or "n/a"),
            _fmt(_value(row, "repeats"), "{:.0f}"),
            str(run_id)[:8] if run_id else "n/a",
        ])
    return data


def precision_order(values) -> list[str]:
    """Precisions from widest to narrowest, as ``trials.config.PRECISIONS`` lists them."""
    known = [p for p in PRECISIONS if p in set(values)]
    return known + sorted(set(values) - set(known))


def spread_error_bars(part: pd.DataFrame, y: str, ys: list[float]) -> dict | None:
    """Asymmetric error bars from the ``<y>_min``/``<y>_max`` spread columns, when the runs have them."""
    if not {f"{y}_min", f"{y}_max"} <= set(part.columns):
        return None
    return dict(type="data", symmetric=False,
                array=[max(0.0, float(hi) - m) for hi, m in zip(part[f"{y}_max"], ys)],
                arrayminus=[max(0.0, m - float(lo)) for lo, m in zip(part[f"{y}_min"], ys)])


def grouped_bars(rows: pd.DataFrame, x: str, series: str, y: str, series_order: list,
                 title: str, y_title: str, series_label=str) -> go.Figure:
    """Bars of ``y`` per ``x``, one trace per ``series`` value; error bars from ``y_min``/``y_max``."""
    figure = go.Figure()
    for value in series_order:
        part = rows[rows[series] == value].assign(_x=lambda f: f[x].astype(str)).sort_values("_x")
        ys = [float(v) for v in part[y]]
        error_y = spread_error_bars(part, y, ys)
        figure.add_trace(go.Bar(
            name=series_label(value), x=list(part["_x"]), y=ys, error_y=error_y,
            customdata=provenance(part),
            hovertemplate=f"<b>%{{x}}</b> · {series_label(value)}<br>{y_title}: %{{y:.1f}}<br>"
                          + PROVENANCE_HOVER + "<extra></extra>"))
    figure.update_layout(title=title, barmode="group", xaxis_title=x, yaxis_title=y_title,
                         legend_title=series, template="plotly_white",
                         margin=dict(l=60, r=20, t=60, b=50), height=420)
    return figure


def device_names(rows: pd.DataFrame) -> str:
    column = "tags.env.device_name" if "tags.env.device_name" in rows.columns else "device"
    names = sorted({str(v) for v in rows.get(column, pd.Series(dtype=str)).dropna()})
    return ", ".join(names) or "unknown device"


def count_range(rows: pd.DataFrame, column: str) -> str:
    """``3`` or ``2–5``: the values of a count column over the charted runs."""
    values = sorted({int(v) for v in pd.to_numeric(rows.get(column), errors="coerce").dropna()}) \
        if column in rows.columns else []
    if not values:
        return "?"
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"


def points(rows: pd.DataFrame, x: str, y: str, series: str, series_order: list, title: str,
           x_title: str, y_title: str, mode: str = "lines+markers") -> go.Figure:
    """``y`` against a numeric ``x``, one trace per ``series`` value, error bars from ``y_min``/``y_max``."""
    figure = go.Figure()
    for value in series_order:
        part = rows[rows[series] == value].sort_values(x)
        ys = [float(v) for v in part[y]]
        error_y = spread_error_bars(part, y, ys)
        label = "" if "model" not in part.columns else "%{text}<br>"
        figure.add_trace(go.Scatter(
            name=str(value), x=[float(v) for v in part[x]], y=ys, mode=mode, error_y=error_y,
            text=list(part["model"].astype(str)) if "model" in part.columns else None,
            customdata=provenance(part),
            hovertemplate=f"<b>{value}</b><br>{label}{x_title}: %{{x}}<br>{y_title}: %{{y:.1f}}<br>"
                          + PROVENANCE_HOVER + "<extra></extra>"))
    figure.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, legend_title=series,
                         template="plotly_white", margin=dict(l=60, r=20, t=60, b=50), height=420)
    return figure


def stack_order(rows: pd.DataFrame) -> list[str]:
    """Stack labels, plain precision first, then by how much is stacked on top."""
    labels = rows["stack"].astype(str).unique()
    return sorted(labels, key=lambda s: (s.count("+"), precision_order(
        [p.split("+")[0] for p in labels]).index(s.split("+")[0]), s))
