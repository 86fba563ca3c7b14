"""The resident memory of another process (a server the trial started), sampled while it works.

A server's memory is not the worker's: the loop's peak (the worker's resident-set high-water mark)
would miss it. A background thread reads the process's resident set (with its children's) every
``interval_s`` until stopped; the peak is what the trial logs as ``peak_memory_bytes``, so the
memory budget (``--memory-budget``) applies to a served stack as to any other.
"""

from __future__ import annotations

import threading

import psutil

METHOD = "the server process's resident set (children included), sampled every 0.1 s under load"


class ProcessMemory:
    def __init__(self, pid: int, interval_s: float = 0.1):
        self.pid, self.interval_s = pid, interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        try:
            process = psutil.Process(self.pid)
            total = process.memory_info().rss + sum(c.memory_info().rss for c in process.children(recursive=True))
        except psutil.Error:          # gone (stopped, or killed mid-load): keep the peak so far
            return
        self.peak_bytes = max(self.peak_bytes, total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "ProcessMemory":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
