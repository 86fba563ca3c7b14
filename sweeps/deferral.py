"""The budget as a promise: which planned trials this run does, which it leaves to the next, and when
to stop starting trials.

Why: shrinking workloads (``sweeps.budget.fit``) stops at floors; past them a plan can still exceed
``--budget``. Then the run does what fits in priority order and defers the rest, says so, and the next
run (the same command on the same store) does exactly those: finished configs are skipped, and the
deferred ones are the only ones left.

* ``priority_order``: every (group, model) block's first cell before any block's second, and so on
  (a block keeps its space's order: reference and shipped stacks first, the first point of every curve
  before its second), so every chart has a bar for every model before any curve gets longer.
* ``defer``: in that order, what fits the budget's worker-seconds (a trial that holds its node takes
  every worker's share; work beside the trials, the zoo's training and builds, takes its own), the
  rest deferred. Greedy: a trial that does not fit leaves room to the smaller ones after it.
* ``Deadline``: while the trials run, a trial starts only if its estimate, corrected by what the
  finished trials took against theirs, ends before the budget does; what does not is deferred too.
  It also gives the heartbeat its time left.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

from trials import groups
from trials.config import TrialConfig

MIN_FOR_GROUP_RATIO = 3         # finished trials of a group before its own measured/estimated ratio is used
RATIO_RANGE = (0.25, 4.0)       # a correction outside this says the estimate is broken, not the machine


def holds_node(config: TrialConfig) -> bool:
    return groups.get(config.group).holds_node


def worker_seconds(config: TrialConfig, seconds: float, workers: int) -> float:
    """What a trial takes of the machine's worker-seconds: its own time, on every worker if it holds
    the node (a server and its client: no other trial runs beside it)."""
    return seconds * (workers if holds_node(config) else 1)


def priority_keys(configs: list[TrialConfig]) -> dict[str, tuple[int, int]]:
    """config_hash -> sort key: round r holds every (group, model) block's r-th cell, in the space's
    order; a round goes model by model (smallest first, as ``sweeps.spaces.run_order``), group by group
    within a model, so that consecutive trials share a model. Stable: the same plan, the same keys."""
    from sweeps.spaces import run_order

    position: dict[str, int] = {}
    seen: Counter = Counter()
    for c in configs:
        position[c.config_hash] = seen[(c.group, c.model)]
        seen[(c.group, c.model)] += 1
    return {c.config_hash: (position[c.config_hash], i) for i, c in enumerate(run_order(configs))}


def priority_order(configs: list[TrialConfig]) -> list[TrialConfig]:
    """``configs`` highest priority first (``priority_keys``)."""
    keys = priority_keys(configs)
    return sorted(configs, key=lambda c: keys[c.config_hash])


@dataclass
class Deferral:
    """What ``defer`` chose: the trials to run (priority order), the deferred ones, their estimates."""

    run: list[TrialConfig]
    deferred: list[TrialConfig]
    seconds: dict[str, float]           # config_hash -> estimated seconds of that one trial
    capacity_s: float | None            # worker-seconds the trials may take (None: no budget)
    beside_s: float = 0.0               # worker-seconds of the work beside the trials
    workers: int = 1

    def load_s(self, configs: list[TrialConfig] | None = None) -> float:
        configs = self.run if configs is None else configs
        return sum(worker_seconds(c, self.seconds.get(c.config_hash, 0.0), self.workers) for c in configs)

    def per_group(self, configs: list[TrialConfig]) -> dict[str, tuple[int, float]]:
        """group -> (trials, estimated wall minutes on the workers)."""
        out: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for c in configs:
            out[c.group][0] += 1
            out[c.group][1] += worker_seconds(c, self.seconds.get(c.config_hash, 0.0), self.workers) / self.workers / 60
        return {g: (n, m) for g, (n, m) in out.items()}


def defer(pending: list[TrialConfig], seconds: dict[str, float], capacity_s: float | None, workers: int,
          beside_s: float = 0.0) -> Deferral:
    """Take ``pending`` in priority order while their worker-seconds fit ``capacity_s`` less
    ``beside_s``; defer the rest (nothing is deferred without a budget)."""
    ordered = priority_order(pending)
    if capacity_s is None:
        return Deferral(ordered, [], seconds, None, beside_s, workers)
    room = capacity_s - beside_s
    run, deferred = [], []
    for c in ordered:
        need = worker_seconds(c, seconds.get(c.config_hash, 0.0), workers)
        if need <= room:
            run.append(c)
            room -= need
        else:
            deferred.append(c)
    return Deferral(run, deferred, seconds, capacity_s, beside_s, workers)


def as_record(per_group: dict[str, tuple[int, float]]) -> dict[str, dict]:
    """``Deferral.per_group`` as the sweep's record and summary JSON keep it."""
    return {group: {"trials": n, "minutes": round(m, 2)} for group, (n, m) in per_group.items()}


def describe_deferred(per_group: dict[str, tuple[int, float]], command: str) -> list[str]:
    """The lines that say what is deferred, per group, and what runs it."""
    if not per_group:
        return []
    total = sum(n for n, _ in per_group.values())
    minutes = sum(m for _, m in per_group.values())
    lines = [f"Deferred to the next run: {total} trial(s), ~{minutes:.1f} min estimated "
             f"(lowest priority first: the last point of a curve before any chart's bar)"]
    lines += [f"  {group:<14}{n:>4} trials  ~{m:5.1f} min" for group, (n, m) in per_group.items()]
    lines.append(f"  they run with: {command}")
    return lines


@dataclass
class Deadline:
    """The budget while trials run: which trial may still start, and how long the rest will take.

    ``start`` sets the clock (the first trial); ``admits`` says whether a trial's corrected estimate
    ends before the budget does (a trial that holds the node first waits for the running ones, which
    ``running``/``finished`` track); ``finished`` feeds the correction (measured/estimated so far, per
    group once it has ``MIN_FOR_GROUP_RATIO`` trials, else over all). ``pricer`` estimates a trial the
    plan did not price (a search's proposal; None where its step cost is not calibrated)."""

    budget_s: float | None
    seconds: dict[str, float]
    workers: int = 1
    started: float | None = None
    measured: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    deferred: list[TrialConfig] = field(default_factory=list)
    in_flight: dict[str, tuple[float, TrialConfig]] = field(default_factory=dict)   # trial id -> (start, config)
    pricer: Callable[[TrialConfig], float | None] | None = None

    def price(self, config: TrialConfig, like: TrialConfig) -> None:
        """Estimate ``config``, which runs in ``like``'s place (a searched slot's proposal: its slots,
        weights and ``-b`` change how long its capacity search takes): by its own cost model where the
        pricer knows its step cost, else as ``like`` was planned."""
        own = self.pricer(config) if self.pricer is not None else None
        self.seconds[config.config_hash] = own if own is not None else self.seconds.get(like.config_hash, 0.0)

    def running(self, trial_id: str, config: TrialConfig, now: float | None = None) -> None:
        self.in_flight[trial_id] = (time.monotonic() if now is None else now, config)

    def wait_s(self, now: float | None = None) -> float:
        """Until the running trials end, by their corrected estimates (what a node-holding trial waits)."""
        now = time.monotonic() if now is None else now
        return max((start + self.estimate(c) - now for start, c in self.in_flight.values()), default=0.0)

    def ends_at(self) -> float | None:
        """When the budget ends, in seconds since the epoch (a trial's own limit is what is left when it starts)."""
        left = self.left_s()
        return None if left is None else time.time() + left

    def start(self, now: float | None = None) -> None:
        if self.started is None:
            self.started = time.monotonic() if now is None else now

    def estimate(self, config: TrialConfig) -> float:
        return self.seconds.get(config.config_hash, 0.0) * self.ratio(config.group)

    def ratio(self, group: str | None = None) -> float:
        pairs = self.measured.get(group, []) if group else []
        if len(pairs) < MIN_FOR_GROUP_RATIO:
            pairs = [p for each in self.measured.values() for p in each]
        estimated = sum(e for _, e in pairs)
        if not pairs or estimated <= 0:
            return 1.0
        low, high = RATIO_RANGE
        return min(high, max(low, sum(m for m, _ in pairs) / estimated))

    def failed(self, trial_id: str) -> None:
        """A trial whose worker died: no longer running; its time says nothing of its estimate."""
        self.in_flight.pop(trial_id, None)

    def finished(self, config: TrialConfig, measured_s: float, trial_id: str | None = None) -> None:
        self.in_flight.pop(trial_id, None)
        estimated = self.seconds.get(config.config_hash)
        if estimated:
            self.measured[config.group].append((measured_s, estimated))

    def left_s(self, now: float | None = None) -> float | None:
        if self.budget_s is None or self.started is None:
            return None
        return self.budget_s - ((time.monotonic() if now is None else now) - self.started)

    def admits(self, config: TrialConfig, now: float | None = None) -> bool:
        """Whether ``config`` may start now (always without a budget); a trial refused is deferred."""
        left = self.left_s(now)
        wait = max(0.0, self.wait_s(now)) if holds_node(config) else 0.0     # an overdue trial: no wait left
        if left is None or wait + self.estimate(config) <= left:
            return True
        self.deferred.append(config)
        return False

    def time_left(self, queued: list[TrialConfig], now: float | None = None) -> str:
        """The heartbeat's words: the queued trials' corrected estimates on the workers (those holding
        the node on all of them), and when the budget ends."""
        load = sum(worker_seconds(c, self.estimate(c), self.workers) for c in queued) / max(1, self.workers)
        by_plan = (f"~{load / 60:.0f} min of queued trials by the plan's estimates "
                   f"(x{self.ratio():.2f}: measured/estimated so far)")
        left = self.left_s(now)
        return by_plan if left is None else f"{by_plan}; the budget ends in {max(0.0, left) / 60:.0f} min"
