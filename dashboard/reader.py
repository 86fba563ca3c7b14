"""What the page reads from the store, for the app and the export alike: each section's frame and
its failed configurations, out of one ``tracking.RunsCache`` (every group read once, then only the
runs that ended since). Sections only ever see frames; only ``tracking`` queries the store."""

from __future__ import annotations

from html import escape

import numpy as np
import pandas as pd

import tracking
from dashboard.sections.common import failed_note


def open_store(uri: str) -> tracking.RunsCache:
    """Every group's runs, read now."""
    runs = tracking.RunsCache(uri)
    runs.refresh()
    return runs


def section_frame(section, runs: tracking.RunsCache):
    """The runs a section charts: FINISHED ones, unless the section asks for more with ``RUN_STATUS``
    (None: every run, with a ``status`` column; e.g. FAILED 'oom' runs mark a memory boundary).
    Only each configuration's most recent run: a chart shows no other, and a store where the same
    sweep ran a hundred times then charts as fast as one where it ran once; a section whose chart
    shows each run (``EVERY_RUN``, e.g. a search's trials in order) gets them all. A finished run
    without its section's measured number (``MEASURED_BY``, else ``tok_per_s``) is left out.
    ``shown``: as a chart may show it."""
    frame = shown(runs.frame(section.GROUP, status=getattr(section, "RUN_STATUS", "FINISHED"),
                             latest=not getattr(section, "EVERY_RUN", False)))
    return frame[~_unmeasured(frame, measured_by(section))]


def deep_dive(section, runs: tracking.RunsCache, model: str, chosen: dict) -> list:
    """A section's deep dive for ``model`` with its controls at ``chosen``: it gets its own frame and,
    where it declares ``deep_dive_reads``, the frames of those groups too (every run, as shown)."""
    others = ({"others": {g: shown(runs.frame(g, status=None, latest=True)) for g in section.deep_dive_reads()}}
              if hasattr(section, "deep_dive_reads") else {})
    return section.deep_dive(section_frame(section, runs), model, **chosen, **others)


def measured_by(section) -> str:
    """The metric a finished run of ``section`` must hold to be charted (``MEASURED_BY``; ``tok_per_s``)."""
    return getattr(section, "MEASURED_BY", "tok_per_s")


def _unmeasured(frame: pd.DataFrame, metric: str = "tok_per_s") -> pd.Series:
    """FINISHED runs without a finite ``metric``: written by another tool, or cut short."""
    finished = frame["status"] == "FINISHED" if "status" in frame.columns else pd.Series(True, index=frame.index)
    speed = frame[metric] if metric in frame.columns else pd.Series(np.nan, index=frame.index)
    return finished & speed.isna()


def unmeasured_note(section, runs: tracking.RunsCache) -> str:
    """The section's line on finished runs it leaves out for want of a throughput; empty if none."""
    try:
        frame = shown(runs.frame(section.GROUP, status="FINISHED", latest=True))
        metric = measured_by(section)
        left = frame[_unmeasured(frame, metric)]
    except Exception:  # the note must never take the section down
        return ""
    if left.empty:
        return ""
    names = ", ".join(sorted({f"{row.get('model', '?')} {row.get('stack', '')}".strip()
                              for _, row in left.iterrows()})[:5])
    what = "tok/s" if metric == "tok_per_s" else metric
    return (f"{len(left)} finished run(s) without a measured {what} (missing, NaN or infinite) left out: "
            f"{names}{' ...' if len(left) > 5 else ''}")


def shown(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame as charts may show it, whatever wrote the store: text HTML-escaped (Plotly renders
    tags in names, hovers and ticks; ``&lt;`` it shows as ``<``), and an infinite metric as missing
    (NaN: not drawn, like a metric the run never logged)."""
    frame = frame.copy()
    for column in frame.columns:
        values = frame[column]
        if values.dtype == object or pd.api.types.is_string_dtype(values):
            text = values.map(lambda v: isinstance(v, str) and any(c in v for c in "<>&"))
            if text.any():
                frame[column] = values.map(lambda v: escape(v, quote=False) if isinstance(v, str) else v)
        elif pd.api.types.is_float_dtype(values):
            frame[column] = values.where(~np.isinf(values))
    return frame


def failed_runs(section, runs: tracking.RunsCache) -> tuple[str, str]:
    """The section's line on failed configurations (and, on hover, which and why); empty if none."""
    try:
        return failed_note(shown(runs.frame(section.GROUP, "FAILED", latest=True)), runs.finished_hashes(section.GROUP),
                           drawn=getattr(section, "RUN_STATUS", "FINISHED") is None)
    except Exception:  # the note must never take the section down
        return "", ""
