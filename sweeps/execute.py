"""Execute a planned sweep: models, calibration and sizing, skipping and deferral, the Tune run,
machine-sharing tags, the summary.

The whole plan is sized before the first trial (a zoo model not trained yet is calibrated as its
architecture with random weights), and this run's share is chosen once: what finished is skipped,
what does not fit the budget beside the work next to the trials is deferred (``sweeps.fitting``,
``sweeps.deferral``). On a fresh local machine the zoo trains beside the trials that need no build
(``sweeps.zoo_stage``, ``sweeps.zoo_beside``), whose first results reach the store while it trains;
its own trials join the queue once it is built; llama.cpp's tools build beside the trials too
(``sweeps.setup_beside``). One Tune run (``sweeps.launch``) runs both, and stops starting trials
that would end past the budget (``Deadline``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import tracking
from sweeps import budget, record
from sweeps.deferral import Deadline, as_record, describe_deferred
from sweeps.fitting import AGAIN, beside_work, budget_seconds, calibrate, plan_run, size_plan, zoo_training
from sweeps.launch import collect_outcomes, planned_workers, run_tune, start_local_ray, trial_threads
from sweeps.plan import ensure_models, finished_configs, flat, is_finished, needs_zoo, split_stages, zoo_sets_to_build
from sweeps.setup_beside import SetupBeside, commands_needed
from sweeps.sharing import machine_sharing, print_sharing
from sweeps.summary import (Phases, estimated_and_measured, never_ran, print_estimates, print_phases, print_summary,
                            write_summary_json)
from sweeps.zoo_stage import ZooStage, stop, trains_beside
from trials.config import TrialConfig
from trials.errors import ConfigError
from trials.redaction import one_line

log = logging.getLogger("sweeps")
INTERRUPTED = 130          # what a shell reports for a command stopped by Ctrl-C (128 + SIGINT)


def run(trials: dict[str, list[TrialConfig]], args, device: str, uri: str, started: float, ray_start_s: float,
        left_out: list[str]) -> int:
    """Size the trials, skip what finished, run the rest on Ray Tune, tag machine sharing, summarize;
    on local Ray, what the planned engines need built here is built beside (``sweeps.setup_beside``)."""
    commands = commands_needed(flat(trials)) if args.address is None else []
    setup = SetupBeside(commands)
    try:
        return _run(trials, args, device, uri, started, ray_start_s, left_out, setup)
    finally:
        if not setup.done():
            log.info("stopping %s: no trial of this sweep is left to wait for it", setup.what)
        setup.stop()


def _run(trials: dict[str, list[TrialConfig]], args, device: str, uri: str, started: float, ray_start_s: float,
         left_out: list[str], setup: SetupBeside) -> int:
    from sweeps import cpus
    from sweeps.zoo_beside import ZooBeside

    phases = Phases(started, ray_start_s)
    budget_s, workers = budget_seconds(args, device), planned_workers(args, device)
    sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    sizing = record.read(uri, args, budget_s)       # the step costs this store's earlier sweeps used
    no_build, zoo_trials = (flat(stage) for stage in split_stages(trials))
    zoo_sets = zoo_sets_to_build(zoo_trials)
    job = None
    reservation_path = None
    try:
        if trains_beside(args, device, zoo_sets, no_build):
            start_local_ray(phases)
            reservation_path = str(Path(tempfile.gettempdir()) / f"llm-sweeps-{sweep_id}-cpus.json")
            zoo_pairs = {pair for pair in budget.pairs_needed(flat(trials)) if pair[0].source == "zoo"} \
                if budget_s is not None else set()
            job = ZooBeside(zoo_sets, device, trial_threads(args, device), reservation_path,
                            dict(cache=sizing.file, recorded=sizing.recorded, recalibrate=args.recalibrate), zoo_pairs)
            log.info("%s, beside the trials whose models need no build", job.what)
            phases.zoo_beside = job.what
            away = cpus.away_from(job.cpus)
        else:
            away = contextlib.nullcontext()
        with away:
            phase = time.perf_counter()
            ensure_models(no_build if job else flat(trials))
            if job:
                phases.models_s = time.perf_counter() - phase     # the real models' conversion
            else:
                phases.zoo_s = time.perf_counter() - phase        # the zoo's build too
            phase = time.perf_counter()
            costs = calibrate(trials, args, device, sizing, skip_zoo=job is not None) if budget_s is not None else {}
            if job is not None and budget_s is not None:     # the zoo's, timed on its own core meanwhile
                costs.update(job.costs_before_training())
                sizing.used.update(budget.keyed(zoo_pairs, costs, device, trial_threads(args, device)))
            phases.calibrate_s = time.perf_counter() - phase
    except ConfigError as exc:
        print(f"python sweeps/full.py: error: {one_line(exc)}", file=sys.stderr)
        stop(job, reservation_path)
        return 2
    trials, _ = size_plan(trials, costs, args, device)
    done = finished_configs(trials, args, uri)
    beside = beside_work(zoo_sets if job is not None else [], costs, setup) if budget_s is not None else {}
    chosen = plan_run(trials, costs, done, args, device, beside)
    first_pending = [c for c in chosen.run if job is None or not needs_zoo(c)]     # priority order
    zoo_stage = ZooStage([c for c in chosen.run if job is not None and needs_zoo(c)], job, phases)
    skipped = Counter(c.group for c in flat(trials) if is_finished(c, done))
    tracking.prepare_store(uri)
    record.write(uri, sizing, sweep_id, args, device, workers, deferred=chosen.per_group(chosen.deferred))
    record.say_what_is_measured_again(sizing, args)
    log.info("sweep %s: %d trials planned, %d to run%s, %d already finished (skipped), %d deferred to the next run",
             sweep_id, len(flat(trials)), len(chosen.run),
             f" (the zoo's {len(zoo_stage.planned)} once it is built)" if job else "",
             sum(skipped.values()), len(chosen.deferred))
    deadline = Deadline(None if chosen.capacity_s is None else budget_s, chosen.seconds, workers,
                        pricer=lambda config: budget.priced_alone(config, costs))
    standby = list(chosen.deferred)      # offered after the planned trials while the budget has time left
    outcomes: list[dict] = []
    sharing: list[float] = []
    printer = None
    if first_pending or zoo_stage.pending or job:
        start_local_ray(phases)          # first: a Ctrl-C inside ray.init can crash the process
        setup.start()
        if job is not None:
            job.wait_until_reserved()                    # no trial starts on the zoo's core first
        phase = time.perf_counter()
        results, printer = run_tune(first_pending, zoo_stage if job is not None else None, args, uri, sweep_id,
                                    device, deadline, reservation_path, job, setup, standby)
        phases.tune_s = time.perf_counter() - phase
        if printer.first_finished is not None:
            phases.first_finished_s = printer.first_finished - started
        outcomes = collect_outcomes(results, uri, sweep_id)
        tracking.deliver_spooled(uri)                    # what a worker spooled while the store was away
        if job is not None and not job.done():           # Tune ended first (Ctrl-C): the build is not waited for
            stop(job, reservation_path)
        for line in setup.finish():
            print(line, flush=True)
        beside_windows = [w for w in (job.window() if job is not None else None, setup.window()) if w]
        sharing = machine_sharing(uri, sweep_id, beside_windows)   # the zoo's training and builds, if they ran beside
    stop(None, reservation_path)
    phases.estimate_s = (chosen.load_s() + chosen.beside_s) / workers if budget_s is not None else None
    # refused for the time they need, or never offered
    deferred = deadline.deferred + (printer.searcher.standby if printer is not None else standby)
    waiting = {c.config_hash for c in deferred}
    all_configs = [c for c in flat(trials) if c.config_hash not in waiting]
    elapsed_s = time.perf_counter() - started
    print_summary(all_configs, outcomes, skipped, uri, elapsed_s, phases.ray_start_s, left_out,
                  why_not_run="the zoo's build failed (the error above)" if zoo_stage.error else "interrupted")
    took = {**setup.elapsed(), **({zoo_training(zoo_sets): phases.zoo_s} if job is not None else {})}
    print_estimates(deadline, beside, took, phases)
    for line in describe_deferred(chosen.per_group(deferred), f"{AGAIN}, or a larger --budget"):
        print(line)
    if {c.config_hash for c in deferred} != {c.config_hash for c in chosen.deferred}:    # the record says what waits
        record.write(uri, sizing, sweep_id, args, device, workers, deferred=chosen.per_group(deferred))
    print_sharing(sharing, workers)
    if outcomes:
        print_phases(phases, all_configs)
    print(record.describe(sizing))
    if args.summary_json:
        write_summary_json(args.summary_json, sweep_id=sweep_id, uri=uri, device=device, outcomes=outcomes,
                           skipped=skipped, elapsed_s=elapsed_s, phases=phases, job=job,
                           calibration=record.describe(sizing),
                           estimates={g: {"trials": n, "estimated_s": round(e, 1), "measured_s": round(m, 1)}
                                      for g, (n, e, m) in estimated_and_measured(deadline).items()},
                           deferred=as_record(chosen.per_group(deferred)))
    if zoo_stage.error:
        return 1
    return INTERRUPTED if never_ran(all_configs, outcomes, skipped) else 0    # the summary said "interrupted"
