"""Capacity under the SLO, per model (placeholder: the capacity charts replace this module).

The capacity group's spec names this module as its section; without it every page and
``llm-recommend`` fail to build their sections. It draws nothing yet: the capacity pick is on the
best-stack card (``dashboard.capacity``).
"""

from __future__ import annotations

import pandas as pd

GROUP = "capacity"
TITLE = "Capacity — the most requests per second within the SLO"
BLURB = ("Which server configuration sustains the most requests per second within p95 TTFT and TPOT, "
         "and how many servers does a target rate take?")


def figures(frame: pd.DataFrame) -> list:
    return []
