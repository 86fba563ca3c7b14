"""The capacity group: one served configuration, its capacity under the SLO found by probing.

Before any load, the step-time model of the configuration (``trials.stats.step_time``: seconds per
scheduling step against the tokens in it, measured once per GGUF, cache type and threads with
llama-bench) says whether its ``-b`` can meet the TPOT limit at all; one that cannot is skipped,
said so, with its prediction logged. Otherwise the trial starts the server (127.0.0.1, a free port,
healthy first, stopped and checked gone after), sends the warm-up requests, then:

1. single stream: ``requests`` one at a time; where fewer than ``attainment`` of them meet both
   limits the configuration is infeasible, and the run says so with the single-stream p95s;
2. probes (``trials.stats.capacity.find_capacity``): each ``warmup + requests`` seeded Poisson
   arrivals at one rate, the first ``warmup`` left out; attainment with a bootstrap interval;
   a probe stops once more requests missed than the target allows (it cannot pass; the share it
   reports is then the most it could have reached); doubled from the single-stream rate (half of it with one slot: ``spec.start_rps``), then bisected
   to 10 %. A probe during which processes
   outside the trial took more than ``NOISY_CORES`` of a core is run once more, and said so. A probe
   that does not fit in the time the sweep gave the trial ends the search: a lower bound.

Every point is kept in the run's artifact (its requests' timelines) and as ``c1_*`` / ``p{i}_*``
metrics (``trials.measurement.point_names``); the predicted p95 ITL is logged beside the measured one
at every probe, from the step curve plus what the server adds to each step beyond llama-bench's
compute (its single stream's median ITL less the curve's one-token step: ``server_step_overhead_s``).
"""

from __future__ import annotations

import logging
import math
import os
import time

from trials import engines
from trials.config import Runtime, TrialConfig
from trials.loop import TrialResult, model_tags
from trials.measurement.environment import environment_tags
from trials.measurement import point_names
from trials.measurement.load import poisson_arrivals, run_point
from trials.measurement.point_names import Point
from trials.measurement.neighbours import NOISY_CORES, outside_trial
from trials.measurement.process_memory import METHOD as MEMORY_METHOD, ProcessMemory
from trials.stats.capacity import Capacity, Probe, attainment_interval, find_capacity
from trials.stats.serving import Slo, meets
from trials.techniques.capacity.spec import start_rps
from trials.techniques.serving.runner import POINT_TIMEOUT_S, Ladder, _requests

log = logging.getLogger(__name__)
STOP_MARGIN_S = 15            # kept back from the trial's time limit: stopping the server, logging
DEFAULT_STEP_TOKENS = 2048    # llama-server's -b when none is given


class Points(Ladder):
    """The serving ladder's points (each kept whatever happens), measured as probes: each point also
    says which of its kept requests met both limits, and the artifact lists the probes."""

    def measure(self, point: Point, *, arrivals=None, concurrency=None, count: int, warmup: int = 0,
                offset: int = 0, stop=None) -> tuple[dict, list[bool]]:
        """One point; returns (its summary, whether each kept request met both limits)."""
        summary = self.point(point, arrivals=arrivals, concurrency=concurrency, count=count, offset=offset,
                             warmup=warmup, stop=stop)
        kept = sorted(self.points[-1][2].records, key=lambda r: r.sent_s)[warmup:]
        return summary, [meets(r, self.slo) for r in kept]

    def artifact(self, probes: list[Probe]) -> dict:
        return {**super().artifact(), "probes": [p.to_dict() for p in probes]}


def _prediction(config: TrialConfig, served, threads: int):
    """(the step-time curve, the reason the -b cannot meet the TPOT limit or None, mean prompt tokens)."""
    from trials.stats.step_time import tpot_cannot_meet

    stack = config.stack
    prompt = sum(len(ids) for ids in served.prompt_ids.values()) / len(served.prompt_ids)
    backend = engines.backend(stack)
    if not hasattr(backend, "step_curve"):
        return None, None, prompt
    curve = backend.step_curve(config, served, threads)
    reason = tpot_cannot_meet(curve, stack.step_tokens or DEFAULT_STEP_TOKENS, stack.batch_size, round(prompt),
                              config.workload.max_new_tokens, config.load.tpot_slo_s)
    return curve, reason, prompt


def _predict_itl(curve, config: TrialConfig, prompt: float, rate: float) -> float:
    from trials.stats.step_time import predict_itl_p95

    return predict_itl_p95(curve, config.stack.step_tokens or DEFAULT_STEP_TOKENS, config.stack.batch_size,
                           round(prompt), config.workload.max_new_tokens, rate)


class Decided:
    """A probe's early stop: once more of its requests (after the warm-up arrivals) missed the SLO
    than the target allows, it cannot pass, and the requests left are not worth their time.
    ``misses``: how many had missed when it stopped (None while it runs)."""

    def __init__(self, slo: Slo, load, arrivals: list[float]):
        self.slo, self.allowed = slo, math.floor((1 - load.attainment) * load.requests + 1e-9)
        self.first_kept = arrivals[load.warmup] if load.warmup < len(arrivals) else math.inf
        self.misses: int | None = None

    def __call__(self, finished) -> str:
        misses = sum(not meets(r, self.slo) for r in finished if r.scheduled_s >= self.first_kept)
        if misses <= self.allowed:
            return ""
        self.misses = misses
        return f"{misses} requests missed the SLO, more than the {self.allowed} the target allows"


class Search:
    """The probes of one trial: each a Poisson point at one rate, run again once when disturbed."""

    def __init__(self, config: TrialConfig, points: Points, curve, prompt: float, sweep_pids=()):
        self.config, self.points, self.curve, self.prompt = config, points, curve, prompt
        self.sweep_pids = sweep_pids
        self.probes = 0
        self.metrics: dict[str, float] = {}
        self.summaries: dict[float, dict] = {}

    def probe(self, rate: float) -> Probe:
        load = self.config.load
        self.probes += 1
        index = self.probes
        point = point_names.probe(index)
        for attempt in (1, 2):
            arrivals = poisson_arrivals(rate, load.warmup + load.requests, seed=self.config.seed + 100 * index + attempt)
            stop = Decided(self.points.slo, load, arrivals)
            with outside_trial(self.sweep_pids) as outside:
                summary, met = self.points.measure(point if attempt == 1 else point_names.probe(index, repeat=True),
                                                   arrivals=arrivals, count=load.warmup + load.requests,
                                                   warmup=load.warmup, offset=index, stop=stop)
            cores = outside.outside_cpu_cores
            if attempt == 1 and cores is not None and cores > NOISY_CORES:
                log.info("capacity probe %s at %.3g req/s: %.2f cores taken outside the trial: run again",
                         point.name, rate, cores)
                continue
            break
        share, low, high = attainment_interval(met, seed=self.config.seed + index)
        if stop.misses is not None:      # stopped early: at most this share could have met the limits
            share, low, high = 1 - stop.misses / load.requests, sum(met) / load.requests, 1 - stop.misses / load.requests
        passed = share >= load.attainment
        probe = Probe(rate, share, low, high, passed, point.name, repeated=attempt == 2,
                      outside_cpu_cores=math.nan if cores is None else cores, stopped=stop.misses is not None)
        predicted = _predict_itl(self.curve, self.config, self.prompt, rate) if self.curve is not None else math.nan
        measured = {"offered_rps": rate, "slo_attainment": share, "slo_attainment_low": low,
                    "slo_attainment_high": high, "passed": float(passed), "repeated": float(attempt == 2),
                    "stopped_early": float(probe.stopped), "outside_cpu_cores": probe.outside_cpu_cores,
                    "itl_s_p95_predicted": predicted,
                    **{k: summary[k] for k in ("ttft_s_p95", "tpot_s_p95", "itl_s_p95", "output_tok_per_s",
                                               "achieved_rps") if k in summary}}
        self.metrics.update({point.metric(k): v for k, v in measured.items()})
        self.summaries[rate] = summary
        log.info("capacity %s %s at %.3g req/s: %.0f %% within the SLO (%s)", self.config.stack.label, point.name, rate,
                 100 * share, "passes" if passed else "misses")
        return probe


def _single_stream_note(summary: dict, slo: Slo) -> str:
    return (f"one request at a time already misses the SLO: p95 TTFT {1000 * summary['ttft_s_p95']:.0f} ms "
            f"(limit {1000 * slo.ttft_s:.0f}), p95 TPOT {1000 * summary['tpot_s_p95']:.0f} ms (limit {1000 * slo.tpot_s:.0f})")


def _ratios(summary: dict, slo: Slo) -> tuple[float, float]:
    return summary["ttft_s_p95"] / slo.ttft_s, summary["tpot_s_p95"] / slo.tpot_s


def run_capacity_trial(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """Predict, serve, probe single stream then rates, stop the server; a server that dies or refuses
    mid-load fails the trial with what was measured kept."""
    began = time.perf_counter()
    limit = runtime.time_limit_s if runtime.time_limit_s is not None else math.inf
    backend = engines.backend(config.stack)
    served = backend.load(config)
    stack, load = config.stack, config.load
    threads = stack.threads or runtime.num_threads or os.cpu_count() or 1
    slo = Slo(load.ttft_slo_s, load.tpot_slo_s)
    tags = {**environment_tags(config.device, runtime.git_sha if runtime.git_sha != "unknown" else None),
            **model_tags(config), "memory_method": MEMORY_METHOD}
    metrics = {"server_step_tokens": float(stack.step_tokens or DEFAULT_STEP_TOKENS), "server_threads": float(threads),
               "parallel_slots": float(stack.batch_size), "attainment_target": load.attainment,
               "ttft_slo_s": slo.ttft_s, "tpot_slo_s": slo.tpot_s}
    curve, skip, prompt = _prediction(config, served, threads)
    metrics["prompt_tokens_mean"] = prompt
    if curve is not None:
        metrics.update(step_fixed_s=curve.fixed_s, step_per_token_s=curve.per_token_s)
    tags["server_command"] = tags["user_code"] = backend.user_command(config, served, threads)
    if skip:
        tags.update(capacity_status="skipped", capacity_note=skip)
        from trials.stats.step_time import tpot_one_arrival

        predicted = tpot_one_arrival(curve, stack.step_tokens or DEFAULT_STEP_TOKENS, stack.batch_size, round(prompt),
                                     config.workload.max_new_tokens)
        metrics.update(capacity_rps=0.0, capacity_rps_low=0.0, capacity_rps_high=math.nan, capacity_probes=0.0,
                       tpot_s_predicted=predicted, slo_margin=min(0.0, 1 - predicted / load.tpot_slo_s),
                       trial_wall_s=time.perf_counter() - began)
        log.info("capacity %s skipped before any load: %s", stack.label, skip)
        return TrialResult(config, "FINISHED", metrics=metrics, tags=tags, raw={"points": [], "probes": []})
    points, search, capacity = None, None, None
    try:
        with backend.serve(config, served, threads) as running, ProcessMemory(running.pid) as memory:
            points = Points(config, served, running.url, backend.request_body(served), backend.STREAM_ENDS_WITH_DONE)
            if load.warmup:
                run_point(running.url, _requests(served, load.warmup, config.workload.max_new_tokens),
                          concurrency=1, timeout_s=POINT_TIMEOUT_S, body=points.body, ends_with_done=points.ends_with_done)
            single, met = points.measure(point_names.SINGLE, concurrency=1, count=load.requests)
            if curve is not None:       # what the server adds to each step, from its own single stream
                overhead = max(0.0, single["itl_s_p50"] - curve.seconds(1))
                metrics["server_step_overhead_s"] = overhead
                curve = curve.with_overhead(overhead)
            search = Search(config, points, curve, prompt, runtime.sweep_pids)
            share, _, _ = attainment_interval(met, seed=config.seed)
            if share < load.attainment:
                capacity = Capacity("infeasible", 0.0, 0.0, math.nan, [], _single_stream_note(single, slo))
            else:
                request_s = single["e2e_s_p50"]
                count = load.warmup + load.requests
                capacity = find_capacity(
                    search.probe, start_rps(single["achieved_rps"], stack.batch_size), target=load.attainment,
                    time_left=lambda: limit - (time.perf_counter() - began) - STOP_MARGIN_S,
                    probe_seconds=lambda rate: count / rate + request_s)
            metrics["peak_memory_bytes"] = float(memory.peak_bytes)
            facts = backend.trial_facts(config, served, running)
    except Exception as exc:
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        kept = points.artifact([]) if points is not None else {}
        return TrialResult(config, "FAILED", metrics={**metrics, **(search.metrics if search else {})},
                           tags={**tags, "failure": "capacity"}, raw=kept, error=f"{type(exc).__name__}: {line}"[:500])
    metrics.update(facts.logged(stack, running))
    tags.update({k: v for k, v in facts.tags.items() if k not in ("server_command", "user_code")})
    metrics.update(search.metrics)
    metrics.update({point_names.SINGLE.metric(k): single[k] for k in ("ttft_s_p95", "tpot_s_p95", "itl_s_p95", "itl_s_p50", "achieved_rps",
                                                   "e2e_s_p50", "output_tok_per_s") if k in single})
    metrics["single_stream_rps"] = single["achieved_rps"]
    ttft_ratio, tpot_ratio = _ratios(single, slo)
    metrics.update(ttft_ratio=ttft_ratio, tpot_ratio=tpot_ratio)
    metrics.update(_capacity_metrics(capacity, search, ttft_ratio, tpot_ratio))
    if curve is not None and capacity.rps > 0:
        metrics["itl_s_p95_predicted"] = _predict_itl(curve, config, prompt, capacity.rps)
    # the run's throughput, as every group logs one: the most output tok/s at any point
    metrics["tok_per_s"] = max(s.get("output_tok_per_s", 0.0) for _, s, _ in points.points)
    metrics["trial_wall_s"] = time.perf_counter() - began
    metrics["cores_held"] = float(runtime.num_threads or os.cpu_count() or 1)
    tags.update(capacity_status=capacity.status, capacity_note=capacity.note,
                load_mode="warm-up, single stream, then seeded Poisson probes at rates the capacity search chose; "
                          "streaming /v1/completions from one asyncio client")
    return TrialResult(config, "FINISHED", metrics=metrics, tags=tags, raw=points.artifact(capacity.probes))


def _capacity_metrics(capacity: Capacity, search: Search, ttft_ratio: float, tpot_ratio: float) -> dict[str, float]:
    out = {"capacity_rps": capacity.rps, "capacity_rps_low": capacity.low, "capacity_rps_high": capacity.high,
           "capacity_probes": float(len(capacity.probes)),
           "slo_margin": capacity.rps if capacity.rps > 0 else min(0.0, 1 - max(ttft_ratio, tpot_ratio))}
    at = capacity.at
    if at is not None:
        summary = search.summaries.get(at.rate, {})
        out.update(capacity_attainment=at.attainment, capacity_attainment_low=at.low,
                   capacity_attainment_high=at.high,
                   capacity_output_tok_per_s=summary.get("output_tok_per_s", math.nan),
                   itl_s_p95=summary.get("itl_s_p95", math.nan))
    return out
