"""A server process's lifecycle, for every server engine: started on 127.0.0.1 on a free port in its
own process group, healthy before the first request, stopped with its whole group afterwards
(SIGTERM, then SIGKILL) and checked gone, on success, failure and Ctrl-C alike.

Why a process group and a parent-death signal: a server may start helpers of its own, and a
worker killed outright (SIGKILL: no ``finally`` runs) must not leave its server behind, so the
server is told to stop when the process that started it dies (Linux's ``PR_SET_PDEATHSIG``).
Engine-neutral: each engine says how its command line is made and what its ``/health`` is.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

from trials.engines import process_group

HOST = "127.0.0.1"
HEALTH_TIMEOUT_S = 180            # loading the weights and warming up; a server slower than this is broken
STOP_TIMEOUT_S = 10               # SIGTERM, then SIGKILL of the process group
LOG_LINES = 4                     # the server's last log lines in an error
LOG_LINE_CHARS = 240              # of each, its start (an error's type and the beginning of its message)


class ServerError(RuntimeError):
    """The server did not start, died or would not stop: one line, with its last log lines."""


@dataclass
class Running:
    """A healthy server: where it answers, what started it, how long it took to become healthy."""

    url: str
    command: list[str]
    process: subprocess.Popen
    log_path: pathlib.Path
    started_s: float              # from launch to healthy
    threads: int
    notes: dict = field(default_factory=dict)     # what the engine learns while it runs (parity's facts)

    @property
    def pid(self) -> int:
        return self.process.pid


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def port_taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return True
    return False


def log_tail(log_path: pathlib.Path) -> str:
    """The server's last non-empty log lines, joined into one line."""
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return " | ".join(line[:LOG_LINE_CHARS] for line in lines[-LOG_LINES:]) or "no output"


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; an HTTP error is a status, not an exception."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def wait_healthy(name: str, process: subprocess.Popen, url: str, log_path: pathlib.Path,
                 timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """Until ``{url}/health`` answers 200, or raise ``ServerError`` with the server's last log lines:
    it exited, or it never became healthy within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(f"{name} exited with code {process.returncode} before it was healthy: {log_tail(log_path)}")
        with contextlib.suppress(OSError):
            if http_get(f"{url}/health", timeout_s=2)[0] == 200:
                return
        time.sleep(0.1)
    raise ServerError(f"{name} was not healthy within {timeout_s:g} s: {log_tail(log_path)}")


def stop(name: str, process: subprocess.Popen, first: signal.Signals = signal.SIGTERM,
         grace_s: float = STOP_TIMEOUT_S) -> None:
    """``first`` (SIGTERM; SIGINT for a Python child that cleans up on KeyboardInterrupt) to the server's
    process group, SIGKILL after ``grace_s``, until no process of the group is left (``ServerError``
    if one still is after SIGKILL)."""
    if not process_group.stop(process, first, grace_s):
        raise ServerError(f"{name} (process group {process.pid}) is still running after SIGKILL")


def _libc_prctl():
    """libc's ``prctl``, resolved in the parent (the child between fork and exec only calls it)."""
    if not sys.platform.startswith("linux"):
        return None
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl
    return None


_PRCTL = _libc_prctl()
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it dies (Linux only)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


@contextlib.contextmanager
def serve_process(name: str, command_for: Callable[[int], list[str]], threads: int, port: int | None = None,
                  health_timeout_s: float = HEALTH_TIMEOUT_S, env: dict[str, str] | None = None):
    """``command_for(port)`` started on 127.0.0.1 (a free port unless ``port`` is given) in its own
    process group, with ``env`` added to this process's environment; yields a healthy ``Running``;
    stopped and checked gone on the way out, whatever happened inside (Ctrl-C included)."""
    if port is not None and port_taken(port):
        raise ServerError(f"port {port} on {HOST} is taken: {name} cannot bind it")
    port = port or free_port()
    command = command_for(port)
    handle, log_name = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
    log_path = pathlib.Path(log_name)
    began = time.perf_counter()
    try:
        with os.fdopen(handle, "w") as log:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=_die_with_parent,
                                       env={**os.environ, **(env or {})})
    except OSError as exc:
        log_path.unlink(missing_ok=True)
        raise ServerError(f"{name} could not start ({command[0]}): {exc}") from None
    try:
        url = f"http://{HOST}:{port}"
        wait_healthy(name, process, url, log_path, health_timeout_s)
        yield Running(url, command, process, log_path, time.perf_counter() - began, threads)
    finally:
        try:
            stop(name, process)
        finally:
            log_path.unlink(missing_ok=True)


def parity(prompts, new_tokens: int, served, local, agreed) -> dict[str, float]:
    """A server's greedy output against its in-process engine's, prompt by prompt, after one untimed
    local warm-up: ``served(prompt)`` -> the server's answer, ``local(prompt, new_tokens)`` -> the
    in-process ``BatchRecord`` of that one prompt, ``agreed(answer, record)`` -> (tokens that agree up
    to the first divergence, whether the whole output is the same). ``parity_token_match``: the share
    of positions that agree; ``parity_prompts_identical``: the share of prompts whose output is the
    same (1.0: the in-process groups' quality numbers carry over); ``in_process_ttft_s_p50``: the
    in-process time to first token on the same prompts, one at a time, to set beside the served one."""
    local(prompts[0], 2)                                       # warm-up, not timed
    matched, identical, ttfts, record = 0, 0, [], None
    for prompt in prompts:
        answer = served(prompt)
        record = local(prompt, new_tokens)
        tokens, same = agreed(answer, record)
        matched += tokens
        identical += int(same)
        ttfts.append(record.ttft_s)
    return {"parity_token_match": matched / (new_tokens * len(prompts)),
            "parity_prompts_identical": identical / len(prompts),
            "in_process_ttft_s_p50": statistics.median(ttfts)}
