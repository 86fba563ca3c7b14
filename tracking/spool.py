"""Results that could not reach the store, kept on local disk until it is back: nothing lost.

When ``log_trial`` finds the store unreachable (a tracking server restarting, a network blip), the
trial's whole result is written here as one JSON file, with the store's URI and a ``trial_key``
(one per attempt to log). Delivery (``deliver``) happens after the next successful ``log_trial`` to
the same store, at the start and end of every sweep, and on ``python sweeps/full.py --flush``. It is
idempotent by that key: a run tagged with it that ended is proof of delivery (the file is dropped);
one still RUNNING is a half-written attempt (the store went away mid-write) and is deleted before the
result is written again. A file is claimed by renaming it before delivery, so two processes never
deliver it twice.

The spool is per machine: ``$LLM_SWEEPS_SPOOL``, else ``~/.cache/llm-inference-sweeps/spool``. On a
cluster, results spooled on a worker node are delivered by that node's next trial, or by
``python sweeps/full.py --flush`` run there.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

SPOOL_ENV = "LLM_SWEEPS_SPOOL"


def spool_dir() -> Path:
    return Path(os.environ.get(SPOOL_ENV) or Path.home() / ".cache" / "llm-inference-sweeps" / "spool")


def save(uri: str, record: dict, reason: str) -> Path:
    """Keep one result (``record``: result dict, sweep_id, trial_key) for ``uri``; returns its file."""
    folder = spool_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.time_ns()}-{record['trial_key']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"uri": uri, "reason": reason, **record}))
    tmp.replace(path)                       # a reader never sees half a file
    return path


def pending(uri: str | None = None) -> list[Path]:
    """Spooled results (for ``uri``, or for any store), oldest first."""
    folder = spool_dir()
    if not folder.is_dir():
        return []
    files = sorted(folder.glob("*.json"))
    if uri is None:
        return files
    mine = []
    for path in files:
        try:
            if json.loads(path.read_text()).get("uri") == uri:
                mine.append(path)
        except (OSError, ValueError, RecursionError, AttributeError):     # not a spooled record
            continue
    return mine


def deliver(uri: str | None, write) -> tuple[int, int]:
    """Write every spooled result for ``uri`` (None: each to its own store) with ``write(uri, record)``;
    returns (delivered, left). A store still unreachable leaves its files for next time."""
    delivered = left = 0
    for path in pending(uri):
        claimed = path.with_suffix(f".delivering-{os.getpid()}")
        try:
            path.rename(claimed)
        except OSError:                      # another process took it
            continue
        try:
            record = json.loads(claimed.read_text())
            write(record["uri"], record)
        except Exception:  # still unreachable (or a file from another version): keep it
            claimed.rename(path)
            left += 1
            continue
        claimed.unlink()
        delivered += 1
    return delivered, left
