"""The serving group: one stack behind its server engine, driven by the load generator.

The trial starts the server (the engine's ``serve``: 127.0.0.1, a free port, healthy first, stopped
and checked gone after), sends the warm-up requests (excluded), then measures in this order:

1. single stream: ``requests`` one at a time (closed loop, concurrency 1); its achieved rate is the
   stack's single-stream capacity, which sizes the rate ladder;
2. each other ``concurrency`` level (closed loop: N requests always in flight);
3. each of ``rates`` x that capacity (open loop: seeded Poisson arrivals, sent on schedule whether
   or not earlier requests finished, so queueing shows up in TTFT as it does for real users);
4. parity: the server's greedy tokens against the in-process engine's on the same weights.

Per point: latency percentiles with bootstrap intervals, goodput under the trial's SLO, the client's
own CPU time (``trials.stats.serving.summarize``). The trial logs them as ``c<N>_<metric>``
(concurrency N) and ``r<i>_<metric>`` (the i-th rate, from 1), the per-request records in its
artifact, and the saturation point and sustainable rate beside. A server that dies mid-load fails
the trial with the points measured so far kept in the artifact.
"""

from __future__ import annotations

import logging
import os
import time

from trials import engines
from trials.config import Runtime, TrialConfig
from trials.loop import TrialResult, model_tags
from trials.measurement.bandwidth import memory_bandwidth
from trials.measurement.cost import usd_per_million_tokens
from trials.measurement.environment import environment_tags
from trials.measurement.process_memory import METHOD as MEMORY_METHOD, ProcessMemory
from trials.measurement import point_names
from trials.measurement.load import STOPPED, PointRun, Request, poisson_arrivals, run_point
from trials.measurement.point_names import Point
from trials.stats.serving import Slo, saturation_rps, summarize, sustainable
from trials.stats.theory import decode_step_bytes, roofline_metrics

log = logging.getLogger(__name__)
POINT_TIMEOUT_S = 600             # one point; a server slower than this on 20 requests is broken


class LoadFailed(RuntimeError):
    """A point of the load came back with errors (the server died or refused): the points so far kept."""


def _requests(served, count: int, new_tokens: int, offset: int = 0) -> list[Request]:
    """``count`` requests cycling through the workload's prompts (the same order for every stack)."""
    ids = [served.prompts[(offset + i) % len(served.prompts)].id for i in range(count)]
    return [Request(prompt_id, served.request_prompts[prompt_id], new_tokens) for prompt_id in ids]


class Ladder:
    """The points of one trial, measured in order; what failed and what was kept."""

    def __init__(self, config: TrialConfig, served, url: str, body: dict, ends_with_done: bool = True):
        self.config, self.served, self.url, self.body = config, served, url, body
        self.ends_with_done = ends_with_done
        self.slo = Slo(config.load.ttft_slo_s, config.load.tpot_slo_s)
        self.points: list[tuple[Point, dict, PointRun]] = []     # (point, summary, run)

    def point(self, point: Point, *, arrivals=None, concurrency=None, count: int, offset: int = 0,
              warmup: int = 0, stop=None) -> dict:
        """One point of ``count`` requests (its first ``warmup`` left out of the summary), kept whatever
        happens; ``LoadFailed`` if a request failed (one that ``stop`` cut short did not)."""
        requests = _requests(self.served, count, self.config.workload.max_new_tokens, offset)
        run = run_point(self.url, requests, arrivals=arrivals, concurrency=concurrency, timeout_s=POINT_TIMEOUT_S,
                        body=self.body, ends_with_done=self.ends_with_done, stop=stop)
        summary = summarize(run, self.slo, warmup=warmup)
        self.points.append((point, summary, run))
        failed = [r.error for r in run.records if r.error and not r.error.startswith(STOPPED)]
        if failed:
            raise LoadFailed(f"{len(failed)} of {len(run.records)} requests failed at {point.name}: {failed[0]}")
        log.info("%s %s %s: %.2f req/s achieved, p95 TTFT %.3f s", self.config.group, self.config.stack.label,
                 point.name, summary["achieved_rps"], summary["ttft_s_p95"])
        return summary

    def run(self) -> float:
        """Warm-up, single stream, concurrency levels, Poisson rates; returns the single-stream rate."""
        load = self.config.load
        if load.warmup:
            run_point(self.url, _requests(self.served, load.warmup, self.config.workload.max_new_tokens),
                      concurrency=1, timeout_s=POINT_TIMEOUT_S, body=self.body, ends_with_done=self.ends_with_done)
        single = self.point(point_names.SINGLE, concurrency=1, count=load.requests)["achieved_rps"]
        for level in (c for c in load.concurrency if c != 1):
            self.point(point_names.concurrency(level), concurrency=level, count=load.requests)
        for i, multiple in enumerate(load.rates, start=1):
            arrivals = poisson_arrivals(multiple * single, load.requests, seed=self.config.seed + i)
            summary = self.point(point_names.rate(i), arrivals=arrivals, count=load.requests, offset=i)
            summary["rate_multiple"] = multiple
        return single

    def metrics(self) -> dict[str, float]:
        out = {point.metric(name): float(value) for point, summary, _ in self.points
               for name, value in summary.items() if value is not None}
        rates = [s for point, s, _ in self.points if point.kind == point_names.RATE]
        if rates:
            out["saturation_rps"] = saturation_rps(rates) or 0.0
            at = [s for s in rates if s["offered_rps"] == out["saturation_rps"]]
            singles = [s for point, s, _ in self.points if point == point_names.SINGLE]
            out["saturation_output_tok_per_s"] = (at or singles or rates)[0]["output_tok_per_s"]
            best = sustainable(rates, self.slo)
            out["sustainable_rps"] = best["achieved_rps"] if best else 0.0
            out["sustainable_output_tok_per_s"] = best["output_tok_per_s"] if best else 0.0
            out["sustainable_rate_multiple"] = best.get("rate_multiple", 0.0) if best else 0.0
            out["goodput_rps_max"] = max(s["goodput_rps"] for s in rates)
            out["output_tok_per_s_max"] = max(s["output_tok_per_s"] for s in rates)
            low = min(rates, key=lambda s: s["offered_rps"])
            out["ttft_s_p50_lowest_rate"] = low["ttft_s_p50"]
        everything = [s for _, s, _ in self.points]
        if everything:          # the run's throughput, as every group logs one: the most output tok/s at any point
            out["tok_per_s"] = max(s.get("output_tok_per_s", 0.0) for s in everything)
        out["client_cpu_share_max"] = max(s["client_cpu_share"] for s in everything) if everything else 0.0
        out["ttft_slo_s"], out["tpot_slo_s"] = self.slo.ttft_s, self.slo.tpot_s
        return out

    def artifact(self) -> dict:
        return {"points": [{"point": point.name, "summary": summary, "mode": run.mode,
                            "offered_rps": run.offered_rps, "concurrency": run.concurrency,
                            "requests": [r.to_dict() for r in run.records]}
                           for point, summary, run in self.points]}


def _counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The server's own counters over the measured points (warm-up and parity aside)."""
    deltas = {name: after[name] - before.get(name, 0.0) for name in after if name.endswith("_total")}
    drafted = deltas.get("server_spec_decode_num_draft_tokens_total")
    if drafted:
        deltas["server_draft_acceptance"] = deltas.get("server_spec_decode_num_accepted_tokens_total", 0.0) / drafted
    rounds = deltas.get("server_spec_decode_num_drafts_total")
    if rounds:     # each verifying pass keeps the accepted tokens and adds one of its own
        deltas["server_tokens_per_target_pass"] = (deltas.get("server_spec_decode_num_accepted_tokens_total", 0.0)
                                                   + rounds) / rounds
    return deltas


def _roofline(config: TrialConfig, metrics: dict, ladder: Ladder) -> dict[str, str]:
    """The prediction beside the served rate: decoding with every slot busy, a step reads the weights
    once and each slot's cache at the mean context (the requests' prompt tokens plus half the new ones),
    at this machine's copy bandwidth, so no step emits more than ``slots`` tokens faster than that
    (prefill and the server's own work only lower it; a draft model can pass it, several tokens a pass).
    Where the engine reports no weight and cache bytes, nothing is predicted."""
    weights, cache, n_ctx = (metrics.get(k) for k in ("weights_bytes", "kv_cache_allocated_bytes", "n_ctx"))
    prompts = [r.prompt_tokens for _, _, run in ladder.points for r in run.records if r.prompt_tokens]
    if not (weights and cache and n_ctx and prompts and metrics.get("output_tok_per_s_max")):
        return {}
    slots = config.stack.batch_size
    context = sum(prompts) / len(prompts) + config.workload.max_new_tokens / 2
    step = decode_step_bytes(weights, cache / n_ctx, context, rows=slots)
    bandwidth, source = memory_bandwidth(config.device, config.config_hash)
    metrics.update(roofline_metrics(metrics["output_tok_per_s_max"], slots, bandwidth, step))
    return {"bandwidth_source": source}


def run_serving_trial(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """Serve the stack, drive it point by point, check parity, stop the server; a server that dies or
    refuses mid-load fails the trial with what was measured kept."""
    backend = engines.backend(config.stack)
    served = backend.load(config)
    threads = runtime.num_threads or os.cpu_count() or 1
    ladder, metrics = None, {}
    tags = {**environment_tags(config.device, runtime.git_sha if runtime.git_sha != "unknown" else None),
            **model_tags(config), "memory_method": MEMORY_METHOD}
    began = time.perf_counter()
    try:
        with backend.serve(config, served, threads) as running, ProcessMemory(running.pid) as memory:
            ladder = Ladder(config, served, running.url, backend.request_body(served), backend.STREAM_ENDS_WITH_DONE)
            tags["server_command"] = " ".join(running.command)
            before = backend.server_metrics(running)
            metrics["single_stream_rps"] = ladder.run()
            metrics.update(_counter_deltas(before, backend.server_metrics(running)))
            metrics["peak_memory_bytes"] = float(memory.peak_bytes)       # under load, before parity
            metrics.update(backend.parity(config, served, running))
            facts = backend.trial_facts(config, served, running)
            metrics.update(facts.logged(config.stack, running))
    except Exception as exc:
        kept = ladder.artifact() if ladder is not None else {}
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return TrialResult(config, "FAILED", metrics=ladder.metrics() if ladder and ladder.points else {},
                           tags={**tags, "failure": "serving"}, raw=kept, error=f"{type(exc).__name__}: {line}"[:500])
    metrics.update(ladder.metrics())
    single_ttft = metrics.get(point_names.SINGLE.metric("ttft_s_p50"))
    if single_ttft and metrics.get("in_process_ttft_s_p50"):
        # one request at a time through the server's HTTP and queue vs the same weights in-process
        metrics["ttft_served_vs_in_process"] = single_ttft / metrics["in_process_ttft_s_p50"]
    tags.update(_roofline(config, metrics, ladder))
    metrics["trial_wall_s"] = time.perf_counter() - began
    metrics["cores_held"] = float(threads)
    price = runtime.price_per_hour_usd
    if price is not None and metrics.get("saturation_output_tok_per_s"):     # at the highest rate it keeps up with
        metrics["price_per_hour_usd"] = float(price)
        metrics["usd_per_million_output_tokens"] = usd_per_million_tokens(price, metrics["saturation_output_tok_per_s"])
    tags.update(facts.tags)
    tags.update(load_mode="warm-up, single stream, closed-loop concurrency levels, then seeded Poisson arrivals at "
                          "multiples of the single-stream rate; streaming /v1/completions from one asyncio client")
    return TrialResult(config, "FINISHED", metrics=metrics, tags=tags, raw=ladder.artifact())
