"""What the page reads from the store, for the app and the export alike: each section's frame and
its failed configurations. Sections only ever see frames; only this module (through ``tracking``)
queries the store."""

from __future__ import annotations

import tracking
from dashboard.sections.common import failed_note


def section_frame(section, uri: str):
    """The runs a section charts: FINISHED ones, unless the section asks for more with ``RUN_STATUS``
    (None: every run, with a ``status`` column; e.g. FAILED 'oom' runs mark a memory boundary)."""
    return tracking.runs_frame(uri, section.GROUP, status=getattr(section, "RUN_STATUS", "FINISHED"))


def failed_runs(section, uri: str) -> tuple[str, str]:
    """The section's line on failed configurations (and, on hover, which and why); empty if none."""
    try:
        failed = tracking.runs_frame(uri, section.GROUP, status="FAILED")
        return failed_note(failed, tracking.finished_hashes(uri, section.GROUP),
                           drawn=getattr(section, "RUN_STATUS", "FINISHED") is None)
    except Exception:  # the note must never take the section down
        return "", ""
