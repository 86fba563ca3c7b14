"""Latency per request, from the loop's batch records: what a latency limit is checked against.

Every request of a batch waits for the batch's first token (TTFT) and decodes at the batch's pace
(time per output token), so each request counts once with its batch's times. Torch-free: the
decision (``dashboard.decision``) reads the same constants.
"""

from __future__ import annotations

import math

# A p95 is reported only over at least this many requests: below, the 95th percentile is the largest
# sample or next to it, and a limit is checked against the largest sample instead, said so
MIN_SAMPLES_P95 = 20


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile: the smallest sample with at least ``p`` % of samples at or below
    it, always a value that was measured."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def latency_metrics(records: list) -> dict[str, float]:
    """TTFT and time per output token per request (``BatchRecord``s of the timed passes). p50 always;
    p95 over ``MIN_SAMPLES_P95`` requests or more; ``latency_samples`` says how many requests they
    rest on."""
    ttft = [b.ttft_s for b in records for _ in b.prompt_ids]
    tpot = [b.decode_s / max(b.decode_tokens, 1) for b in records for _ in b.prompt_ids]
    metrics = {"latency_samples": float(len(ttft)), "ttft_s_p50": percentile(ttft, 50),
               "tpot_s_p50": percentile(tpot, 50)}
    if len(ttft) >= MIN_SAMPLES_P95:
        metrics.update(ttft_s_p95=percentile(ttft, 95), tpot_s_p95=percentile(tpot, 95))
    return metrics
