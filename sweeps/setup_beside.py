"""Build what the planned engines need on this machine beside the first trials, not before them.

An engine may need something built here before its trials can run in full (``Engine.machine_setup``:
llama.cpp's ``llama-bench`` and ``llama-server``, minutes of compiling). Built before the
sweep, that delays every first result; so a local sweep starts each such command in a child process
of its own (its own session, ``nice`` 10, output to a log file) as its trials start (after its step
costs are calibrated, so that a build never inflates them), and the trials that use it wait for it
(``tools_dir``'s file lock) only if they come first. The build's window joins the runs'
machine-sharing tags, like the zoo's training. ``stop`` ends a build still running (Ctrl-C, an error,
the sweep's end) with its whole process group: nothing is left behind.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from trials import engines
from trials.config import TrialConfig
from trials.engines import server_process

log = logging.getLogger("sweeps")
CLEANUP_GRACE_S = 60          # a stopped build's own cleanup (its scratch folder) before SIGKILL


def interruptible() -> None:
    """In the child, before exec: SIGINT back to its default. A sweep started in the background (``&``
    without job control, ``nohup``) ignores SIGINT, and an ignored signal is inherited: the build would
    then ignore the SIGINT ``stop`` sends, run on, and be killed with its scratch folder left."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
NICENESS = 10                 # the trials' timed passes come first when the cores are contended


def commands_needed(configs: list[TrialConfig]) -> list[tuple[str, ...]]:
    """The planned engines' machine setups, each once, in plan order."""
    needed = dict.fromkeys(engines.get(c.stack.engine).machine_setup for c in configs)
    return [command for command in needed if command]


class SetupBeside:
    """One child process per setup command, from ``start`` (as the trials start: the sweep's calibration
    runs before, without it); ``finish`` reports, ``stop`` ends them."""

    def __init__(self, commands: list[tuple[str, ...]], log_dir: str | os.PathLike | None = None):
        self.commands = commands
        self.started = time.time()
        self.host = socket.gethostname()
        self.folder = Path(log_dir or tempfile.gettempdir())
        self.jobs: list[tuple[tuple[str, ...], subprocess.Popen, Path]] = []
        self.reported: set[int] = set()           # the commands ``finish`` has said

    def start(self) -> "SetupBeside":
        """Start every command (once), each in a session of its own, niced, its output in a log file."""
        if self.jobs:
            return self
        self.started = time.time()
        for command in self.commands:
            handle, name = tempfile.mkstemp(prefix=f"llm-sweeps-setup-{command[0].rsplit('.', 1)[-1]}-",
                                            suffix=".log", dir=self.folder)
            os.close(handle)
            path = Path(name)
            with path.open("w") as out:
                process = subprocess.Popen([sys.executable, "-m", *command], stdin=subprocess.DEVNULL, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True,
                                           preexec_fn=interruptible)
            os.setpriority(os.PRIO_PROCESS, process.pid, NICENESS)     # what it starts inherits it
            self.jobs.append((command, process, path))
            log.info("started `python -m %s` beside the trials (nice %d; a trial that needs it waits for it; "
                     "log: %s)", " ".join(command), NICENESS, path)
        return self

    def __getstate__(self) -> dict:
        """A copy (Ray Tune pickles its callbacks, the heartbeat's poll of this among them) owns no process."""
        return {**self.__dict__, "jobs": []}

    @property
    def what(self) -> str:
        return "; ".join(f"`python -m {' '.join(command)}`" for command, _, _ in self.jobs)

    def done(self) -> bool:
        return all(process.poll() is not None for _, process, _ in self.jobs)

    def finish(self) -> list[str]:
        """One line per command that ended since the last call: how long it ran, and its log; a failure
        is a warning with its last line (the trials that needed it then say so themselves)."""
        lines = []
        for command, process, path in self.jobs:
            if process.poll() is None or process.pid in self.reported:
                continue
            self.reported.add(process.pid)
            took = max(path.stat().st_mtime - self.started, 0.0)
            line = f"`python -m {' '.join(command)}` beside the trials: done in {took:.0f} s (log: {path})"
            if process.returncode != 0:
                said = [text.strip() for text in path.read_text(errors="replace").splitlines() if text.strip()]
                line = (f"`python -m {' '.join(command)}` beside the trials failed (exit code {process.returncode}): "
                        f"{said[-1] if said else 'no output'} (log: {path})")
                log.warning("%s", line)
            lines.append(line)
        return lines

    def estimates(self) -> dict[str, float]:
        """What each command is estimated to take of one core's time here (its module's
        ``beside_estimate_s()``: 0 where there is nothing left to build), by its words; for the budget."""
        found = {}
        for command in self.commands:
            try:
                estimate = getattr(importlib.import_module(command[0]), "beside_estimate_s", None)
                seconds = float(estimate()) if estimate else 0.0
            except Exception as exc:      # a module that cannot say (a package missing): its build says why
                log.info("no estimate for `python -m %s`: %s", " ".join(command), exc)
                seconds = 0.0
            if seconds > 0:
                found[f"`python -m {' '.join(command)}`"] = seconds
        return found

    def elapsed(self) -> dict[str, float]:
        """How long each command that ended ran (to its log's last line), by its words."""
        return {f"`python -m {' '.join(command)}`": max(path.stat().st_mtime - self.started, 0.0)
                for command, process, path in self.jobs if process.poll() is not None}

    def said_by(self, printer) -> Callable[[], None]:
        """Put the commands among what ``printer`` (a ``ProgressPrinter``) says runs, in its heartbeat and
        on the dashboard; returns the poll that takes them off when they end, saying how they ended."""
        building = f"building: {self.what}"
        printer.running[building] = self.started

        def poll() -> None:
            if building in printer.running and self.done():
                printer.running.pop(building)
                for line in self.finish():
                    printer.say(line)
        return poll

    def window(self) -> tuple[float, float, str, str] | None:
        """(start, end, host, what) while a command ran, for the runs' machine-sharing tags: it ends
        with its log's last line (the file's modification time), or now for one still running."""
        if not self.jobs:
            return None
        if not self.done():
            return (self.started, time.time(), self.host, f"building: {self.what}")
        ended = max(path.stat().st_mtime for _, _, path in self.jobs)
        return (self.started, max(ended, self.started), self.host, f"building: {self.what}")

    def stop(self) -> None:
        """End every command still running: SIGINT to its process group (a build then stops its
        compilers' own group and removes its scratch folder), SIGKILL after ``CLEANUP_GRACE_S`` (removing a
        source tree and its objects on a loaded machine can take longer than a server's stop)."""
        for command, process, _ in self.jobs:
            if process.poll() is None:
                try:
                    server_process.stop(f"`python -m {' '.join(command)}`", process, first=signal.SIGINT,
                                        grace_s=CLEANUP_GRACE_S)
                except server_process.ServerError as exc:
                    log.warning("%s", exc)
