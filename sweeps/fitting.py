"""Fit the plan to --budget on this machine and say, before anything runs, what runs now and what waits.

``sweeps.budget`` holds the model (calibration, per-trial estimates, the shrinking) and
``sweeps.deferral`` the choice of what runs past the floors; this module applies them to a sweep: the
budget a profile gets by default, the calibration on the threads a trial gets, the whole plan's fit
with its printed estimate (``size_plan``: one level for every trial, chosen from the whole plan so
that a rerun plans the same configs), and this run's share of it (``plan_run``: what finished is
skipped, what does not fit beside the work that runs next to the trials is deferred). The step costs
come from the store's record of its earlier sweeps where it has them, else from this machine's
cache, else measured (a zoo model not trained yet: its architecture with random weights).
"""

from __future__ import annotations

import argparse
import math

from sweeps import budget, deferral
from sweeps.launch import planned_workers, trial_threads
from sweeps.plan import chosen_profile, flat, is_finished, zoo_sets_planned
from trials.config import TrialConfig

DEFAULT_BUDGET = {"quick": "45m", "full": "none"}
AGAIN = "the same command again (`make run` for the main job)"


def budget_seconds(args: argparse.Namespace, device: str) -> float | None:
    return budget.parse_budget(args.budget or DEFAULT_BUDGET[chosen_profile(args, device).base])


def calibrate(trials: dict[str, list[TrialConfig]], args, device: str, sizing, measure: bool = True,
              skip_zoo: bool = False) -> dict:
    """The step costs of the trials' models: as the store's sweep records keep them, else this
    machine's cached calibration of the sweep's purpose, else measured now (``measure`` False: only
    what is known; ``skip_zoo``: not the zoo's, which its build beside the trials times on its own core).
    Adds them to ``sizing.used`` (``sweeps.record.Sizing``), what the sweep's record keeps."""
    pairs, threads = budget.pairs_needed(flat(trials)), trial_threads(args, device)
    if skip_zoo:
        pairs = {pair for pair in pairs if pair[0].source != "zoo"}
    costs = budget.calibrate(pairs, device, threads, recalibrate=args.recalibrate, cache=sizing.file,
                             recorded=sizing.recorded, measure=measure)
    sizing.used.update(budget.keyed(pairs, costs, device, threads))
    return costs


def size_plan(trials: dict[str, list[TrialConfig]], costs: dict, args, device: str):
    """Shrink the whole plan's workloads to the budget (one level for all; ``budget.fit``) and print
    the estimate: (trials by group, the Fit; None without a budget)."""
    budget_s, workers = budget_seconds(args, device), planned_workers(args, device)
    configs = flat(trials)
    if budget_s is None or not configs:
        return trials, None
    # the zoo's training, counted whether it is built or not: a rerun then chooses the same workloads,
    # and on a fresh machine the trials are at their floors before any is deferred for the training
    training_s = budget.zoo_build_seconds(zoo_sets_planned(configs), costs) / workers
    fitted = budget.fit(configs, costs, max(1.0, budget_s - training_s), workers)
    used = {(entry.name, precision) for entry, precision in budget.pairs_needed(configs)}
    if training_s:
        print(f"Sizing to {duration(budget_s)} less ~{duration(training_s)} for the zoo's training on a fresh machine "
              "(counted whether it is built or not, so that a rerun sizes the same)")
    print_estimate(fitted, {key: cost for key, cost in costs.items() if key in used}, device, workers)
    sized: dict[str, list[TrialConfig]] = {group: [] for group in trials}
    for config in fitted.configs:
        sized[config.group].append(config)
    return sized, fitted


def fit_to_budget(trials: dict[str, list[TrialConfig]], costs: dict, args, device: str):
    """``size_plan``'s trials alone (a dry run)."""
    return size_plan(trials, costs, args, device)[0]


def zoo_training(zoo_sets: list[str]) -> str:
    """The words that name the zoo's training beside the trials (its estimate's key, and its measurement's)."""
    return f"training the zoo ({', '.join(zoo_sets)})"


def beside_work(zoo_sets: list[str], costs: dict, setup) -> dict[str, float]:
    """What runs beside the trials and takes a core meanwhile, by its words: the zoo's training (where
    ``zoo_sets`` train beside them) and the builds of ``setup`` (a ``SetupBeside``), in estimated seconds."""
    beside = {zoo_training(zoo_sets): budget.zoo_build_seconds(zoo_sets, costs)} if zoo_sets else {}
    beside.update(setup.estimates())
    return beside


def plan_run(trials: dict[str, list[TrialConfig]], costs: dict, done: dict[str, set[str]], args, device: str,
             beside: dict[str, float] | None = None) -> deferral.Deferral:
    """This run's share of the sized plan: the trials without a FINISHED run, in priority order, as
    many as fit the budget's worker-seconds beside ``beside`` (what else takes a core meanwhile, by
    name: seconds); the rest deferred. Prints it per group."""
    budget_s, workers = budget_seconds(args, device), planned_workers(args, device)
    configs = flat(trials)
    pending = [c for c in configs if not is_finished(c, done)]
    seconds = (budget.trial_estimates(deferral.priority_order(pending), costs, workers)
               if budget_s is not None else {})
    beside_s = sum((beside or {}).values())
    capacity = None if budget_s is None or getattr(args, "no_defer", False) else budget_s * workers
    chosen = deferral.defer(pending, seconds, capacity, workers, beside_s)
    if budget_s is not None:
        print_run(chosen, configs, done, beside or {}, budget_s)
    return chosen


def print_run(chosen: deferral.Deferral, configs: list[TrialConfig], done, beside: dict[str, float],
              budget_s: float) -> None:
    """The plan per group: planned, finished, run now and deferred, with estimated minutes."""
    workers = chosen.workers
    runs, waits = chosen.per_group(chosen.run), chosen.per_group(chosen.deferred)
    within = "with --no-defer: every trial, past" if chosen.capacity_s is None else "within"
    print(f"This run, {within} --budget {duration(budget_s)} on {workers} worker(s) "
          "(finished configs skipped; past the floors the lowest-priority trials wait for the next run):")
    print(f"  {'group':<14}{'planned':>8}{'finished':>9}{'run now':>9}{'~min':>7}{'deferred':>9}{'~min':>7}")
    for group in dict.fromkeys(c.group for c in configs):
        planned = [c for c in configs if c.group == group]
        n_done = sum(is_finished(c, done) for c in planned)
        run, wait = runs.get(group, (0, 0.0)), waits.get(group, (0, 0.0))
        print(f"  {group:<14}{len(planned):>8}{n_done:>9}{run[0]:>9}{run[1]:>7.1f}{wait[0]:>9}{wait[1]:>7.1f}")
    for what, seconds in beside.items():
        print(f"  beside the trials: {what}, ~{seconds / 60:.1f} min of one core")
    used = (chosen.load_s() + chosen.beside_s) / workers
    print(f"Estimated: ~{used / 60:.1f} min of wall time for this run (budget {duration(budget_s)})")
    if chosen.deferred:
        need = (chosen.load_s(chosen.run + chosen.deferred) + chosen.beside_s) / workers
        for line in deferral.describe_deferred(waits, f"{AGAIN}, or --budget {math.ceil(need / 60 * 1.1)}m to run "
                                                      "them in this one"):
            print(line)
        print("  (where the planned trials take less than estimated, they start in this run, in this order, "
              "each only if it ends within the budget)")


def print_estimate(fitted, costs, device: str, workers: int) -> None:
    print("Calibration (what one step costs here, batch 1):")
    print(budget.format_calibration(costs, device))
    if fitted.budget_s is None:
        print(f"No budget: the profile as written, estimated {fitted.estimate_s / 60 / workers:.1f} min "
              f"of trials on {workers} worker(s)")
    else:
        print(f"Budget {duration(fitted.budget_s)} on {workers} worker(s): the profile as written would "
              f"take ~{fitted.unscaled_s / 60 / workers:.1f} min; chose {fitted.describe_level()}")
    if fitted.emulated:
        worst = max(fitted.emulated, key=lambda e: e[2])
        print(f"  {len(fitted.emulated)} trial(s) run in a precision this device emulates (bf16 on this CPU: "
              f"{', '.join(sorted({e[0].stack.precision for e in fitted.emulated}))}); each shrunk further, "
              f"the longest ~{worst[2]:.0f} s ({worst[0].model} {worst[0].group} {worst[0].stack.label}, "
              f"{fitted.describe_level(worst[1])})")
    print(f"The whole plan at this size: ~{fitted.estimate_s / 60 / workers:.1f} min of trials "
          f"(a model of the step costs above, not a measurement; the summary prints the real time per group)")


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
