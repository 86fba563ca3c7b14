"""The zoo's trials as the sweep's second stage: whether the zoo trains beside the first trials, and
sizing its trials once it is built.

On local Ray with a zoo to build, trials to run meanwhile and a core to spare, the zoo trains in a
Ray task beside the first stage (``trains_beside``; the task is ``sweeps.zoo_beside``). ``ZooStage``
then sizes the zoo's trials the moment that task returns their step costs (at once where the zoo
was built before), skips what finished, and hands the rest to Tune (``sweeps.staged``). ``stop``
cancels a build still running when the sweep ends early.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

from sweeps import budget
from sweeps.fitting import ZOO_STAGE, budget_seconds, fit_stage
from sweeps.launch import trial_threads
from sweeps.plan import finished_configs, flat, is_finished
from sweeps.spaces import run_order
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
    """The zoo's trials, sized as soon as the zoo's build beside the first trials returns its step
    costs (at once where it was built before; ``poll``), and handed to Tune (``StagedSearcher``) after
    the first stage's."""

    def __init__(self, trials, args, uri: str, device: str, workers: int, first, costs: dict, job, phases: Phases,
                 sizing=None, keep_record=None):
        self.trials, self.args, self.uri, self.device, self.workers = trials, args, uri, device, workers
        self.first, self.costs, self.job, self.phases = first, costs, job, phases
        self.sizing = sizing                                  # sweeps.record.Sizing: gets the zoo's step costs
        self.keep_record = keep_record                        # called once the zoo's costs are in ``sizing``
        self.planned: list[TrialConfig] = flat(trials)      # sized once the costs are here
        self.pending: list[TrialConfig] | None = None        # what to run, once sized
        self.skipped: Counter = Counter()
        self.error: str | None = None
        self.fitted = None                                    # budget.Fit, once sized
        self.on_ready = None                                  # called with (trials to run, their estimate)

    def poll(self) -> bool:
        """Whether the zoo's trials are sized; sizes them the first time the build is found done."""
        if self.pending is not None:
            return True
        if self.job is not None and not self.job.done():
            return False
        costs = dict(self.costs)
        if self.job is not None:
            built = self.job.result
            self.phases.zoo_s = (built.ended - built.started) if built else time.time() - self.job.started
            if self.job.error:
                self.error = f"the zoo's build failed, so its {len(self.planned)} trial(s) did not run: {self.job.error}"
                print(f"python sweeps/full.py: error: {self.error}", file=sys.stderr, flush=True)
                self.pending = []
                if self.on_ready:
                    self.on_ready(0, None)
                return True
            costs.update(built.costs)
            if self.sizing is not None:
                self.sizing.used.update(budget.keyed(budget.pairs_needed(self.planned), built.costs, self.device,
                                                     trial_threads(self.args, self.device)))
            if self.keep_record is not None:
                self.keep_record()
            print(f"The zoo is built and calibrated ({built.built - built.started:.0f} s training, "
                  f"{built.ended - built.built:.0f} s calibration; {self.job.what}); sizing its trials, which "
                  "join the queue in run order (smallest models first):", flush=True)
        budget_s = budget.later_stage_budget(budget_seconds(self.args, self.device), self.first, self.workers)
        trials, self.fitted = fit_stage(self.trials, costs, budget_s, self.device, self.workers, ZOO_STAGE) \
            if budget_s is not None else (self.trials, None)
        self.planned = flat(trials)
        done = finished_configs(trials, self.args, self.uri)
        self.skipped = Counter(c.group for c in self.planned if is_finished(c, done))
        self.pending = run_order([c for c in self.planned if not is_finished(c, done)])
        if self.on_ready:
            self.on_ready(len(self.pending), self.fitted.estimate_s / self.workers if self.fitted else None)
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
