"""The serving group's declaration: a server engine's stacks (``Engine.serves``) driven by a load
generator, measured as latency percentiles, goodput under an SLO and the rate each sustains.

A trial holds every CPU of its node (the server's threads and the client's one process), so that no
other trial's work is mistaken for the server's queueing.
"""

from __future__ import annotations

from trials import engines
from trials.techniques.spec import ProfileKey, Technique, built_in, served_keys

NAME = "serving"
MIN_NEW_TOKENS = 32        # a realistic output length: shorter, and TTFT alone decides every SLO


def guard(stack) -> str | None:
    if stack.compile:
        return f"the serving group drives servers (no compiled decoding), got stack {stack.label}"
    return None


def batched_speedup(step, in_flight: int) -> float:
    """How many times the single-stream token rate ``in_flight`` sequences decoding together get: a
    step of b tokens reads the weights once and computes b tokens, ~ one decode step plus b - 1
    prompt tokens' worth of compute (``step``: the engine's own step cost at batch 1)."""
    return in_flight * step.decode_s / (step.decode_s + (in_flight - 1) * step.prefill_token_s)


def cost(config, estimate) -> float:
    """The server's start (its engine's ``start_s``), then the trial's load at the rate the stack
    serves, from the step cost of the engine that runs its weights (``estimate.cost``): one request
    alone is its prompt's prefill and its new tokens' decode steps; the warm-up and single-stream
    point send them one at a time; a concurrency level keeps min(level, slots) decoding together
    (``batched_speedup``); a Poisson point lasts its arrival span (requests / rate, the rate a multiple
    of the single-stream one) or, past what the slots sustain, the time they take to serve its
    requests, plus the last request's own time; parity sends each prompt once to the server and once
    in-process."""
    load, slots, step = config.load, config.stack.batch_size, estimate.cost
    request_s = estimate.prompt_tokens * step.prefill_token_s + config.workload.max_new_tokens * step.decode_s
    served_s = load.requests * request_s / batched_speedup(step, slots)
    single = (load.warmup + load.requests) * request_s
    levels = sum(load.requests * request_s / batched_speedup(step, min(c, slots)) for c in load.concurrency if c != 1)
    rates = sum(max(load.requests * request_s / m, served_s) + request_s for m in load.rates)
    parity = 2 * estimate.prompts * request_s
    return engines.get(config.stack.engine).start_s + single + levels + rates + parity


def shrink(config, workload, prompts_divisor: int):
    """Fewer prompts (they cycle through each point's requests), never fewer than ``MIN_NEW_TOKENS``."""
    from dataclasses import replace

    return replace(workload, max_new_tokens=max(workload.max_new_tokens,
                                                min(config.workload.max_new_tokens, MIN_NEW_TOKENS)))


SPEC = Technique(
    NAME, "Serving: requests per second within a latency SLO", order=8,
    guard=guard,
    **built_in(NAME, "run_serving_trial"),
    reference="the same weights in-process (the engine the server builds on, batch 1) for token parity; the "
              "stack's own single-stream capacity (measured first in the trial) sizes its rate ladder",
    profile_keys=served_keys(lookup_k=ProfileKey("int", low=1, high=64, optional=True),
                             drafts=ProfileKey("weight", many=True, optional=True),
                             draft_k=ProfileKey("int", low=1, high=64, optional=True),
                             rates=ProfileKey("number", many=True, low=0.01, high=1000),
                             concurrency=ProfileKey("int", many=True, low=1, high=1024),
                             requests_per_point=ProfileKey("int", low=1, high=100_000)),
    cost=cost, shrink=shrink, engines=None, serving=True, holds_node=True,
)
