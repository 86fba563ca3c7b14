"""Predictions the measurements are logged beside: pure formulas, no torch.

The dashboard imports this module to draw theory curves, so it must stay free of torch, transformers
and the measurement loop. Formulas that need a model's architecture (exact KV-cache bytes) live in
``trials.measurement.kv_footprint``, which is equally torch-free.
"""

from __future__ import annotations


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Leviathan et al. (2023): E = (1 - α^(k+1)) / (1 - α), the expected tokens per target pass when
    each of k proposals is accepted with independent probability α (k + 1 at α = 1)."""
    return float(k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def leviathan(alpha: float, k: int, cost_ratio: float) -> tuple[float, float]:
    """(expected tokens per target pass, predicted speedup E / (k·c + 1)) for α, k drafts, and a draft
    step costing ``cost_ratio`` target steps."""
    expected = expected_tokens_per_pass(alpha, k)
    return expected, expected / (k * cost_ratio + 1)


def decode_step_bytes(weights_bytes: float, kv_bytes_per_token: float, context_tokens: float,
                      rows: int = 1) -> float:
    """Bytes one decode step reads: the weights once, and each of ``rows`` sequences' KV cache at
    ``context_tokens`` (the roofline's denominator for a single stream and for a server's slots)."""
    return weights_bytes + rows * kv_bytes_per_token * context_tokens


def roofline_tok_per_s(batch: int, bandwidth_bytes_per_s: float, bytes_per_step: float) -> float:
    """The bandwidth bound of decoding: one step reads ``bytes_per_step`` (weights once plus every
    row's KV cache) and emits ``batch`` tokens, so no step beats ``batch · bandwidth / bytes``."""
    return batch * bandwidth_bytes_per_s / bytes_per_step


def roofline_metrics(measured_tok_per_s: float, batch: int, bandwidth_bytes_per_s: float,
                     bytes_per_step: float) -> dict[str, float]:
    """The roofline as every group logs it, beside the measured decode rate: the bandwidth, the bytes
    one step reads, the bound (``roofline_tok_per_s``) and measured / bound (``roofline_ratio``)."""
    bound = roofline_tok_per_s(batch, bandwidth_bytes_per_s, bytes_per_step)
    return {"memory_bandwidth_bytes_per_s": bandwidth_bytes_per_s, "decode_bytes_per_step": bytes_per_step,
            "roofline_tok_per_s": bound, "roofline_ratio": measured_tok_per_s / bound}
