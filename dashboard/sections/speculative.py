"""Speculative decoding: a draft model proposes k tokens, the target checks them in one pass.

Decode is bandwidth-bound, so verifying k tokens costs about one target step; the win depends on how
often the draft is right (acceptance a) and how cheap it is relative to the target (c): Leviathan's
expected speedup is (1 - a^(k+1)) / ((1 - a)(kc + 1)). This chart compares every model's plain
decode with its speculative stacks side by side; a per-model deep dive (acceptance, tokens per pass,
measured vs expected) belongs beside it once the trials log those numbers.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.sections.common import grouped_bars, has, latest, stack_order

GROUP = "speculative"
TITLE = "Speculative decoding — across models"
BLURB = ("A small draft guesses ahead; the big model verifies in one pass. "
         "Speedup needs a cheap draft that's often right.")


def figures(frame: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    if not has(frame, "model", "stack", "tok_per_s"):
        return []
    rows = latest(frame, ["model", "stack", "device"])
    return [("speculative-throughput",
             grouped_bars(rows, x="model", series="stack", y="tok_per_s",
                          series_order=stack_order(rows),
                          title="Decode throughput with and without a draft", y_title="tok/s"))]
