"""Train the zoo beside the first trials: a Ray task on one reserved core, after its stand-ins' calibration.

A fresh machine has no zoo, and training it takes minutes; the real models need only a conversion.
So on local Ray the sweep starts this task first, runs the trials that need no zoo model meanwhile
on the other cores. First a task times each zoo model's random-weight stand-in on that core while the
driver calibrates the other models (the whole plan is sized with both), then the training task runs
there; the zoo's trials join the queue once it returns (``sweeps.zoo_stage``). The task holds one CPU in Ray's accounting (Ray starts no trial on it), pins
itself and its training process to one core (``sweeps.cpus``: each trial pins itself to the others
while the reservation lives), trains in one process, and returns its time window, so each run can
say that zoo training ran beside it.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field

import ray

from sweeps import cpus as cores


@dataclass
class Built:
    """What the training task returns: when and where it trained."""

    started: float = 0.0          # unix seconds
    ended: float = 0.0
    cpus: list[int] = field(default_factory=list)
    host: str = ""
    what: str = ""


@ray.remote(num_cpus=1, max_retries=0)
def calibrate_stand_ins(pairs: set, device: str, threads: int, cpus: list[int], sizing: dict) -> dict:
    """The zoo's step costs before it is trained (``budget.calibrate`` times each model's random-weight
    stand-in), on the core the zoo will train on, while the driver calibrates the other models on theirs."""
    from sweeps import budget

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("sweeps.budget").setLevel(logging.INFO)
    cores.pin(cpus)
    return budget.calibrate(pairs, device, threads, **sizing) if pairs else {}


@ray.remote(num_cpus=1, max_retries=0)
def train(set_names: list[str], cpus: list[int], reservation_path: str, what: str, after=None) -> Built:
    """Train the zoo's ``set_names`` on ``cpus`` (held as reserved meanwhile); ``after``: a task's
    result to wait for first (Ray resolves it before this starts)."""
    from trials.models import zoo

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("trials.models.zoo").setLevel(logging.INFO)
    started = time.time()
    with cores.reservation(reservation_path, cpus, what):
        for set_name in set_names:
            zoo.build(set_name, jobs=1)
    return Built(started, time.time(), list(cpus), socket.gethostname(), what)


class ZooBeside:
    """The driver's handle on the task: start it, ask whether it is done, the window it ran in."""

    def __init__(self, set_names: list[str], device: str, threads: int, reservation_path: str,
                 sizing: dict | None = None, stand_in_pairs: set | None = None):
        machine = sorted(cores.current())
        self.cpus = machine[-1:]                      # the last core; the trials get the others
        self.what = f"zoo training ({', '.join(set_names)} set) on CPU {cores.describe(self.cpus)}"
        self.path = reservation_path
        self.started = time.time()
        # first the stand-ins' step costs (``costs_before_training``), then the build on the same core
        self.calibration = calibrate_stand_ins.remote(stand_in_pairs or set(), device, threads, self.cpus,
                                                      sizing or {})
        self.ref = train.remote(set_names, self.cpus, reservation_path, self.what, after=self.calibration)
        self.result: Built | None = None
        self.error: str | None = None

    def costs_before_training(self) -> dict:
        """The zoo's step costs from its stand-ins (waits for them; the sized plan needs them)."""
        return ray.get(self.calibration)

    def wait_until_reserved(self, timeout_s: float = 120.0) -> None:
        """Until the task holds its core (so no trial starts there first) or has ended."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not cores.reserved(self.path):
            if ray.wait([self.ref], timeout=0.2)[0]:
                return

    def done(self) -> bool:
        """Whether the task has ended (then ``result`` or ``error`` says how)."""
        if self.result is not None or self.error is not None:
            return True
        if not ray.wait([self.ref], timeout=0)[0]:
            return False
        try:
            self.result = ray.get(self.ref)
        except Exception as exc:      # the build's own error, raised in the task: said in one line
            cause = getattr(exc, "cause", None) or exc
            self.error = f"{type(cause).__name__}: {' '.join(str(cause).split())[:400]}"
        return True

    def window(self) -> tuple[float, float, str, str] | None:
        """(start, end, host, what) of the training, for the runs' machine-sharing tags;
        for a task that did not return (stopped by Ctrl-C, failed, still running) from its start until now,
        so that no run that trained beside it reads "ran alone"."""
        if self.result is None:
            return (self.started, time.time(), socket.gethostname(), self.what)
        return (self.result.started, self.result.ended, self.result.host, self.result.what)
