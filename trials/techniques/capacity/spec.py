"""The capacity group's declaration: one served configuration per trial (llama-server: weights, KV
cache type, slots ``-np``, tokens per scheduling step ``-b``, threads ``-t/-tb``), measured as the
highest Poisson rate at which at least ``attainment`` (90 %) of its requests meet both the TTFT and
the TPOT limit (``trials.stats.capacity``).

Its configurations are searched, not gridded, by default: the sweep's capacity search
(``sweeps.capacity_search``) proposes each next one with a stock Ray Tune searcher from the ones
measured so far (warm-started from the store); ``--search grid`` runs this space's full grid
(``space.plan``). A trial holds every CPU of its node, as a serving trial does.
"""

from __future__ import annotations

from trials import engines
from trials.stats.capacity import Probe, find_capacity
from trials.techniques.serving.spec import batched_speedup
from trials.techniques.spec import ProfileKey, Technique, built_in, served_keys

NAME = "capacity"
MIN_REQUESTS = 20            # a probe's requests after warm-up: fewer and a 90 % share is 1 miss in 10
MIN_NEW_TOKENS = 32
# The budget's guess of where a capacity lies, as a share of the single-stream rate: the 2-core CPU
# runs measured 0.35-0.42 of it at 500 ms / 50 ms (TTFT-bound: prompts queue behind each other's
# prefill). The estimate walks the search to it; the search itself decides.
TYPICAL_CAPACITY = 0.4
STOPPED_SHARE = 0.5          # a probe that misses stops once it cannot pass: about half its requests
TTFT_SPREAD = 0.25           # the longest prompt's calibrated prefill against the measured single-stream p95 TTFT
# Served, that p95 runs above the calibrated prefill (HTTP, tokenizing, the first decode step, a short
# prompt's prefill less efficient than the calibration's): 1.02-1.55x in one sweep's six capacity
# trials; 1.1 puts every recorded sweep's capacity estimate within 25 % (benchmarks/estimate_vs_measured.py).
SERVED_TTFT_FACTOR = 1.1


KNOBS = ("step_tokens", "threads")     # what a server engine must take (``Engine.server_knobs``) to be searched here


def guard(stack) -> str | None:
    missing = [k for k in KNOBS if k not in engines.get(stack.engine).server_knobs]
    if missing:
        return f"the capacity group searches a server's {' and '.join(KNOBS)}; {stack.engine} does not take {', '.join(missing)}"
    if stack.compile:
        return f"the capacity group drives servers (no compiled decoding), got stack {stack.label}"
    if stack.speculation != "none":
        return (f"the capacity group searches weights, cache, slots, step tokens and threads (speculation "
                f"is the serving group's), got stack {stack.label}")
    return None


def start_rps(single_rps: float, slots: int) -> float:
    """Where the search starts: the single-stream rate where several slots decode together (they
    sustain more), half of it with one slot (which queues at once above it)."""
    return single_rps if slots > 1 else single_rps / 2


def probe_rates(single_rps: float, slots: int) -> list[tuple[float, bool]]:
    """The rates a typical search probes, each with whether it passes (the budget's estimate): the
    search's own walk (``find_capacity``) to a capacity of ``TYPICAL_CAPACITY`` x the single-stream
    rate."""
    bar = TYPICAL_CAPACITY * single_rps
    found = find_capacity(lambda rate: Probe(rate, float(rate <= bar), 0.0, 1.0, rate <= bar),
                          start_rps(single_rps, slots))
    return [(p.rate, p.passed) for p in found.probes]


def cost(config, estimate) -> float:
    """The server's start, the warm-up and single-stream point one request at a time, then the
    open-loop probes of ``warmup + requests`` Poisson arrivals each at the rates a typical search
    takes (``probe_rates``; from the engine's step cost: the single-stream rate is one request's
    time, a probe lasts its arrival span or, past what the slots sustain, the time they take; one
    that misses stops about half way), plus the last request's own time per probe. A configuration
    whose single stream misses the TTFT limit ends after the single stream: the probes are weighted
    by the chance that it meets it (``feasible_chance``)."""
    load, slots, step = config.load, config.stack.batch_size, estimate.cost
    request_s = estimate.prompt_tokens * step.prefill_token_s + config.workload.max_new_tokens * step.decode_s
    count = load.warmup + load.requests
    served_s = count * request_s / batched_speedup(step, slots)
    single = count * request_s
    start = engines.get(config.stack.engine).start_s + single
    predicted = SERVED_TTFT_FACTOR * estimate.longest_prompt_tokens * step.prefill_token_s
    chance = feasible_chance(predicted, load.ttft_slo_s)
    return start + chance * sum(max(count / rate, served_s) * (1 if passed else STOPPED_SHARE) + request_s
                                for rate, passed in probe_rates(1 / request_s, slots))


def feasible_chance(predicted_ttft_s: float, limit_s: float) -> float:
    """The chance that a single stream's p95 TTFT meets ``limit_s`` when its longest prompt's calibrated
    prefill, served, takes ``predicted_ttft_s``: that prediction is within ``TTFT_SPREAD`` of the measured p95,
    so 1/2 at the limit, falling linearly to 0 (1) a spread above (below) it. Near the limit either
    outcome is as likely, and a step-cost calibration a little slower than the last must not turn a
    whole search into a single stream in the estimate."""
    return min(1.0, max(0.0, 0.5 + (limit_s - predicted_ttft_s) / (2 * TTFT_SPREAD * limit_s)))


def shrink(config, workload, prompts_divisor: int):
    """Fewer prompts (they cycle through a probe's requests), never fewer than ``MIN_NEW_TOKENS``."""
    from dataclasses import replace

    return replace(workload, max_new_tokens=max(workload.max_new_tokens,
                                                min(config.workload.max_new_tokens, MIN_NEW_TOKENS)))


SPEC = Technique(
    NAME, "Capacity: the most requests per second within the SLO, by search", order=9,
    guard=guard,
    **built_in(NAME, "run_capacity_trial"),
    reference="the configuration's own single-stream point (one request at a time): where it already misses the "
              "SLO the configuration is infeasible; its rate is where the search starts",
    profile_keys=served_keys(step_tokens=ProfileKey("int", many=True, low=0, high=65536),
                             threads=ProfileKey("int", many=True, low=0, high=1024),
                             search_trials=ProfileKey("int", low=1, high=10_000),
                             requests_per_point=ProfileKey("int", low=MIN_REQUESTS, high=100_000),
                             attainment=ProfileKey("number", low=0.01, high=1)),
    cost=cost, shrink=shrink, engines=None, serving=True, holds_node=True,
    search="trials.techniques.capacity.space",
)
