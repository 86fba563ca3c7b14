"""Machine sharing: tag each run with what else ran on its machine during its timed passes, and say so.

Trials run side by side (and, on a fresh machine, beside the zoo's training), so a run's timings may
have shared the machine. After the Tune run the store's runs of this sweep get the tag
``shared_machine`` (``tracking.record_machine_sharing``), and the summary says how many shared and
how to measure each trial alone (``--workers 1``).
"""

from __future__ import annotations

import logging

import tracking
from trials.redaction import redact

log = logging.getLogger("sweeps")


def machine_sharing(uri: str, sweep_id: str, beside=()) -> list[float]:
    """Tag the sweep's runs with what shared the machine during their timed passes (the other trials',
    the zoo's training: ``beside``); best effort: a store that went away keeps the runs without the tag."""
    try:
        return tracking.record_machine_sharing(uri, sweep_id, beside)
    except Exception as exc:  # the runs are logged; the tag is an addition
        log.warning("could not record machine sharing: %s", redact(f"{type(exc).__name__}: {exc}"))
        return []


def print_sharing(sharing: list[float], workers: int) -> None:
    """One line: how many runs shared the machine (``sharing``: each run's shared fraction of its time)."""
    if not sharing:
        return
    shared = [f for f in sharing if f > 0]
    print(f"Machine sharing: {len(shared)} of {len(sharing)} runs had other work beside their timed passes "
          f"(another trial's, the zoo's training or a build beside them; median {100 * sorted(sharing)[len(sharing) // 2]:.0f} % "
          "of the time; each run's tag shared_machine says which); --workers 1 measures each trial alone "
          f"(the zoo trained first), in about {workers}x the trial time")
