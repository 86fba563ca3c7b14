"""The sweep's command line, beyond its options (``sweeps/full.py`` declares those): a usage error in
one line, the option types, and ``validate``, which checks the options against the sweep file, the
chart groups and the model catalogue before anything starts.
"""

from __future__ import annotations

import argparse

from sweeps import budget
from trials import groups
from trials.errors import ConfigError
from trials.models.registry import BUILT_IN, Catalogue, all_models
from trials.redaction import one_line


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def comma_list(text: str) -> list[str]:
    """``a, b,,c`` -> [a, b, c]."""
    return [item.strip() for item in text.split(",") if item.strip()]


def duration_arg(text: str) -> str:
    """Checks a duration (--budget, --gpu-wait); ``budget.parse_budget`` turns it into seconds."""
    try:
        budget.parse_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


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
