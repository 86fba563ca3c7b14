"""KV-cache quantization: store keys and values in fewer bits.

The cache grows with every token (2 x layers x kv_heads x head_dim x tokens x bytes), so at long
contexts or large batches it, not the weights, fills memory. Quantizing it saves memory, but
de/quantizing each step costs time, and the last ``residual_length`` tokens stay full precision, so
short contexts barely shrink. Hence two charts: speed, and measured cache bytes beside the bytes an
unquantized cache would take (``kv_cache_bytes_exact``).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.sections.common import MB, grouped_bars, has, latest

GROUP = "kv_cache"
TITLE = "KV-cache quantization — does it actually help?"
BLURB = ("Fewer bits per cached key and value shrink the cache that grows with every token; "
         "does that buy memory, speed, or neither?")


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, "model", "kv_bits", "tok_per_s"):
        return []
    rows = latest(frame, ["model", "precision", "kv_bits", "device"])
    rows["kv"] = rows["kv_bits"].map(lambda b: f"kv{int(b)}")
    order = [f"kv{int(b)}" for b in sorted(rows["kv_bits"].dropna().unique(), reverse=True)]
    result = [("kv_cache-throughput",
               grouped_bars(rows, x="model", series="kv", y="tok_per_s", series_order=order,
                            title="Decode throughput by KV-cache bits", y_title="tok/s"))]
    if "kv_cache_bytes" in rows.columns:
        rows["kv_cache_mb"] = rows["kv_cache_bytes"] / MB
        memory = grouped_bars(rows, x="model", series="kv", y="kv_cache_mb", series_order=order,
                              title="KV-cache size, measured (bars) vs unquantized formula (marks)",
                              y_title="KV cache MB")
        if "kv_cache_bytes_exact" in rows.columns:
            exact = rows.groupby("model")["kv_cache_bytes_exact"].max() / MB
            memory.add_trace(go.Scatter(name="formula, 16-bit", x=list(exact.index),
                                        y=[float(v) for v in exact], mode="markers",
                                        marker=dict(symbol="line-ew-open", size=40, color="black")))
        result.append(("kv_cache-memory", memory))
    return result
