"""KV-cache quantization: does storing keys and values in fewer bits actually help?

The cache grows with every token (2 x layers x kv_heads x head_dim x tokens x bytes), so at long
contexts or large batches it, not the weights, fills memory; fewer bits shrink it, at some cost in
speed (de/quantizing) and fidelity. Per model, under a selector (numbers from ``trials.techniques.kv_cache.runner`` via
one query, ``tracking.runs_frame``):

1. The cache itself: measured bytes against context, full precision and 4-bit, with the exact
   formula (full precision) and the expected 4-bit bytes (formula x bits/16 + scales/zeros + the
   full-precision residual window) drawn as lines beside the measured points.
2. Where the cache overtakes the weights: the measured full-precision cache, then the exact formula
   projected (dashed) for batch 1 and batch ``LARGE_BATCH``; the crossover contexts are marked.
3. The trade-off at the longest measured context: cache memory against greedy token match and
   teacher-forced KL divergence, by KV precision (16/8/4/2), one line per backend.
   And beside them, decode throughput against context per KV precision: what de/quantizing costs.

Across models, from the architecture alone (``trials.measurement.kv_footprint``: the catalogue's transcribed
hub configs and the measured zoo models' config.json; nothing here is measured):

4. The KV cache at 32k tokens, full vs 8-bit vs 4-bit.
5. The full-precision cache against context length (sliding-window models flatten).
"""

from __future__ import annotations


import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.sections.common import (MB, PROVENANCE, PROVENANCE_HOVER, TEMPLATE, Hover, count_range, device_names,
                                       finished_only, has, latest, oom_crosses, oom_rows, points, trial_seconds)
from trials.measurement.kv_footprint import CATALOGUE, KVFootprintError, kv_footprint
from trials.models import zoo

GROUP = "kv_cache"
TITLE = "KV-cache quantization — does it actually help?"
BLURB = ("Fewer bits per cached key and value shrink the cache that grows with every token: "
         "how much memory does that buy, from which context on does it matter, and what does it "
         "cost in speed and fidelity?")
RUN_STATUS = None          # FINISHED runs draw the charts; FAILED 'oom' runs mark contexts that did not fit
DEEP_DIVE_TITLE = "Per model: cache memory, where it overtakes the weights, and what fewer bits cost"
MEMORY_ID, WEIGHTS_ID, TRADEOFF_ID, SPEED_ID = ("kv_cache-memory", "kv_cache-weights",
                                                "kv_cache-tradeoff", "kv_cache-speed")
AT_32K_ID, CONTEXT_ID = "kv_cache-32k", "kv_cache-context"

GIB = 1024 ** 3
LARGE_BATCH = 16
CONTEXT_32K = 32768
CONTEXT_GRID = [512 * 2 ** i for i in range(9)]          # 512 .. 131072 tokens
CHART_BITS = (16, 8, 4)
LAYOUT = dict(template=TEMPLATE, margin=dict(l=60, r=20, t=60, b=50), height=440)
BACKEND_COLORS = {"hqq": "#636efa", "quanto": "#00cc96"}
KEYS = ["model", "device", "precision", "kv_bits", "kv_backend", "kv_group_size",
        "kv_residual_length", "context_tokens"]
NUMERIC = ("kv_bits", "kv_group_size", "kv_residual_length", "context_tokens")
_MB = lambda v: f"{float(v) / MB:,.3f} MB"  # noqa: E731
KV = PROVENANCE + Hover(
    ("kv_measured", "KV cache, measured", "kv_cache_bytes", _MB),
    ("kv_expected", "KV cache, expected", "kv_cache_bytes_expected", _MB),
    ("kv_exact", "full-precision formula", "kv_cache_bytes_exact", _MB),
    ("token_match", "greedy token match", "fidelity_token_match", "{:.1%}"),
    ("divergence", "first divergence at token", "first_divergence_token", "{:.0f}"),
    ("kl", "teacher-forced KL (nats/token)", "kl_divergence", "{:.2e}"),
    ("ppl_delta", "perplexity Δ", "perplexity_delta", "{:+.3f}"),
)
KV_HOVER = KV.lines(*(f[0] for f in KV.fields[len(PROVENANCE.fields):]))


# ------------------------------------------------------------------------------ rows

def label(bits: int, backend: str) -> str:
    return "16-bit (full)" if int(bits) == 16 else f"{int(bits)}-bit {backend}"


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Latest run per model, stack and context, numeric where the charts need numbers."""
    frame = frame.copy()
    for column in NUMERIC:
        if column in frame.columns:
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    rows = latest(frame, KEYS)
    backends = rows["kv_backend"] if "kv_backend" in rows.columns else ["none"] * len(rows)
    rows["label"] = [label(b, k) for b, k in zip(rows["kv_bits"], backends)]
    return rows


def _fmt(value, pattern: str, scale: float = 1.0) -> str:
    value = pd.to_numeric(value, errors="coerce")
    return "n/a" if pd.isna(value) else pattern.format(float(value) * scale)


def _customdata(rows: pd.DataFrame) -> list[list[str]]:
    return KV.rows(rows)


def _hover(name: str, x_title: str, y_title: str, x_format: str = ",.0f") -> str:
    return (f"<b>{name}</b><br>{x_title}: %{{x:{x_format}}}<br>{y_title}: %{{y:,.3f}}<br>" + KV_HOVER
            + PROVENANCE_HOVER + "<extra></extra>")


def _per_token_bytes(part: pd.DataFrame) -> float | None:
    """Full-precision bytes per cached token of one sequence, as the trials logged the formula."""
    if "kv_cache_bytes_per_token_exact" in part.columns:
        values = pd.to_numeric(part["kv_cache_bytes_per_token_exact"], errors="coerce").dropna()
        if not values.empty:
            return float(values.iloc[-1])
    return None


def _measured(figure: go.Figure, part: pd.DataFrame, name: str, y: str, **kwargs) -> None:
    part = part.sort_values("kv_cache_tokens")
    figure.add_trace(go.Scatter(
        name=name, x=[float(v) for v in part["kv_cache_tokens"]], y=[float(v) / MB for v in part[y]],
        customdata=_customdata(part), hovertemplate=_hover(name, "tokens in cache", "MB"), **kwargs))


def _reference_note(rows: pd.DataFrame) -> str:
    """Which full-precision cache the quantized ones are compared with (fp32 where bf16 is emulated)."""
    bits = sorted({int(b) for b in pd.to_numeric(rows.get("kv_cache_dtype_bits", pd.Series(dtype=float)),
                                                 errors="coerce").dropna()})
    if not bits or bits == [16]:
        return ""
    return (f"The full-precision reference cache here is {'/'.join(map(str, bits))}-bit: these runs used "
            f"{'/'.join(sorted(set(rows['precision'].astype(str))))} weights (bf16 is emulated on a CPU "
            "without native bf16, so the group runs fp32 there, and transformers' QuantizedCache keeps "
            "its residual window and scales in the weights' dtype); compression ratios are against "
            "that cache, not a 16-bit one. ")


# ------------------------------------------------------------------------------ per model

def memory_chart(rows: pd.DataFrame, model: str) -> go.Figure:
    """Chart 1: measured cache bytes vs context, full and 4-bit, beside the formula and expectation."""
    part = rows[rows["model"] == model]
    figure = go.Figure()
    per_token = _per_token_bytes(part)
    top = float(part["kv_cache_tokens"].max())
    if per_token is not None:
        bits = _fmt(part.get("kv_cache_dtype_bits", pd.Series(dtype=float)).max(), "{:.0f}")
        figure.add_trace(go.Scatter(
            name=f"formula, {bits}-bit (exact)", x=[0.0, top], y=[0.0, per_token * top / MB],
            mode="lines", line=dict(color="black", width=1),
            hovertemplate="exact formula (trials/measurement/kv_footprint.py)<br>%{x:,.0f} tokens: "
                          "%{y:,.3f} MB<extra></extra>"))
    four = part[part["kv_bits"] == 4]
    for backend, sub in four.groupby("kv_backend", sort=True):
        sub = sub.sort_values("kv_cache_tokens")
        figure.add_trace(go.Scatter(
            name=f"expected, 4-bit {backend}", x=[float(v) for v in sub["kv_cache_tokens"]],
            y=[float(v) / MB for v in sub["kv_cache_bytes_expected"]], mode="lines",
            line=dict(dash="dot"),
            hovertemplate=f"expected 4-bit {backend}: formula × 4/16 + scales/zeros + residual "
                          "window (trials/techniques/kv_cache/runner.py)<br>%{x:,.0f} tokens: %{y:,.3f} MB<extra></extra>"))
    full_bits = _fmt(part.get("kv_cache_dtype_bits", pd.Series([16.0])).max(), "{:.0f}").replace("n/a", "16")
    for name, sub in [(f"{full_bits}-bit (full), measured", part[part["kv_bits"] == 16])] + \
            [(f"4-bit {b}, measured", s) for b, s in four.groupby("kv_backend", sort=True)]:
        _measured(figure, sub, name, "kv_cache_bytes", mode="markers", marker=dict(size=10))
    figure.update_layout(title=f"{model}: the KV cache itself — full vs 4-bit (points measured, "
                               "lines: formula and expectation)",
                         xaxis_title="tokens in cache (context + generated)", yaxis_title="KV cache MB",
                         **LAYOUT)
    return figure


def crossover_tokens(weights_bytes: float, per_token_bytes: float, batch: int) -> float:
    """Context at which a batch's full-precision cache holds as many bytes as the weights."""
    return weights_bytes / (per_token_bytes * batch)


def _geometric(start: float, stop: float, steps: int = 40) -> list[float]:
    ratio = (stop / start) ** (1 / (steps - 1))
    return [start * ratio ** i for i in range(steps)]


def weights_chart(rows: pd.DataFrame, model: str) -> go.Figure:
    """Chart 2: measured full cache, the formula projected beyond it, the weights, the crossovers."""
    full = rows[(rows["model"] == model) & (rows["kv_bits"] == 16)].sort_values("kv_cache_tokens")
    figure = go.Figure()
    per_token = _per_token_bytes(full)
    if full.empty or per_token is None or "weights_bytes" not in full.columns:
        return figure
    weights = float(full["weights_bytes"].iloc[-1])
    low, high = float(full["kv_cache_tokens"].min()), float(full["kv_cache_tokens"].max())
    crossings = {b: crossover_tokens(weights, per_token, b) for b in (1, LARGE_BATCH)}
    end = max(2 * crossings[1], 4 * high)
    _measured(figure, full, "KV cache, batch 1 (measured)", "kv_cache_bytes", mode="lines+markers",
              line=dict(color="#1f77b4"), marker=dict(size=9))
    for batch, start, color in ((1, high, "#1f77b4"), (LARGE_BATCH, low, "#d62728")):
        xs = _geometric(start, end)
        figure.add_trace(go.Scatter(
            name=f"batch {batch}: exact formula, projected", x=xs, y=[x * per_token * batch / MB for x in xs],
            mode="lines", line=dict(dash="dash", color=color),
            hovertemplate=f"batch {batch}, formula ({per_token:,.0f} B/token/sequence)<br>"
                          "%{x:,.0f} tokens: %{y:,.1f} MB<extra></extra>"))
    figure.add_trace(go.Scatter(
        name="weights (measured)", x=[low, end], y=[weights / MB] * 2, mode="lines",
        line=dict(color="black"),
        hovertemplate=f"weights_bytes: {weights / MB:,.1f} MB (measured in the same runs)<extra></extra>"))
    for batch, color in ((1, "#1f77b4"), (LARGE_BATCH, "#d62728")):
        at = crossings[batch]
        figure.add_trace(go.Scatter(
            name=f"crossover, batch {batch}", x=[at], y=[weights / MB], mode="markers+text",
            marker=dict(symbol="x", size=14, color=color), text=[f"batch {batch}: {at:,.0f} tokens"],
            textposition="top left" if batch == 1 else "bottom right",
            hovertemplate=f"batch {batch}: the cache equals the weights at %{{x:,.0f}} tokens"
                          "<extra></extra>"))
    figure.update_layout(title=f"{model}: at scale the cache overtakes the weights "
                               f"(batch 1 and {LARGE_BATCH})",
                         xaxis=dict(title="tokens in cache per sequence (log)", type="log"),
                         yaxis=dict(title="MB (log)", type="log"), **LAYOUT)
    return figure


def tradeoff_rows(rows: pd.DataFrame, model: str) -> pd.DataFrame:
    """The model's runs at its longest context that has a full-precision run."""
    part = rows[rows["model"] == model]
    full = part[part["kv_bits"] == 16]
    if full.empty:
        return part.iloc[0:0]
    return part[part["context_tokens"] == full["context_tokens"].max()]


def tradeoff_chart(rows: pd.DataFrame, model: str) -> go.Figure:
    """Chart 3: cache memory vs greedy token match and teacher-forced KL, one line per backend."""
    part = tradeoff_rows(rows, model)
    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "greedy outputs: token match vs full cache", "teacher-forced: KL(full ‖ quantized)"))
    full = part[part["kv_bits"] == 16]
    for backend in sorted(set(part["kv_backend"]) - {"none"}):
        line = pd.concat([full, part[part["kv_backend"] == backend]]).sort_values("kv_bits",
                                                                                  ascending=False)
        for col, y in ((1, "fidelity_token_match"), (2, "kl_divergence")):
            figure.add_trace(go.Scatter(
                name=backend, legendgroup=backend, showlegend=col == 1,
                x=[float(v) / MB for v in line["kv_cache_bytes"]], y=[float(v) for v in line[y]],
                mode="lines+markers+text", text=[f"{int(b)}-bit" for b in line["kv_bits"]],
                textposition="top center", marker=dict(size=10, color=BACKEND_COLORS.get(backend)),
                line=dict(color=BACKEND_COLORS.get(backend)), customdata=_customdata(line),
                hovertemplate=_hover(backend, "KV cache MB", y, ",.3f")),
                row=1, col=col)
    context = "?" if part.empty else f"{int(part['context_tokens'].iloc[0]):,}"
    figure.update_layout(title=f"{model}: precision trade-off at {context} context tokens — "
                               "cache memory vs fidelity, by KV precision", legend_title="backend",
                         **LAYOUT)
    figure.update_xaxes(title_text="KV cache MB (measured)")
    figure.update_yaxes(title_text="share of tokens equal", row=1, col=1)
    figure.update_yaxes(title_text="nats per token", row=1, col=2)
    return figure


def speed_chart(rows: pd.DataFrame, model: str, out_of_memory: pd.DataFrame | None = None) -> go.Figure:
    """tok/s vs context per KV precision; a context that ran out of memory (``out_of_memory``: the
    model's ``oom`` runs) is a red cross at the chart's floor."""
    part = rows[rows["model"] == model]
    order = sorted(part["label"].unique(), key=lambda s: (-int(s.split("-")[0]), s))
    figure = points(part, x="context_tokens", y="tok_per_s", series="label", series_order=order,
                    title=f"{model}: decode throughput by KV precision (whiskers: 95 % interval over repeats)",
                    x_title="context tokens", y_title="tok/s")
    if out_of_memory is not None and not out_of_memory.empty:
        failed = out_of_memory[out_of_memory["model"] == model]
        oom_crosses(figure, failed, "context_tokens", "context tokens", "label", y=0.0)
    figure.update_layout(legend_title="KV precision")
    return figure


def deep_dive_models(frame: pd.DataFrame) -> list[str]:
    frame = finished_only(frame)
    return sorted(frame["model"].dropna().unique()) if has(frame, "model") else []


def deep_dive(frame: pd.DataFrame, model: str) -> list[tuple[str, go.Figure]]:
    failed, frame = oom_rows(frame), finished_only(frame)
    if "tags.config_hash" in frame.columns:       # a configuration that later fit is drawn, not crossed
        failed = failed[~failed["tags.config_hash"].isin(frame["tags.config_hash"])]
    if not has(frame, "model", "kv_bits", "kv_cache_bytes", "kv_cache_tokens"):
        return []
    rows = _rows(frame)
    return [(MEMORY_ID, memory_chart(rows, model)), (WEIGHTS_ID, weights_chart(rows, model)),
            (TRADEOFF_ID, tradeoff_chart(rows, model)),
            (SPEED_ID, speed_chart(rows, model, _rows(failed) if not failed.empty else None))]


# ------------------------------------------------------------------------------ across models

def catalogue_models(frame: pd.DataFrame) -> list[tuple[str, object, str]]:
    """(name, footprint, where its config came from): the catalogue, then the measured zoo models."""
    out = [(name, kv_footprint(name), f"transcribed config of {spec['hub_id']}")
           for name, spec in CATALOGUE.items()]
    measured = frame["model"].dropna().unique() if has(frame, "model") else []
    for name in sorted(m for m in measured if m in zoo.RECIPES):
        try:
            out.append((name, kv_footprint(name), f"zoo config {zoo.model_path(name)}/config.json"))
        except KVFootprintError:
            continue
    return out


def at_32k_chart(models: list[tuple[str, object, str]]) -> go.Figure:
    """Chart 4: exact KV bytes at 32k tokens, batch 1, full vs 8-bit vs 4-bit, per model."""
    figure = go.Figure()
    for bits in CHART_BITS:
        figure.add_trace(go.Bar(
            name=f"{bits}-bit" + (" (full)" if bits == 16 else ""), x=[m for m, _, _ in models],
            y=[fp.total_bytes(CONTEXT_32K, 1, bits) / GIB for _, fp, _ in models],
            customdata=[source for _, _, source in models],
            hovertemplate=f"<b>%{{x}}</b> · {bits}-bit<br>%{{y:,.3f}} GiB at {CONTEXT_32K:,} tokens, "
                          "batch 1<br>exact from config: %{customdata}<br>trials/measurement/kv_footprint.py"
                          + ("" if bits == 16 else "; payload only (scales/zeros extra)")
                          + "<extra></extra>"))
    figure.update_layout(title="KV cache at 32k tokens, batch 1: full vs 8-bit vs 4-bit "
                               "(exact, from each config)", barmode="group",
                         xaxis_title="model", yaxis=dict(title="GiB (log)", type="log"),
                         legend_title="KV precision", **LAYOUT)
    return figure


def context_chart(models: list[tuple[str, object, str]]) -> go.Figure:
    """Chart 5: exact full-precision KV bytes against context, one line per model."""
    figure = go.Figure()
    for name, fp, source in models:
        figure.add_trace(go.Scatter(
            name=name, x=[float(c) for c in CONTEXT_GRID],
            y=[fp.total_bytes(c, 1, 16) / GIB for c in CONTEXT_GRID], mode="lines+markers",
            hovertemplate=f"<b>{name}</b><br>%{{x:,.0f}} tokens: %{{y:,.4f}} GiB (16-bit, batch 1)"
                          f"<br>exact from config: {source}<extra></extra>"))
    figure.update_layout(title="Full-precision KV cache vs context length, per model (exact, from config)",
                         xaxis=dict(title="context tokens (log)", type="log"),
                         yaxis=dict(title="GiB (log)", type="log"), legend_title="model", **LAYOUT)
    return figure


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    frame = finished_only(frame)
    if not has(frame, "model", "kv_bits", "kv_cache_bytes"):
        return []
    models = catalogue_models(frame)
    return [(AT_32K_ID, at_32k_chart(models)), (CONTEXT_ID, context_chart(models))]


# ------------------------------------------------------------------------------ caption

def integrity(rows: pd.DataFrame) -> str:
    """How measured bytes compare with the expectation over every charted run."""
    both = rows.dropna(subset=["kv_cache_bytes", "kv_cache_bytes_expected"]) \
        if {"kv_cache_bytes", "kv_cache_bytes_expected"} <= set(rows.columns) else rows.iloc[0:0]
    if both.empty:
        return "No run logged an expected size."
    exact = int((both["kv_cache_bytes"] == both["kv_cache_bytes_expected"]).sum())
    worst = float(((both["kv_cache_bytes"] - both["kv_cache_bytes_expected"]).abs()
                   / both["kv_cache_bytes_expected"]).max())
    return (f"Integrity: measured bytes equal the expected bytes exactly in {exact} of {len(both)} "
            f"runs; the largest deviation is {worst:.2%}.")


def caption(frame: pd.DataFrame) -> str:
    frame = finished_only(frame)
    if not has(frame, "model", "kv_bits", "kv_cache_bytes"):
        return ""
    rows = _rows(frame)
    contexts = ", ".join(f"{int(c):,}" for c in sorted(rows["context_tokens"].dropna().unique()))
    prompt_sets = ", ".join(sorted(rows["prompt_set"].astype(str).unique())) \
        if "prompt_set" in rows.columns else "?"
    return (
        "Per model (selector below): measured kv_cache_bytes walk the cache's real tensors "
        "(quantized codes, scales, zeros and the full-precision residual window, each storage once); "
        "the expected bytes are the formula at the cache's bits for the quantized tokens plus one "
        "scale and zero per group and the residual window at full precision (trials/techniques/kv_cache/runner.py); "
        f"the exact line is the full-precision formula (trials/measurement/kv_footprint.py). {integrity(rows)} "
        "Fidelity is against the full-precision cache on the same prompts: greedy token match, and "
        "teacher-forced KL(full ‖ quantized) per token over each prompt's last tokens, which does not "
        f"compound after a first flip. Contexts {contexts} tokens, "
        f"{count_range(rows, 'prompts_per_type')} prompt(s) per type ({prompt_sets}), "
        f"{count_range(rows, 'max_new_tokens')} new tokens, {count_range(rows, 'repeats')} repeats, "
        f"batch 1, device: {device_names(rows)}; latest run per stack and context. "
        f"{_reference_note(rows)}"
        f"The crossover chart projects the exact formula beyond the measured range for batch 1 and "
        f"batch {LARGE_BATCH}. The two charts above are exact from config, not measured: "
        "trials/measurement/kv_footprint.py on the catalogue's transcribed hub configs (MLA as its latent cache, "
        "sliding windows capped) and the measured zoo models' config.json; 8- and 4-bit bars are "
        "the payload only (group-wise scales and zeros add about 0.5 bit per element at group 64 "
        "with 16-bit scale and zero).")


def report(frame: pd.DataFrame) -> list[str]:
    """Trial seconds per backend at each context (what sizes the quick contexts)."""
    if frame.empty:
        return []
    frame = frame.assign(seconds=trial_seconds(frame), context=pd.to_numeric(frame["context_tokens"]))
    lines = ["| model | context | backend | bits | median trial s |", "| --- | --- | --- | --- | --- |"]
    for (model, context, backend, bits), part in frame.groupby(["model", "context", "kv_backend", "kv_bits"]):
        lines.append(f"| {model} | {int(context)} | {backend} | {int(bits)} | {part['seconds'].median():.1f} |")
    return lines
