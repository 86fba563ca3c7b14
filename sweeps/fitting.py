"""Fit the plan to --budget on this machine, stage by stage, and print what each stage is estimated to take.

``sweeps.budget`` holds the model (calibration, per-trial estimates, the shrinking); this module
applies it to a sweep: the budget a profile gets by default, the calibration on the threads a trial
gets, each stage's fit with its printed estimate (``fit_stage``), and both stages at once for a dry
run or a zoo already built (``fit_to_budget``). The step costs come from the store's record of its
earlier sweeps where it has them (``sweeps.record``), else from this machine's cache, else measured.
"""

from __future__ import annotations

import argparse

from sweeps import budget
from sweeps.launch import planned_workers, trial_threads
from sweeps.plan import chosen_profile, flat, split_stages
from trials.config import TrialConfig

DEFAULT_BUDGET = {"quick": "30m", "full": "none"}

FIRST_STAGE = "Trials that start at once (their models need no build):"
ZOO_STAGE = "The zoo's trials (sized once the zoo is built and calibrated):"


def budget_seconds(args: argparse.Namespace, device: str) -> float | None:
    return budget.parse_budget(args.budget or DEFAULT_BUDGET[chosen_profile(args, device).base])


def calibrate(trials: dict[str, list[TrialConfig]], args, device: str, sizing, measure: bool = True) -> dict:
    """The step costs of the trials' models: as the store's sweep records keep them, else this
    machine's cached calibration of the sweep's purpose, else measured now (``measure`` False: only
    what is known). Adds them to ``sizing.used`` (``sweeps.record.Sizing``), what the sweep's record keeps."""
    pairs, threads = budget.pairs_needed(flat(trials)), trial_threads(args, device)
    costs = budget.calibrate(pairs, device, threads, recalibrate=args.recalibrate, cache=sizing.file,
                             recorded=sizing.recorded, measure=measure)
    sizing.used.update(budget.keyed(pairs, costs, device, threads))
    return costs


def fit_stage(trials: dict[str, list[TrialConfig]], costs: dict, budget_s: float | None, device: str,
              workers: int, title: str):
    """Shrink one stage's workloads to ``budget_s``; prints its estimate. (trials by group, the Fit)."""
    configs = flat(trials)
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


def fit_to_budget(trials: dict[str, list[TrialConfig]], costs: dict, args, device: str):
    """Size both stages at once with ``costs`` (``calibrate``; a dry run): the same sizes as a sweep
    that trains the zoo beside its first trials."""
    now, later = split_stages(trials)
    budget_s, workers = budget_seconds(args, device), planned_workers(args, device)
    now, first = fit_stage(now, costs, budget.first_stage_budget(budget_s, len(flat(now)), len(flat(trials))),
                           device, workers, FIRST_STAGE)
    later, _ = fit_stage(later, costs, budget.later_stage_budget(budget_s, first, workers), device, workers, ZOO_STAGE)
    return {group: now[group] + later[group] for group in trials}


def stage_estimate(budget_s: float | None, workers: int, *fits) -> float | None:
    """The budget's estimate of the sized stages' trials, in wall time on ``workers`` (None without a budget)."""
    if budget_s is None:
        return None
    return sum(f.estimate_s / workers for f in fits if f is not None)


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
