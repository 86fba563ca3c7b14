"""Engines: the same models and prompts on every engine (``trials.engines``).

Per model, two charts. **Speed vs memory**: decode tok/s (x, 95 % interval over repeats) against peak
memory (y) for every stack of every engine, one colour per engine, labelled with its weights (each
engine's own weight types) and its cache or prompt lookup: bottom-right is best.
**Effects per engine**: each optimization's multiplicative effect on tok/s, measured on each engine
from its own 16-bit base (``Engine.sixteen_bit``): 4-bit weights (the type a model ships in where the
engine runs it as is, the type people deploy, preferred over one requantized from it), an 8- and a
4-bit KV cache, prompt lookup. The whisker is a 95 % t-interval on
the log ratio of the two runs (their repeats' variances, Welch-style degrees of freedom rounded down):
where it crosses 1 the effect is within the noise. An effect above 1 on one engine and below on the
other is a flip, and the chart shows it side by side.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.sections.common import (MB, PROVENANCE_HOVER, TEMPLATE, WHISKERS, count_range, has, latest,
                                       provenance, spread_error_bars)
from dashboard.sections.readable import magnitude_groups
from trials.engines import DEFAULT, ENGINES
from trials.stats.factorial import t_quantile

GROUP = "engines"
TITLE = "Engines — the same optimizations on every engine"
BLURB = ("Does an optimization still help on the engine you deploy? The same models, prompts and "
         "greedy tokens on every engine, each optimization's effect per engine.")
DEEP_DIVE_TITLE = "Per model: speed vs memory by engine, and each optimization's effect per engine"
OVERVIEW_ID, ALL_EFFECTS_ID = "engines-overview", "engines-effects-all"
SCATTER_ID, EFFECTS_ID = "engines-scatter", "engines-effects"
NEEDED = ("model", "tok_per_s", "peak_memory_bytes", "engine", "precision", "stack")
COLORS = {name: engine.color for name, engine in ENGINES.items()}
EFFECTS = ("4-bit weights vs 16-bit", "8-bit KV cache vs 16", "4-bit KV cache vs 16", "prompt lookup vs none")


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    rows = latest(frame, ["model", "stack"]).copy()
    for column in ("tok_per_s", "peak_memory_bytes", "kv_bits", "log_tok_per_s_mean", "log_tok_per_s_var",
                   "tok_per_s_repeats", "kl_divergence", "perplexity", "fidelity_token_match"):
        if column in rows.columns:
            rows[column] = pd.to_numeric(rows[column], errors="coerce")
    rows = rows[rows["tok_per_s"].notna() & rows["tok_per_s"].map(math.isfinite)]
    rows["engine"] = rows["engine"].fillna(DEFAULT).replace("", DEFAULT)
    return rows


def deep_dive_models(frame: pd.DataFrame) -> list[str]:
    return sorted(_rows(frame)["model"].unique()) if has(frame, *NEEDED) else []


def _plain(rows: pd.DataFrame) -> pd.Series:
    return (rows["kv_bits"].fillna(16) == 16) & (rows.get("speculation", "none").fillna("none") == "none")


def _base(rows: pd.DataFrame, engine: str) -> pd.Series | None:
    mine = rows[(rows["engine"] == engine) & _plain(rows)]
    for precision in ENGINES[engine].sixteen_bit if engine in ENGINES else ():
        found = mine[mine["precision"] == precision]
        if len(found):
            return found.iloc[0]
    return None


def _ratio(a: pd.Series, b: pd.Series) -> tuple[float, float | None, float | None]:
    """a / b in tok/s, and its 95 % t-interval on the log scale (None without repeats' variances)."""
    ratio = float(a["tok_per_s"]) / float(b["tok_per_s"])
    va, vb = a.get("log_tok_per_s_var"), b.get("log_tok_per_s_var")
    na, nb = a.get("tok_per_s_repeats"), b.get("tok_per_s_repeats")
    if any(v is None or pd.isna(v) for v in (va, vb, na, nb)) or min(na, nb) < 2:
        return ratio, None, None
    se2a, se2b = va / na, vb / nb
    se = math.sqrt(se2a + se2b)
    df = (se2a + se2b) ** 2 / ((se2a ** 2 / (na - 1) if se2a else 0) + (se2b ** 2 / (nb - 1) if se2b else 0)) \
        if (se2a or se2b) else na + nb - 2
    half = t_quantile(max(1, int(df))) * se
    log_ratio = float(a["log_tok_per_s_mean"]) - float(b["log_tok_per_s_mean"])
    return ratio, math.exp(log_ratio - half), math.exp(log_ratio + half)


def effects(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (engine, effect) measured for this model's rows: ratio, interval, both runs."""
    out = []
    for engine in sorted(rows["engine"].unique()):
        base = _base(rows, engine)
        if base is None:
            continue
        mine = rows[rows["engine"] == engine]
        same_weights = mine["precision"] == base["precision"]
        spec = mine.get("speculation", pd.Series("none", index=mine.index)).fillna("none")
        candidates = {
            EFFECTS[0]: mine[_plain(mine) & mine["precision"].isin(ENGINES[engine].four_bit if engine in ENGINES else ())],
            EFFECTS[1]: mine[same_weights & (mine["kv_bits"] == 8) & (spec == "none")],
            EFFECTS[2]: mine[same_weights & (mine["kv_bits"] == 4) & (spec == "none")],
            EFFECTS[3]: mine[same_weights & (mine["kv_bits"].fillna(16) == 16) & (spec == "prompt_lookup")],
        }
        for name, found in candidates.items():
            if len(found):
                shipped = found[found.get("tags.weights_as_shipped", pd.Series("", index=found.index)) == "True"]
                row = (shipped if len(shipped) else found).sort_values("tok_per_s").iloc[-1]
                ratio, low, high = _ratio(row, base)
                out.append({"engine": engine, "effect": name, "ratio": ratio, "low": low, "high": high,
                            "stack": row["stack"], "base": base["stack"]})
    return pd.DataFrame(out)


def _quality(row) -> str:
    parts = []
    for column, label, fmt in (("fidelity_token_match", "token match", ".2f"), ("kl_divergence", "KL", ".4f"),
                               ("perplexity", "perplexity", ".2f")):
        value = row.get(column)
        if value is not None and not pd.isna(value):
            parts.append(f"{label} {float(value):{fmt}}")
    if row.get("tags.weights_as_shipped") == "True":
        parts.append("weights as shipped")
    checked = _benchmark(row)
    if checked:
        parts.append(checked[0])
    return ", ".join(parts) or "not scored"


def _benchmark(row) -> tuple[str, bool] | None:
    """(how the run's decode rate compares with its engine's own benchmark on the same file, whether
    they differ by more than the tolerance), or None where the engine has no benchmark or it did not run."""
    engine = ENGINES.get(row.get("engine"))
    if engine is None or not engine.benchmark_ratio:
        return None
    ratio, tolerance = row.get(engine.benchmark_ratio), engine.benchmark_tolerance
    if ratio is None or pd.isna(ratio):
        return None
    plain = row.get("speculation", "none") in ("none", None) or pd.isna(row.get("speculation"))
    off = plain and abs(float(ratio) - 1) > tolerance
    return f"x{float(ratio):.2f} of {engine.benchmark}'s decode rate" + (" (differs by more than "
                                                                          f"{tolerance:.0%})" if off else ""), off


def _scatter_traces(rows: pd.DataFrame, every_model: bool) -> list[go.Scatter]:
    """One trace per engine: tok/s vs peak memory, each point named by its stack (and its model)."""
    traces = []
    for engine, part in rows.groupby("engine"):
        xs = [float(v) for v in part["tok_per_s"]]
        names = [str(s).split(":", 1)[-1] for s in part["stack"]]
        if every_model:
            names = [f"{m} {n}" for m, n in zip(part["model"], names)]
        traces.append(go.Scatter(
            name=engine, legendgroup=engine, x=xs, y=[float(v) / MB for v in part["peak_memory_bytes"]],
            mode="markers+text", text=names, textposition="top center",
            marker=dict(size=11, color=COLORS.get(engine)), error_x=spread_error_bars(part, "tok_per_s", xs),
            customdata=provenance(part), hovertext=[_quality(row) for _, row in part.iterrows()],
            hovertemplate=f"<b>{engine}</b> %{{text}}<br>tok/s: %{{x:.1f}}<br>peak memory: %{{y:.1f}} MB<br>"
                          "quality: %{hovertext}<br>" + PROVENANCE_HOVER + "<extra></extra>"))
    return traces


def scatter(rows: pd.DataFrame, model: str | None) -> go.Figure:
    """tok/s vs peak memory, one colour per engine; ``model`` None: every model, in one panel per order
    of magnitude of tok/s (``readable.magnitude_groups``: the zoo's thousands of tok/s would squeeze
    real models' tens into one pile), each point named with its model where a panel holds several."""
    groups = [sorted(rows["model"].unique())] if model is not None else \
        magnitude_groups(rows.groupby("model")["tok_per_s"].median().to_dict())
    figure = make_subplots(rows=1, cols=len(groups), subplot_titles=[", ".join(g) for g in groups]
                           if len(groups) > 1 else None)
    shown = set()
    for col, models in enumerate(groups, start=1):
        for trace in _scatter_traces(rows[rows["model"].isin(models)], len(models) > 1):
            trace.showlegend = trace.name not in shown
            shown.add(trace.name)
            figure.add_trace(trace, row=1, col=col)
    figure.update_xaxes(title_text="decode tok/s")
    figure.update_yaxes(title_text="peak memory (MB)")
    panels = "<br><sup>one panel per order of magnitude of tok/s</sup>" if len(groups) > 1 else ""
    figure.update_layout(title=f"{model or 'Every model'}: decode tok/s vs peak memory by engine "
                               f"(bottom-right is best){panels}", legend_title="engine", template=TEMPLATE,
                         margin=dict(l=70, r=20, t=80 if len(groups) > 1 else 60, b=50), height=440)
    return figure


def effects_chart(table: pd.DataFrame, model: str | None) -> go.Figure:
    """Each effect's tok/s ratio per engine; ``model`` None: every model's (x: model · effect)."""
    figure = go.Figure()
    for engine, part in table.groupby("engine"):
        ys = list(part["ratio"])
        xs = list(part["effect"]) if model is not None else [f"{m} · {e}" for m, e in zip(part["model"], part["effect"])]
        has_ci = part["low"].notna() & part["high"].notna()
        error_y = dict(type="data", symmetric=False,
                       array=[(h - r) if ok else 0 for r, h, ok in zip(ys, part["high"], has_ci)],
                       arrayminus=[(r - lo) if ok else 0 for r, lo, ok in zip(ys, part["low"], has_ci)])
        figure.add_trace(go.Bar(
            name=engine, x=xs, y=ys, error_y=error_y, marker_color=COLORS.get(engine),
            customdata=list(zip(part["stack"], part["base"])),
            hovertemplate=f"<b>{engine}</b> %{{x}}<br>x%{{y:.2f}} tok/s: %{{customdata[0]}} over "
                          "%{customdata[1]}<extra></extra>"))
    figure.add_hline(y=1.0, line_dash="dash", line_color="#555")
    figure.update_layout(title=f"{model or 'Every model'}: each optimization's effect on tok/s, per engine "
                               "(1 = no change; whiskers: 95 % interval)",
                         barmode="group", xaxis_title="optimization", yaxis_title="tok/s ratio (x)",
                         yaxis_type="log", legend_title="engine", template=TEMPLATE,
                         margin=dict(l=70, r=20, t=60, b=50), height=440)
    return figure


def all_effects(rows: pd.DataFrame) -> pd.DataFrame:
    tables = [effects(part).assign(model=model) for model, part in rows.groupby("model")]
    tables = [t for t in tables if not t.empty]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    """Every model at once: speed vs memory, and every effect side by side per engine (a flip shows)."""
    if not has(frame, *NEEDED):
        return []
    rows = _rows(frame)
    if rows.empty:
        return []
    out = [(OVERVIEW_ID, scatter(rows, None))]
    table = all_effects(rows)
    if not table.empty:
        out.append((ALL_EFFECTS_ID, effects_chart(table, None)))
    return out


def deep_dive(frame: pd.DataFrame, model: str) -> list[tuple[str, go.Figure]]:
    if not has(frame, *NEEDED):
        return []
    rows = _rows(frame)
    rows = rows[rows["model"] == model]
    if rows.empty:
        return []
    out = [(SCATTER_ID, scatter(rows, model))]
    table = effects(rows)
    if not table.empty:
        out.append((EFFECTS_ID, effects_chart(table, model)))
    return out


def caption(frame: pd.DataFrame) -> str:
    if not has(frame, *NEEDED):
        return ""
    rows = _rows(frame)
    notes = []
    for name in sorted(rows["engine"].unique()):
        engine = ENGINES.get(name)
        if engine is None or not engine.caption:
            continue
        builds = rows[rows["engine"] == name].get(f"tags.{engine.version_tag}", pd.Series(dtype=str)).dropna()
        build = ", ".join(sorted({str(v) for v in builds}))
        notes.append(f"{engine.title}{f' {build}' if build else ''}: {engine.caption}")
    return (f"Median decode tok/s over {count_range(rows, 'repeats')} repeats ({WHISKERS}); batch 1, greedy, "
            f"{count_range(rows, 'max_new_tokens')} new tokens per prompt, the same prompt token ids on every "
            f"engine (the transformers tokenizer's). {' '.join(notes)} Real models' values are 4-bit-derived. "
            f"Effects: a 95 % t-interval on the log ratio of two runs.{_benchmark_note(rows)}")


def _benchmark_note(rows: pd.DataFrame) -> str:
    """Which runs' decode rates differ from their engine's own benchmark by more than its tolerance."""
    checked = [(row, _benchmark(row)) for _, row in rows.iterrows()]
    checked = [(row, found) for row, found in checked if found]
    if not checked:
        return ""
    off = [f"{row['model']} {row['stack']} ({found[0]})" for row, found in checked if found[1]]
    return (f" Each run's decode rate beside its engine's own benchmark on the same file ({len(checked)} runs): "
            + (f"{len(off)} differ by more than the tolerance: {'; '.join(off)}." if off else "all within the tolerance."))


def report(frame: pd.DataFrame) -> list[str]:
    """Per model and engine: tok/s, peak memory and token match per stack; then the effects."""
    if not has(frame, *NEEDED):
        return []
    rows = _rows(frame)
    lines = ["| model | engine | stack | tok/s (95 % interval) | peak MB | token match | KL (nats) | perplexity | vs own benchmark |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def number(row, column: str, fmt: str) -> str:
        value = row.get(column)
        return "" if value is None or pd.isna(value) else format(float(value), fmt)

    for _, row in rows.sort_values(["model", "engine", "tok_per_s"]).iterrows():
        low, high = row.get("tok_per_s_ci_low"), row.get("tok_per_s_ci_high")
        ci = f" ({float(low):.1f}–{float(high):.1f})" if low is not None and not pd.isna(low) else ""
        lines.append(f"| {row['model']} | {row['engine']} | {row['stack']} | {float(row['tok_per_s']):.1f}{ci} | "
                     f"{float(row['peak_memory_bytes']) / MB:.0f} | {number(row, 'fidelity_token_match', '.2f')} | "
                     f"{number(row, 'kl_divergence', '.4f')} | {number(row, 'perplexity', '.2f')} | "
                     f"{(_benchmark(row) or ('',))[0]} |")
    lines += ["", "| model | effect | " + " | ".join(sorted(rows["engine"].unique())) + " |",
              "| --- | --- | " + " | ".join("---" for _ in rows["engine"].unique()) + " |"]
    for model, part in rows.groupby("model"):
        table = effects(part)
        if table.empty:
            continue
        for effect, cells in table.groupby("effect", sort=False):
            by_engine = {r["engine"]: r for _, r in cells.iterrows()}
            text = []
            for engine in sorted(rows["engine"].unique()):
                r = by_engine.get(engine)
                text.append("" if r is None else f"x{r['ratio']:.2f}" + (
                    f" ({r['low']:.2f}–{r['high']:.2f})" if r["low"] is not None and not pd.isna(r["low"]) else ""))
            lines.append(f"| {model} | {effect} | " + " | ".join(text) + " |")
    return lines
