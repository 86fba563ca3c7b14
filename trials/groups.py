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
import os
import pkgutil

from trials import techniques
from trials.errors import ConfigError, import_named
from trials.techniques.spec import Technique

PLUGINS_ENV = "LLM_SWEEPS_TECHNIQUES"


def _discover() -> tuple[Technique, ...]:
    built_in = [f"trials.techniques.{m.name}.spec" for m in pkgutil.iter_modules(techniques.__path__) if m.ispkg]
    plugins = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    specs = []
    for name in built_in + plugins:
        # a folder of trials/techniques without a spec is not a technique; any other failure is one line
        module = import_named(name, f"${PLUGINS_ENV}" if name in plugins else "technique", name not in plugins)
        if module is None:
            continue
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, Technique):
            raise ConfigError(f"{name} has no SPEC (a trials.techniques.spec.Technique)")
        specs.append(spec)
    clash = sorted({s.name for s in specs if [t.name for t in specs].count(s.name) > 1})
    if clash:
        raise ConfigError(f"technique {clash[0]!r} is declared twice")
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
