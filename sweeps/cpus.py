"""Which cores a trial may use while the sweep trains the zoo beside it.

On a local machine the sweep trains the zoo in a Ray task beside the first trials (``sweeps.zoo_beside``).
That task holds one CPU in Ray's accounting, so Ray never starts more trials than the remaining
cores, and it pins itself (and the training process it spawns) to one core, the *reserved* one,
naming it in a reservation file while it runs. Each trial, as it starts, pins its worker to the
cores no live reservation holds (all of the machine's once the build is done: a reused worker is
unpinned again) and records them (tag ``cpu_affinity``), so a trial never shares its core with zoo
training and its run says which core it had. Torch-free; a no-op where the OS has no affinity call.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path


def supported() -> bool:
    return hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")


def current() -> set[int]:
    """The cores this process may run on (every core the OS counts where affinity is unsupported)."""
    return set(os.sched_getaffinity(0)) if supported() else set(range(os.cpu_count() or 1))


def describe(cpus) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"``."""
    ordered, parts = sorted(cpus), []
    for cpu in ordered:
        if parts and cpu == parts[-1][1] + 1:
            parts[-1][1] = cpu
        else:
            parts.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def pin(cpus) -> None:
    if supported() and cpus:
        os.sched_setaffinity(0, set(cpus))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reserved(path: str | Path | None) -> dict | None:
    """The live reservation in ``path`` (its cores, what holds them, since when), or None."""
    if not path:
        return None
    try:
        state = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(state, dict) or not _alive(int(state.get("pid", 0) or 0)):
        return None
    return state


@contextmanager
def reservation(path: str | Path, cpus, what: str):
    """Pin this process to ``cpus`` and name them reserved in ``path`` until the block ends."""
    path = Path(path)
    pin(cpus)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"cpus": sorted(cpus), "pid": os.getpid(), "what": what, "since": time.time()}))
    os.replace(temporary, path)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def pin_trial(path: str | Path | None, machine: list[int] | None) -> str:
    """Pin this worker to the machine's cores that no live reservation in ``path`` holds; returns
    them as text for the run's tag (``"0"``, ``"0-1"``)."""
    cpus = set(machine) if machine else current()
    held = reserved(path)
    if held:
        cpus = (cpus - set(held["cpus"])) or cpus
    pin(cpus)
    return describe(current())


@contextmanager
def away_from(cpus):
    """This process off ``cpus`` for the block (the driver converting and calibrating while the zoo
    trains on them), then back on the cores it had."""
    before = current()
    pin((before - set(cpus)) or before)
    try:
        yield
    finally:
        pin(before)
