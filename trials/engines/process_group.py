"""A child in its own process group, stopped with everything it started: one signal to the whole
group, a grace period, then SIGKILL, until no member is left. Every child the project starts that
may start children of its own (a server, llama.cpp's build and llama-bench, a build beside the trials)
is started with ``start_new_session=True`` and stopped through ``stop``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil

KILL_WAIT_S = 10          # after SIGKILL, for the kernel to take the group down


def alive(pgid: int) -> bool:
    """Whether a process of the group is still running (a zombie, dead and waiting for its reaper,
    is not: a helper whose parent died is reaped by init, when init reaps)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for member in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(member.pid) == pgid and member.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


def stop(process: subprocess.Popen, first: signal.Signals = signal.SIGTERM, grace_s: float = 10.0) -> bool:
    """``first`` to the process group led by ``process``, SIGKILL after ``grace_s``; True once no
    process of the group is left (the leader reaped), False if one still is after SIGKILL."""
    for sent in dict.fromkeys((first, signal.SIGKILL)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sent)
        deadline = time.monotonic() + (grace_s if sent == first else KILL_WAIT_S)
        while time.monotonic() < deadline:
            process.poll()                        # reap the leader itself
            if process.returncode is not None and not alive(process.pid):
                return True
            time.sleep(0.05)
    return False
