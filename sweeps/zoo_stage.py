"""The zoo's trials as the sweep's second stage: whether the zoo trains beside the first trials, and
handing its trials to Tune once it is built.

On local Ray with a zoo to build, trials to run meanwhile and a core to spare, the zoo trains in a
Ray task beside the first stage (``trains_beside``; the task is ``sweeps.zoo_beside``). Its trials
were sized with the rest of the plan before the first trial (their step costs from the recipes'
architectures, ``trials.models.zoo.stand_in``); ``ZooStage`` holds them until the task returns and
then hands them to Tune (``sweeps.staged``). ``stop`` cancels a build still running when the sweep
ends early.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sweeps.summary import Phases
from trials.config import TrialConfig


def trains_beside(args, device: str, zoo_sets: list[str], first_stage: list[TrialConfig]) -> bool:
    """Whether the zoo trains in a Ray task beside the first trials: local Ray, a zoo to build, trials
    to run meanwhile, a core to spare for it, and more than one trial at a time allowed (``--workers 1``
    runs one thing at a time: the zoo first, then each trial alone). Otherwise the zoo builds first,
    on every core."""
    from sweeps import cpus

    spare = device == "cuda" or len(cpus.current()) > args.cpus_per_trial
    return bool(zoo_sets) and bool(first_stage) and args.address is None and args.workers != 1 and spare


class ZooStage:
    """The zoo's trials of this run (sized and chosen already), handed to Tune (``StagedSearcher``)
    once the zoo's build beside the first trials is done (at once where nothing builds; ``poll``)."""

    def __init__(self, planned: list[TrialConfig], job, phases: Phases):
        self.planned, self.job, self.phases = list(planned), job, phases
        self.pending: list[TrialConfig] | None = None if job is not None else list(planned)
        self.error: str | None = None
        self.on_ready = None                                  # called with the number of trials to run

    def poll(self) -> bool:
        """Whether the zoo's trials can run; says so the first time the build is found done."""
        if self.pending is not None:
            return True
        if not self.job.done():
            return False
        built = self.job.result
        self.phases.zoo_s = (built.ended - built.started) if built else time.time() - self.job.started
        if self.job.error:
            self.error = f"the zoo's build failed, so its {len(self.planned)} trial(s) did not run: {self.job.error}"
            print(f"python sweeps/full.py: error: {self.error}", file=sys.stderr, flush=True)
            self.pending = []
        else:
            print(f"The zoo is built ({built.ended - built.started:.0f} s; {self.job.what}); its "
                  f"{len(self.planned)} trial(s) join the queue in priority order", flush=True)
            self.pending = list(self.planned)
        if self.on_ready:
            self.on_ready(len(self.pending))
        return True

    def __call__(self) -> list[TrialConfig] | None:
        """For ``StagedSearcher``: the trials to run, or None while the build runs."""
        return self.pending if self.poll() else None


def stop(job, reservation_path: str | None) -> None:
    """Cancel a zoo build still running (the sweep ends early) and remove its reservation file."""
    if job is not None:
        import ray

        ray.cancel(job.ref, force=True)
    if reservation_path:
        Path(reservation_path).unlink(missing_ok=True)
