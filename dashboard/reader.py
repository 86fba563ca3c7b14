"""What the page reads from the store, for the app and the export alike: each section's frame and
its failed configurations, out of one ``tracking.RunsCache`` (every group read once, then only the
runs that ended since). Sections only ever see frames; only ``tracking`` queries the store."""

from __future__ import annotations

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
    sweep ran a hundred times then charts as fast as one where it ran once."""
    return runs.frame(section.GROUP, status=getattr(section, "RUN_STATUS", "FINISHED"), latest=True)


def failed_runs(section, runs: tracking.RunsCache) -> tuple[str, str]:
    """The section's line on failed configurations (and, on hover, which and why); empty if none."""
    try:
        return failed_note(runs.frame(section.GROUP, "FAILED", latest=True), runs.finished_hashes(section.GROUP),
                           drawn=getattr(section, "RUN_STATUS", "FINISHED") is None)
    except Exception:  # the note must never take the section down
        return "", ""
