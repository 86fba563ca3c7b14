"""What a worker process keeps between trials, in one object with one lifetime.

Ray Tune reuses its worker processes (actors) for many trials, so loading a model, measuring a
group's reference run or the memory bandwidth once per worker saves minutes. Everything kept lives in
``WORKER`` (one ``WorkerState`` per process): it is born empty when the process starts, lives as long
as the process, and is dropped by ``WORKER.reset()`` (tests; a sweep's workers are fresh processes).
Besides it, ``trials`` keeps only memoized pure lookups at module level (``functools`` caches of
discovered engines and groups, the catalogue, tokenized prompts, the corpus, the CPU's facts): each
a function of its arguments and the installed code, never of a trial.

A reused measurement is never silent: ``WorkerMemo.get`` says where a value came from, and each group
writes that into a ``*_source`` tag of the trial that reused it (``"this trial"`` or ``"reused:
measured 42 s earlier in this worker (trial <hash>)"``), so the store shows which numbers a trial
shares with which.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field


class WorkerMemo:
    """A measurement a worker makes once and reuses for its next trials (a group's reference run).

    Keyed by what determines the measurement (e.g. the reference stack's ``config_hash``); ``get``
    also says where the value came from, for the trial's ``*_source`` tag. Entries older than
    ``max_age_s`` are measured again (the machine's state drifts); ``keep_latest`` bounds memory to
    one entry when values are large.
    """

    def __init__(self, max_age_s: float | None = None, keep_latest: bool = False) -> None:
        self.max_age_s, self.keep_latest = max_age_s, keep_latest
        self._entries: dict = {}          # key -> (value, config_hash of the measuring trial, time)

    def get(self, key, measured_by: str, make):
        """The value for ``key`` (``make()`` when missing or too old) and where it came from."""
        entry = self.peek(key)
        if entry is not None:
            return entry
        return self.put(key, measured_by, make()), "this trial"

    def peek(self, key):
        """(value, source) when a fresh entry exists, else None."""
        entry = self._entries.get(key)
        if entry is None or (self.max_age_s is not None and time.time() - entry[2] >= self.max_age_s):
            return None
        return entry[0], (f"reused: measured {time.time() - entry[2]:.0f} s earlier in this worker "
                          f"(trial {entry[1]})")

    def put(self, key, measured_by: str, value):
        """Remember ``value`` (measured by trial ``measured_by``) and return it."""
        if self.keep_latest:
            self._entries.clear()
        self._entries[key] = (value, measured_by, time.time())
        return value

    def __contains__(self, key) -> bool:
        return self.peek(key) is not None


def model_cache_size() -> int:
    """Models kept loaded per worker (``LLM_SWEEPS_MODEL_CACHE``, default 2): a real 8B model in two
    precisions already fills a GPU; the sweep orders trials by model so consecutive ones share it."""
    return max(1, int(os.environ.get("LLM_SWEEPS_MODEL_CACHE", "2")))


@dataclass
class WorkerState:
    """Everything one worker process keeps between trials (see the module docstring).

    ``models``: loaded models, LRU by (model, precision, device) (``trials.models.loading.load``);
    ``copies``: one independent second instance (a model drafting for itself);
    ``load_notes``: how a quantized model was made (GPTQ cache hit, calibration), by load key;
    ``memos``: each group's reference runs and other once-per-worker measurements, by name
    (``memo(name)``), e.g. ``speculative.baseline``, ``kv_cache.reference``, ``batching.batch1``,
    ``bandwidth``, ``batching.ladder_end``, ``quantization.reference``.
    """

    models: "OrderedDict[tuple[str, str, str], object]" = field(default_factory=OrderedDict)
    copies: dict = field(default_factory=dict)
    load_notes: dict = field(default_factory=dict)
    memos: dict[str, WorkerMemo] = field(default_factory=dict)

    def memo(self, name: str, max_age_s: float | None = None, keep_latest: bool = False) -> WorkerMemo:
        """The worker's memo called ``name``, created on first use with these settings."""
        if name not in self.memos:
            self.memos[name] = WorkerMemo(max_age_s=max_age_s, keep_latest=keep_latest)
        return self.memos[name]

    def drop_models(self) -> None:
        """Unload every model (the memos stay)."""
        self.models.clear()
        self.copies.clear()

    def reset(self) -> None:
        """Forget everything: the next trial loads and measures as in a fresh process."""
        self.drop_models()
        self.load_notes.clear()
        self.memos.clear()


WORKER = WorkerState()
