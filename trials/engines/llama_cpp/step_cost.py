"""One prefill and a few decode steps of a model on llama.cpp, timed for the budget.

Why: llama.cpp's kernels on a GGUF type are not transformers' on fp32 weights (a 4-bit GGUF reads a
fraction of the bytes per step), so its trials are sized from its own step: the type's GGUF
(``gguf.gguf_file``: built once per model and type and kept, or a real model's shipped file),
opened with the arguments a trial uses (``generation.llama_arguments``: f16 cache, flash attention)
on ``threads`` for both prompt and decode, timed with ``perf_counter`` around ``Llama.eval``.
Random token ids: a step's cost does not depend on which tokens it reads.
"""

from __future__ import annotations

import random
import statistics
import time

from trials.config import Stack
from trials.engines.llama_cpp import generation, gguf
from trials.engines.llama_cpp.spec import NAME
from trials.engines.spec import StepCost
from trials.models.registry import ModelEntry

CONTEXT_ROUNDING = 256
PREFILL_REPEATS = 3


def measure(entry: ModelEntry, precision: str, device: str, threads: int, prefill_tokens: int,
            decode_steps: int) -> StepCost:
    """Open ``entry``'s GGUF of type ``precision``, time one prefill of ``prefill_tokens`` tokens and
    ``decode_steps`` decode steps at batch 1 on ``threads`` threads. ``load_s`` is opening the file
    (a GGUF built here for the first time is built before the clock starts: a trial finds it built),
    plus, for a zoo model's stand-in, building its GGUF (the trained model's first trial builds its own)."""
    started = time.perf_counter()
    path, _ = gguf.gguf_file(entry, precision)
    # a stand-in's GGUF (trials.models.zoo.stand_in) is built again for the trained model by its first
    # trial: that build counts toward the trial's load; a model's own GGUF is built here once and kept
    build_s = time.perf_counter() - started if gguf.is_stand_in(entry) else 0.0
    n_ctx = -(-(prefill_tokens + decode_steps + 8) // CONTEXT_ROUNDING) * CONTEXT_ROUNDING
    started = time.perf_counter()
    model = generation.open_llama(path, generation.llama_arguments(Stack(precision=precision, engine=NAME), n_ctx),
                                  seed=0, n_threads=threads)
    load_s = time.perf_counter() - started + build_s
    draw = random.Random(0)
    ids = [draw.randrange(3, model.n_vocab()) for _ in range(prefill_tokens + decode_steps)]
    try:
        model.eval(ids[:4])                                  # first call: buffers, thread pool
        prefills = []
        for _ in range(PREFILL_REPEATS):                     # the least: a moment's contention is not the cost
            model.reset()
            started = time.perf_counter()
            model.eval(ids[:prefill_tokens])
            prefills.append(time.perf_counter() - started)
        prefill_s = min(prefills)
        steps = []
        for token in ids[prefill_tokens:]:
            started = time.perf_counter()
            model.eval([token])
            steps.append(time.perf_counter() - started)
    finally:
        model.close()
    return StepCost(decode_s=statistics.median(steps), prefill_token_s=prefill_s / prefill_tokens,
                    load_s=load_s, measured_at=time.strftime("%Y-%m-%d %H:%M:%S"))
