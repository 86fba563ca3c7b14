"""The latest run per key: the one rule every reader of a store's runs follows.

A rerun replaces an older measurement of the same thing (a configuration, a stack, a design cell):
the charts, the decisions, the comparison, the store's views and the planner all keep the most
recently started run per key, through ``latest``.
"""

from __future__ import annotations

import pandas as pd


def latest(frame: pd.DataFrame, keys, *, finished: bool = False) -> pd.DataFrame:
    """One row per ``keys`` (a column name or a list; those the frame lacks are left out): the most
    recently started run (``start_time``; without it, the last in the frame's order). ``finished``:
    FINISHED runs only. With none of the keys in the frame, every run is its own."""
    keys = [keys] if isinstance(keys, str) else list(keys)
    if finished and "status" in frame.columns:
        frame = frame[frame["status"] == "FINISHED"]
    keys = [k for k in keys if k in frame.columns]
    if "start_time" in frame.columns:
        frame = frame.sort_values("start_time", kind="stable")
    if keys:
        frame = frame.drop_duplicates(keys, keep="last")
    return frame.reset_index(drop=True)
