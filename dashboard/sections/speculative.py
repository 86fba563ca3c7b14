"""Speculative decoding: a cheap proposer guesses k tokens, the target checks them in one pass.

Decode is bandwidth-bound, so verifying k+1 tokens costs about one target step; the win depends on
how often the guesses are right (acceptance α) and how cheap they are relative to the target (cost
ratio c). Leviathan et al. (2023): expected tokens per target pass E = (1 - α^(k+1)) / (1 - α), predicted
speedup E / (k·c + 1). Every trial logs what it measured beside those predictions (``trials.techniques.speculative.runner``).

Across models:

1. Decode throughput without speculation, with the draft model and with prompt lookup, each at its
   best k (the fastest of the k values run), labelled with the speedup and k.
2. Acceptance rate (accepted / proposed draft tokens) at that best k, per model and proposer.

Deep dive, per model (selector):

3. Acceptance and tokens per target pass vs k, measured, with the theory curve E(k) from the α
   pooled over that proposer's trials (and each trial's own prediction as an open marker). α is the
   per-token acceptance probability; the acceptance line is accepted / proposed, which falls with k.
4. Throughput vs k, the no-speculation baseline as a reference line, and the predicted throughput
   (baseline × predicted speedup) beside each measured point, also with the measured cost of a
   verification pass in place of Leviathan's one decode step.
5. Where the emitted tokens came from at the best k: accepted draft tokens vs the target's own
   token of every pass.
6. Acceptance by prompt type (code, prose, structured, repetitive) at the best k.
"""

from __future__ import annotations

import re

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.sections.common import (TEMPLATE, PROVENANCE, PROVENANCE_HOVER, Hover, device_names, has, latest,
                                       spread_error_bars)
from trials.stats.theory import expected_tokens_per_pass

GROUP = "speculative"
TITLE = "Speculative decoding — across models"
BLURB = ("A small draft guesses ahead; the big model verifies in one pass. "
         "Speedup needs a cheap draft that's often right.")
DEEP_DIVE_TITLE = "Per model: acceptance, tokens per pass and throughput by k"
THROUGHPUT_ID, ACCEPTANCE_ID = "speculative-throughput", "speculative-acceptance"
ACCEPTANCE_K_ID, THROUGHPUT_K_ID = "speculative-acceptance-vs-k", "speculative-throughput-vs-k"
SOURCE_ID, BY_TYPE_ID = "speculative-token-source", "speculative-acceptance-by-type"

REQUIRED = ("model", "speculation", "num_draft_tokens", "tok_per_s", "baseline_tok_per_s",
            "acceptance_rate", "tokens_per_target_pass")
PROPOSERS = {"draft": "draft model", "prompt_lookup": "prompt lookup"}
COLORS = {"plain": "#7f7f7f", "draft": "#1f77b4", "prompt_lookup": "#ff7f0e"}
LAYOUT = dict(template=TEMPLATE, margin=dict(l=60, r=20, t=60, b=50), height=420)
TYPE_COLUMN = re.compile(r"^acceptance_rate_(?!.*_(?:min|max)$)(\w+)$")


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Latest run per model, proposer, k and device, sorted by model, proposer, k."""
    rows = latest(frame, ["model", "speculation", "draft_model", "num_draft_tokens", "device"])
    rows = rows[rows["speculation"].isin(PROPOSERS)]
    return rows.sort_values(["model", "speculation", "num_draft_tokens"]).reset_index(drop=True)


def best_k(rows: pd.DataFrame) -> pd.DataFrame:
    """Per model and proposer, the run with the highest measured throughput (its k is the best k)."""
    if rows.empty:
        return rows
    index = rows.groupby(["model", "speculation"])["tok_per_s"].idxmax()
    return rows.loc[sorted(index)].reset_index(drop=True)


def pooled_alpha(part: pd.DataFrame) -> float | None:
    """Leviathan's per-token α over all of a proposer's trials of one model, from the pooled counts:
    accepted / (accepted + rounds ending in a rejection), as ``trials.techniques.speculative.runner`` estimates it."""
    if {"draft_tokens_accepted", "rejected_rounds"} <= set(part.columns):
        accepted = pd.to_numeric(part["draft_tokens_accepted"], errors="coerce").sum()
        tested = accepted + pd.to_numeric(part["rejected_rounds"], errors="coerce").sum()
        if tested > 0:
            return float(accepted / tested)
    return None


SPEC = PROVENANCE + Hover(
    ("k", "k (draft tokens)", "num_draft_tokens", "{:.0f}"),
    ("acceptance", "accepted/proposed", "acceptance_rate", "{:.1%}"),
    ("alpha", "α", "alpha", "{:.3f}"),
    ("per_pass", "tokens per target pass", "tokens_per_target_pass", "{:.2f}"),
    ("per_pass_theory", "tokens per target pass, theory", "expected_tokens_per_target_pass", "{:.2f}"),
    ("speedup", "speedup", "speedup", "{:.2f}x"),
    ("speedup_predicted", "speedup, predicted", "predicted_speedup", "{:.2f}x"),
    ("draft_cost", "draft cost ratio", "draft_cost_ratio", "{:.3f}"),
    ("lossless", "lossless", "lossless", "{:.0f}"),
)
SPEC_HOVER = SPEC.lines(*(f[0] for f in SPEC.fields[len(PROVENANCE.fields):]))


# ------------------------------------------------------------------------------ across models

def throughput_chart(best: pd.DataFrame) -> go.Figure:
    figure = go.Figure()
    models = sorted(best["model"].unique())
    baseline = best.groupby("model")["baseline_tok_per_s"].median()
    figure.add_trace(go.Bar(name="no speculation", x=models, y=[float(baseline[m]) for m in models],
                            marker_color=COLORS["plain"],
                            hovertemplate="<b>%{x}</b><br>no speculation: %{y:.1f} tok/s<br>"
                                          "(same prompts, same worker)<extra></extra>"))
    for speculation, name in PROPOSERS.items():
        part = best[best["speculation"] == speculation].sort_values("model")
        if part.empty:
            continue
        ys = [float(v) for v in part["tok_per_s"]]
        figure.add_trace(go.Bar(
            name=f"{name} (best k)", x=list(part["model"]), y=ys, marker_color=COLORS[speculation],
            error_y=spread_error_bars(part, "tok_per_s", ys),
            text=[f"{s:.2f}x, k={k:.0f}" for s, k in zip(part["speedup"], part["num_draft_tokens"])],
            textposition="outside", customdata=SPEC.rows(part),
            hovertemplate=f"<b>%{{x}}</b> · {name}<br>tok/s: %{{y:.1f}}<br>" + SPEC_HOVER
                          + PROVENANCE_HOVER + "<extra></extra>"))
    figure.update_layout(title="Decode throughput without vs with speculation (each at its best k)",
                         barmode="group", xaxis_title="target model", yaxis_title="tok/s",
                         legend_title="", **LAYOUT)
    return figure


def acceptance_chart(best: pd.DataFrame) -> go.Figure:
    figure = go.Figure()
    for speculation, name in PROPOSERS.items():
        part = best[best["speculation"] == speculation].sort_values("model")
        if part.empty:
            continue
        figure.add_trace(go.Bar(
            name=name, x=list(part["model"]), y=[100 * float(v) for v in part["acceptance_rate"]],
            marker_color=COLORS[speculation], customdata=SPEC.rows(part),
            text=[f"k={k:.0f}" for k in part["num_draft_tokens"]], textposition="outside",
            hovertemplate=f"<b>%{{x}}</b> · {name}<br>acceptance: %{{y:.1f}}%<br>" + SPEC_HOVER
                          + PROVENANCE_HOVER + "<extra></extra>"))
    figure.update_layout(title="Draft acceptance rate (accepted / proposed), at the best k",
                         barmode="group", xaxis_title="target model", yaxis_title="acceptance (%)",
                         yaxis_range=[0, 105], legend_title="proposer", **LAYOUT)
    return figure


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, *REQUIRED):
        return []
    best = best_k(_rows(frame))
    if best.empty:
        return []
    return [(THROUGHPUT_ID, throughput_chart(best)), (ACCEPTANCE_ID, acceptance_chart(best))]


# ------------------------------------------------------------------------------ per model

def deep_dive_models(frame: pd.DataFrame) -> list[str]:
    if not has(frame, *REQUIRED):
        return []
    return sorted(_rows(frame)["model"].unique())


def acceptance_vs_k(rows: pd.DataFrame, model: str) -> go.Figure:
    figure = make_subplots(specs=[[{"secondary_y": True}]])
    for speculation, name in PROPOSERS.items():
        part = rows[rows["speculation"] == speculation]
        if part.empty:
            continue
        ks = [float(k) for k in part["num_draft_tokens"]]
        color, custom = COLORS[speculation], SPEC.rows(part)
        figure.add_trace(go.Scatter(
            name=f"{name}: tokens per target pass", x=ks,
            y=[float(v) for v in part["tokens_per_target_pass"]], mode="lines+markers",
            line=dict(color=color), marker=dict(size=10), customdata=custom,
            hovertemplate=f"<b>{name}</b><br>k: %{{x}}<br>tokens per pass: %{{y:.2f}}<br>" + SPEC_HOVER
                          + PROVENANCE_HOVER + "<extra></extra>"), secondary_y=False)
        if "expected_tokens_per_target_pass" in part.columns:
            figure.add_trace(go.Scatter(
                name=f"{name}: theory from each trial's α", x=ks,
                y=[float(v) for v in part["expected_tokens_per_target_pass"]], mode="markers",
                marker=dict(size=14, symbol="circle-open", color=color, line=dict(width=2)),
                hovertemplate=f"<b>{name}</b><br>k: %{{x}}<br>theory: %{{y:.2f}} tokens per pass"
                              "<extra></extra>"), secondary_y=False)
        alpha = pooled_alpha(part)
        if alpha is not None:
            grid = list(range(1, int(max(ks)) + 1))
            figure.add_trace(go.Scatter(
                name=f"{name}: theory (1-α^(k+1))/(1-α), α={alpha:.2f}", x=grid,
                y=[expected_tokens_per_pass(alpha, k) for k in grid], mode="lines",
                line=dict(color=color, dash="dash"),
                hovertemplate=f"theory at pooled α={alpha:.3f}<br>k: %{{x}}<br>%{{y:.2f}} tokens per pass"
                              "<extra></extra>"), secondary_y=False)
        figure.add_trace(go.Scatter(
            name=f"{name}: accepted / proposed (%)", x=ks, y=[100 * float(v) for v in part["acceptance_rate"]],
            mode="lines+markers", line=dict(color=color, dash="dot"), marker=dict(symbol="diamond"),
            customdata=custom,
            hovertemplate=f"<b>{name}</b><br>k: %{{x}}<br>acceptance: %{{y:.1f}}%<br>" + PROVENANCE_HOVER
                          + "<extra></extra>"), secondary_y=True)
    figure.update_layout(title=f"{model}: acceptance and tokens per target pass vs k", **LAYOUT)
    figure.update_xaxes(title_text="k (draft tokens proposed per round)", dtick=1)
    figure.update_yaxes(title_text="tokens per target pass", rangemode="tozero", secondary_y=False)
    figure.update_yaxes(title_text="accepted / proposed (%)", range=[0, 105], dtick=20, showgrid=False,
                        secondary_y=True)
    return figure


def throughput_vs_k(rows: pd.DataFrame, model: str) -> go.Figure:
    figure = go.Figure()
    for speculation, name in PROPOSERS.items():
        part = rows[rows["speculation"] == speculation]
        if part.empty:
            continue
        ks = [float(k) for k in part["num_draft_tokens"]]
        ys = [float(v) for v in part["tok_per_s"]]
        figure.add_trace(go.Scatter(
            name=f"{name} (measured)", x=ks, y=ys, mode="lines+markers",
            error_y=spread_error_bars(part, "tok_per_s", ys), line=dict(color=COLORS[speculation]),
            marker=dict(size=10), customdata=SPEC.rows(part),
            hovertemplate=f"<b>{name}</b><br>k: %{{x}}<br>tok/s: %{{y:.1f}}<br>" + SPEC_HOVER
                          + PROVENANCE_HOVER + "<extra></extra>"))
        if "predicted_speedup" in part.columns:
            figure.add_trace(go.Scatter(
                name=f"{name} (predicted: baseline × Leviathan speedup)", x=ks,
                y=[float(b) * float(s) for b, s in zip(part["baseline_tok_per_s"], part["predicted_speedup"])],
                mode="markers", marker=dict(size=14, symbol="x-thin-open", color=COLORS[speculation],
                                            line=dict(width=2)),
                hovertemplate=f"<b>{name}</b> predicted<br>k: %{{x}}<br>%{{y:.1f}} tok/s<extra></extra>"))
        if "predicted_speedup_measured_verify" in part.columns:
            figure.add_trace(go.Scatter(
                name=f"{name} (predicted with the measured verification cost)", x=ks,
                y=[float(b) * float(s) for b, s in zip(part["baseline_tok_per_s"],
                                                       part["predicted_speedup_measured_verify"])],
                mode="markers", marker=dict(size=12, symbol="cross-thin-open", color=COLORS[speculation],
                                            line=dict(width=2)),
                hovertemplate=f"<b>{name}</b> predicted, verification pass as measured<br>k: %{{x}}<br>"
                              "%{y:.1f} tok/s<extra></extra>"))
    baseline = float(rows["baseline_tok_per_s"].median())
    figure.add_hline(y=baseline, line_dash="dash", line_color=COLORS["plain"],
                     annotation_text=f"no speculation: {baseline:.1f} tok/s",
                     annotation_position="bottom right")
    figure.update_layout(title=f"{model}: decode throughput vs k", xaxis_title="k", yaxis_title="tok/s",
                         legend_title="", **LAYOUT)
    figure.update_xaxes(dtick=1)
    return figure


def token_source_chart(best: pd.DataFrame, model: str) -> go.Figure:
    labels = [f"{PROPOSERS[s]} (k={k:.0f})" for s, k in zip(best["speculation"], best["num_draft_tokens"])]
    totals = [float(d) + float(t) for d, t in zip(best["tokens_from_draft"], best["tokens_from_target"])]
    figure = go.Figure()
    for column, name, color in (("tokens_from_draft", "accepted from the proposer", "#2ca02c"),
                                ("tokens_from_target", "from the target (one per pass)", "#7f7f7f")):
        values = [float(v) for v in best[column]]
        figure.add_trace(go.Bar(
            name=name, x=labels, y=values, marker_color=color,
            text=[f"{v / t:.0%}" if t else "" for v, t in zip(values, totals)], textposition="inside",
            hovertemplate=f"<b>%{{x}}</b><br>{name}: %{{y:.0f}} tokens (%{{text}})<extra></extra>"))
    figure.update_layout(title=f"{model}: where the emitted tokens came from, at the best k",
                         barmode="stack", xaxis_title="proposer", yaxis_title="tokens per workload pass",
                         legend_title="", **LAYOUT)
    return figure


def type_columns(frame: pd.DataFrame) -> list[str]:
    return sorted(c for c in frame.columns if TYPE_COLUMN.match(c) and frame[c].notna().any())


def acceptance_by_type(best: pd.DataFrame, model: str) -> go.Figure:
    columns = type_columns(best)
    types = [TYPE_COLUMN.match(c).group(1) for c in columns]
    figure = go.Figure()
    for _, row in best.iterrows():
        name = f"{PROPOSERS[row['speculation']]} (k={row['num_draft_tokens']:.0f})"
        figure.add_trace(go.Bar(
            name=name, x=types, y=[100 * float(row[c]) if pd.notna(row[c]) else None for c in columns],
            marker_color=COLORS[row["speculation"]],
            hovertemplate=f"<b>%{{x}}</b> · {name}<br>acceptance: %{{y:.1f}}%<extra></extra>"))
    figure.update_layout(title=f"{model}: acceptance by prompt type, at the best k", barmode="group",
                         xaxis_title="prompt type", yaxis_title="acceptance (%)", yaxis_range=[0, 105],
                         legend_title="proposer", **LAYOUT)
    return figure


def deep_dive(frame: pd.DataFrame, model: str) -> list[tuple[str, go.Figure]]:
    if not has(frame, *REQUIRED):
        return []
    rows = _rows(frame)
    rows = rows[rows["model"] == model]
    if rows.empty:
        return []
    best = best_k(rows)
    return [(ACCEPTANCE_K_ID, acceptance_vs_k(rows, model)), (THROUGHPUT_K_ID, throughput_vs_k(rows, model)),
            (SOURCE_ID, token_source_chart(best, model)), (BY_TYPE_ID, acceptance_by_type(best, model))]


# ------------------------------------------------------------------------------ caption

def caption(frame: pd.DataFrame) -> str:
    if not has(frame, *REQUIRED):
        return ""
    rows = _rows(frame)
    if rows.empty:
        return ""
    lossless = pd.to_numeric(rows.get("lossless"), errors="coerce")
    lossy = rows[lossless != 1]
    ratio = pd.to_numeric(rows.get("speedup_vs_predicted"), errors="coerce").dropna()
    best = best_k(rows)
    drafts = best[best["speculation"] == "draft"]
    parts = [f"{r.model}: {r.speedup:.2f}x at k={r.num_draft_tokens:.0f} (accepted/proposed "
             f"{r.acceptance_rate:.0%}, α {getattr(r, 'alpha', float('nan')):.2f}, cost ratio "
             f"{r.draft_cost_ratio:.2f})" for r in drafts.itertuples()] \
        if "draft_cost_ratio" in drafts.columns else []
    text = ("Greedy, batch 1; the baseline is the same prompts without speculation, measured in the same "
            f"worker (median of repeats). Draft speculation at its best k: {'; '.join(parts) or 'n/a'}. ")
    if not ratio.empty:
        text += (f"Measured / predicted speedup (Leviathan, from each trial's measured α and cost ratio): "
                 f"{ratio.min():.2f}–{ratio.max():.2f}, median {ratio.median():.2f}. ")
        why = []
        for column, meaning in (("verify_cost_ratio", "a verification pass costs {:.2f}x a decode step "
                                 "(theory: 1)"),
                                ("tokens_per_pass_vs_theory", "measured tokens per pass are {:.2f}x the "
                                 "theory's")):
            values = pd.to_numeric(rows.get(column), errors="coerce").dropna()
            if not values.empty:
                why.append(meaning.format(values.median()))
        if why:
            text += "Where they part (medians): " + "; ".join(why) + ". "
    if {"speedup", "predicted_speedup_measured_verify"} <= set(rows.columns):
        verified = (pd.to_numeric(rows["speedup"], errors="coerce")
                    / pd.to_numeric(rows["predicted_speedup_measured_verify"], errors="coerce")).dropna()
        if not verified.empty:
            text += (f"With the measured verification cost in place of 1: measured / predicted "
                     f"{verified.min():.2f}–{verified.max():.2f}, median {verified.median():.2f}. ")
    text += (f"Lossless (every output equals the baseline token for token): "
             f"{len(rows) - len(lossy)} of {len(rows)} trials"
             + (f"; not lossless: {', '.join(sorted(set(lossy['stack'].astype(str))))}. " if len(lossy) else ". "))
    return text + f"Device: {device_names(rows)}. Hover a point for where it came from."


def report(frame: pd.DataFrame) -> list[str]:
    if frame.empty:
        return []
    lines = ["| model | proposer | best k | speedup | alpha | lossless |", "| --- | --- | --- | --- | --- | --- |"]
    for (model, proposer), part in frame.groupby(["model", "speculation"]):
        best = part.loc[part["tok_per_s"].idxmax()]
        lines.append(f"| {model} | {proposer} | {int(best['num_draft_tokens'])} | {best['speedup']:.2f}x | "
                     f"{best.get('alpha', float('nan')):.2f} | {best['lossless']:.0f} |")
    return lines
