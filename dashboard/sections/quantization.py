"""Weight quantization: bf16, 8-bit and 4-bit weights.

Decode reads all weights every step, so fewer bytes per weight should mean more tokens per second and
a smaller footprint, unless dequantizing costs more than the bandwidth saved (it often does on CPU,
and in unfused kernels). Speed and weight bytes are shown side by side so the trade is visible.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.sections.common import MB, grouped_bars, has, latest, precision_order

GROUP = "quantization"
TITLE = "Quantization — bf16 / 8-bit / 4-bit"
BLURB = ("Fewer bits per weight mean fewer bytes read per token: does it decode faster, and how "
         "much memory does it save?")


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, "model", "precision", "tok_per_s"):
        return []
    rows = latest(frame, ["model", "precision", "device"])
    order = precision_order(rows["precision"])
    result = [("quantization-throughput",
               grouped_bars(rows, x="model", series="precision", y="tok_per_s", series_order=order,
                            title="Decode throughput by weight precision", y_title="tok/s"))]
    if "weights_bytes" in rows.columns:
        rows["weights_mb"] = rows["weights_bytes"] / MB
        result.append(("quantization-weights",
                       grouped_bars(rows, x="model", series="precision", y="weights_mb",
                                    series_order=order, title="Weight bytes by precision",
                                    y_title="weights MB")))
    return result
