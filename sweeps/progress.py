"""Progress a person can read while a sweep runs: one line per trial as it starts and ends, and a
heartbeat at least every ``HEARTBEAT_S`` (what runs, for how long, how many are done, time left)."""

from __future__ import annotations

import copy
import time

from ray.tune import Callback

from trials.config import TrialConfig

HEARTBEAT_S = 30.0


class ProgressPrinter(Callback):
    def __init__(self, total: int, estimate_s: float | None = None, first_run_hint: str = "",
                 on_change=None, watch=None) -> None:
        self.total = total
        self.watch = watch                    # called about once a second (the zoo's build: done yet?)
        self.last_watch = 0.0
        self.on_change = on_change            # called with (running: name -> unix start, done, total)
        self.estimate_s = estimate_s          # the budget's estimate of the whole sweep, if any
        self.first_run_hint = first_run_hint  # said once, when the store has its first finished run
        self.done = 0
        self.started = self.last_line = time.perf_counter()
        self.running: dict[str, float] = {}   # trial name (or the zoo's build) -> start (unix seconds)
        self.first_finished: float | None = None   # perf_counter() when the first FINISHED result came

    def _name(self, trial) -> str:
        """``group model stack-label [ctxN]``, e.g. ``kv_cache zoo-gqa bf16+kv4-hqq ctx2048``."""
        config = TrialConfig.from_dict(copy.deepcopy(trial.config["trial"]))
        context = f" ctx{config.workload.context_tokens}" if config.workload.context_tokens else ""
        return f"{config.group} {config.model} {config.stack.label}{context}"

    def say(self, line: str) -> None:
        """A line of the sweep's own (it also rewrites the live status)."""
        self._print(line)

    def _print(self, line: str) -> None:
        self.last_line = time.perf_counter()
        print(f"[{self._elapsed()}] {line}", flush=True)
        if self.on_change is not None:
            self.on_change(dict(self.running), self.done, self.total)

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.running[self._name(trial)] = time.time()
        self._print(f"start  {self._name(trial)}")

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.done += 1
        self.running.pop(self._name(trial), None)
        status = result.get("trial_status", "?")
        detail = (f"{result['tok_per_s']:.1f} tok/s" if status == "FINISHED" and "tok_per_s" in result
                  else result.get("error", ""))
        self._print(f"{self.done}/{self.total} {status:<8} {self._name(trial)}: {detail}")
        if status == "FINISHED" and self.first_finished is None:
            self.first_finished = time.perf_counter()
        if status == "FINISHED" and self.first_run_hint:
            self._print(self.first_run_hint)
            self.first_run_hint = ""

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.done += 1
        self.running.pop(self._name(trial), None)
        self._print(f"{self.done}/{self.total} ERROR    {self._name(trial)}")

    def on_step_end(self, iteration, trials, **info) -> None:
        """The heartbeat: nothing printed for ``HEARTBEAT_S``, so say what is running."""
        now = time.perf_counter()
        if self.watch is not None and now - self.last_watch >= 1.0:
            self.last_watch = now
            self.watch()
        if now - self.last_line < HEARTBEAT_S:
            return
        running = ", ".join(f"{name} ({time.time() - t0:.0f} s)" for name, t0 in self.running.items()) or "starting"
        self._print(f"{self.done}/{self.total} done · running: {running} · {self._time_left(now)}")

    def _time_left(self, now: float) -> str:
        elapsed = now - self.started
        if self.done:
            left = elapsed / self.done * (self.total - self.done)
            return f"~{left / 60:.0f} min left at the rate so far"
        if self.estimate_s:
            return f"~{max(0.0, self.estimate_s - elapsed) / 60:.0f} min left by the estimate"
        return "time left: after the first trial"

    def _elapsed(self) -> str:
        elapsed = time.perf_counter() - self.started
        return f"{int(elapsed // 3600)}:{time.strftime('%M:%S', time.gmtime(elapsed))}" if elapsed >= 3600 \
            else time.strftime("%M:%S", time.gmtime(elapsed))
