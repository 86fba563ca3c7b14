"""The budget's per-trial estimates beside what the trials took, per group (printed as minutes and ratios).

    python sweeps/full.py --summary-json run1.json ...      # a sweep's own record of what ran
    python -m benchmarks.estimate_vs_measured run1.json run2.json --calibration ~/.cache/llm-inference-sweeps/calibration.json
    python -m benchmarks.estimate_vs_measured --recorded tests/data/recorded_sweeps.json
    python -m benchmarks.estimate_vs_measured run1.json run2.json --calibration ... --save tests/data/recorded_sweeps.json

Each summary's trials are estimated as the run that planned them estimates them: in priority order
(``sweeps.deferral.priority_order``) on the run's workers (``sweeps.budget.trial_estimates``), from the
step costs in the calibration file; measured is each trial's own time (start to result). A trial that
started while a build shared the machine (the llama.cpp tools: a run's first ``--beside-s``
seconds) is also counted apart. Summaries given with ``--recorded`` join its runs, each with the step
costs of its own ``--calibration``. ``--save`` keeps the trials, their times and the step costs they
read as a recorded sweep, the fixture of ``tests/test_budget.py``, so the estimate is checked against
measured runs without them.
A reader apart from ``--save``: it writes nothing else.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections import defaultdict
from dataclasses import asdict

from trials.errors import ConfigError, one_line_errors

AGREE = 0.25            # the target: per group, estimated and measured within 25 %


def load_summaries(paths: list[str], calibration: str, beside_s: list[float]) -> dict:
    """A recorded sweep from ``--summary-json`` files and the calibration file their runs read."""
    from sweeps import budget
    from trials.config import TrialConfig

    missing = [path for path in [*paths, calibration] if not pathlib.Path(path).is_file()]
    if missing:
        raise ConfigError(f"no such file: {', '.join(missing)}")
    runs = []
    for path, build_s in zip(paths, beside_s + [0.0] * (len(paths) - len(beside_s))):
        summary = json.loads(pathlib.Path(path).read_text())
        outcomes = [o for o in summary.get("outcomes", []) if o.get("trial_status") == "FINISHED"]
        if not outcomes:
            raise ConfigError(f"{path}: no finished trials in its outcomes (is it a --summary-json file?)")
        first_start = min(o["timestamp"] - o["time_total_s"] for o in outcomes)
        workers = len(outcomes[0]["config"].get("machine_cpus") or [1])
        runs.append({"name": pathlib.Path(path).name, "workers": workers,
                     "trials": [{"config": o["config"]["trial"], "measured_s": round(o["time_total_s"], 2),
                                 "beside_build": o["timestamp"] - o["time_total_s"] < first_start + build_s}
                                for o in outcomes]})
    configs = [TrialConfig.from_dict(t["config"]) for run in runs for t in run["trials"]]
    pairs = budget.pairs_needed(configs)
    recorded = budget.read_cache(pathlib.Path(calibration))     # every entry, as the runs read it (older ones too)
    costs = budget.calibrate(pairs, "cpu", 1, cache=pathlib.Path(calibration), recorded=recorded, measure=False)
    if len(costs) < len(pairs):          # keyed by this CPU's capability: another CPU's file holds none of ours
        raise ConfigError(f"{calibration}: no step cost for {len(pairs) - len(costs)} of the {len(pairs)} "
                          f"model/precision pairs on this CPU setting (recorded on another CPU, or with "
                          f"ATEN_CPU_CAPABILITY set? Run this with the same setting)")
    return {"runs": runs, "costs": [[model, label, asdict(cost)] for (model, label), cost in sorted(costs.items())]}


def as_lines(recorded: dict) -> str:
    """The recorded sweep as JSON with one trial and one step cost per line (readable diffs)."""
    def row(value) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))

    def costs(rows) -> str:
        return ",\n".join(f"  {row(c)}" for c in rows)

    runs = [f'  {{"name": {json.dumps(run["name"])}, "workers": {run["workers"]}, '
            + (f'"costs": [\n{costs(run["costs"])}],\n  ' if "costs" in run else "") + '"trials": [\n'
            + ",\n".join(f"   {row(t)}" for t in run["trials"]) + "]}" for run in recorded["runs"]]
    return '{"runs": [\n' + ",\n".join(runs) + '],\n "costs": [\n' + costs(recorded["costs"]) + "]}\n"


def per_group(recorded: dict) -> dict[tuple[str, str], dict]:
    """(run, group) -> trials, estimated and measured seconds, and the same for those of them that
    ran beside a build."""
    from sweeps import budget
    from sweeps.deferral import priority_order
    from trials.config import TrialConfig
    from trials.engines.spec import StepCost

    out: dict = defaultdict(lambda: {"trials": 0, "estimated_s": 0.0, "measured_s": 0.0,
                                     "beside_trials": 0, "beside_estimated_s": 0.0, "beside_measured_s": 0.0})
    for run in recorded["runs"]:                   # a run with its own calibration keeps its step costs
        costs = {(model, label): StepCost(**fields) for model, label, fields in run.get("costs", recorded["costs"])}
        trials = [(TrialConfig.from_dict(t["config"]), t) for t in run["trials"]]
        estimates = budget.trial_estimates(priority_order([c for c, _ in trials]), costs, run["workers"])
        for config, t in trials:
            row = out[(run["name"], config.group)]
            for prefix in ("", "beside_") if t["beside_build"] else ("",):
                row[f"{prefix}trials"] += 1
                row[f"{prefix}estimated_s"] += estimates[config.config_hash]
                row[f"{prefix}measured_s"] += t["measured_s"]
    return dict(out)


@one_line_errors("estimate_vs_measured")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.estimate_vs_measured",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("summaries", nargs="*", help="--summary-json files of sweeps, in the order they ran")
    parser.add_argument("--calibration", help="the calibration file those sweeps read (step costs)")
    parser.add_argument("--recorded", help="a recorded sweep saved with --save (summaries given too join it)")
    parser.add_argument("--beside-s", type=float, nargs="*", default=[],
                        help="per summary: seconds from its first trial during which a build shared the "
                             "machine (the summary's tools build; 0 where none ran)")
    parser.add_argument("--save", help="write the recorded sweep here")
    args = parser.parse_args(argv)
    if not args.recorded and not args.summaries:
        raise ConfigError("give --summary-json files (with --calibration), --recorded, or both")
    if args.summaries and not args.calibration:
        raise ConfigError("--calibration is required with summary files: the step costs their runs read")
    added = load_summaries(args.summaries, args.calibration, args.beside_s) if args.summaries else None
    if not args.recorded:
        recorded = added
    else:
        recorded = json.loads(pathlib.Path(args.recorded).read_text())
        if added is not None:                                  # each joins with its own step costs
            recorded["runs"] += [{**run, "costs": added["costs"]} for run in added["runs"]]
    print(f"{'run':<22}{'group':<14}{'trials':>7}{'est min':>9}{'meas min':>10}{'ratio':>7}   of them beside a build")
    for (run, group), row in per_group(recorded).items():
        ratio = row["measured_s"] / row["estimated_s"] if row["estimated_s"] else float("nan")
        flag = "" if abs(ratio - 1) <= AGREE else "  <- outside 25 %"
        beside = (f"{row['beside_trials']} trials, {row['beside_estimated_s'] / 60:.1f} est / "
                  f"{row['beside_measured_s'] / 60:.1f} min" if row["beside_trials"] else "")
        print(f"{run:<22}{group:<14}{row['trials']:>7}{row['estimated_s'] / 60:>9.1f}{row['measured_s'] / 60:>10.1f}"
              f"{ratio:>7.2f}   {beside}{flag}")
    if args.save:
        pathlib.Path(args.save).write_text(as_lines(recorded))
        print(f"saved the recorded sweep to {args.save}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
