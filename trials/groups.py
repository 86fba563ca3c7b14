"""The chart groups: one declaration per technique, and every table derived from it.

A group is a technique measured on its own (or, for ``stacks``, techniques combined): an MLflow
experiment, a search space in ``sweeps/``, a runner in ``trials/``, a section of the dashboard. Each
is declared once, in ``GROUPS`` below, with

* ``name``: the experiment name and ``TrialConfig.group``;
* ``guard``: why a stack does not belong to the group (checked when a ``TrialConfig`` is built, so a
  bad combination fails before a sweep starts), or ``None`` when it does;
* ``runner``: the function running one trial, ``(TrialConfig, Runtime) -> TrialResult``;
* ``reference``: what the group compares a trial with, and how often a worker measures it;
* ``space`` and ``section``: where the group's trials are listed (``sweeps.spaces``) and drawn
  (``dashboard.sections``).

Runners, spaces and sections are ``"module:attr"`` strings, resolved on use: this module is
imported by the dashboard and the sweep driver, which must not import torch or the measurement loop
(only a trial's worker does). Everything else is plain data. Adding a technique = one technique
module in ``trials/``, one section module in ``dashboard/sections/``, one space function in
``sweeps/spaces.py`` and one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from trials.errors import ConfigError


def _only_weights_and_batch(group: str) -> Callable:
    def guard(stack) -> str | None:
        if stack.kv_bits != 16 or stack.speculation != "none" or stack.compile:
            return (f"the {group} group varies weight precision and batch size only (no KV-cache "
                    f"quantization, speculation or compiled decoding), got stack {stack.label}")
        return None
    return guard


def _speculative_guard(stack) -> str | None:
    if stack.speculation == "none":
        return "the speculative group needs speculation 'draft' or 'prompt_lookup'"
    if stack.kv_bits != 16:
        return f"the speculative group keeps the full-precision KV cache, got stack {stack.label}"
    return None


SPEC_NEEDS_CROP = ("KV-cache quantization and speculation cannot run together: transformers' assisted "
                   "generation must crop the cache after each rejected draft, and QuantizedCache cannot "
                   "be cropped")


def _kv_cache_guard(stack) -> str | None:
    if stack.speculation != "none":
        return f"the kv_cache group measures the cache without speculation, got stack {stack.label}"
    return None


@dataclass(frozen=True)
class Group:
    name: str
    title: str
    guard: Callable[[object], str | None]
    runner: str | None                 # "module:function"; None: no trials yet
    space: str | None                  # "sweeps.spaces:function"; None: no trials yet
    section: str                       # "dashboard.sections.<module>"
    reference: str                     # what a trial is compared with, and how it is memoized
    space_reads_store: bool = False    # the space takes ``uri=``: it plans from what the store holds

    @property
    def implemented(self) -> bool:
        return self.runner is not None and self.space is not None

    def check(self, stack) -> None:
        """Raise ``ConfigError`` when ``stack`` does not belong to this group."""
        reason = self.guard(stack)
        if reason:
            raise ConfigError(reason)

    def run(self, config, runtime):
        if self.runner is None:
            raise ConfigError(f"group {self.name!r} has no trials yet; implemented: {', '.join(implemented())}")
        return resolve(self.runner)(config, runtime)

    def plan(self, models: list[str], profile, device: str, uri: str | None = None,
             catalogue=None) -> list:
        """The group's trials of ``models`` (names the ``catalogue`` resolves: the built-in models
        and a sweep file's own, ``trials.models.registry.Catalogue``)."""
        if self.space is None:
            raise ConfigError(f"group {self.name!r} has no trials yet; implemented: {', '.join(implemented())}")
        extra = {"uri": uri} if self.space_reads_store else {}
        if catalogue is not None:
            extra["catalogue"] = catalogue
        return resolve(self.space)(models, profile, device, **extra)


# In page order.
GROUPS: tuple[Group, ...] = (
    Group("baseline", "Baseline: each model at each weight precision",
          guard=_only_weights_and_batch("baseline"),
          runner="trials.techniques.baseline.runner:run_baseline", space="sweeps.spaces:baseline",
          section="dashboard.sections.baseline",
          reference="none: the baseline is what the other groups compare against"),
    Group("speculative", "Speculative decoding: a draft model or prompt lookup proposes k tokens",
          guard=_speculative_guard,
          runner="trials.techniques.speculative.runner:run_speculative", space="sweeps.spaces:speculative",
          section="dashboard.sections.speculative",
          reference="the same prompts without speculation, measured once per worker, model and "
                    "workload, reused for 15 minutes (tag baseline_source)"),
    Group("kv_cache", "KV-cache quantization: 16/8/4/2-bit caches at growing contexts",
          guard=_kv_cache_guard,
          runner="trials.techniques.kv_cache.runner:run_kv_cache", space="sweeps.spaces:kv_cache",
          section="dashboard.sections.kv_cache",
          reference="the full-precision cache on the same prompts, measured once per worker, model "
                    "and workload, reused for 30 minutes (tag reference_source)"),
    Group("batching", "Static batching: B rows per decode step, up to the memory boundary",
          guard=_only_weights_and_batch("batching"),
          runner="trials.techniques.batching.runner:run_batching", space="sweeps.spaces:batching",
          section="dashboard.sections.batching",
          reference="each prompt decoded alone (batch 1), once per worker, model and workload (tag "
                    "batch1_reference); the memory bandwidth once per worker (tag bandwidth_source)"),
    Group("quantization", "Weight quantization: fp32/bf16/int8/nf4/GPTQ weights",
          guard=_only_weights_and_batch("quantization"),
          runner="trials.techniques.quantization.runner:run_quantization", space="sweeps.spaces:quantization",
          section="dashboard.sections.quantization",
          reference="the reference precision's greedy outputs and perplexity, once per worker, model "
                    "and workload (tag reference_source)"),
    Group("stacks", "How much did optimizations help? Techniques combined in one trial",
          guard=lambda stack: SPEC_NEEDS_CROP if stack.kv_bits != 16 and stack.speculation != "none" else None,
          runner="trials.techniques.stacks.runner:run_stack", space="sweeps.spaces:stacks", space_reads_store=True,
          section="dashboard.sections.stacks",
          reference="the base stack (fast precision, full cache, no speculation) for speed and memory "
                    "(tag baseline_source), the reference precision's greedy outputs and "
                    "teacher-forced predictions for quality (tag reference_source); each once per "
                    "worker, model and workload, reused for 30 minutes"),
)

BY_NAME: dict[str, Group] = {g.name: g for g in GROUPS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def get(name: str) -> Group:
    if name not in BY_NAME:
        raise ConfigError(f"unknown group {name!r}; valid: {', '.join(NAMES)}")
    return BY_NAME[name]


def implemented() -> list[str]:
    """Groups that have trials (a search space and a runner), in page order."""
    return [g.name for g in GROUPS if g.implemented]


def resolve(pointer: str):
    """The object a ``"module:attr"`` pointer names (``"module"`` alone: the module)."""
    module, _, attr = pointer.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded
