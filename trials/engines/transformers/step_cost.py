"""One prefill (scoring the last position, as generation does, and every position, as perplexity does)
and a few decode steps of a model on transformers, timed for the budget.

Why: a sweep is sized from what a step costs on this machine (``sweeps.budget``), and a step here is
the model's own forward pass at batch 1, with a KV cache, on the threads a trial gets. Random token
ids: a step's cost does not depend on which tokens it reads.
"""

from __future__ import annotations

import statistics
import time

from trials.engines.spec import StepCost
from trials.models.registry import ModelEntry

PREFILL_REPEATS = 3


def measure(entry: ModelEntry, precision: str, device: str, threads: int, prefill_tokens: int,
            decode_steps: int) -> StepCost:
    """Load ``entry`` in ``precision``, time a prefill of ``prefill_tokens`` tokens both ways and
    ``decode_steps`` decode steps (torch on ``threads`` threads on a CPU, as a trial sets it)."""
    import torch

    from trials.models import loading
    previous = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(threads)
    try:
        loaded = loading.load(entry, precision, device)
        net = loaded.model
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(3, net.config.vocab_size, (1, prefill_tokens), generator=generator).to(loaded.device)

        def sync():
            if device == "cuda":
                torch.cuda.synchronize()

        with torch.inference_mode():
            net(input_ids=ids[:, :4])                             # first call: lazy init, kernel choice
            sync()
            def prefill(**kwargs):
                """The least of a few (a moment's contention is not the cost), and the last output."""
                times = []
                for _ in range(PREFILL_REPEATS):
                    started = time.perf_counter()
                    out = net(input_ids=ids, use_cache=True, **kwargs)
                    sync()
                    times.append(time.perf_counter() - started)
                return min(times), out

            scored_s, _ = prefill()                              # every position's logits: perplexity, training
            prefill_s, out = prefill(logits_to_keep=1)           # the last position's only: generation's prefill
            cache, token, steps = out.cache, out.logits[:, -1:].argmax(-1), []
            for _ in range(decode_steps):
                started = time.perf_counter()
                out = net(input_ids=token, cache=cache, use_cache=True)
                sync()
                steps.append(time.perf_counter() - started)
                cache, token = out.cache, out.logits[:, -1:].argmax(-1)
    finally:
        torch.set_num_threads(previous)
    return StepCost(decode_s=statistics.median(steps), prefill_token_s=prefill_s / prefill_tokens,
                    load_s=loaded.load_s, measured_at=time.strftime("%Y-%m-%d %H:%M:%S"),
                    scored_token_s=scored_s / prefill_tokens)
