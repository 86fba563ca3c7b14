"""Optimization stacks: precision, KV bits, speculation and batching combined.

Optimizations interact (a 4-bit model may make a draft relatively more expensive; a quantized cache
matters more at large batch), so the question is which whole stacks are worth it. Each point is one
stack on one model: up is faster, left is smaller, and the useful stacks lie on the upper-left edge.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.sections.common import MB, has, latest, points, stack_order

GROUP = "stacks"
TITLE = "Speed vs memory by optimization stack"
BLURB = ("Which combinations of optimizations give the most tokens per second for the least "
         "memory?")


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, "model", "stack", "tok_per_s", "peak_memory_bytes"):
        return []
    rows = latest(frame, ["model", "stack", "device"])
    rows["peak_mb"] = rows["peak_memory_bytes"] / MB
    return [("stacks-frontier",
             points(rows, x="peak_mb", y="tok_per_s", series="stack", series_order=stack_order(rows),
                    title="Decode throughput vs peak memory (up and left is better)",
                    x_title="peak memory MB", y_title="tok/s", mode="markers"))]
