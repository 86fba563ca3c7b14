"""What a running sweep is doing now, for a dashboard beside it: the store holds a run only once its
trial has ended, so the sweep's driver also writes a small status file beside a sqlite store
(``sweep-live.json``: the trials running and since when, how many are done) on every start, end and
heartbeat; the dashboard reads it and shows it while it is fresh. A server store (a cluster) has no
folder of ours, so nothing is written there and the page shows only the finished runs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

LIVE_FILE = "sweep-live.json"
FRESH_S = 90.0          # older than this (3 missed heartbeats): the sweep is gone, the file is ignored


def live_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):]).parent / LIVE_FILE


def write_live(uri: str, sweep_id: str, running: dict[str, float], done: int, total: int) -> None:
    """``running``: trial name -> start (unix seconds). Best effort, atomic (a reader never sees half)."""
    path = live_path(uri)
    if path is None:
        return
    state = {"sweep_id": sweep_id, "running": running, "done": done, "total": total, "written": time.time()}
    try:
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(state))
        os.replace(temporary, path)
    except OSError:          # a read-only folder: the page then shows finished runs only
        pass


def read_live(uri: str, now: float | None = None) -> dict | None:
    """The running sweep's state, or None when there is none (no file, stale, finished, unreadable)."""
    path = live_path(uri)
    try:
        state = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(state, dict) or (now or time.time()) - float(state.get("written", 0)) > FRESH_S:
        return None
    return state if state.get("done", 0) < state.get("total", 0) else None


def describe_live(state: dict | None, now: float | None = None) -> str:
    """One line for the page: what runs now and how far the sweep is."""
    if not state:
        return ""
    now = now or time.time()
    running = ", ".join(f"{name} ({now - float(since):.0f} s)" for name, since in state.get("running", {}).items())
    return (f"Sweep {state.get('sweep_id', '?')} is running: {state.get('done', 0)}/{state.get('total', 0)} trials "
            f"done; now: {running or 'starting'} (charts add each run as it finishes)")
