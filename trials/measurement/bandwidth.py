"""The device's memory bandwidth, measured: what a batch-1 decode step's roofline divides by.

A large device-to-device copy (read + write counted), best of a few: on a CPU the buffer is twice the
last-level cache (so it streams from DRAM), on a GPU 1 GiB. ``memory_bandwidth`` measures it once per
worker and thread count (the trial's threads are the ones that read its weights) and says where the
value came from, for the trial's ``bandwidth_source`` tag. Used by the batching group's roofline, the
engines group's and the GPU check (``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import time

import torch

from trials.config import parse_memory_budget
from trials.errors import ConfigError
from trials.worker import WORKER

COPY_REPEATS = 5


def _last_level_cache_bytes() -> int:
    sizes = []
    for index in range(8):
        path = f"/sys/devices/system/cpu/cpu0/cache/index{index}/size"
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            break
        try:
            sizes.append(parse_memory_budget(text.replace("K", "KiB").replace("M", "MiB")))
        except ConfigError:
            pass
    return max(sizes, default=0)


def copy_buffer_bytes(device: str) -> int:
    """1 GiB on a GPU; on a CPU twice the last-level cache (at least 256 MiB, at most 2 GiB), so the
    copy streams from DRAM instead of the cache."""
    if device == "cuda":
        return 2**30
    return int(min(max(2 * _last_level_cache_bytes(), 256 * 2**20), 2 * 2**30))


def memory_bandwidth(device: str, measured_by: str = "") -> tuple[float, str]:
    """Bytes/s of a large device-to-device copy (read + write counted), best of a few, and where it
    came from; measured once per worker and thread count (the trial's torch threads are the ones
    that read its weights)."""
    return WORKER.memo("bandwidth").get(
        (device, torch.get_num_threads()), measured_by,
        lambda: _measure_bandwidth(device, copy_buffer_bytes(device)))


def copy_seconds(device: str, nbytes: int, repeats: int = COPY_REPEATS) -> list[float]:
    """Seconds of ``repeats`` copies of an ``nbytes`` buffer on ``device`` (after one warm-up copy);
    each copy reads and writes ``nbytes``, so its bandwidth is ``2 * nbytes / seconds``."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)
    times = []
    for i in range(repeats + 1):                    # the first copy warms up
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            started = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - started
        if i:
            times.append(seconds)
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return times


def _measure_bandwidth(device: str, nbytes: int) -> float:
    return 2 * nbytes / min(copy_seconds(device, nbytes))
