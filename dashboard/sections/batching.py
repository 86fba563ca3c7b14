"""Static batching: decode several prompts in one forward pass.

A decode step reads every weight once whatever the batch size, so total throughput should rise almost
linearly with the batch until the step becomes compute-bound; each stream, meanwhile, gets a little
slower. The two charts show both sides: total tok/s and tok/s per stream against batch size.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.sections.common import has, latest, points

GROUP = "batching"
TITLE = "Static batching — across models"
BLURB = ("One weight read serves every row of a batch: how far does total throughput climb with "
         "batch size, and what does each stream pay?")


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, "model", "batch_size", "tok_per_s"):
        return []
    rows = latest(frame, ["model", "precision", "batch_size", "device"])
    rows["series"] = rows["model"].astype(str)
    if "precision" in rows.columns:
        rows["series"] += " " + rows["precision"].astype(str)
    order = sorted(rows["series"].unique())
    result = [("batching-throughput",
               points(rows, x="batch_size", y="tok_per_s", series="series", series_order=order,
                      title="Total decode throughput vs batch size", x_title="batch size",
                      y_title="tok/s (all streams)"))]
    if "per_stream_tok_per_s" in rows.columns:
        result.append(("batching-per-stream",
                       points(rows, x="batch_size", y="per_stream_tok_per_s", series="series",
                              series_order=order, title="Per-stream decode throughput vs batch size",
                              x_title="batch size", y_title="tok/s per stream")))
    return result
