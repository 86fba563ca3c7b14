"""Run every chart group's trials through Ray Tune and record them in MLflow.

    python sweeps/full.py                         # all groups, local Ray, ./mlflow.db, the zoo
    python sweeps/full.py --groups baseline --models zoo-gqa --dry-run
    python sweeps/full.py --address auto --tracking-uri http://head:5000 --profile full
    python sweeps/full.py --sweep my-sweep.yaml   # your models, groups, sizes, stacks (README)

Steps: validate the options (bad input: one line, exit 2, nothing touched) -> plan the trials of
each group -> convert the real models the plan needs and, where the zoo is not built yet, train it
in a Ray task on one reserved core beside the first trials (local Ray; sweeps/zoo_beside.py; on a
cluster or with --workers 1 it is built first) -> calibrate what a step costs on this machine and
shrink the workloads to --budget in two stages, the trials that need no build first and the zoo's
once it is calibrated (sweeps/budget.py; prints each estimate) -> skip configs that already have a
FINISHED run (unless --rerun) -> run the rest on Ray Tune (actors reused, one GPU per trial when the
cluster has GPUs, else --cpus-per-trial CPUs; sweeps/staged.py hands the zoo's trials over when they
can run) -> tag what shared the machine with each run -> print a summary, the time of each phase
and when the first run reached the store, and where to look.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import tracking
from sweeps import budget
from sweeps.spaces import default_models, run_order
from sweeps.sizing import builtin_profile_names
from sweeps.sweepfile import profiles
from trials import groups
from trials.config import TrialConfig, parse_memory_budget
from trials.errors import ConfigError, argument_type, one_line_errors, positive_int
from trials.measurement.cost import parse_price_per_hour
from trials.redaction import redact
from trials.models import pypi, zoo
from trials.models.registry import BUILT_IN, Catalogue, all_models

log = logging.getLogger("sweeps")

RAY_RESULTS = Path.home() / ".cache" / "llm-inference-sweeps" / "ray_results"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _budget(text: str) -> str:
    """Checks a --budget value; ``budget_seconds`` turns it into seconds."""
    try:
        budget.parse_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


DEFAULT_BUDGET = {"quick": "30m", "full": "none"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python sweeps/full.py", description=__doc__.split("\n\n")[0],
                           epilog=__doc__.split("\n\n", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default=None, metavar="FILE",
                        help="a sweep file (YAML): models (yours too), groups, profile overrides, stacks; "
                             "--groups, --models and --profile given on the command line win over it "
                             "(format: sweeps/sweepfile.py, README 'Your own sweep')")
    parser.add_argument("--groups", type=_csv, default=None,
                        help=f"comma-separated chart groups (implemented: {', '.join(groups.implemented())}; default: all)")
    parser.add_argument("--models", type=_csv, default=None,
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
    parser.add_argument("--gpu-wait", type=_budget, default="20m", metavar="DURATION",
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
    parser.add_argument("--budget", type=_budget, default=None, metavar="DURATION",
                        help="wall time the trials may take, e.g. 30m, 2h or none: a short calibration "
                             "measures each model's step cost here, and workloads (new tokens, prompts, "
                             "repeats; never the set of trials) shrink until the estimate fits "
                             f"(default: {DEFAULT_BUDGET['quick']} for the quick profile, none for full)")
    parser.add_argument("--recalibrate", action="store_true",
                        help="measure step costs again instead of using this machine's cached calibration")
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


def validate(args: argparse.Namespace) -> None:
    """Raise ConfigError (one line) for a bad sweep file, groups or models, before anything starts."""
    args.sweep_file = None
    if args.sweep is not None:
        from sweeps.sweepfile import load_sweep

        args.sweep_file = load_sweep(args.sweep)
        args.groups = args.groups if args.groups is not None else args.sweep_file.groups
        args.models = args.models if args.models is not None else args.sweep_file.models
    if args.max_failures < 0:
        raise ConfigError(f"--max-failures must be 0 or more, not {args.max_failures}")
    chosen = args.groups if args.groups is not None else groups.implemented()
    for name in chosen:
        if not groups.get(name).implemented:
            raise ConfigError(f"group {name!r} has no trials yet; implemented: {', '.join(groups.implemented())}")
    if not chosen:
        raise ConfigError(f"--groups is empty; valid: {', '.join(groups.implemented())}")
    args.groups = chosen
    if args.wait_for_gpus and args.address is None:
        raise ConfigError("--wait-for-gpus needs --address (a Ray cluster whose workers are starting)")
    args.catalogue = Catalogue(tuple(args.sweep_file.entries)) if args.sweep_file else BUILT_IN
    if args.models is not None:
        if not args.models:
            raise ConfigError(f"--models is empty; valid: {', '.join(all_models())}")
        for model in args.models:
            args.catalogue.get(model)


# Environment variables the trials need on every node: Ray's runtime_env hands them to the workers,
# so that a secret never has to be written into cluster.yaml or onto a node's disk.
FORWARDED_ENV = ("HF_TOKEN",)   # gated Hugging Face models (Llama)


def worker_env_vars() -> dict[str, str]:
    return {name: os.environ[name] for name in FORWARDED_ENV if os.environ.get(name)}


def wait_for_gpus(count: int, timeout_s: float | None, poll_s: float = 15.0) -> None:
    """Until the cluster has ``count`` GPUs; ``ConfigError`` after ``timeout_s`` (None: no limit)."""
    import ray

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while (present := ray.cluster_resources().get("GPU", 0)) < count:
        if deadline is not None and time.monotonic() >= deadline:
            raise ConfigError(f"waited {timeout_s:.0f} s for {count} GPU(s) and the cluster has {present:g}: "
                              "does cluster.yaml have a GPU worker type that can start (`ray status` on the "
                              "head shows pending nodes; the autoscaler log says why one failed)?")
        log.info("waiting for GPUs: %g of %d have joined the cluster", present, count)
        time.sleep(min(poll_s, max(0.1, deadline - time.monotonic())) if deadline else poll_s)


def detect_device(address: str | None) -> str:
    """'cuda' when the cluster (or this machine, for local Ray) has GPUs, else 'cpu'."""
    if address is None:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    import ray

    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


def _alive_nodes() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def plan(args: argparse.Namespace, device: str, uri: str | None = None) -> dict[str, list[TrialConfig]]:
    models = args.models or default_models(device)
    profile = chosen_profile(args, device)
    catalogue = getattr(args, "catalogue", BUILT_IN)
    runs = None if uri is None else (lambda group: tracking.runs_frame(uri, group))
    trials = {name: groups.get(name).plan(models, profile, device, catalogue, runs) for name in args.groups}
    sweep = getattr(args, "sweep_file", None)
    if sweep is not None and sweep.stacks:
        for name in trials:
            if groups.get(name).select is not None:
                trials[name] = groups.get(name).select(trials[name], sweep.stacks, sweep.source)
    return trials


def chosen_profile(args: argparse.Namespace, device: str):
    """--profile, else the sweep file's profile, else quick on a CPU and full on GPUs."""
    sweep = getattr(args, "sweep_file", None)
    if args.profile is None and sweep is not None and sweep.profile is not None:
        return sweep.profile
    return profiles()[args.profile or ("quick" if device == "cpu" else "full")]


def budget_seconds(args: argparse.Namespace, device: str) -> float | None:
    return budget.parse_budget(args.budget or DEFAULT_BUDGET[chosen_profile(args, device).base])


def planned_workers(args: argparse.Namespace, device: str) -> int:
    """Trials at once, as run_tune will choose them (before Ray starts: from this machine)."""
    import ray

    if ray.is_initialized():
        slots = ray.cluster_resources().get("GPU" if device == "cuda" else "CPU", 1)
    else:
        import torch

        slots = torch.cuda.device_count() if device == "cuda" else (os.cpu_count() or 1)
    slots = int(slots // (1 if device == "cuda" else args.cpus_per_trial))
    return max(1, min(args.workers or slots, slots))


def _flat(trials: dict[str, list[TrialConfig]]) -> list[TrialConfig]:
    return [c for configs in trials.values() for c in configs]


def needs_zoo(config: TrialConfig) -> bool:
    """Whether a trial needs a zoo model (its target or draft), i.e. waits for the zoo's build."""
    return any(config.entry(name).source == "zoo" for name in (config.model, config.stack.draft_model) if name)


def split_stages(trials: dict[str, list[TrialConfig]]):
    """(the trials whose models need no build, the zoo's trials), each by group: the budget's two
    stages (``sweeps.budget``), and the order they start in."""
    now = {group: [c for c in configs if not needs_zoo(c)] for group, configs in trials.items()}
    later = {group: [c for c in configs if needs_zoo(c)] for group, configs in trials.items()}
    return now, later


def trial_threads(args, device: str) -> int:
    """The threads one trial gets (what its step costs are calibrated on)."""
    return 1 if device == "cuda" else args.cpus_per_trial


def calibrate(trials: dict[str, list[TrialConfig]], args, device: str) -> dict:
    """This machine's step costs for the trials' models (cached per machine; ``sweeps.budget``)."""
    return budget.calibrate(budget.pairs_needed(_flat(trials)), device, trial_threads(args, device),
                            recalibrate=args.recalibrate)


def fit_stage(trials: dict[str, list[TrialConfig]], costs: dict, budget_s: float | None, device: str,
              workers: int, title: str):
    """Shrink one stage's workloads to ``budget_s``; prints its estimate. (trials by group, the Fit)."""
    configs = _flat(trials)
    if not configs:
        return trials, None
    fitted = budget.fit(configs, costs, budget_s, workers)
    print(title)
    used = {(entry.name, precision) for entry, precision in budget.pairs_needed(configs)}
    print_estimate(fitted, {key: cost for key, cost in costs.items() if key in used}, device, workers)
    shrunk: dict[str, list[TrialConfig]] = {group: [] for group in trials}
    for config in fitted.configs:
        shrunk[config.group].append(config)
    return shrunk, fitted


FIRST_STAGE = "Trials that start at once (their models need no build):"
ZOO_STAGE = "The zoo's trials (sized once the zoo is built and calibrated):"


def fit_to_budget(trials: dict[str, list[TrialConfig]], args, device: str):
    """Calibrate every model (cached per machine) and size both stages at once (a dry run, or a zoo
    already built): the same sizes as a sweep that trains the zoo beside its first trials."""
    now, later = split_stages(trials)
    costs = calibrate(trials, args, device)
    budget_s, workers = budget_seconds(args, device), planned_workers(args, device)
    now, first = fit_stage(now, costs, budget.first_stage_budget(budget_s, len(_flat(now)), len(_flat(trials))),
                           device, workers, FIRST_STAGE)
    later, _ = fit_stage(later, costs, budget.later_stage_budget(budget_s, first, workers), device, workers, ZOO_STAGE)
    return {group: now[group] + later[group] for group in trials}


def print_estimate(fitted, costs, device: str, workers: int) -> None:
    print("Calibration (what one step costs here, batch 1):")
    print(budget.format_calibration(costs, device))
    if fitted.budget_s is None:
        print(f"No budget: the profile as written, estimated {fitted.estimate_s / 60 / workers:.1f} min "
              f"of trials on {workers} worker(s)")
    else:
        print(f"Budget {duration(fitted.budget_s)} on {workers} worker(s): the profile as written would "
              f"take ~{fitted.unscaled_s / 60 / workers:.1f} min; chose {fitted.describe_level()}")
    per_group: dict[str, list] = {}
    references: set = set()
    for config in fitted.configs:
        per_group.setdefault(config.group, []).append(budget.trial_seconds(config, costs, references))
    for group, seconds in per_group.items():
        print(f"  {group:<14}{len(seconds):>4} trials  ~{sum(seconds) / 60 / workers:5.1f} min")
    if fitted.emulated:
        worst = max(fitted.emulated, key=lambda e: e[2])
        print(f"  {len(fitted.emulated)} trial(s) run in a precision this device emulates (bf16 on this CPU: "
              f"{', '.join(sorted({e[0].stack.precision for e in fitted.emulated}))}); each shrunk further, "
              f"the longest ~{worst[2]:.0f} s ({worst[0].model} {worst[0].group} {worst[0].stack.label}, "
              f"{fitted.describe_level(worst[1])})")
    print(f"Estimated: ~{fitted.estimate_s / 60 / workers:.1f} min of trials "
          f"(a model of the step costs above, not a measurement; the summary prints the real time)")
    if fitted.budget_s is not None and fitted.estimate_s / max(1, workers) > fitted.budget_s:
        print(f"  Over its budget ({duration(fitted.budget_s)}) even at the floors: the budget shrinks "
              "workloads, never the set of trials; to hold it, run fewer (--groups, --models, or a sweep file)")


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def measured_at_other_sizes(trials: dict[str, list[TrialConfig]], done: dict[str, set[str]],
                            uri: str) -> dict[str, tuple[TrialConfig, str]]:
    """Planned configs without a FINISHED run that the store measured at another workload:
    config_hash -> (the config, the size it was measured at)."""
    found = {}
    for group, configs in trials.items():
        pending = [c for c in configs if not _finished(c, done)]
        subjects = tracking.finished_subjects(uri, group) if pending else {}
        found.update({c.config_hash: (c, subjects[c.subject_hash]) for c in pending if c.subject_hash in subjects})
    return found


def say_measured_elsewhere(elsewhere: dict[str, tuple[TrialConfig, str]], reuse: bool) -> None:
    if not elsewhere:
        return
    config, before = next(iter(elsewhere.values()))
    example = f"{config.group} {config.model} {config.stack.label}: {before} there, {config.describe_size()} now"
    if reuse:
        print(f"{len(elsewhere)} config(s) have a FINISHED run at another workload (e.g. {example}); --reuse: "
              "keeping those runs, not measuring them again")
    else:
        print(f"{len(elsewhere)} config(s) finished before at another workload (e.g. {example}): measuring them "
              "again at this sweep's workload; --reuse keeps those runs instead")


def _finished(config: TrialConfig, done: dict[str, set[str]]) -> bool:
    """Whether the store already holds a FINISHED run of this exact config."""
    return config.config_hash in done.get(config.group, ())


def print_plan(trials: dict[str, list[TrialConfig]], done: dict[str, set[str]]) -> None:
    print(f"{'group':<14}{'model':<24}{'trials':>7}{'to skip':>9}")
    for group, configs in trials.items():
        per_model = Counter(c.model for c in configs)
        skipped = Counter(c.model for c in configs if _finished(c, done))
        for model, count in per_model.items():
            print(f"{group:<14}{model:<24}{count:>7}{skipped[model]:>9}")
        if not configs:
            print(f"{group:<14}{'(none)':<24}{0:>7}{0:>9}")
    total = sum(len(c) for c in trials.values())
    to_skip = sum(_finished(c, done) for cs in trials.values() for c in cs)
    print(f"total: {total} trials, {to_skip} already finished")


def _model_names(configs: list[TrialConfig], source: str) -> set[str]:
    entries = {c.entry(name) for c in configs for name in (c.model, c.stack.draft_model) if name}
    return {entry.location for entry in entries if entry.source == source}


def models_ready(configs: list[TrialConfig]) -> bool:
    return all(zoo.is_built(n) for n in _model_names(configs, "zoo")) \
        and all(pypi.is_converted(n) for n in _model_names(configs, "pypi"))


def ensure_models(configs: list[TrialConfig]) -> None:
    """Build the zoo models and convert the real (PyPI) models the plan needs; both are cached."""
    for set_name in zoo_sets_to_build(configs):
        log.info("building zoo set %r (a model the plan needs is missing or stale)", set_name)
        zoo.build(set_name)
    real = sorted(_model_names(configs, "pypi"))
    if real:
        pypi.fetch(real)


def first_run_hint(uri: str) -> str:
    """What to run, once the store has a run, to watch the sweep fill the charts."""
    default = uri == tracking.resolve_uri(None)
    command = "make dashboard" if default else f"python dashboard/app.py --tracking-uri {redact(uri)}"
    return (f"the store has its first run: in another terminal, `{command}` opens the dashboard on "
            "http://127.0.0.1:8050; it follows this sweep, drawing each run as it finishes and saying what runs now")


def run_tune(configs: list[TrialConfig], later, args, uri: str, sweep_id: str, device: str,
             estimate_s: float | None = None, reservation_path: str | None = None, job=None):
    """One Tune run: ``configs`` in order, then what ``later`` (a ``ZooStage``) hands out once it can.
    Returns (Tune's results, the progress printer)."""
    from ray import tune

    from sweeps import cpus
    from sweeps.progress import ProgressPrinter
    from sweeps.staged import StagedSearcher
    from sweeps.trainable import run_in_worker
    from trials.measurement.environment import git_sha

    if device == "cuda":
        resources = {"cpu": 1, "gpu": 1}
    else:
        resources = {"cpu": args.cpus_per_trial}
    workers = planned_workers(args, device)
    waiting = len(later.planned) if later is not None else 0
    log.info("running %d trials%s, %d at a time, each with %s", len(configs),
             f" (then the zoo's {waiting})" if later is not None else "", workers, resources)
    printer = ProgressPrinter(len(configs) + waiting, estimate_s, first_run_hint(uri),
                              functools.partial(tracking.write_live, uri, sweep_id),
                              watch=later.poll if later is not None else None)
    if job is not None:
        printer.running[job.what] = job.started      # said in the heartbeat and on the dashboard
    if later is not None:
        def zoo_trials_known(count: int, estimate_s: float | None) -> None:
            if job is not None:
                printer.running.pop(job.what, None)
            printer.total = len(configs) + count
            if printer.estimate_s is not None and estimate_s is not None:
                printer.estimate_s += estimate_s
            printer.say(f"the zoo's {count} trial(s) queued, smallest models first")
        later.on_ready = zoo_trials_known
    param_space = {"tracking_uri": uri, "sweep_id": sweep_id, "git_sha": git_sha(),
                   "profile": chosen_profile(args, device).name,
                   "memory_budget_bytes": args.memory_budget, "price_per_hour_usd": args.price_per_hour,
                   "reservation_path": reservation_path, "machine_cpus": sorted(cpus.current())}
    tuner = tune.Tuner(
        tune.with_resources(run_in_worker, resources),
        param_space=param_space,
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=workers, num_samples=-1,
                                    search_alg=StagedSearcher(configs, later, run_order)),
        run_config=tune.RunConfig(name=sweep_id, storage_path=args.storage_path, verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=args.max_failures),
                                  callbacks=[printer]),
    )
    return tuner.fit(), printer


@one_line_errors("python sweeps/full.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    import tracking

    if args.flush:
        return flush_spool()
    try:
        validate(args)
        uri = tracking.reachable_uri(args.tracking_uri)
    except (ConfigError, tracking.TrackingError) as exc:
        print(f"python sweeps/full.py: error: {redact(exc)}", file=sys.stderr)
        return 2
    delivered, left = tracking.deliver_spooled(uri)      # before planning: they count as done
    if delivered or left:
        print(f"Spooled results from an earlier outage: {delivered} delivered to {redact(uri)}, {left} still waiting")

    started = time.perf_counter()
    ray_start_s = 0.0
    if args.address is not None:
        import ray

        env_vars = worker_env_vars()
        ray.init(address=args.address, logging_level=logging.WARNING,
                 runtime_env={"env_vars": env_vars} if env_vars else None)
        if args.wait_for_gpus:
            try:
                wait_for_gpus(args.wait_for_gpus, budget.parse_budget(args.gpu_wait))
            except ConfigError as exc:
                print(f"python sweeps/full.py: error: {redact(exc)}", file=sys.stderr)
                ray.shutdown()
                return 2
    device = detect_device(args.address)
    if args.address is not None and uri.startswith("sqlite") and _alive_nodes() > 1:
        print("python sweeps/full.py: error: a multi-node Ray cluster needs a tracking server that "
              "every node reaches (--tracking-uri http://HEAD:5000); a sqlite file is local to one "
              "node", file=sys.stderr)
        return 2
    try:
        with PlanNotes() as left_out:
            trials = plan(args, device, uri)
    except ConfigError as exc:
        print(f"python sweeps/full.py: error: {redact(exc)}", file=sys.stderr)
        return 2

    if args.dry_run:
        return dry_run(trials, args, device, uri)
    return run(trials, args, device, uri, started, ray_start_s, left_out.notes)


def dry_run(trials: dict[str, list[TrialConfig]], args, device: str, uri: str) -> int:
    """``--dry-run``: the plan as the sweep would size it (when the models are here to calibrate)."""
    if budget_seconds(args, device) is not None:
        if not models_ready(_flat(trials)):
            print("(the plan before --budget shrinks it: calibrating needs the models; build them with "
                  "python -m trials.models.zoo build and python -m trials.models.pypi fetch, or run without "
                  "--dry-run)")
        else:
            trials = fit_to_budget(trials, args, device)
    print_plan(trials, finished_configs(trials, args, uri))
    return 0


def finished_configs(trials: dict[str, list[TrialConfig]], args, uri: str) -> dict[str, set[str]]:
    """Config hashes to skip, by group: FINISHED in the store (none with --rerun; with --reuse also
    the same configs measured at another workload, which is said either way)."""
    if args.rerun:
        return {}
    done = {g: tracking.finished_hashes(uri, g) for g in trials}
    elsewhere = measured_at_other_sizes(trials, done, uri)
    say_measured_elsewhere(elsewhere, args.reuse)
    if args.reuse:
        done = {g: done[g] | {c.config_hash for c in cs if c.config_hash in elsewhere} for g, cs in trials.items()}
    return done


def zoo_sets_to_build(configs: list[TrialConfig]) -> list[str]:
    stale = {n for n in _model_names(configs, "zoo") if not zoo.is_built(n)}
    return [set_name for set_name, names in zoo.ZOO_SETS.items() if stale & set(names)]


def trains_beside(args, device: str, zoo_sets: list[str], first_stage: list[TrialConfig]) -> bool:
    """Whether the zoo trains in a Ray task beside the first trials: local Ray, a zoo to build, trials
    to run meanwhile, a core to spare for it, and more than one trial at a time allowed (``--workers 1``
    runs one thing at a time: the zoo first, then each trial alone). Otherwise the zoo builds first,
    on every core."""
    from sweeps import cpus

    spare = device == "cuda" or len(cpus.current()) > args.cpus_per_trial
    return bool(zoo_sets) and bool(first_stage) and args.address is None and args.workers != 1 and spare


class Phases:
    """Wall time of each phase of the sweep (seconds), for the summary and --summary-json."""

    def __init__(self, started: float, ray_start_s: float) -> None:
        self.started, self.ray_start_s = started, ray_start_s
        self.zoo_s = self.models_s = self.calibrate_s = self.tune_s = 0.0
        self.zoo_beside: str = ""            # what trained beside the trials (empty: the zoo trained first)
        self.first_finished_s: float | None = None
        self.estimate_s: float | None = None  # the budget's estimate of the trials, both stages


def _start_ray(phases: Phases) -> None:
    import ray

    if not ray.is_initialized():
        began = time.perf_counter()
        ray.init(logging_level=logging.WARNING, include_dashboard=False)
        phases.ray_start_s = time.perf_counter() - began


class ZooStage:
    """The zoo's trials, sized as soon as the zoo's build beside the first trials returns its step
    costs (at once where it was built before; ``poll``), and handed to Tune (``StagedSearcher``) after
    the first stage's."""

    def __init__(self, trials, args, uri: str, device: str, workers: int, first, costs: dict, job, phases: Phases):
        self.trials, self.args, self.uri, self.device, self.workers = trials, args, uri, device, workers
        self.first, self.costs, self.job, self.phases = first, costs, job, phases
        self.planned: list[TrialConfig] = _flat(trials)     # sized once the costs are here
        self.pending: list[TrialConfig] | None = None        # what to run, once sized
        self.skipped: Counter = Counter()
        self.error: str | None = None
        self.fitted = None                                    # budget.Fit, once sized
        self.on_ready = None                                  # called with (trials to run, their estimate)

    def poll(self) -> bool:
        """Whether the zoo's trials are sized; sizes them the first time the build is found done."""
        if self.pending is not None:
            return True
        if self.job is not None and not self.job.done():
            return False
        costs = dict(self.costs)
        if self.job is not None:
            built = self.job.result
            self.phases.zoo_s = (built.ended - built.started) if built else time.time() - self.job.started
            if self.job.error:
                self.error = f"the zoo's build failed, so its {len(self.planned)} trial(s) did not run: {self.job.error}"
                print(f"python sweeps/full.py: error: {self.error}", file=sys.stderr, flush=True)
                self.pending = []
                if self.on_ready:
                    self.on_ready(0, None)
                return True
            costs.update(built.costs)
            print(f"The zoo is built and calibrated ({built.built - built.started:.0f} s training, "
                  f"{built.ended - built.built:.0f} s calibration; {self.job.what}); sizing its trials, which "
                  "join the queue in run order (smallest models first):", flush=True)
        budget_s = budget.later_stage_budget(budget_seconds(self.args, self.device), self.first, self.workers)
        trials, self.fitted = fit_stage(self.trials, costs, budget_s, self.device, self.workers, ZOO_STAGE) \
            if budget_s is not None else (self.trials, None)
        self.planned = _flat(trials)
        done = finished_configs(trials, self.args, self.uri)
        self.skipped = Counter(c.group for c in self.planned if _finished(c, done))
        self.pending = run_order([c for c in self.planned if not _finished(c, done)])
        if self.on_ready:
            self.on_ready(len(self.pending), self.fitted.estimate_s / self.workers if self.fitted else None)
        return True

    def __call__(self) -> list[TrialConfig] | None:
        """For ``StagedSearcher``: the trials to run, or None while the build runs."""
        return self.pending if self.poll() else None


def run(trials: dict[str, list[TrialConfig]], args, device: str, uri: str, started: float, ray_start_s: float,
        left_out: list[str]) -> int:
    """Size the trials, skip what finished, run the rest on Ray Tune, tag machine sharing, summarize.

    On a fresh local machine the zoo trains beside the trials that need no build (``sweeps.zoo_beside``),
    whose first results reach the store while it trains; its own trials follow once it is calibrated."""
    from sweeps import cpus
    from sweeps.zoo_beside import ZooBeside

    phases = Phases(started, ray_start_s)
    now, later = split_stages(trials)
    budget_s, workers = budget_seconds(args, device), planned_workers(args, device)
    sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    zoo_sets = zoo_sets_to_build(_flat(later))
    job = None
    reservation_path = None
    try:
        if trains_beside(args, device, zoo_sets, _flat(now)):
            _start_ray(phases)
            reservation_path = str(Path(tempfile.gettempdir()) / f"llm-sweeps-{sweep_id}-cpus.json")
            pairs = budget.pairs_needed(_flat(later)) if budget_s is not None else set()
            job = ZooBeside(zoo_sets, pairs, device, trial_threads(args, device), reservation_path)
            log.info("%s, beside the trials whose models need no build", job.what)
            phases.zoo_beside = job.what
            away = cpus.away_from(job.cpus)
        else:
            away = contextlib.nullcontext()
        with away:
            phase = time.perf_counter()
            ensure_models(_flat(now) if job else _flat(trials))
            if job:
                phases.models_s = time.perf_counter() - phase     # the real models' conversion
            else:
                phases.zoo_s = time.perf_counter() - phase        # the zoo's build too
            phase = time.perf_counter()
            costs = calibrate(now if job else trials, args, device) if budget_s is not None else {}
            phases.calibrate_s = time.perf_counter() - phase
    except ConfigError as exc:
        print(f"python sweeps/full.py: error: {redact(exc)}", file=sys.stderr)
        _stop(job, reservation_path)
        return 2
    now, first = fit_stage(now, costs, budget.first_stage_budget(budget_s, len(_flat(now)), len(_flat(trials))),
                           device, workers, FIRST_STAGE) if budget_s is not None else (now, None)
    zoo_stage = ZooStage(later, args, uri, device, workers, first, costs, job, phases)
    first_done = finished_configs(now, args, uri)
    first_pending = run_order([c for c in _flat(now) if not _finished(c, first_done)])
    skipped_first = Counter(c.group for c in _flat(now) if _finished(c, first_done))
    later_now = None if job else zoo_stage()                   # sized at once where nothing trains
    tracking.prepare_store(uri)
    log.info("sweep %s: %d trials planned, %d to run now%s, %d already finished (skipped)", sweep_id,
             len(_flat(trials)), len(first_pending) + len(later_now or []),
             f", the zoo's {len(_flat(later))} once it is built" if job else "",
             sum(skipped_first.values()) + sum(zoo_stage.skipped.values()))

    outcomes: list[dict] = []
    sharing: list[float] = []
    if first_pending or later_now or job:
        _start_ray(phases)
        if job is not None:
            job.wait_until_reserved()                    # no trial starts on the zoo's core first
        phase = time.perf_counter()
        results, printer = run_tune(first_pending + (later_now or []), None if later_now is not None else zoo_stage,
                                    args, uri, sweep_id, device, stage_estimate(budget_s, workers, first, zoo_stage.fitted),
                                    reservation_path, job)
        phases.tune_s = time.perf_counter() - phase
        if printer.first_finished is not None:
            phases.first_finished_s = printer.first_finished - started
        outcomes = collect_outcomes(results, uri, sweep_id)
        tracking.deliver_spooled(uri)                    # what a worker spooled while the store was away
        if job is not None and not job.done():           # Tune ended first (Ctrl-C): the build is not waited for
            _stop(job, reservation_path)
        beside = job.window() if job is not None else None            # the zoo's training, if it ran beside
        sharing = machine_sharing(uri, sweep_id, [beside] if beside else [])
    _stop(None, reservation_path)
    phases.estimate_s = stage_estimate(budget_s, workers, first, zoo_stage.fitted)
    all_configs = _flat(now) + zoo_stage.planned
    skipped = skipped_first + zoo_stage.skipped
    elapsed_s = time.perf_counter() - started
    print_summary(all_configs, outcomes, skipped, uri, elapsed_s, phases.ray_start_s, left_out,
                  why_not_run="the zoo's build failed (the error above)" if zoo_stage.error else "interrupted")
    if sharing:
        shared = [f for f in sharing if f > 0]
        print(f"Machine sharing: {len(shared)} of {len(sharing)} runs had other work beside their timed passes "
              f"(another trial's, or the zoo's training; median {100 * sorted(sharing)[len(sharing) // 2]:.0f} % "
              "of the time; each run's tag shared_machine says which); --workers 1 measures each trial alone "
              f"(the zoo trained first), in about {workers}x the trial time")
    if outcomes:
        print_phases(phases, all_configs)
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps({
            "sweep_id": sweep_id, "tracking_uri": uri, "device": device,
            "finished": sum(o.get("trial_status") == "FINISHED" for o in outcomes),
            "failed": sum(o.get("trial_status") != "FINISHED" for o in outcomes),
            "skipped": sum(skipped.values()), "elapsed_s": elapsed_s, "zoo_s": phases.zoo_s,
            "zoo_beside": phases.zoo_beside, "zoo_window": job.window() if job else None,
            "zoo_cpus": job.cpus if job else None, "models_s": phases.models_s,
            "calibrate_s": phases.calibrate_s, "estimate_s": phases.estimate_s,
            "first_finished_s": phases.first_finished_s,
            "ray_start_s": phases.ray_start_s, "tune_s": phases.tune_s, "outcomes": outcomes}, indent=1))
    return 1 if zoo_stage.error else 0


def print_phases(phases: Phases, configs: list[TrialConfig]) -> None:
    zoo_text = (f"zoo {phases.zoo_s:.0f} s (trained beside the trials: {phases.zoo_beside}), "
                f"real models {phases.models_s:.0f} s" if phases.zoo_beside else f"zoo {phases.zoo_s:.0f} s")
    first = (f"; the first finished run {phases.first_finished_s:.0f} s after the sweep started"
             if phases.first_finished_s is not None else "")
    estimate = f"estimated {phases.estimate_s / 60:.1f} min for " if phases.estimate_s else ""
    print(f"Phases: {zoo_text}, calibration {phases.calibrate_s:.0f} s, Ray start-up {phases.ray_start_s:.0f} s, "
          f"trials {phases.tune_s / 60:.1f} min ({estimate}all {len(configs)} planned){first}")


def stage_estimate(budget_s: float | None, workers: int, *fits) -> float | None:
    """The budget's estimate of the sized stages' trials, in wall time on ``workers`` (None without a budget)."""
    if budget_s is None:
        return None
    return sum(f.estimate_s / workers for f in fits if f is not None)


def _stop(job, reservation_path: str | None) -> None:
    """Cancel a zoo build still running (the sweep ends early) and remove its reservation file."""
    if job is not None:
        import ray

        ray.cancel(job.ref, force=True)
    if reservation_path:
        Path(reservation_path).unlink(missing_ok=True)


def flush_spool() -> int:
    """``--flush``: deliver every spooled result; exit 0 when none is left."""
    import tracking
    from tracking import spool

    waiting = len(spool.pending())
    delivered, left = tracking.deliver_spooled(None)
    print(f"Spool {spool.spool_dir()}: {waiting} result(s) waiting, {delivered} delivered, {left} left"
          + (" (their store is still unreachable; run --flush again later)" if left else ""))
    return 0 if not left else 1


def machine_sharing(uri: str, sweep_id: str, beside=()) -> list[float]:
    """Tag the sweep's runs with what shared the machine during their timed passes (the other trials',
    the zoo's training: ``beside``); best effort: a store that went away keeps the runs without the tag."""
    try:
        return tracking.record_machine_sharing(uri, sweep_id, beside)
    except Exception as exc:  # the runs are logged; the tag is an addition
        log.warning("could not record machine sharing: %s", redact(f"{type(exc).__name__}: {exc}"))
        return []


def collect_outcomes(results, uri: str, sweep_id: str) -> list[dict]:
    """One dict per trial; a trial whose worker died is recorded here as a FAILED run."""
    import tracking
    from trials.loop import failed_result

    outcomes = []
    for result in results:
        if result.error is None and result.metrics and "trial_status" in result.metrics:
            outcomes.append(result.metrics)
            continue
        if not result.config or "trial" not in result.config:
            continue                          # a trial Tune created but never started (Ctrl-C)
        config = TrialConfig.from_dict(result.config["trial"])
        reason = (str(result.error).strip().splitlines()[-1] if result.error
                  else "interrupted before it reported a result")
        failure = failed_result(config, RuntimeError(f"worker failed: {reason}"))
        tracking.log_trial(uri, failure, sweep_id=sweep_id)
        outcomes.append({"trial_status": "FAILED", "error": failure.error, "group": config.group,
                         "model": config.model, "stack": config.stack.label})
    return outcomes


class PlanNotes(logging.Handler):
    """What the techniques' search spaces left out and warned about while planning (GPTQ without its
    extra, llama.cpp without its binding), kept to be said again in the summary."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.notes: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.notes.append(record.getMessage())

    def __enter__(self) -> "PlanNotes":
        logging.getLogger("trials.techniques").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("trials.techniques").removeHandler(self)


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
    for note in left_out:
        print(f"  not planned: {note}")
    planned = len(configs) - sum(skipped.values())
    if len(outcomes) < planned:
        print(f"  {planned - len(outcomes)} planned trial(s) never ran ({why_not_run}); the same command again "
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


if __name__ == "__main__":
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    sys.exit(main())
