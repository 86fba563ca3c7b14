"""Execute a planned sweep: models, calibration and sizing, skipping, the Tune run, machine-sharing
tags, the summary.

On a fresh local machine the zoo trains beside the trials that need no build (``sweeps.zoo_stage``,
``sweeps.zoo_beside``), whose first results reach the store while it trains; its own trials follow
once it is calibrated; llama.cpp's tools build beside the trials too (``sweeps.setup_beside``).
Elsewhere the zoo (and every real model) is built first and both stages are sized at once. Either way
one Tune run (``sweeps.launch``) runs both stages.
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
from sweeps.fitting import FIRST_STAGE, budget_seconds, calibrate, fit_stage, stage_estimate
from sweeps.launch import collect_outcomes, planned_workers, run_tune, start_local_ray, trial_threads
from sweeps.plan import ensure_models, finished_configs, flat, is_finished, split_stages, zoo_sets_to_build
from sweeps.setup_beside import SetupBeside, commands_needed
from sweeps.sharing import machine_sharing, print_sharing
from sweeps.spaces import run_order
from sweeps.summary import Phases, never_ran, print_phases, print_summary, write_summary_json
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
    now, later = split_stages(trials)
    budget_s, workers = budget_seconds(args, device), planned_workers(args, device)
    sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    sizing = record.read(uri, args, budget_s)       # the step costs this store's earlier sweeps used

    def keep_record() -> None:
        record.write(uri, sizing, sweep_id, args, device, workers)

    zoo_sets = zoo_sets_to_build(flat(later))
    job = None
    reservation_path = None
    try:
        if trains_beside(args, device, zoo_sets, flat(now)):
            start_local_ray(phases)
            reservation_path = str(Path(tempfile.gettempdir()) / f"llm-sweeps-{sweep_id}-cpus.json")
            pairs = budget.pairs_needed(flat(later)) if budget_s is not None else set()
            job = ZooBeside(zoo_sets, pairs, device, trial_threads(args, device), reservation_path,
                            dict(cache=sizing.file, recorded=sizing.recorded, recalibrate=args.recalibrate))
            log.info("%s, beside the trials whose models need no build", job.what)
            phases.zoo_beside = job.what
            away = cpus.away_from(job.cpus)
        else:
            away = contextlib.nullcontext()
        with away:
            phase = time.perf_counter()
            ensure_models(flat(now) if job else flat(trials))
            if job:
                phases.models_s = time.perf_counter() - phase     # the real models' conversion
            else:
                phases.zoo_s = time.perf_counter() - phase        # the zoo's build too
            phase = time.perf_counter()
            costs = calibrate(now if job else trials, args, device, sizing) if budget_s is not None else {}
            phases.calibrate_s = time.perf_counter() - phase
    except ConfigError as exc:
        print(f"python sweeps/full.py: error: {one_line(exc)}", file=sys.stderr)
        stop(job, reservation_path)
        return 2
    now, first = fit_stage(now, costs, budget.first_stage_budget(budget_s, len(flat(now)), len(flat(trials))),
                           device, workers, FIRST_STAGE) if budget_s is not None else (now, None)
    zoo_stage = ZooStage(later, args, uri, device, workers, first, costs, job, phases, sizing,
                         keep_record if job else None)
    first_done = finished_configs(now, args, uri)
    first_pending = run_order([c for c in flat(now) if not is_finished(c, first_done)])
    skipped_first = Counter(c.group for c in flat(now) if is_finished(c, first_done))
    later_now = None if job else zoo_stage()                   # sized at once where nothing trains
    tracking.prepare_store(uri)
    keep_record()                                    # before any trial: a rerun sizes them the same way
    record.say_what_is_measured_again(sizing, args)
    log.info("sweep %s: %d trials planned, %d to run now%s, %d already finished (skipped)", sweep_id,
             len(flat(trials)), len(first_pending) + len(later_now or []),
             f", the zoo's {len(flat(later))} once it is built" if job else "",
             sum(skipped_first.values()) + sum(zoo_stage.skipped.values()))

    outcomes: list[dict] = []
    sharing: list[float] = []
    if first_pending or later_now or job:
        setup.start()
        start_local_ray(phases)
        if job is not None:
            job.wait_until_reserved()                    # no trial starts on the zoo's core first
        phase = time.perf_counter()
        results, printer = run_tune(first_pending + (later_now or []), None if later_now is not None else zoo_stage,
                                    args, uri, sweep_id, device, stage_estimate(budget_s, workers, first, zoo_stage.fitted),
                                    reservation_path, job, setup)
        phases.tune_s = time.perf_counter() - phase
        if printer.first_finished is not None:
            phases.first_finished_s = printer.first_finished - started
        outcomes = collect_outcomes(results, uri, sweep_id)
        tracking.deliver_spooled(uri)                    # what a worker spooled while the store was away
        if job is not None and not job.done():           # Tune ended first (Ctrl-C): the build is not waited for
            stop(job, reservation_path)
        for line in setup.finish():
            print(line, flush=True)
        beside = [w for w in (job.window() if job is not None else None, setup.window()) if w]
        sharing = machine_sharing(uri, sweep_id, beside)         # the zoo's training and builds, if they ran beside
    stop(None, reservation_path)
    phases.estimate_s = stage_estimate(budget_s, workers, first, zoo_stage.fitted)
    all_configs = flat(now) + zoo_stage.planned
    skipped = skipped_first + zoo_stage.skipped
    elapsed_s = time.perf_counter() - started
    print_summary(all_configs, outcomes, skipped, uri, elapsed_s, phases.ray_start_s, left_out,
                  why_not_run="the zoo's build failed (the error above)" if zoo_stage.error else "interrupted")
    print_sharing(sharing, workers)
    if outcomes:
        print_phases(phases, all_configs)
    print(record.describe(sizing))
    if args.summary_json:
        write_summary_json(args.summary_json, sweep_id=sweep_id, uri=uri, device=device, outcomes=outcomes,
                           skipped=skipped, elapsed_s=elapsed_s, phases=phases, job=job,
                           calibration=record.describe(sizing))
    if zoo_stage.error:
        return 1
    return INTERRUPTED if never_ran(all_configs, outcomes, skipped) else 0    # the summary said "interrupted"
