"""Baseline: decode throughput of each model at each precision, batch 1, no optimization.

Every other group is judged against these bars, so they show decode throughput only: prefill reads
the prompt once and is compute-bound, decode emits one token per step and is bound by memory
bandwidth, and for long outputs decode is where the time goes. The bar is the median over repeats;
the whisker is the 95 % interval over repeats (``common.spread_error_bars``), so a noisy machine shows
as a long whisker rather than a wrong bar.
Numbers come from ``trials.run`` (the measurement loop) via one query, ``tracking.runs_frame``.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.sections.common import (WHISKERS, count_range, device_names, grouped_bars, has, latest,
                                       precision_order)

GROUP = "baseline"
TITLE = "Baseline — decode throughput per model and precision"
BLURB = ("How fast does each model decode, unoptimized, at full and half precision? "
         "The reference every other chart compares to.")
THROUGHPUT_ID = "baseline-throughput"


def _charted(frame: pd.DataFrame) -> pd.DataFrame:
    rows = latest(frame, ["model", "precision", "device"])
    multi_device = "device" in rows.columns and rows["device"].nunique() > 1
    rows["x"] = (rows["model"] + " (" + rows["device"] + ")") if multi_device else rows["model"]
    return rows


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, "model", "precision", "tok_per_s"):
        return []
    rows = _charted(frame)
    figure = grouped_bars(rows, x="x", series="precision", y="tok_per_s",
                          series_order=precision_order(rows["precision"]),
                          title="Decode throughput (higher is better)", y_title="tok/s")
    figure.update_layout(xaxis_title="model")
    return [(THROUGHPUT_ID, figure)]


def caption(frame: pd.DataFrame) -> str:
    if not has(frame, "model", "precision", "tok_per_s"):
        return ""
    rows = _charted(frame)
    return (f"Bars: median decode throughput over {count_range(rows, 'repeats')} repeats; {WHISKERS}. "
            f"Decode only (prefill/TTFT excluded), batch "
            f"{count_range(rows, 'batch_size')}, greedy, "
            f"{count_range(rows, 'max_new_tokens')} new tokens per prompt. "
            f"Device: {device_names(rows)}. Latest run per model and precision; hover a bar for "
            "where it came from.")
