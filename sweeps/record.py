"""What sized a sweep, kept in its store, so that a rerun against the store sizes its trials the same way.

Why: workloads are part of a trial's ``config_hash``, and the budget chooses them from this machine's
step costs (``sweeps.budget``). A calibration measured again (another sweep's ``--recalibrate``, a
cache cleared, a busy machine) sizes other workloads, and every finished trial would be measured
again. So each sweep keeps the step costs it sized with in its store (``tracking.record_sweep``: a
run of the ``sweeps`` experiment, written before its trials start), and the next sweep on that store
takes its step costs from there (``read``): this purpose's newest record first, then the other
sweeps' on the store, and only pairs no record holds (new models, new precisions) from this
machine's cache of its purpose (``budget.cache_file``), or measured. A record from before engines
measured their own steps (no ``STEP_LABELS``) sized every engine's trials from the default engine's
reference step: its costs are read so again (``budget.legacy_entries``). ``--recalibrate`` ignores the
records; ``--rerun`` and a budget other than the last one's measure again too: each is said in one
line before anything runs (``say_what_is_measured_again``).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import tracking
from sweeps import budget, deferral
from sweeps.fitting import duration
from trials.redaction import redact

log = logging.getLogger("sweeps")

STEP_LABELS = "step_labels"     # a record whose step costs carry their engine (``budget.step_label``)


def purpose(args) -> str:
    """What a calibration is for: the main job (no sweep file), or one sweep file (its name and a hash
    of its path, so two files of one name stay apart)."""
    if getattr(args, "sweep", None) is None:
        return budget.MAIN_PURPOSE
    path = Path(args.sweep).resolve()
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", path.stem)[:40] or "sweep"
    return f"{stem}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"


@dataclass
class Sizing:
    """What sizes this sweep: its purpose and cache file, the store's recorded step costs (by
    calibration key), this purpose's last record there, and the step costs this sweep used."""

    purpose: str
    file: Path
    budget_s: float | None
    recorded: dict[str, dict] = field(default_factory=dict)
    recorded_by: dict[str, str] = field(default_factory=dict)      # calibration key -> sweep id
    last: dict | None = None                                        # this purpose's newest record
    used: dict[str, dict] = field(default_factory=dict)             # calibration key -> step cost


def read(uri: str, args, budget_s: float | None) -> Sizing:
    """This sweep's sizing as the store remembers it (reads only; nothing recorded with
    ``--recalibrate``, which measures afresh)."""
    mine = purpose(args)
    sizing = Sizing(mine, budget.cache_file(mine), budget_s)
    records = tracking.sweep_records(uri)                 # newest first
    sizing.last = next((r for r in records if r.get("purpose") == mine), None)
    if args.recalibrate:
        return sizing
    oldest_first = sorted(records[::-1], key=lambda r: r.get("purpose") == mine)    # stable: mine last
    for record in oldest_first:
        calibration = record.get("calibration")
        if isinstance(calibration, dict):
            entries = {key: cost for key, cost in calibration.items() if isinstance(cost, dict)}
            sizing.recorded.update(entries)
            if not record.get(STEP_LABELS):
                sizing.recorded.update(budget.legacy_entries(entries))
            sizing.recorded_by.update(dict.fromkeys(entries, record["sweep_id"]))
    return sizing


def write(uri: str, sizing: Sizing, sweep_id: str, args, device: str, workers: int,
          deferred: dict[str, tuple[int, float]] | None = None) -> None:
    """Keep ``sizing`` (the step costs used so far) as this sweep's record in the store, with what it
    deferred to the next run (group -> (trials, estimated minutes): the dashboard says it); a store
    that cannot take it is said in one line (the sweep goes on; a rerun then calibrates as before)."""
    record = {"sweep_id": sweep_id, "purpose": sizing.purpose, "sweep_file": args.sweep,
              "written": time.strftime("%Y-%m-%d %H:%M:%S"), "budget_s": sizing.budget_s, "device": device,
              "workers": workers, "calibration_file": str(sizing.file), "calibration": sizing.used,
              STEP_LABELS: True,
              "deferred": deferral.as_record(deferred or {})}
    try:
        tracking.record_sweep(uri, record)
    except Exception as exc:     # MLflow's own errors, a store gone away: the record is a convenience
        log.warning("could not keep this sweep's sizing in %s (%s): a rerun calibrates from this machine's cache",
                    redact(uri), type(exc).__name__)


def say_what_is_measured_again(sizing: Sizing, args) -> None:
    """One line where this sweep measures again what the store holds: ``--rerun``, ``--recalibrate``,
    or a budget other than this purpose's last sweep on the store was sized to."""
    last = sizing.last
    if args.rerun:
        print("--rerun: every planned trial is measured again, those the store holds FINISHED runs of too")
    elif args.recalibrate:
        print("--recalibrate: step costs measured afresh, not taken from the store's sweep records: where "
              "the workloads they size differ, those trials are measured again")
    elif last is not None and last.get("budget_s") != sizing.budget_s:
        print(f"budget {_budget_text(sizing.budget_s)}, not the {_budget_text(last.get('budget_s'))} this store's last "
              f"sweep of this kind ({last['sweep_id']}) was sized to: where the workloads it chooses differ, those "
              "trials are measured again")


def describe(sizing: Sizing) -> str:
    """One line: which calibration sized this sweep (when its step costs were measured, its file, how
    many as the store's records keep them)."""
    if sizing.budget_s is None:
        return "Calibration: none (no budget: the profile as written)"
    if not sizing.used:
        return f"Calibration: no step costs known yet (cache {sizing.file})"
    dates = sorted(str(cost.get("measured_at") or "?") for cost in sizing.used.values())
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    same = [key for key, cost in sizing.used.items() if sizing.recorded.get(key) == cost]
    sweeps = sorted({sizing.recorded_by[key] for key in same})
    parts = [f"{len(same)} as this store's record of sweep {', '.join(sweeps)} keeps them" if same else "",
             f"{len(sizing.used) - len(same)} from this machine's {sizing.file}" if len(same) < len(sizing.used) else ""]
    return f"Calibration: {len(sizing.used)} step cost(s) measured {when}: {', '.join(p for p in parts if p)}"


def _budget_text(seconds: float | None) -> str:
    return "none" if seconds is None else duration(seconds)
