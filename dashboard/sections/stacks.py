"""How much did optimizations help? Whole stacks, each optimization's own effect, the best stack.

Each point is ONE trial of a combined stack (weights, KV cache, speculation loaded and generated
together, ``trials.techniques.stacks.runner``), never a sum of separate trials. The charts:

1. Speed vs memory by optimization stack: x = decode tok/s (right = faster), y = peak memory (lower =
   less), error bars the 95 % t-interval over repeats, the Pareto front drawn (no other stack both
   faster and smaller), bottom-right best. All models above; one model under the selector.
2. What each optimization contributes: main effects and two-way interactions from the per-model 2^n
   design (``trials.stats.factorial``), as "x faster" with 95 % intervals; an interval spanning 1x is
   marked not significant. Memory effects carry no interval (one peak per trial).
3. Best stack: ``dashboard.decision``'s picks (the fastest single-stream stack, the highest-throughput
   batched one, the smallest, the cheapest with a price, the served one with serving runs) within the
   limits typed in the boxes beside the model selector (quality, latency, price), as the table
   ``llm-recommend`` prints (``dashboard.decision_table``: one row per distinct stack), why each
   runner-up lost under it, and each stack's code and reproduce command behind a click. Under it,
   with capacity runs, the capacity pick (``dashboard.capacity``: the llama-server configuration with
   the most requests/s within the SLO and the quality budget, with its interval and status, and for
   the rate typed in its box the servers it takes and their cost), its command line behind a click.
"""

from __future__ import annotations

import html
import math
import textwrap

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from dashboard import capacity, served
from dashboard.decision import decide
from dashboard.limits import DEFAULT_LIMITS, Limits
from dashboard.decision_table import COLUMNS, Glance, glance
from dashboard.sections.common import (MB, PROVENANCE, PROVENANCE_HOVER, TEMPLATE, Hover, TextBeside, count_range,
                                       has, latest)
from dashboard.sections.readable import magnitude_groups
from trials.stats.factorial import effects, factor_columns
from trials.techniques.stacks.spec import SPEC_NEEDS_CROP

GROUP = "stacks"
TITLE = "How much did optimizations help?"
BLURB = ("Which stack of optimizations should this model run, and which part of the stack is doing "
         "the work?")
DEEP_DIVE_TITLE = "Per model: the stacks, what each optimization contributes, the best stack"
RUN_STATUS = None                     # FAILED combinations are named, not hidden
DECIDES = True                        # the decision (dashboard.decision, llm-recommend) reads this group
OVERVIEW_ID = "stacks-overview"
FRONTIER_ID, EFFECTS_ID = "stacks-frontier", "stacks-effects"
CARD_ID, CARD_TEXT_ID = "stacks-best", "stacks-best-more"
# The best-stack card's limits, typed beside the model selector (an emptied box: its default; a
# negative value, or a box without a default left empty: no limit); the defaults are the decision's
# (``dashboard.limits.Limits``, justified there from measured stores)
DEEP_DIVE_CONTROLS = {
    "max_kl": ("max KL (nats)", DEFAULT_LIMITS.max_kl, 0.01),
    "max_ppl_pct": ("max perplexity increase %", 100 * DEFAULT_LIMITS.max_perplexity_increase, 0.5),
    "min_token_match": ("min token match", None, 0.01),
    "max_ttft_ms": ("max TTFT ms", None, 10),
    "max_tpot_ms": ("max time/token ms", None, 1),
    "price_per_hour": ("price $/h", None, 0.1),
    "rate_rps": ("rate req/s (capacity)", None, 0.5),
}
LAYOUT = dict(template=TEMPLATE, margin=dict(l=70, r=20, t=60, b=50), height=440)
COLORS = qualitative.Plotly
NEEDED = ("model", "tok_per_s", "peak_memory_bytes", "tags.stack_name")
STACK = PROVENANCE + Hover(
    ("interval", "tok/s 95 % interval", lambda row: _interval(row), "{}"),
    ("parts", "parts", "tags.parts", "{}"),
    ("quality", "quality", lambda row: _quality(row), "{}"),
)
STACK_HOVER = ("<b>%{text}</b><br>tok/s: %{x:.1f}<br>peak memory: %{y:.1f} MB<br>"
               + STACK.lines("interval", "parts", "quality"))


def _finished(frame: pd.DataFrame) -> pd.DataFrame:
    if "status" in frame.columns:
        frame = frame[frame["status"] == "FINISHED"]
    return frame


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Latest finished run per model and stack, with the columns the charts read."""
    rows = latest(_finished(frame), ["model", "tags.stack_name", "device"])
    rows = rows.assign(peak_mb=rows["peak_memory_bytes"].astype(float) / MB,
                       name=rows["tags.stack_name"].astype(str))
    return rows


def _interval(row) -> str:
    low, high = row.get("tok_per_s_ci_low"), row.get("tok_per_s_ci_high")
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return "n/a (one repeat)"
    return f"{float(low):.1f}–{float(high):.1f}"


def _quality(row) -> str:
    parts = [f"token match {float(row['fidelity_token_match']):.3f}"] if pd.notna(row.get("fidelity_token_match")) else []
    if pd.notna(row.get("kl_divergence")):
        parts.append(f"KL {float(row['kl_divergence']):.4f}")
    if pd.notna(row.get("lossless")):
        parts.append("lossless" if float(row["lossless"]) == 1 else "not lossless")
    return ", ".join(parts) or "n/a"


def _customdata(rows: pd.DataFrame) -> list[list[str]]:
    return STACK.rows(rows)


def _error_x(rows: pd.DataFrame) -> dict | None:
    if not {"tok_per_s_ci_low", "tok_per_s_ci_high"} <= set(rows.columns):
        return None
    x = rows["tok_per_s"].astype(float)
    return dict(type="data", symmetric=False,
                array=[0.0 if pd.isna(h) else max(0.0, float(h) - v) for h, v in zip(rows["tok_per_s_ci_high"], x)],
                arrayminus=[0.0 if pd.isna(lo) else max(0.0, v - float(lo)) for lo, v in zip(rows["tok_per_s_ci_low"], x)])


def pareto_front(rows: pd.DataFrame) -> pd.Series:
    """Stacks no other stack beats on both: at least as fast and at most as big, better in one."""
    fast, small = rows["tok_per_s"].astype(float), rows["peak_mb"].astype(float)
    return pd.Series([not ((fast >= f) & (small <= s) & ((fast > f) | (small < s))).any()
                      for f, s in zip(fast, small)], index=rows.index)


def _scatter(rows: pd.DataFrame, name: str, color: str, labels: bool = True) -> go.Scatter:
    return go.Scatter(name=name, x=[float(v) for v in rows["tok_per_s"]], y=[float(v) for v in rows["peak_mb"]],
                      mode="markers+text" if labels else "markers", text=list(rows["name"]),
                      textposition="top center",
                      marker=dict(size=10, color=color), error_x=_error_x(rows),
                      customdata=_customdata(rows),
                      hovertemplate=STACK_HOVER + PROVENANCE_HOVER + "<extra></extra>")


def overview(rows: pd.DataFrame) -> go.Figure:
    """Every model's stacks, in one panel per order of magnitude of tok/s (``readable.magnitude_groups``)."""
    groups = magnitude_groups(pd.to_numeric(rows["tok_per_s"]).groupby(rows["model"]).median().to_dict())
    figure = make_subplots(rows=1, cols=len(groups), subplot_titles=[", ".join(g) for g in groups]
                           if len(groups) > 1 else None)
    for i, (model, part) in enumerate(rows.groupby("model")):
        col = next(c for c, models in enumerate(groups, start=1) if model in models)
        figure.add_trace(_scatter(part, model, COLORS[i % len(COLORS)], labels=False),   # names on hover
                         row=1, col=col)
    figure.update_xaxes(title_text="decode tok/s (95 % interval over repeats)")
    figure.update_yaxes(title_text="peak memory MB")
    panels = "<br><sup>one panel per order of magnitude of tok/s</sup>" if len(groups) > 1 else ""
    figure.update_layout(title="Speed vs memory, by optimization stack (right = faster · lower = less "
                               "memory · bottom-right is best)" + panels, legend_title="model",
                         **{**LAYOUT, "margin": dict(l=70, r=20, t=80, b=50)})
    return figure


def frontier(rows: pd.DataFrame, model: str) -> go.Figure:
    figure = go.Figure()
    figure.add_trace(_scatter(rows, "stacks", COLORS[0]))
    front = rows[pareto_front(rows)].sort_values("tok_per_s")
    figure.add_trace(go.Scatter(name="Pareto front", x=[float(v) for v in front["tok_per_s"]],
                                y=[float(v) for v in front["peak_mb"]], mode="lines",
                                line=dict(dash="dot", color="gray"), hoverinfo="skip"))
    best = rows.loc[(rows["tok_per_s"].astype(float) / rows["peak_mb"].astype(float)).idxmax()]
    figure.add_annotation(x=float(best["tok_per_s"]), y=float(best["peak_mb"]), ax=-40, ay=-40,
                          text=f"best tok/s per MB: {best['name']}", showarrow=True)
    figure.update_layout(title=f"{model}: speed vs memory by stack (bottom-right is best)",
                         xaxis_title="decode tok/s (95 % interval over repeats)", yaxis_title="peak memory MB",
                         **LAYOUT)
    return figure


def effects_chart(frame: pd.DataFrame, model: str) -> go.Figure:
    """A forest plot: each term's multiplicative effect on tok/s and on peak memory, 1x = none."""
    found, notes = effects(_finished(frame[frame["model"] == model]))
    figure = go.Figure()
    for response, label, symbol in (("tok_per_s", "tok/s", "circle"), ("peak_memory_bytes", "peak memory", "diamond")):
        rows = [e for e in found if e.response == response]
        if not rows:
            continue
        low = [math.exp(e.ci_low) if not math.isnan(e.ci_low) else None for e in rows]
        high = [math.exp(e.ci_high) if not math.isnan(e.ci_high) else None for e in rows]
        significant = ["no interval" if e.significant is None else ("significant" if e.significant else
                       "NOT significant: interval spans 1x") for e in rows]
        figure.add_trace(go.Scatter(
            name=f"effect on {label}", x=[e.ratio for e in rows], y=[e.term for e in rows], mode="markers",
            marker=dict(symbol=[symbol if s != "NOT significant: interval spans 1x" else f"{symbol}-open"
                                for s in significant], size=11),
            error_x=None if response != "tok_per_s" else dict(
                type="data", symmetric=False, array=[h - e.ratio for h, e in zip(high, rows)],
                arrayminus=[e.ratio - lo for lo, e in zip(low, rows)]),
            customdata=[[f"{lo:.3f}–{hi:.3f}" if lo else "n/a", s] for lo, hi, s in zip(low, high, significant)],
            hovertemplate=f"<b>%{{y}}</b><br>{label}: x%{{x:.3f}}<br>95 %: %{{customdata[0]}}<br>"
                          "%{customdata[1]}<extra></extra>"))
    title = f"{model}: what each optimization contributes (x = multiplies; 1 = no effect)"
    if not found:
        title = f"{model}: no effect estimates: {notes.get(model, 'no design')}"
    elif notes.get(model):
        missing = [n.split(":")[0] for n in notes[model].removeprefix("not estimable: ").split("; ")]
        title += f"<br><sup>not estimable (never run together): {', '.join(missing)}</sup>"
    figure.add_vline(x=1.0, line_dash="dash", line_color="gray")
    figure.update_layout(title=title, xaxis_type="log", xaxis_title="multiplicative effect (log scale)",
                         yaxis=dict(autorange="reversed", title="factor or interaction"), **LAYOUT)
    return figure


def limits(max_kl=None, max_ppl_pct=None, min_token_match=None, max_ttft_ms=None, max_tpot_ms=None,
           price_per_hour=None) -> Limits:
    """The boxes' values as the decision's limits (an empty or negative box: no limit)."""
    def given(value, scale=1.0):
        return None if value is None or value == "" or float(value) < 0 else float(value) * scale

    price = given(price_per_hour)
    return Limits(max_kl=given(max_kl), max_perplexity_increase=given(max_ppl_pct, 0.01),
                  min_token_match=given(min_token_match), max_ttft_s=given(max_ttft_ms, 1e-3),
                  max_tpot_s=given(max_tpot_ms, 1e-3), price_per_hour_usd=price or None)


# The card's table: ``dashboard.decision_table``'s columns, with relative widths. A plotly table does
# not wrap text, so each cell is wrapped here to its column's width (at the card's usual width) and the
# rows sized to their lines.
CARD_WIDTHS = (1.6, 1.6, 1.1, 1.6, 0.8, 1.7, 1.5, 0.8)
CARD_WIDTH_PX, CHAR_PX, LINE_PX, ROW_PX = 1000, 7.2, 20, 10


def _cell_lines(text: str, units: float) -> list[str]:
    """``text`` wrapped to a column ``units`` wide, each piece HTML-escaped so that no text of a run
    (a model's name, a user's code) is taken for a tag by plotly. The section's frame comes escaped
    (``dashboard.reader.shown``): it is unescaped first, so that no entity is cut in two."""
    width = max(8, int(units / sum(CARD_WIDTHS) * CARD_WIDTH_PX / CHAR_PX))
    return [html.escape(piece, quote=False) for line in html.unescape(text).splitlines() or [""]
            for piece in (textwrap.wrap(line, width, break_long_words=True, break_on_hyphens=False) or [""])]


def best_card(table: Glance) -> go.Figure:
    """The decision's table (``dashboard.decision_table``): one row per distinct stack, the picks it wins."""
    columns, rows = table.shown()
    widths = [CARD_WIDTHS[COLUMNS.index(name)] for name in columns]
    scale = sum(CARD_WIDTHS) / sum(widths)              # the columns left share the card's width
    wrapped = [[_cell_lines(cell, units * scale) for cell, units in zip(row, widths)] for row in rows]
    if not wrapped:
        wrapped = [[["no stack within the limits"]] + [[""]] * (len(columns) - 1)]
    cells = [["<br>".join(row[i]) for row in wrapped] for i in range(len(columns))]
    lines = sum(max(len(cell) for cell in row) for row in wrapped)
    header = max(len(_cell_lines(name, units * scale)) for name, units in zip(columns, widths))
    figure = go.Figure(go.Table(header=dict(values=columns), columnwidth=widths,
                                cells=dict(values=cells, align="left", font=dict(size=12))))
    figure.update_layout(title=f"{table.model}: best stack within {table.limits}" if table.lines else
                         f"{table.model}: no stack within the limits ({table.limits})",
                         template=TEMPLATE, margin=dict(l=20, r=20, t=50, b=10),
                         height=60 + LINE_PX * (lines + header) + ROW_PX * (len(wrapped) + 1))
    return figure


def card_text(table: Glance, capacity_pick: capacity.CapacityDecision | None = None,
              limits_now: Limits = DEFAULT_LIMITS) -> TextBeside:
    """Under the card: why each runner-up lost and the notes; each stack's code and the command that
    reruns it (a served stack: the server's command line) behind a click, with a copy button; then the
    capacity pick's block and its command line (none: no capacity runs for the model)."""
    folds = []
    for line in table.lines:
        blocks = (("turn it on in your code", line.code),
                  ("reproduce the trial" if line.code else "serve it", line.command))
        if line.code or line.command:
            folds.append((f"{line.stack}: the code and the command", tuple(b for b in blocks if b[1])))
    lines = tuple(f"why not the runner-up, {text}" for text in table.why) + tuple(table.notes)
    if capacity_pick is not None:
        lines += tuple(capacity.card_lines(capacity_pick, limits_now))
        chosen = capacity_pick.pick or (capacity_pick.closest[0] if capacity_pick.closest else None)
        if chosen is not None and chosen.command:
            which = "capacity pick" if capacity_pick.pick is not None else "capacity, closest"
            folds.append((f"{which} {chosen.label}: the command", (("serve it", chosen.command),)))
    return TextBeside(lines, tuple(folds))


def deep_dive_reads() -> tuple[str, ...]:
    """The groups the card reads besides this one: the served pick's (serving runs, and the in-process
    runs that score their GGUFs) and the capacity pick's."""
    serving, in_process = served.groups_read()
    return tuple(serving + in_process + [capacity.GROUP])


# ------------------------------------------------------------------------------ the protocol

def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, *NEEDED) or _finished(frame).empty:
        return []
    return [(OVERVIEW_ID, overview(_rows(frame)))]


def deep_dive_models(frame: pd.DataFrame) -> list[str]:
    if not has(frame, *NEEDED):
        return []
    return sorted(_finished(frame)["model"].dropna().unique())


def deep_dive(frame: pd.DataFrame, model: str, others: dict | None = None, **boxes) -> list[tuple[str, object]]:
    """``boxes``: the ``DEEP_DIVE_CONTROLS`` by name (missing: its default); ``others``: the frames of
    ``deep_dive_reads`` by group (the served pick; none: no served line)."""
    if not has(frame, *NEEDED):
        return []
    mine = frame[frame["model"] == model]
    rows = _rows(mine)
    if rows.empty:
        return []
    chosen = {name: boxes.get(name, default) for name, (_, default, _) in DEEP_DIVE_CONTROLS.items()}
    rate = chosen.pop("rate_rps")
    limits_now = limits(**chosen)
    [decision] = decide(mine, limits_now, [model])
    table = glance(decision, _served(others or {}, limits_now, model), limits_now)
    capacity_pick = _capacity(others or {}, limits_now, model, rate)
    return [(FRONTIER_ID, frontier(rows, model)), (EFFECTS_ID, effects_chart(frame, model)),
            (CARD_ID, best_card(table)), (CARD_TEXT_ID, card_text(table, capacity_pick, limits_now))]


def _served(others: dict, limits_now: Limits, model: str):
    """The model's served decision from the frames of ``deep_dive_reads`` (None: no serving runs)."""
    serving, in_process = (pd.concat([others.get(g, pd.DataFrame()) for g in names] or [pd.DataFrame()],
                                     ignore_index=True) for names in served.groups_read())
    found = served.decide_served(serving, in_process, limits_now, [model])
    return found[0] if found else None


def _capacity(others: dict, limits_now: Limits, model: str, rate) -> capacity.CapacityDecision | None:
    """The model's capacity decision from the frames of ``deep_dive_reads`` (None: no capacity runs);
    ``rate``: the box's req/s (empty or not above 0: none)."""
    runs = others.get(capacity.GROUP, pd.DataFrame())
    in_process = pd.concat([others.get(g, pd.DataFrame()) for g in served.groups_read()[1]] or [pd.DataFrame()],
                           ignore_index=True)
    rate_rps = float(rate) if rate not in (None, "") and float(rate) > 0 else None
    found = capacity.decide_capacity(runs, in_process, limits_now, [model], rate_rps)
    return found[0] if found else None


def caption(frame: pd.DataFrame) -> str:
    if not has(frame, *NEEDED):
        return ""
    rows = _rows(frame)
    factors = ", ".join(factor_columns(frame)) or "none"
    failed = frame[frame["status"] == "FAILED"] if "status" in frame.columns else frame.iloc[:0]
    return (f"{len(rows)} finished stacks over {rows['model'].nunique()} model(s); each point is one "
            f"combined trial (not a sum of separate ones). Throughput: median decode tok/s over "
            f"{count_range(rows, 'repeats')} repeats with a 95 % t-interval (on log tok/s), batch "
            f"{count_range(rows, 'batch_size')}, {count_range(rows, 'max_new_tokens')} greedy tokens per "
            f"prompt. Effects: a 2^n design over {factors}, on log tok/s (interval from the repeats) and log "
            f"peak memory (one peak per trial, no interval). Quality against each model's reference "
            f"precision (tag reference_precision); speed and memory against the base stack."
            + (f" {len(failed)} combination(s) FAILED and are listed in the best-stack table." if len(failed) else "")
            + f" Refused at plan time: a quantized KV cache with speculation ({SPEC_NEEDS_CROP}); "
              "compiled decoding with either (it needs transformers' static cache). Compiled stacks "
              "compile in the warm-up (compile_warmup_s), never in the timed passes.")


def report(frame: pd.DataFrame) -> list[str]:
    """Each stack per model (tok/s with its 95 % interval, memory, quality), then the effects."""
    if frame.empty or "tags.stack_name" not in frame:
        return []

    # "x base": against the base stack measured in the same worker (speedup_vs_baseline), which is not
    # the ratio of two rows of this table when the two workers' machines were loaded differently
    lines = ["| model | stack | tok/s (95 % CI) | x base, same worker | peak MiB | x base, same worker | token match | KL |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    rows = latest(frame, ["model", "tags.stack_name"])
    for _, r in rows.sort_values(["model", "tok_per_s"], ascending=[True, False]).iterrows():
        kl = r.get("kl_divergence")
        lines.append(f"| {r['model']} | {r['tags.stack_name']} | {r['tok_per_s']:.1f} "
                     f"({r.get('tok_per_s_ci_low', float('nan')):.1f}–{r.get('tok_per_s_ci_high', float('nan')):.1f}) | "
                     f"{r['speedup_vs_baseline']:.2f} | {r['peak_memory_bytes'] / 2**20:.1f} | "
                     f"{r['memory_vs_baseline']:.2f} | {r['fidelity_token_match']:.3f} | "
                     f"{'' if pd.isna(kl) else f'{kl:.4f}'} |")
    found, notes = effects(frame)
    lines += ["", "| model | term | x tok/s (95 % CI) | significant | x peak memory |", "| --- | --- | --- | --- | --- |"]
    memory = {(e.model, e.term): e.ratio for e in found if e.response == "peak_memory_bytes"}
    for e in (e for e in found if e.response == "tok_per_s"):
        lines.append(f"| {e.model} | {e.term} | {e.ratio:.3f} ({math.exp(e.ci_low):.3f}–{math.exp(e.ci_high):.3f}) | "
                     f"{'yes' if e.significant else 'no'} | {memory[(e.model, e.term)]:.3f} |")
    lines += [f"\n{model}: {note}" for model, note in notes.items()]
    return lines
