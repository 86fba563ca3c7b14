"""The chart groups: every technique's declaration, collected, and the lookups every layer uses.

A group is a technique measured on its own (or, for the stacks group, techniques combined): an
MLflow experiment, a search space, a runner, a section of the dashboard. Each is declared once, in
its folder's ``spec.py`` (``trials.techniques.<name>.spec.SPEC``, a ``Technique``); this module
finds them (every folder of ``trials/techniques`` with a spec, in their ``order``), and the modules
a user names in ``$LLM_SWEEPS_TECHNIQUES`` (comma-separated, each with a ``SPEC``): a technique of
one's own, with no line changed here.

This module is imported by the dashboard and the sweep driver, which must not import torch or the
measurement loop (only a trial's worker does): specs are torch-free, and runners, spaces and
sections are ``"module:attr"`` pointers resolved on use.
"""

from __future__ import annotations

import functools

from trials import techniques
from trials.errors import ConfigError
from trials.plugins import discover
from trials.techniques.spec import Technique

PLUGINS_ENV = "LLM_SWEEPS_TECHNIQUES"


def _discover() -> tuple[Technique, ...]:
    specs = [spec for _, spec in discover(techniques, PLUGINS_ENV, "technique", Technique)]
    return tuple(sorted(specs, key=lambda s: (s.order, s.name)))


@functools.cache
def _groups() -> tuple[Technique, ...]:
    return _discover()


@functools.cache
def _by_name() -> dict[str, Technique]:
    return {g.name: g for g in _groups()}


def __getattr__(name: str):
    """``GROUPS`` (in page order), ``BY_NAME`` and ``NAMES``, found on first use: a technique's own
    module may import ``trials.config``, which imports this module."""
    if name == "GROUPS":
        return _groups()
    if name == "BY_NAME":
        return dict(_by_name())
    if name == "NAMES":
        return tuple(g.name for g in _groups())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get(name: str) -> Technique:
    if name not in _by_name():
        raise ConfigError(f"unknown group {name!r}; valid: {', '.join(_by_name())}")
    return _by_name()[name]


def implemented() -> list[str]:
    """Groups that have trials (a search space and a runner), in page order."""
    return [g.name for g in _groups() if g.implemented]
