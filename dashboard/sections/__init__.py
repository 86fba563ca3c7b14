"""One module per chart group, in page order; which modules is the groups' declaration
(``trials.groups``, the ``section`` of each group), so a new group needs no line here.

A section module follows ``Section`` (below): ``GROUP`` (its MLflow experiment, equal to its group's
name), ``TITLE``, ``BLURB`` (one sentence: the question it answers) and
``figures(frame) -> [(component id, plotly figure)]``; and it may define the optional hooks in
``OPTIONAL_HOOKS``: ``caption(frame) -> str`` (what the numbers are), ``RUN_STATUS`` (which runs it
charts; None: all, with a ``status`` column), ``EVERY_RUN`` (True: every run, not only each
configuration's latest, e.g. a search's trials in order), ``MEASURED_BY`` (the metric a finished run
must hold to be charted; ``tok_per_s`` by default), ``deep_dive(frame, model)`` with ``DEEP_DIVE_TITLE`` and
``deep_dive_models(frame)`` (per-model charts under a selector), and ``DEEP_DIVE_CONTROLS``
(``{name: (label, default, step)}``: number boxes beside the selector, passed to ``deep_dive`` by
name), ``deep_dive_reads() -> [group]`` (other groups whose frames ``deep_dive`` gets as ``others``,
e.g. the best-stack card's served pick; a deep dive may return ``(id, common.TextBeside)`` beside its
figures: text, and folds with copy buttons), and ``report(frame) -> [Markdown lines]`` (its table in
``llm-report``, the results page). ``frame`` is ``tracking.runs_frame`` of the group; an empty list
of figures means "nothing to show yet" and the app lays out the empty state. ``check_section`` enforces the protocol when the page is built: a missing or mistyped
attribute, or a public name one typo away from a hook (``captions``, ``deepdive``), is an error
instead of a hook that silently never runs. The app marks, in every section, the points of runs
whose precision their CPU only emulated (``common.mark_emulated``, for any trace whose hover uses
``common.PROVENANCE_HOVER``) and adds the section's one-line ``common.emulation_note``; and it makes
every chart readable (``readable``: log axes where values span over 10x, labels that do not collide).
"""

from __future__ import annotations

import difflib
import functools
from types import ModuleType
from typing import Callable, Protocol, runtime_checkable

from trials import groups
from trials.errors import import_named


@runtime_checkable
class Section(Protocol):
    GROUP: str
    TITLE: str
    BLURB: str

    def figures(self, frame) -> list: ...


REQUIRED = {"GROUP": str, "TITLE": str, "BLURB": str, "figures": Callable}
OPTIONAL_HOOKS = {"caption": Callable, "RUN_STATUS": (str, type(None)), "EVERY_RUN": bool, "MEASURED_BY": str,
                  "deep_dive": Callable,
                  "DEEP_DIVE_TITLE": str, "deep_dive_models": Callable, "DEEP_DIVE_CONTROLS": dict,
                  "deep_dive_reads": Callable, "report": Callable}
HOOKS = {**REQUIRED, **OPTIONAL_HOOKS}


class SectionError(TypeError):
    """A section module that does not follow the protocol."""


def _is(value, kind) -> bool:
    return callable(value) if kind is Callable else isinstance(value, kind)


def check_section(module: ModuleType, group: str) -> ModuleType:
    """``module`` if it is a valid section of ``group``; else ``SectionError`` naming the problem."""
    name = module.__name__
    for attr, kind in REQUIRED.items():
        if not hasattr(module, attr):
            raise SectionError(f"{name} has no {attr}")
    for attr, kind in HOOKS.items():
        if hasattr(module, attr) and not _is(getattr(module, attr), kind):
            raise SectionError(f"{name}.{attr} has the wrong type ({type(getattr(module, attr)).__name__})")
    if module.GROUP != group:
        raise SectionError(f"{name}.GROUP is {module.GROUP!r}, but the group declaring it is {group!r}")
    if hasattr(module, "deep_dive") != hasattr(module, "deep_dive_models") and hasattr(module, "deep_dive_models"):
        raise SectionError(f"{name} defines deep_dive_models but no deep_dive")
    public = {a for a in vars(module) if not a.startswith("_") and a not in HOOKS}
    for attr in public:
        near = difflib.get_close_matches(attr, HOOKS, n=1, cutoff=0.8)
        if near and getattr(module, attr).__class__.__module__ != "typing":
            raise SectionError(f"{name}.{attr} looks like a misspelt hook {near[0]!r}; rename one of them")
    assert isinstance(module, Section)
    return module


def deep_dive_choices(section, frame) -> list[str]:
    """The models a section's deep-dive selector offers: its ``deep_dive_models``, else every model."""
    if hasattr(section, "deep_dive_models"):
        return list(section.deep_dive_models(frame))
    return sorted(frame["model"].dropna().unique()) if "model" in frame.columns else []


def deep_dive_defaults(section) -> dict:
    """The ``DEEP_DIVE_CONTROLS`` at their defaults, as ``deep_dive`` takes them ({} without controls)."""
    return {name: default for name, (_, default, _) in getattr(section, "DEEP_DIVE_CONTROLS", {}).items()}


@functools.cache
def all_sections() -> tuple[ModuleType, ...]:
    """Every group's section, in page order; found on first use (a bad ``$LLM_SWEEPS_TECHNIQUES`` is
    then a ``ConfigError`` of the command, not a traceback of an import; so is a section module that
    fails to import)."""
    return tuple(check_section(import_named(g.section, f"the {g.name} technique's section"), g.name)
                 for g in groups.GROUPS)


def __getattr__(name: str):
    if name == "SECTIONS":
        return all_sections()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Section", "all_sections", "check_section", "deep_dive_choices", "deep_dive_defaults"]
