"""One line per trial as it starts and ends, so a long sweep shows where it is."""

from __future__ import annotations

import time

from ray.tune import Callback


class ProgressPrinter(Callback):
    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.started = time.perf_counter()

    def _name(self, trial) -> str:
        config = trial.config["trial"]
        stack = config["stack"]
        return f"{config['group']} {config['model']} {stack['precision']} b{stack['batch_size']}"

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        print(f"[{self._elapsed()}] start  {self._name(trial)}", flush=True)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.done += 1
        status = result.get("trial_status", "?")
        detail = (f"{result['tok_per_s']:.1f} tok/s" if status == "FINISHED" and "tok_per_s" in result
                  else result.get("error", ""))
        print(f"[{self._elapsed()}] {self.done}/{self.total} {status:<8} {self._name(trial)}: {detail}",
              flush=True)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.done += 1
        print(f"[{self._elapsed()}] {self.done}/{self.total} ERROR    {self._name(trial)}", flush=True)

    def _elapsed(self) -> str:
        return time.strftime("%M:%S", time.gmtime(time.perf_counter() - self.started))
