"""What a stack must meet (``Limits``: quality against the model's reference precision, latency, a
price) and the parsers that read them from a command line (``llm-recommend``'s flags).

The quality defaults: ``max_kl`` = 0.02 nats per token and ``max_perplexity_increase`` = 2 %. On the
main job's stores, the stacks users call near-lossless (bf16, an 8-bit KV cache, 8-bit and shipped
4-bit GGUF types) lie far below these limits, and the stacks that visibly degrade (a 4-bit or 2-bit
KV cache, NF4, 4-bit types requantized from a 4-bit file) far above: the limits sit in that gap, so
every model gets a recommendation and a harmful stack is refused (the measured values: ``llm-report``,
the results page).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What a stack must meet; ``None``: no limit. Quality against the model's reference precision."""

    max_kl: float | None = 0.02                       # nats per token, teacher-forced
    max_perplexity_increase: float | None = 0.02      # 0.02 = +2 %
    min_token_match: float | None = None              # greedy token match: information unless set
    max_ttft_s: float | None = None
    max_tpot_s: float | None = None
    price_per_hour_usd: float | None = None

    def describe(self) -> str:
        parts = []
        if self.max_kl is not None:
            parts.append(f"KL <= {self.max_kl:g}")
        if self.max_perplexity_increase is not None:
            parts.append(f"perplexity +{100 * self.max_perplexity_increase:g} % at most")
        if self.min_token_match is not None:
            parts.append(f"token match >= {self.min_token_match:g}")
        if self.max_ttft_s is not None:
            parts.append(f"TTFT <= {seconds(self.max_ttft_s)}")
        if self.max_tpot_s is not None:
            parts.append(f"time per output token <= {seconds(self.max_tpot_s)}")
        if self.price_per_hour_usd is not None:
            parts.append(f"price ${self.price_per_hour_usd:g}/h")
        return ", ".join(parts) or "no limits"


DEFAULT_LIMITS = Limits()


# ------------------------------------------------------------------------------ parsing limits

_LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


def parse_latency(text: str) -> float:
    """Seconds from ``"200ms"``, ``"0.2s"`` or ``"150us"``: a unit is required, the value above 0."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|ms|us|µs)\s*", str(text))
    if not match:
        raise ValueError(f"{text!r} is not a latency with a unit (e.g. 200ms, 0.5s)")
    value = float(match[1]) * _LATENCY_UNITS[match[2]]
    if value <= 0:
        raise ValueError(f"{text!r}: a latency limit must be above 0")
    return value


def parse_percent(text: str) -> float:
    """A fraction from ``"2%"``, ``"2"`` (percent) : 0 or above."""
    cleaned = str(text).strip().removesuffix("%").strip()
    try:
        value = float(cleaned) / 100
    except ValueError:
        raise ValueError(f"{text!r} is not a percentage (e.g. 2%)") from None
    if not (0 <= value < float("inf")):
        raise ValueError(f"{text!r}: a percentage must be 0 or above")
    return value


def parse_nonnegative(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number ({what})") from None
    if not (0 <= value < float("inf")):
        raise ValueError(f"{text!r}: {what} must be a finite number, 0 or above")
    return value


def parse_share(text: str, what: str) -> float:
    """A share of something, from 0 to 1 (a token match: 0.9 is 90 % of the tokens)."""
    value = parse_nonnegative(text, what)
    if value > 1:
        raise ValueError(f"{text!r}: {what} is a share from 0 to 1 (e.g. 0.9 for 90 %)")
    return value


def seconds(value: float) -> str:
    return f"{value * 1e3:.0f} ms" if value >= 0.01 else f"{value * 1e3:.2f} ms"
