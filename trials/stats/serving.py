"""Serving under load: percentiles with intervals, goodput under an SLO, and where a server saturates.

A load point (``trials.measurement.load``) is a list of request timelines. What a serving decision
needs from it: tail latencies with their uncertainty (a p99 over 40 requests is the largest one, and
says so), the rate of requests that met the latency SLO (goodput: raw throughput counts requests
nobody wanted to wait for), and whether the server kept up with the offered rate at all. Above
saturation an open-loop queue grows for as long as the point lasts, so a point's latencies depend on
its length; only points that keep up are comparable, hence ``keeps_up`` before ``sustainable``.

Percentiles are nearest-rank (a measured value, as ``trials.measurement.latency.percentile``); the
95 % interval is the percentile bootstrap. Pure arithmetic on records: numpy, no torch, no aiohttp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from trials.measurement.load import PointRun, RequestRecord

# Requests needed before a percentile is reported as such: below, it is the largest value, flagged
MIN_FOR = {50: 1, 95: 20, 99: 100}
QUANTILES = {"ttft_s": (50, 95, 99), "itl_s": (50, 95, 99), "tpot_s": (50, 95), "e2e_s": (50, 95, 99)}
KEEP_UP_RATIO = 0.9             # completion rate / offered rate a point must reach to keep up
TTFT_GROWTH_FACTOR = 2.0        # last third's median TTFT may be at most this times the first third's ...
TTFT_SLACK_S = 0.05             # ... plus this, so that millisecond TTFTs do not trip on noise


@dataclass(frozen=True)
class Percentile:
    value: float                # the nearest-rank percentile, or the largest value when not exact
    low: float                  # 95 % bootstrap interval; NaN when not exact or n < 2
    high: float
    n: int
    exact: bool                 # False when n < MIN_FOR[q]: value is then max(values)


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float


def min_for(q: float) -> int:
    """Samples needed for the q-th percentile (``MIN_FOR``; elsewhere 1 / (1 - q/100), rounded up)."""
    return MIN_FOR.get(q, math.ceil(100 / (100 - q)))


def rank_index(q: float, n: int) -> int:
    """0-based index of the nearest-rank q-th percentile among n sorted values."""
    return min(n - 1, max(0, math.ceil(q * n / 100) - 1))


def percentile_with_interval(values, q: float, seed: int = 0, resamples: int = 1000) -> Percentile:
    """The q-th nearest-rank percentile and its 95 % percentile-bootstrap interval. Below
    ``min_for(q)`` samples the value is the largest sample, ``exact`` is False and there is no
    interval. A resample's k-th order statistic is drawn directly, not by resampling n values: it is
    ``sorted[ceil(n U) - 1]`` with U ~ Beta(k, n - k + 1), the k-th of n uniforms pushed through the
    empirical quantile function, which is the same distribution at O(resamples) cost (a pooled ITL
    has hundreds of thousands of values)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    if n == 0:
        return Percentile(math.nan, math.nan, math.nan, 0, False)
    if n < min_for(q):
        return Percentile(float(ordered[-1]), math.nan, math.nan, n, False)
    k = rank_index(q, n)
    if n < 2:
        return Percentile(float(ordered[k]), math.nan, math.nan, n, True)
    u = np.random.default_rng(seed).beta(k + 1, n - k, size=resamples)
    draws = ordered[np.clip(np.ceil(n * u).astype(int) - 1, 0, n - 1)]
    low, high = np.quantile(draws, [0.025, 0.975], method="inverted_cdf")
    return Percentile(float(ordered[k]), float(low), float(high), n, True)


def percentile_metrics(name: str, values: list[float], seed: int) -> dict[str, float]:
    """``{name}_p50`` etc. with ``_low``/``_high`` bounds and ``_exact`` (1/0) for each quantile."""
    out = {}
    for q in QUANTILES[name]:
        p = percentile_with_interval(values, q, seed=seed)
        key = f"{name}_p{q}"
        out.update({key: p.value, f"{key}_low": p.low, f"{key}_high": p.high, f"{key}_exact": float(p.exact)})
    return out


def rate(count: int, span_s: float) -> float:
    return count / span_s if span_s > 0 else math.nan


def median_or_nan(values: list[float]) -> float:
    return float(np.median(values)) if values else math.nan


def ttft_trend(ok: list[RequestRecord]) -> dict[str, float]:
    """Median TTFT of the first and last thirds of the ok requests (by send time) and their ratio:
    an open-loop queue that grows through the point shows as a last third slower than the first."""
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    third = len(ttft) // 3
    first = median_or_nan(ttft[:third])
    last = median_or_nan(ttft[-third:] if third else [])
    return {"ttft_s_first_third_p50": first, "ttft_s_last_third_p50": last,
            "ttft_growth": last / first if first > 0 else math.nan}


def meets(record: RequestRecord, slo: Slo) -> bool:
    """Ok, first token within the SLO, and decode pace within it (a one-token answer has no pace)."""
    tpot = record.tpot_s
    return record.ok and record.ttft_s is not None and record.ttft_s <= slo.ttft_s and (
        tpot is None or tpot <= slo.tpot_s)


def rates(kept: list[RequestRecord], skipped: list[RequestRecord], ok: list[RequestRecord],
          open_loop: bool) -> dict[str, float]:
    """Offered (requests over their arrival window, from the last warm-up arrival or the point's
    start), achieved (ok requests over first send to last done) and completion rate (ok requests
    less one over first to last completion: unlike achieved, not diluted by the last request's
    latency, so it matches the arrival rate of a server that keeps up) and arrival rate (ok requests
    less one over first to last send)."""
    start = max((r.scheduled_s for r in skipped), default=0.0)
    last_arrival = max((r.scheduled_s for r in kept), default=start)
    wall = max(r.done_s for r in kept) - min(r.sent_s for r in kept)
    done = sorted(r.done_s for r in ok)
    sent = sorted(r.sent_s for r in ok)
    return {"offered_rps": rate(len(kept), last_arrival - start) if open_loop else math.nan,
            "arrival_rps": rate(len(sent) - 1, sent[-1] - sent[0]) if open_loop and len(sent) > 1 else math.nan,
            "achieved_rps": rate(len(ok), wall), "wall_s": wall,
            "completion_rps": rate(len(done) - 1, done[-1] - done[0]) if len(done) > 1 else math.nan,
            "output_tok_per_s": rate(sum(r.output_tokens for r in ok), wall)}


def summarize(point: PointRun | list[RequestRecord], slo: Slo, warmup: int = 0, *, open_loop: bool | None = None,
              client_cpu_s: float | None = None, concurrency: int | None = None, seed: int = 0) -> dict[str, float]:
    """Flat metrics of one load point, units in the names. ``point`` is a ``PointRun`` or a list of
    records (then the keywords give what the run would: ``open_loop`` defaults to True). The first
    ``warmup`` records by send time are left out of everything; latencies are over ok requests;
    ``goodput_rps`` counts the ok requests within the SLO per second of wall, ``slo_attainment`` their
    share of all requests (failed ones miss it)."""
    records = point if isinstance(point, list) else point.records
    if not isinstance(point, list):
        open_loop = point.mode == "poisson" if open_loop is None else open_loop
        client_cpu_s = point.client_cpu_s if client_cpu_s is None else client_cpu_s
        concurrency = point.concurrency if concurrency is None else concurrency
    ordered = sorted(records, key=lambda r: r.sent_s)
    skipped, kept = ordered[:warmup], ordered[warmup:]
    ok = [r for r in kept if r.ok]
    good = sum(meets(r, slo) for r in ok)
    out = {"requests": float(len(kept)), "errors": float(len(kept) - len(ok)), "warmup_requests": float(len(skipped)),
           "concurrency": float(concurrency) if concurrency else math.nan,
           "slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s}
    if not kept:
        return out | {"achieved_rps": math.nan, "offered_rps": math.nan, "goodput_rps": math.nan}
    out |= rates(kept, skipped, ok, open_loop is not False)
    for name, values in (("ttft_s", [r.ttft_s for r in ok if r.ttft_s is not None]),
                         ("itl_s", [gap for r in ok for gap in r.itl_s]),
                         ("tpot_s", [r.tpot_s for r in ok if r.tpot_s is not None]),
                         ("e2e_s", [r.e2e_s for r in ok])):
        out |= percentile_metrics(name, values, seed)
    cpu = math.nan if client_cpu_s is None else client_cpu_s
    point_wall = out["wall_s"] if isinstance(point, list) else point.wall_s    # CPU was counted over all of it
    return out | ttft_trend(ok) | {
        "goodput_rps": rate(good, out["wall_s"]), "slo_attainment": good / len(kept),
        "client_cpu_s": cpu, "client_cpu_share": rate(cpu, point_wall),
        "client_lag_s_max": max(r.client_lag_s for r in kept)}


def finite(value) -> bool:
    return value is not None and not math.isnan(value)


def keeps_up(summary: dict[str, float], slack_s: float = TTFT_SLACK_S) -> bool:
    """Whether the server kept up with the point's load. All three must hold:
    no errors (and at least one request); in open loop, a completion rate of at least
    ``KEEP_UP_RATIO`` x the arrival rate of the same requests (first to last send, the same estimator as
    the completion rate's, so that a short point's Poisson noise cancels; closed loop paces itself: not
    checked); and TTFT not growing
    through the point: median TTFT of the last third <= ``TTFT_GROWTH_FACTOR`` x that of the first
    third + ``slack_s`` (not checked below 3 ok requests)."""
    if not summary.get("requests") or summary.get("errors", 1) > 0:
        return False
    offered = summary.get("arrival_rps", summary.get("offered_rps", math.nan))
    if finite(offered) and not summary.get("completion_rps", 0) >= KEEP_UP_RATIO * offered:
        return False
    first, last = summary.get("ttft_s_first_third_p50"), summary.get("ttft_s_last_third_p50")
    return not (finite(first) and finite(last)) or last <= TTFT_GROWTH_FACTOR * first + slack_s


def saturation_rps(summaries: list[dict[str, float]]) -> float | None:
    """The highest offered rate the server keeps up with: walking the open-loop points up by offered
    rate, the last one that keeps up before the first that does not (a lucky point above a failing
    one does not count). None when the lowest point already fails or there is no open-loop point."""
    ladder = sorted((s for s in summaries if finite(s.get("offered_rps"))), key=lambda s: s["offered_rps"])
    best = None
    for summary in ladder:
        if not keeps_up(summary):
            break
        best = summary["offered_rps"]
    return best


def sustainable(summaries: list[dict[str, float]], slo: Slo) -> dict[str, float] | None:
    """The point with the highest achieved rate that keeps up and whose p95 TTFT and p95 TPOT are
    within the SLO (a p95 over fewer than 20 requests is their largest value: stricter, not looser).
    None when no point qualifies."""
    within = [s for s in summaries if keeps_up(s)
              and s.get("ttft_s_p95", math.nan) <= slo.ttft_s and s.get("tpot_s_p95", math.nan) <= slo.tpot_s]
    return max(within, key=lambda s: s["achieved_rps"], default=None)
