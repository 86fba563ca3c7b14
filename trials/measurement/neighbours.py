"""CPU that processes outside a trial took while it ran: a noisy neighbour, in cores.

Why: a served stack measured beside an unrelated busy process came out at a quarter of its quiet
rate, and nothing in the run said so (the ``shared_machine`` tag knows only the project's own
neighbours). So every trial, and every capacity probe, records ``outside_cpu_cores``:

    (busy CPU time of the CPUs the trial may run on - CPU time of the trial's process tree) / wall s

floored at 0, over the ``with OutsideCpu(...)`` block. In a sweep the trial's tree includes the sweep's
own processes on its node (``outside_trial``: the Ray raylet, whose workers run the other trials the
sweep scheduled beside it by plan), so what is counted is CPU taken by processes the sweep did not start. Busy is /proc/stat's user + nice + system +
irq + softirq + steal (guest is already inside user; idle and iowait are not busy). The CPUs are the
trial's affinity (a trial pinned away from the zoo's cores is not disturbed by the zoo's training);
steal (a hypervisor's other guests) and interrupt time (no process owns it) count as outside. Where
there is no /proc/stat (macOS) the figure is None and ``reason`` says why.

The tree: each root pid (default: this process) with its live descendants, each counted with its own
CPU time plus its reaped children's (``children_user/system``, which the kernel folds into the parent
at ``wait``, recursively). So at one instant every process of the tree is counted exactly once: a
child reaped during the window is counted live at enter and inside its parent's reaped total at
exit. A snapshot lists parents before children and then re-reads the reaped totals: if one moved (a
reap fell between reading a parent and its child: missed, or counted twice), it is taken again.
Not counted as the trial's: a descendant that outlived its parent unreaped (reparented to init), and
a child reaped while SIGCHLD is ignored (the kernel drops its times). Cost: one /proc/stat read and
one walk of /proc per snapshot (milliseconds), cheap enough for probe windows of a few seconds.
"""

from __future__ import annotations

import os
import time

import psutil

NOISY_CORES = 0.1             # more than this many cores taken outside the trial: tag noisy_neighbour "True"
PROC_STAT = "/proc/stat"
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)   # user nice system (idle iowait) irq softirq steal; guest is inside user
SNAPSHOT_TRIES = 3


class OutsideCpu:
    """``with OutsideCpu() as outside: ...`` then ``outside.outside_cpu_cores`` (None where it cannot
    be measured; ``reason`` says why). ``pids``: the roots of the trial's process trees (default: this
    process; ``()``: nothing is the trial's). ``cpus``: the CPUs whose busy time counts (default: the
    roots' affinity at enter, else every CPU)."""

    def __init__(self, pids=None, cpus=None, proc_stat: str = PROC_STAT):
        self.pids = (os.getpid(),) if pids is None else tuple(pids)
        self.cpus = None if cpus is None else frozenset(cpus)
        self.proc_stat = proc_stat
        self.wall_s = self.machine_cpu_s = self.tree_cpu_s = 0.0
        self.outside_cpu_cores: float | None = None
        self.tree_cpu_cores: float | None = None
        self.reason = ""

    def __enter__(self) -> "OutsideCpu":
        if self.cpus is None:
            self.cpus = _affinity(self.pids)
        self._started = time.perf_counter()
        self._machine, self._tree = self._busy_s(), tree_cpu_s(self.pids)
        return self

    def __exit__(self, *_exc) -> None:
        tree, machine = tree_cpu_s(self.pids), self._busy_s()
        self.wall_s = time.perf_counter() - self._started
        self.tree_cpu_s = tree - self._tree
        self.tree_cpu_cores = self.tree_cpu_s / self.wall_s if self.wall_s > 0 else None
        if machine is None or self._machine is None:
            self.reason = f"{self.proc_stat} cannot be read here (no machine-wide busy time, e.g. on macOS)"
        elif self.wall_s > 0:
            self.machine_cpu_s = machine - self._machine
            self.outside_cpu_cores = max(0.0, (self.machine_cpu_s - self.tree_cpu_s) / self.wall_s)

    @property
    def noisy(self) -> bool | None:
        """More than ``NOISY_CORES`` taken outside the trial; None when not measured."""
        return None if self.outside_cpu_cores is None else self.outside_cpu_cores > NOISY_CORES

    def numbers(self) -> tuple[dict[str, float], dict[str, str]]:
        """(metrics, tags) a run logs: ``outside_cpu_cores`` and tag ``noisy_neighbour`` "True" /
        "False", or "unknown: <reason>" without a metric where it could not be measured."""
        if self.outside_cpu_cores is None:
            return {}, {"noisy_neighbour": f"unknown: {self.reason or 'not measured'}"}
        return {"outside_cpu_cores": self.outside_cpu_cores}, {"noisy_neighbour": str(self.noisy)}

    def _busy_s(self) -> float | None:
        return busy_cpu_s(self.cpus, self.proc_stat)


def busy_cpu_s(cpus=None, proc_stat: str = PROC_STAT) -> float | None:
    """Busy CPU seconds since boot of ``cpus`` (ids; None: all) from /proc/stat; None without it."""
    try:
        with open(proc_stat, encoding="ascii") as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *values = line.split() or ("",)
        if not name.startswith("cpu") or (name == "cpu") != (cpus is None):
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        ticks += sum(int(values[i]) for i in BUSY_FIELDS if i < len(values))
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pids) -> float:
    """CPU seconds of the process trees rooted at ``pids``: each live member's own time plus its
    reaped children's, taken again when a reap fell inside the snapshot (module docstring)."""
    total = 0.0
    for _ in range(SNAPSHOT_TRIES):
        members = _members(pids)
        times = {}
        for process in members:
            try:
                times[process] = process.cpu_times()
            except psutil.Error:          # gone and reaped since listed: its parent's reaped total moves
                pass
        total = sum(t.user + t.system + t.children_user + t.children_system for t in times.values())
        if all(_reaped_s(p) == t.children_user + t.children_system for p, t in times.items()):
            return total
    return total


def _members(pids) -> list[psutil.Process]:
    members = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            members += [root, *root.children(recursive=True)]    # parents before their children
        except psutil.Error:
            continue
    return list(dict.fromkeys(members))      # a root inside another root's tree counts once


def _reaped_s(process: psutil.Process) -> float | None:
    try:
        times = process.cpu_times()
    except psutil.Error:
        return None
    return times.children_user + times.children_system


def outside_trial(sweep_pids=()) -> OutsideCpu:
    """The window of one trial (or probe) in this process: its tree and the trees of ``sweep_pids``
    (the sweep's own processes on this node, e.g. its Ray raylet, whose workers run the other trials
    the sweep schedules here: their CPU is the sweep's plan, not a neighbour's), on this process's CPUs."""
    return OutsideCpu(pids=(os.getpid(), *sweep_pids), cpus=_affinity((os.getpid(),)))


def _affinity(pids) -> frozenset[int] | None:
    """The CPUs the roots may run on; None (every CPU) where the system cannot say."""
    cpus: set[int] = set()
    for pid in pids:
        try:
            cpus |= set(os.sched_getaffinity(pid))
        except (AttributeError, OSError):
            return None
    return frozenset(cpus) or None
