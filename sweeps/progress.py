"""Progress a person can read while a sweep runs: one line per trial as it starts and ends, and a
heartbeat at least every ``HEARTBEAT_S`` (what runs, for how long, how many are done, time left).

Time left comes from the plan's per-trial estimates of the trials still queued, corrected by what the
finished ones took against their estimates (``sweeps.deferral.Deadline``), not from the finished-trials
rate (which, early on, counts the zoo's training and builds beside the trials as trial time)."""

from __future__ import annotations

import copy
import time

from ray.tune import Callback

from trials.config import TrialConfig

HEARTBEAT_S = 30.0


class ProgressPrinter(Callback):
    def __init__(self, total: int, deadline=None, searcher=None, first_run_hint: str = "",
                 on_change=None, watch=None) -> None:
        self.total = total
        self.deadline = deadline              # sweeps.deferral.Deadline: estimates, corrections, the budget
        self.searcher = searcher              # what is still queued (``StagedSearcher.queue``)
        self.began: dict[str, float] = {}     # trial id -> monotonic start
        self.watch = watch                    # called about once a second (the zoo's build: done yet?)
        self.last_watch = 0.0
        self.on_change = on_change            # called with (running: name -> unix start, done, total)
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
        self.began[trial.trial_id] = time.monotonic()
        if self.deadline is not None:
            self.deadline.running(trial.trial_id, TrialConfig.from_dict(copy.deepcopy(trial.config["trial"])))
        self._print(f"start  {self._name(trial)}")

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.done += 1
        self.running.pop(self._name(trial), None)
        if self.deadline is not None and trial.trial_id in self.began:
            config = TrialConfig.from_dict(copy.deepcopy(trial.config["trial"]))
            self.deadline.finished(config, time.monotonic() - self.began.pop(trial.trial_id), trial.trial_id)
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
        if self.deadline is not None:
            self.deadline.failed(trial.trial_id)
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
        if self.deadline is None or self.searcher is None:
            return "time left: unknown (no plan estimates)"
        later = self.searcher.later
        return self.deadline.time_left(list(self.searcher.queue) + list(getattr(later, "planned", None) or []))

    def _elapsed(self) -> str:
        elapsed = time.perf_counter() - self.started
        return f"{int(elapsed // 3600)}:{time.strftime('%M:%S', time.gmtime(elapsed))}" if elapsed >= 3600 \
            else time.strftime("%M:%S", time.gmtime(elapsed))
