"""What a technique declares about itself, torch-free: the one place a sweep, the budget, the report
and the dashboard learn about it.

Each technique folder (``trials/techniques/<name>/``) has a ``spec.py`` whose ``SPEC`` is a
``Technique``: its name (the MLflow experiment, ``TrialConfig.group``), title and place on the page,
the stacks it accepts (``guard``), the settings a profile gives it (``profile_keys``), what its
trials cost (``cost``, for the budget), and pointers, as ``"module:attr"`` strings resolved on use,
to its runner (in a worker), its search space (in the driver) and its dashboard section. Nothing
outside the folder branches on a technique's name: ``trials.groups`` collects the specs, and every
table derives from them.

``cost(config, estimate)`` returns the seconds a trial spends beyond loading its model: the
``estimate`` (``sweeps.budget.Estimate``) knows this machine's step costs and the shared arithmetic
(``plain``: the loop's timed passes of this trial; ``generate_s``; ``once(key, seconds)`` for a
reference a worker measures once and reuses).

Two groups may plan the same measurement (same model, stack, workload, repeats): it runs once
(``sweeps.measure_once``), in a group that ``hosts_shared_runs``, and each other group that declares
``shared_numbers`` adds to that one run what its own runner would have measured on top, at the cost
its ``shared_cost`` estimates.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

from trials import engines
from trials.engines import DEFAULT as DEFAULT_ENGINE
from trials.errors import ConfigError
from trials.models.registry import perplexity_method


@dataclass(frozen=True)
class ProfileKey:
    """One setting a profile gives the technique: ``kind`` ``int`` or ``number`` (``low``..``high``), ``bool``,
    ``precision`` (a weight precision of the default engine), ``weight`` (any engine's weight type),
    ``cache`` (a KV cache: ``full`` or an engine's backend and bits, ``hqq4``) or ``engine``; ``many``: a
    list of them; ``optional``: a built-in profile may leave it out."""

    kind: str
    many: bool = False
    low: float = 1
    high: float = 1_000_000
    optional: bool = False


@dataclass(frozen=True)
class DeviceSetup:
    """What a device check (``benchmarks/gpu_check.py``) offers one model's trials: the two 16/32-bit
    precisions worth timing there (``fast`` first), the 4-bit KV backend to try and the package it
    lacks (``""``: present), whether bitsandbytes is missing, the batch sizes and the draft's folder."""

    device: str
    fast: str
    other: str
    kv_backend: str
    kv_missing: str
    bnb_missing: str
    batches: tuple[int, ...]
    draft: str


@dataclass(frozen=True)
class DeviceCheck:
    """One trial of a device check: the stack, whether it takes the long-context workload, the
    package whose absence makes a failure expected, and the least time left worth starting it with."""

    stack: object
    long_context: bool = False
    needs: str = ""
    min_budget_s: float = 20


@dataclass(frozen=True)
class Technique:
    name: str
    title: str
    order: int                                     # place on the page and in plans
    guard: Callable[[object], str | None]          # why a stack does not belong here, or None
    runner: str | None                             # "module:function" (config, runtime) -> TrialResult
    space: str | None                              # "module:function" planning its trials
    section: str                                   # the dashboard section's module
    reference: str                                 # what a trial is compared with, and how it is reused
    profile_keys: Mapping[str, ProfileKey] = field(default_factory=dict)
    cost: Callable | None = None                   # (config, estimate) -> seconds; None: the loop's passes
    calibrates_reference: bool = False             # its cost reads the reference precision's step cost
    shrink: Callable | None = None                 # (config, workload, prompts_divisor) -> workload
    select: Callable | None = None                 # (configs, stack names, source) -> a sweep file's stacks
    space_reads_store: bool = False                # the space takes ``runs=``: it plans from the store
    device_checks: Callable | None = None          # (DeviceSetup) -> [DeviceCheck]: its GPU-check trials
    engines: tuple[str, ...] | None = (DEFAULT_ENGINE,)   # the engines its trials run on; None: every engine
    #                                                       of its kind (in-process, or servers where ``serving``)
    serving: bool = False                          # it measures server engines (``Engine.serves``) under load
    holds_node: bool = False                       # a trial holds every CPU of its node (a server and its client)
    hosts_shared_runs: bool = False                # its trial of a measurement other groups also plan runs it for them
    shared_numbers: str | None = None              # "module:function" (config, result) -> (metrics, tags): its own
    #                                                numbers on a run another group measured; None: never shared
    shared_cost: Callable | None = None            # (config, estimate) -> seconds those numbers add
    search: str | None = None                      # "module" of a space searched point by point (``searched``,
    #                                                ``make_config``, ``point_of``, ``KNOBS``; sweeps.searches)

    @property
    def implemented(self) -> bool:
        return self.runner is not None and self.space is not None

    def check(self, stack) -> None:
        """Raise ``ConfigError`` when ``stack`` does not belong to this technique."""
        if self.engines is not None and stack.engine not in self.engines:
            raise ConfigError(f"the {self.name} group runs on {', '.join(self.engines)}, not on "
                              f"{stack.engine} (stack {stack.label})")
        if stack.engine in engines.ENGINES and engines.get(stack.engine).serves != self.serving:
            kind = "server engines" if self.serving else "in-process engines"
            raise ConfigError(f"the {self.name} group runs {kind}, and {stack.engine} "
                              f"{'is not a server' if self.serving else 'is a server (the serving group measures it)'}")
        reason = self.guard(stack)
        if reason:
            raise ConfigError(reason)

    def run(self, config, runtime):
        """Run ``config`` with the runner (in a worker: this imports the technique and torch)."""
        if self.runner is None:
            raise ConfigError(f"group {self.name!r} has no trials yet")
        return resolve(self.runner)(config, runtime)

    def numbers_on_shared_run(self, config, result) -> tuple[dict, dict]:
        """This group's own numbers on ``result``, a run of the same measurement that another group's
        runner made (``config``: the trial as this group plans it; in a worker)."""
        return resolve(self.shared_numbers)(config, result)

    def plan(self, models: list[str], profile, device: str, catalogue=None, runs=None) -> list:
        """The trials of ``models`` (names the ``catalogue`` resolves: the built-in models and a
        sweep file's own, ``trials.models.registry.Catalogue``); ``runs(group)`` reads the store for
        a space that plans from it."""
        if self.space is None:
            raise ConfigError(f"group {self.name!r} has no trials yet")
        extra = {"runs": runs} if self.space_reads_store else {}
        if catalogue is not None:
            extra["catalogue"] = catalogue
        return resolve(self.space)(models, profile, device, **extra)


def resolve(pointer: str):
    """The object a ``"module:attr"`` pointer names (``"module"`` alone: the module)."""
    module, _, attr = pointer.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded


def built_in(name: str, runner: str) -> dict[str, str]:
    """Where a built-in technique's parts live in its folder: ``runner.<runner>``, ``space.plan``, and
    its section ``dashboard/sections/<name>.py`` (a plug-in names its own)."""
    return {"runner": f"trials.techniques.{name}.runner:{runner}", "space": f"trials.techniques.{name}.space:plan",
            "section": f"dashboard.sections.{name}"}


def served_keys(**own: ProfileKey) -> dict[str, ProfileKey]:
    """The profile keys of a group that drives server engines under load (serving, capacity): which
    servers and stacks, requests and warm-up per point, the SLO; then the group's ``own``."""
    return {"servers": ProfileKey("engine", many=True, optional=True),
            "weights": ProfileKey("weight", many=True, optional=True),
            "caches": ProfileKey("cache", many=True, optional=True),
            "parallel": ProfileKey("int", many=True, low=1, high=64),
            "warmup_requests": ProfileKey("int", low=0, high=1000),
            "ttft_slo_ms": ProfileKey("int", low=1, high=3_600_000),
            "tpot_slo_ms": ProfileKey("int", low=1, high=3_600_000),
            "real_models_only": ProfileKey("bool", optional=True), **own}


def only_weights_and_batch(name: str) -> Callable:
    """The guard of a technique that varies weights and batch size only."""
    def guard(stack) -> str | None:
        if stack.kv_bits != 16 or stack.speculation != "none" or stack.compile:
            return (f"the {name} group varies weight precision and batch size only (no KV-cache "
                    f"quantization, speculation or compiled decoding), got stack {stack.label}")
        return None
    return guard


MIN_EVAL_WINDOWS = 4      # perplexity windows a shrunk trial keeps at least


def shrink_eval_windows(config, workload, prompts_divisor: int):
    """A technique's ``shrink`` that scores perplexity: fewer windows as prompts are divided, down to
    ``MIN_EVAL_WINDOWS`` (or the method's own count, where smaller)."""
    from dataclasses import replace

    if prompts_divisor <= 1:
        return workload
    default = perplexity_method(config.entry(), config.workload.eval_windows).windows
    return replace(workload, eval_windows=max(min(default, MIN_EVAL_WINDOWS), default // prompts_divisor))
