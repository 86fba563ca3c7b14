"""What a store measured, as Markdown: the figures the sweep's sizing rests on, regenerated from runs.

Sizes in the code (the batch ladder, the KV contexts, the budget model's batch growth) were chosen
from measurements; those measurements go stale with the machine and the code, so they live here,
recomputed from a store, instead of in comments. Paste the output into the README's "Measured"
section (or a PR) with the command that produced it:

    llm-report --tracking-uri sqlite:///mlflow.db > measured.md

Every figure names its group and model; nothing is printed that the store does not hold.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

import tracking
from dashboard.sections import all_sections
from dashboard.sections.common import neighbour_note, real_model_note, trial_seconds
from trials import groups
from trials.errors import one_line_errors
from trials.redaction import one_line, redact


def all_runs(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every group's finished runs in one frame (empty without any)."""
    found = [f for f in frames.values() if not f.empty]
    return pd.concat(found, ignore_index=True) if found else pd.DataFrame()


def machine(rows: pd.DataFrame) -> str:
    """The CPUs and devices of ``all_runs(frames)``, and when they ran."""
    if rows.empty:
        return "(no finished runs)"
    parts = []
    for column in ("tags.env.cpu_model", "tags.env.cpu_capability", "tags.env.device_name"):
        if column in rows:
            parts.append(", ".join(sorted(rows[column].dropna().astype(str).unique())))
    first, last = pd.to_datetime(rows["start_time"]).min(), pd.to_datetime(rows["end_time"]).max()
    return f"{' / '.join(p for p in parts if p)}; runs from {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC"


def trial_times(frames: dict[str, pd.DataFrame]) -> list[str]:
    lines = ["| group | finished runs | median s per trial | total min |", "| --- | --- | --- | --- |"]
    for group, frame in frames.items():
        if frame.empty:
            continue
        seconds = trial_seconds(frame)
        lines.append(f"| {group} | {len(frame)} | {seconds.median():.1f} | {seconds.sum() / 60:.1f} |")
    return lines


def group_frames(uri: str) -> dict[str, pd.DataFrame]:
    """Each group's finished runs in the store."""
    return {name: tracking.runs_frame(uri, name) for name in groups.NAMES}


def report(uri: str, frames: dict[str, pd.DataFrame]) -> str:
    """The store's figures as Markdown, from ``group_frames(uri)``."""
    rows = all_runs(frames)
    out = [f"Measured in `{redact(uri)}`: {machine(rows)}", ""]
    for note in (real_model_note(rows), neighbour_note(rows)):
        if note:
            out += [note, ""]
    out += trial_times(frames)
    for section in all_sections():                 # each section's own table, where it has one
        lines = section.report(frames[section.GROUP]) if hasattr(section, "report") else []
        if lines:
            out += ["", f"**{groups.get(section.GROUP).title}** (`{section.GROUP}`)", "", *lines]
    return "\n".join(out) + "\n"


def results_page(uri: str, frames: dict[str, pd.DataFrame], command: str) -> str:
    """The results page: when, by which command and code it was generated, then ``report``."""
    def values(column: str, width: int = 100) -> str:
        found = sorted({str(v)[:width] for f in frames.values() if column in f for v in f[column].dropna()})
        return ", ".join(found) or "unknown"

    header = ["# Results", "",
              f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `{command}`, from the runs of "
              f"git {values('tags.env.git_sha', 12)} (profile {values('tags.profile')}). Regenerate it with "
              "the same command; do not edit it by hand.", "", ""]
    return "\n".join(header) + report(uri, frames)


@one_line_errors("llm-report")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db here)")
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="write the results page (a header saying when, how and from which code) to FILE")
    args = parser.parse_args(argv)
    try:
        uri = tracking.reachable_uri(args.tracking_uri, must_exist=True)
        frames = group_frames(uri)
        if all(frame.empty for frame in frames.values()):
            raise tracking.TrackingError(f"{redact(uri)} holds no finished runs: run a sweep into it first "
                                         "(python sweeps/full.py --tracking-uri ...)")
    except tracking.TrackingError as exc:
        print(f"llm-report: error: {one_line(exc)}", file=sys.stderr)
        return 2
    if args.out is None:
        print(report(uri, frames), end="")
        return 0
    command = f"llm-report --tracking-uri {redact(args.tracking_uri or uri)} --out {args.out}"
    try:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(results_page(uri, frames, command))
    except OSError as exc:
        print(f"llm-report: error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
