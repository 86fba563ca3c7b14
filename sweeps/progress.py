"""One line per trial as it starts and ends, so a long sweep shows where it is."""

from __future__ import annotations

import copy
import time

from ray.tune import Callback

from trials.config import TrialConfig


class ProgressPrinter(Callback):
    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.started = time.perf_counter()

    def _name(self, trial) -> str:
        """``group model stack-label [ctxN]``, e.g. ``kv_cache zoo-gqa bf16+kv4-hqq ctx2048``."""
        config = TrialConfig.from_dict(copy.deepcopy(trial.config["trial"]))
        context = f" ctx{config.workload.context_tokens}" if config.workload.context_tokens else ""
        return f"{config.group} {config.model} {config.stack.label}{context}"

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
