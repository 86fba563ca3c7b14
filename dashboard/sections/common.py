"""Chart pieces every section shares: which run stands for a configuration, and where a number came from.

A throughput is only trusted when its origin is one hover away, so every bar and point carries the
same provenance (TTFT, time per output token, peak memory, device, git sha, config hash, run id) and
every bar shows the spread over repeats as its error bar. Reruns of a configuration are kept in the
store; a chart shows the most recent one.

Values reach plotly as plain lists, not numpy arrays, so the figure JSON holds plain numbers that the
browser (and the browser tests) can read back as they are.

A number measured in a precision its CPU only emulates (bf16 on an AVX2-only CPU: ``precision_native``
"False", see ``trials.measurement.hardware``) describes the emulation more than the optimization. Provenance says
so in its device field (CPU model, torch's CPU capability, ``EMULATED``); ``mark_emulated`` then
hatches and fades those bars and crosses and fades those points, and ``emulation_note`` is the line a
section shows above its charts. The app applies both to every section, so a new chart gets them by
using ``provenance`` in its hover. Runs logged before these tags existed count as native.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from trials.config import PRECISIONS
from trials.measurement.neighbours import NOISY_CORES
from trials.stats.runs import latest  # noqa: F401  (the sections read it from here)

MB = 1024 * 1024
EMULATED = "EMULATED"      # in provenance's device field iff the run's precision was emulated
EMULATED_OPACITY = 0.5


# plotly_white's look in a few lines: the named template is kilobytes of JSON copied into every figure,
# which took most of a full page's server time (benchmarks/dashboard_scale.py measures the page).
_GRID = "#EBF0F8"
TEMPLATE = go.layout.Template(layout=dict(
    paper_bgcolor="white", plot_bgcolor="white", font=dict(color="#2a3f5f"), hovermode="closest",
    colorway=["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880",
              "#FF97FF", "#FECB52"],
    xaxis=dict(gridcolor=_GRID, linecolor=_GRID, zerolinecolor=_GRID, ticks="", automargin=True),
    yaxis=dict(gridcolor=_GRID, linecolor=_GRID, zerolinecolor=_GRID, ticks="", automargin=True)))


@dataclass(frozen=True)
class TextBeside:
    """What a section shows beside its charts that is text, not a chart: ``lines`` to read, then
    ``folds`` behind a click, each ``(summary, ((label, text), ...))`` whose texts get a copy button
    (code, a command line). The app draws it with html.Details and dcc.Clipboard, the export as
    <details>: sections stay free of Dash. Texts come as the section's frame holds them (escaped)."""

    lines: tuple[str, ...] = ()
    folds: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()


def has(frame: pd.DataFrame, *columns: str) -> bool:
    """The frame has rows and every named column."""
    return not frame.empty and all(c in frame.columns for c in columns)


def _value(row, column: str):
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _short_sha(sha) -> str:
    if not sha:
        return "n/a"
    sha = str(sha)
    return sha[:12] + "-dirty" if sha.endswith("-dirty") else sha[:12]


def is_emulated(row: pd.Series) -> bool:
    """The run's precision ran emulated on its CPU (tag ``precision_native`` "False"); unknown: no."""
    return str(_value(row, "tags.precision_native")) == "False"


def _slower(row: pd.Series, precision, pattern: str) -> str:
    """``pattern`` filled with the run's measured 16-bit/fp32 matmul time ratio, or "" without one."""
    value = pd.to_numeric(_value(row, f"tags.env.{precision}_matmul_ratio"), errors="coerce")
    return "" if pd.isna(value) else pattern.format(value)


def device_text(row: pd.Series) -> str:
    """``AMD EPYC (AVX2)``; a GPU adds its host CPU; an emulated precision says so and how slow."""
    name = str(_value(row, "tags.env.device_name") or _value(row, "device") or "n/a")
    cpu, capability = _value(row, "tags.env.cpu_model"), _value(row, "tags.env.cpu_capability")
    text = name if not cpu or str(cpu) == name else f"{name} · CPU {cpu}"
    if capability:
        text += f" ({capability})"
    if is_emulated(row):
        precision = _value(row, "precision") or "16-bit"
        text += f" · {precision} {EMULATED}" + _slower(row, precision, ", matmuls ~{:.0f}x fp32 time")
    return text


def noisy_neighbour(row) -> str:
    """``noisy neighbour: 0.42 cores outside`` for a run whose tag ``noisy_neighbour`` is "True" (processes
    outside the trial took more than ``NOISY_CORES`` of its CPUs, ``trials.measurement.neighbours``),
    else "": shown on hover beside ``shared_machine``, and counted by ``neighbour_note``."""
    if str(_value(row, "tags.noisy_neighbour")) != "True":
        return ""
    cores = pd.to_numeric(_value(row, "outside_cpu_cores"), errors="coerce")
    return "noisy neighbour" + ("" if pd.isna(cores) else f": {float(cores):.2f} cores outside")


def neighbour_note(frame: pd.DataFrame) -> str:
    """One line when any run a chart may show (the latest per configuration) had a noisy neighbour."""
    if not has(frame, "tags.noisy_neighbour"):
        return ""
    rows = latest(frame, ["tags.config_hash"]) if "tags.config_hash" in frame.columns else frame
    marked = [row for row in rows.to_dict("records") if noisy_neighbour(row)]
    if not marked:
        return ""
    most = pd.to_numeric(pd.Series([r.get("outside_cpu_cores") for r in marked]), errors="coerce").max()
    return (f"{len(marked)} run(s) shown ran beside a noisy neighbour: processes outside the trial took more "
            f"than {NOISY_CORES:g} core of its CPUs" + ("" if pd.isna(most) else f" (up to {most:.2f})")
            + "; their numbers may read low (\"noisy neighbour\" on hover).")


class Hover:
    """What a point shows on hover, from ONE list of fields ``(name, label, source, format)``: the
    trace's ``customdata`` rows (``rows``) and its hovertemplate lines (``lines``) come from the same
    list, so adding a field shifts nothing by hand. ``source`` is a column or ``row -> value``;
    ``format`` a pattern for a number (``"{:.3f} s"``), ``"{}"`` for text, or ``value -> str``; a
    missing value shows as n/a. Sections extend ``PROVENANCE`` (``PROVENANCE + Hover(...)``), so the
    provenance fields come first in every trace and the app finds them by name."""

    def __init__(self, *fields: tuple):
        names = [f[0] for f in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"hover fields named twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
        self.fields = tuple(fields)

    def __add__(self, other: "Hover") -> "Hover":
        return Hover(*self.fields, *other.fields)

    def index(self, name: str) -> int:
        return [f[0] for f in self.fields].index(name)

    def lines(self, *names: str) -> str:
        """``label: value<br>`` per named field (every field when none is named)."""
        names = names or tuple(f[0] for f in self.fields)
        return "".join(f"{self.fields[self.index(n)][1]}: %{{customdata[{self.index(n)}]}}<br>" for n in names)

    def rows(self, frame: pd.DataFrame) -> list[list[str]]:
        return [[_text(row, source, fmt) for _, _, source, fmt in self.fields]
                for row in frame.to_dict("records")]


def _text(row: dict, source, fmt) -> str:
    value = source(row) if callable(source) else _value(row, source)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if callable(fmt):
        return fmt(value)
    if fmt == "{}":
        return str(value)
    number = pd.to_numeric(value, errors="coerce")
    return "n/a" if pd.isna(number) else fmt.format(float(number))


def _device_and_weights(row) -> str:
    origin = _value(row, "tags.weights_origin")
    return device_text(row) + (f"<br>weights: {origin}" if origin else "")


PROVENANCE = Hover(
    ("ttft", "ttft_s", "ttft_s", "{:.4f} s"),
    ("tpot", "tpot_s", "tpot_s", "{:.5f} s"),
    ("memory", "peak memory", "peak_memory_bytes", lambda v: f"{float(v) / MB:.1f} MB"),
    ("device", "device", _device_and_weights, "{}"),
    ("git", "git sha", lambda row: _short_sha(_value(row, "tags.env.git_sha")), "{}"),
    ("config", "config_hash", "tags.config_hash", "{}"),
    ("repeats", "repeats", "repeats", "{:.0f}"),
    ("shared", "beside it", lambda row: " · ".join(filter(None, (
        _value(row, "tags.shared_machine") or "not recorded", noisy_neighbour(row)))), "{}"),
    ("run", "run", "run_id", "{}"),             # the whole id: a click opens the run (assets/open_run.js)
)
PROVENANCE_HOVER = (PROVENANCE.lines()[:-len("<br>")]
                    + " (click: open it in MLflow · shift-click: its generated texts)")
RUN_ID_FIELD = PROVENANCE.index("run")          # the field a click reads to open the run in the MLflow UI
DEVICE_FIELD = PROVENANCE.index("device")


def provenance(rows: pd.DataFrame) -> list[list[str]]:
    """Per row, the hover fields of ``PROVENANCE_HOVER``, already formatted."""
    return PROVENANCE.rows(rows)


def _is_provenance_trace(trace) -> bool:
    return (isinstance(getattr(trace, "hovertemplate", None), str) and PROVENANCE_HOVER in trace.hovertemplate
            and bool(trace.customdata))


def _emulated_symbol(symbol) -> str:
    """``circle`` -> ``circle-x``, ``diamond-open`` -> ``diamond-x-open``; other shapes stay."""
    symbol = str(symbol or "circle")
    base, open_ = (symbol[:-5], "-open") if symbol.endswith("-open") else (symbol, "")
    return f"{base}-x{open_}" if base in ("circle", "square", "diamond") else symbol


def mark_emulated(figure: go.Figure) -> go.Figure:
    """Hatch and fade every bar, cross and fade every marker, whose run ran an emulated precision.

    Works on any trace whose hover shows ``PROVENANCE_HOVER`` (its customdata rows start with the
    ``provenance`` fields); traces and their names are left as they are, only per-point style changes.
    """
    for trace in figure.data:
        if not _is_provenance_trace(trace):
            continue
        flags = [EMULATED in str(point[DEVICE_FIELD]) for point in trace.customdata]
        if not any(flags):
            continue
        opacity = [EMULATED_OPACITY if f else 1.0 for f in flags]
        if trace.type == "bar":
            trace.marker.pattern.shape = ["/" if f else "" for f in flags]
            trace.marker.opacity = opacity
        elif trace.type == "scatter" and "markers" in (trace.mode or "markers"):
            symbol = trace.marker.symbol
            symbols = list(symbol) if isinstance(symbol, (list, tuple)) else [symbol] * len(flags)
            trace.marker.symbol = [_emulated_symbol(s) if f else (s or "circle")
                                   for s, f in zip(symbols, flags)]
            trace.marker.opacity = opacity
    return figure


def emulation_note(frame: pd.DataFrame) -> str:
    """One line naming each precision a CPU only emulated, over the runs a chart may show (the latest
    run per configuration); empty when there are none or the runs predate the tags."""
    if not has(frame, "tags.precision_native"):
        return ""
    rows = latest(frame, ["tags.config_hash"]) if "tags.config_hash" in frame.columns else frame
    rows = rows[[is_emulated(row) for _, row in rows.iterrows()]]
    keys = [c for c in ("precision", "tags.env.cpu_model", "tags.env.cpu_capability")
            if c in rows.columns]
    parts = []
    for _, row in (rows.drop_duplicates(keys) if keys else rows.head(1)).iterrows():
        precision = _value(row, "precision") or "16-bit"
        cpu = _value(row, "tags.env.cpu_model") or _value(row, "tags.env.device_name") or "its CPU"
        capability = _value(row, "tags.env.cpu_capability")
        parts.append(f"{precision} on {cpu}{f' ({capability})' if capability else ''} is emulated"
                     + _slower(row, precision, " (~{:.0f}x slower matmuls than fp32)")
                     + f": its bars and points (hatched or crossed, faded; {EMULATED} on hover) "
                     "measure that emulation as much as the optimization")
    return "; ".join(parts) + "." if parts else ""


def real_model_note(frame: pd.DataFrame) -> str:
    """One line naming the real pretrained models a section shows, where their weights came from
    (4-bit-derived: dequantized GGUF, not the published checkpoints) and the workload they ran
    (smaller than the zoo's on a CPU); empty without such runs."""
    if not has(frame, "tags.weights_origin"):
        return ""
    rows = frame[frame["tags.weights_origin"].fillna("").astype(str) != ""]
    if rows.empty:
        return ""
    parts = []
    for model, mine in rows.groupby("model", sort=True):
        origin = mine["tags.weights_origin"].iloc[0]
        workloads = sorted({(str(r.get("prompts_per_type", "?")), str(r.get("max_new_tokens", "?")))
                            for _, r in mine.iterrows()})
        load = "; ".join(f"{p} prompt(s) per type x {t} new tokens" for p, t in workloads[:2])
        parts.append(f"{model}: {origin}" + (f", workload {load}" if load else ""))
    return ("Real pretrained models, labelled as such: " + " · ".join(parts)
            + ". Their numbers describe these 4-bit-derived weights, not the published bf16 checkpoints.")


def failed_note(failed: pd.DataFrame, finished_hashes: set[str], drawn: bool = False) -> tuple[str, str]:
    """(one line, the detail) for the configurations whose latest run FAILED and that never finished:
    how many, and each distinct reason with its count; the detail names each configuration.
    ``drawn``: the section draws its ``oom`` runs itself (``RUN_STATUS = None``)."""
    if failed.empty or "tags.config_hash" not in failed.columns:
        return "", ""
    rows = latest(failed[~failed["tags.config_hash"].isin(finished_hashes)], "tags.config_hash")
    if rows.empty:
        return "", ""
    reasons = (rows["tags.error"] if "tags.error" in rows.columns else pd.Series(["(no reason logged)"] * len(rows)))
    reasons = reasons.fillna("(no reason logged)").astype(str).str.split("\n").str[0]
    counts = reasons.value_counts()
    where = "out-of-memory ones marked on the charts" if drawn else "not on the charts"
    line = (f"{len(rows)} configuration(s) failed ({where}; hover for which): "
            + "; ".join(f"{n} x {reason}" for reason, n in counts.items()))
    detail = "\n".join(f"{_value(row, 'model') or '?'} {_value(row, 'stack') or ''}: {reason}"
                       for (_, row), reason in zip(rows.iterrows(), reasons))
    return line, detail


def precision_order(values) -> list[str]:
    """Precisions from widest to narrowest, as ``trials.config.PRECISIONS`` lists them."""
    known = [p for p in PRECISIONS if p in set(values)]
    return known + sorted(set(values) - set(known))


WHISKERS = "whiskers: 95 % interval over repeats (min–max for a run that logged none)"


def spread_error_bars(part: pd.DataFrame, y: str, ys: list[float]) -> dict | None:
    """Asymmetric error bars: the run's 95 % interval over repeats (``<y>_ci_low``/``<y>_ci_high``,
    logged for tok/s), else its ``<y>_min``/``<y>_max`` spread (one repeat, or runs from before the
    intervals); None when the runs have neither. ``WHISKERS`` says so in a chart's words."""
    low_high = []
    for i in range(len(part)):
        row = part.iloc[i]
        lo, hi = _value(row, f"{y}_ci_low"), _value(row, f"{y}_ci_high")
        if lo is None or hi is None:
            lo, hi = _value(row, f"{y}_min"), _value(row, f"{y}_max")
        low_high.append((lo, hi))
    if all(lo is None or hi is None for lo, hi in low_high):
        return None
    return dict(type="data", symmetric=False,
                array=[max(0.0, float(hi) - m) if hi is not None else 0.0 for (_, hi), m in zip(low_high, ys)],
                arrayminus=[max(0.0, m - float(lo)) if lo is not None else 0.0 for (lo, _), m in zip(low_high, ys)])


def grouped_bars(rows: pd.DataFrame, x: str, series: str, y: str, series_order: list,
                 title: str, y_title: str, series_label=str) -> go.Figure:
    """Bars of ``y`` per ``x``, one trace per ``series`` value; error bars: ``spread_error_bars``."""
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
                         legend_title=series, template=TEMPLATE,
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
                         template=TEMPLATE, margin=dict(l=60, r=20, t=60, b=50), height=420)
    return figure


def stack_order(rows: pd.DataFrame) -> list[str]:
    """Stack labels, plain precision first, then by how much is stacked on top."""
    labels = rows["stack"].astype(str).unique()
    return sorted(labels, key=lambda s: (s.count("+"), precision_order(
        [p.split("+")[0] for p in labels]).index(s.split("+")[0]), s))


# Out of memory: FAILED runs whose reason starts with ``oom`` (every group: trials/run.py) mark where
# a chart's axis ran out of memory -- a batch size, a context length.
OOM = PROVENANCE + Hover(("reason", "reason", lambda row: str(row.get("tags.error") or "").split("\n")[0] or None, "{}"))
OOM_COLOR = "#c0392b"


def oom_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs that ran out of memory (their section asked for FAILED runs: ``RUN_STATUS = None``)."""
    if not {"status", "tags.error"} <= set(frame.columns):
        return frame.iloc[0:0]
    return frame[(frame["status"] == "FAILED") & frame["tags.error"].fillna("").astype(str).str.startswith("oom")]


def finished_only(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "FINISHED"] if "status" in frame.columns else frame


def oom_crosses(figure: go.Figure, failed: pd.DataFrame, x: str, x_title: str, series: str, y: float) -> None:
    """A red ``oom`` cross per configuration that ran out of memory, at its ``x`` and at height ``y``
    (the chart's floor: it has no measurement), named by its ``series`` on hover with the reason."""
    for value, part in failed.groupby(series, sort=True):
        part = part.sort_values(x)
        figure.add_trace(go.Scatter(
            name=f"{value}: out of memory", x=[float(v) for v in part[x]], y=[y] * len(part),
            mode="markers+text", text=["oom"] * len(part), textposition="top center",
            marker=dict(symbol="x", size=13, color=OOM_COLOR, line=dict(width=2)),
            customdata=OOM.rows(part),
            hovertemplate=(f"<b>{value}: did not fit</b><br>{x_title}: %{{x:,.0f}}<br>"
                           + OOM.lines("reason") + PROVENANCE_HOVER + "<extra></extra>")))


def trial_seconds(frame: pd.DataFrame) -> pd.Series:
    """Wall time of each trial in its worker (``trial_s``: loading, references and repeats); NaN for
    runs logged before the metric existed."""
    return frame["trial_s"] if "trial_s" in frame else pd.Series(float("nan"), index=frame.index)
