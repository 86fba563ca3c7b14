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
from trials.techniques.serving.spec import batched_speedup
from trials.techniques.spec import ProfileKey, Technique

NAME = "capacity"
MIN_REQUESTS = 20            # a probe's requests after warm-up: fewer and a 90 % share is 1 miss in 10
MIN_NEW_TOKENS = 32
PROBES = 5                   # a typical search: the single-stream start, a doubling, three bisections


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


def probe_rates(single_rps: float, slots: int) -> list[float]:
    """The rates a typical search probes (the budget's estimate; the search itself decides): its
    start, a doubling that misses, then bisections between the two."""
    start = start_rps(single_rps, slots)
    return [start * m for m in (1.0, 2.0, 1.41, 1.19, 1.09)][:PROBES]


def cost(config, estimate) -> float:
    """The server's start, the warm-up and single-stream point one request at a time, then
    ``PROBES`` open-loop probes of ``warmup + requests`` Poisson arrivals each, at the rates a
    typical search takes (from the engine's step cost: the single-stream rate is one request's time,
    a probe lasts its arrival span or, past what the slots sustain, the time they take), plus the
    last request's own time per probe."""
    load, slots, step = config.load, config.stack.batch_size, estimate.cost
    request_s = estimate.prompt_tokens * step.prefill_token_s + config.workload.max_new_tokens * step.decode_s
    count = load.warmup + load.requests
    served_s = count * request_s / batched_speedup(step, slots)
    single = count * request_s
    probes = sum(max(count / rate, served_s) + request_s for rate in probe_rates(1 / request_s, slots))
    return engines.get(config.stack.engine).start_s + single + probes


def shrink(config, workload, prompts_divisor: int):
    """Fewer prompts (they cycle through a probe's requests), never fewer than ``MIN_NEW_TOKENS``."""
    from dataclasses import replace

    return replace(workload, max_new_tokens=max(workload.max_new_tokens,
                                                min(config.workload.max_new_tokens, MIN_NEW_TOKENS)))


SPEC = Technique(
    NAME, "Capacity: the most requests per second within the SLO, by search", order=9,
    guard=guard,
    runner="trials.techniques.capacity.runner:run_capacity_trial",
    space="trials.techniques.capacity.space:plan",
    section="dashboard.sections.capacity",
    reference="the configuration's own single-stream point (one request at a time): where it already misses the "
              "SLO the configuration is infeasible; its rate is where the search starts",
    profile_keys={"weights": ProfileKey("weight", many=True, optional=True),
                  "caches": ProfileKey("cache", many=True, optional=True),
                  "parallel": ProfileKey("int", many=True, low=1, high=64),
                  "step_tokens": ProfileKey("int", many=True, low=0, high=65536),
                  "threads": ProfileKey("int", many=True, low=0, high=1024),
                  "search_trials": ProfileKey("int", low=1, high=10_000),
                  "requests_per_point": ProfileKey("int", low=MIN_REQUESTS, high=100_000),
                  "warmup_requests": ProfileKey("int", low=0, high=1000),
                  "ttft_slo_ms": ProfileKey("int", low=1, high=3_600_000),
                  "tpot_slo_ms": ProfileKey("int", low=1, high=3_600_000),
                  "attainment": ProfileKey("number", low=0.01, high=1),
                  "real_models_only": ProfileKey("bool", optional=True),
                  "servers": ProfileKey("engine", many=True, optional=True)},
    cost=cost, shrink=shrink, engines=None, serving=True, holds_node=True,
    search="trials.techniques.capacity.space",
)
