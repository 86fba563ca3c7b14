"""What the sweep says when it ends: counts per group, the failures, the time of each phase, where to look.

``Phases`` collects the wall time of each phase while the sweep runs; ``print_summary`` prints the
counts (finished, failed, skipped), what was not planned or never ran, results still spooled, and the
commands that show the runs; ``print_phases`` the time of each phase and when the first run reached
the store; ``write_summary_json`` the same for ``--summary-json``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from trials.config import TrialConfig
from trials.redaction import redact


class Phases:
    """Wall time of each phase of the sweep (seconds), for the summary and --summary-json."""

    def __init__(self, started: float, ray_start_s: float) -> None:
        self.started, self.ray_start_s = started, ray_start_s
        self.zoo_s = self.models_s = self.calibrate_s = self.tune_s = 0.0
        self.zoo_beside: str = ""            # what trained beside the trials (empty: the zoo trained first)
        self.first_finished_s: float | None = None
        self.estimate_s: float | None = None  # the budget's estimate of the trials, both stages


MODEL_NOTE = re.compile(r"^(?P<group>[\w-]+): (?P<model>[^\s:,]+): (?P<reason>.+)$")


def grouped_notes(notes) -> list[str]:
    """Planning's notes with one line per reason and the models it applies to: a space says each
    model's ("stacks: tiny-gqa: refused at plan time: ..."), and a reason that holds for every zoo
    model would otherwise be printed once per model. Notes about no one model stay as they are."""
    reasons: dict[str, list[str]] = {}
    for note in notes:
        match = MODEL_NOTE.match(note)
        models = reasons.setdefault(f"{match['group']}: {match['reason']}" if match else note, [])
        if match and match["model"] not in models:
            models.append(match["model"])
    return [f"{reason} — for {', '.join(models)}" if models else reason for reason, models in reasons.items()]


def never_ran(configs, outcomes, skipped) -> int:
    """Planned trials (less those skipped as already finished) that left no outcome: Ctrl-C, or a build
    that failed before them."""
    return max(0, len(configs) - sum(skipped.values()) - len(outcomes))


def print_summary(configs, outcomes, skipped, uri, elapsed_s, ray_start_s, left_out=(),
                  why_not_run: str = "interrupted") -> None:
    finished = [o for o in outcomes if o.get("trial_status") == "FINISHED"]
    failed = [o for o in outcomes if o.get("trial_status") != "FINISHED"]
    print()
    print(f"Sweep done in {elapsed_s:.1f} s (Ray start-up {ray_start_s:.1f} s): "
          f"{len(finished)} finished, {len(failed)} failed, {sum(skipped.values())} skipped "
          "(already finished)")
    for group in dict.fromkeys(c.group for c in configs):
        f = sum(o.get("group") == group for o in finished)
        x = sum(o.get("group") == group for o in failed)
        print(f"  {group:<14} finished {f:>3}  failed {x:>3}  skipped {skipped.get(group, 0):>3}")
    for o in failed:
        print(f"  FAILED {o.get('group')} {o.get('model')} {o.get('stack')}: {o.get('error')}")
    for note in grouped_notes(left_out):
        print(f"  not planned: {note}")
    if missing := never_ran(configs, outcomes, skipped):
        print(f"  {missing} planned trial(s) never ran ({why_not_run}); the same command again "
              "runs only the configurations without a finished run")
    from tracking import spool

    if waiting := len(spool.pending(uri)):
        print(f"  {waiting} result(s) spooled in {spool.spool_dir()} (the store was unreachable); the next sweep "
              "or `python sweeps/full.py --flush` delivers them")
    print("\nLook at the runs:")
    shown = redact(uri)
    print(f"  MLflow UI:  mlflow ui --backend-store-uri {shown} --host 127.0.0.1 --port 5000"
          if uri.startswith("sqlite") else f"  MLflow UI:  {shown}")
    print(f"  Dashboard:  python dashboard/app.py --tracking-uri {shown}   (http://127.0.0.1:8050)")
    print(f"  Decision:   llm-recommend --tracking-uri {shown}   (which stack each model should run; "
          "--max-ttft, --price-per-hour, --help)")


def print_phases(phases: Phases, configs: list[TrialConfig]) -> None:
    zoo_text = (f"zoo {phases.zoo_s:.0f} s (trained beside the trials: {phases.zoo_beside}), "
                f"real models {phases.models_s:.0f} s" if phases.zoo_beside else f"zoo {phases.zoo_s:.0f} s")
    first = (f"; the first finished run {phases.first_finished_s:.0f} s after the sweep started"
             if phases.first_finished_s is not None else "")
    estimate = f"estimated {phases.estimate_s / 60:.1f} min for " if phases.estimate_s else ""
    print(f"Phases: {zoo_text}, calibration {phases.calibrate_s:.0f} s, Ray start-up {phases.ray_start_s:.0f} s, "
          f"trials {phases.tune_s / 60:.1f} min ({estimate}the {len(configs)} of this run){first}")


def estimated_and_measured(deadline) -> dict[str, tuple[int, float, float]]:
    """Per group, over the trials that finished in this run: (trials, estimated s, measured s)."""
    return {group: (len(pairs), sum(e for _, e in pairs), sum(m for m, _ in pairs))
            for group, pairs in deadline.measured.items() if pairs}


def print_estimates(deadline, beside: dict[str, float], took: dict[str, float], phases: Phases) -> None:
    """The plan's estimates beside what the trials and the work beside them (``took``, by the same
    words as ``beside``) took, per group."""
    rows = estimated_and_measured(deadline)
    if not rows and not beside:
        return
    print("Estimated against measured (trial minutes, the trials that ended in this run):")
    for group, (n, estimated, measured) in rows.items():
        ratio = f"{measured / estimated:5.2f}x" if estimated else "    -"
        print(f"  {group:<14}{n:>4} trials  estimated {estimated / 60:6.1f}  measured {measured / 60:6.1f}  {ratio}")
    for what, estimated in beside.items():
        said = f"{took[what] / 60:.1f} min measured" if took.get(what) else "not measured (it did not end)"
        print(f"  beside: {what}: ~{estimated / 60:.1f} min estimated, {said}")
    if phases.estimate_s:
        limit = f"; budget {deadline.budget_s / 60:.0f} min" if deadline.budget_s else ""
        print(f"  this run: ~{phases.estimate_s / 60:.1f} min estimated, {phases.tune_s / 60:.1f} min measured "
              f"(first trial to the last{limit})")


def write_summary_json(path: str, *, sweep_id: str, uri: str, device: str, outcomes: list[dict], skipped,
                       elapsed_s: float, phases: Phases, job, calibration: str = "",
                       deferred: dict | None = None, estimates: dict | None = None) -> None:
    """``--summary-json``: the counts, each phase's time, the calibration used and the outcomes, as JSON."""
    Path(path).write_text(json.dumps({
        "sweep_id": sweep_id, "tracking_uri": uri, "device": device,
        "finished": sum(o.get("trial_status") == "FINISHED" for o in outcomes),
        "failed": sum(o.get("trial_status") != "FINISHED" for o in outcomes),
        "skipped": sum(skipped.values()), "elapsed_s": elapsed_s, "zoo_s": phases.zoo_s,
        "zoo_beside": phases.zoo_beside, "zoo_window": job.window() if job else None,
        "zoo_cpus": job.cpus if job else None, "models_s": phases.models_s,
        "calibrate_s": phases.calibrate_s, "estimate_s": phases.estimate_s,
        "first_finished_s": phases.first_finished_s, "calibration": calibration,
        "ray_start_s": phases.ray_start_s, "tune_s": phases.tune_s, "deferred": deferred or {},
        "estimates": estimates or {}, "outcomes": outcomes}, indent=1))
