"""What a token costs where the machine has a price: $/1M output tokens = price per hour / (tok/s x
3600) x 10^6, from the run's own aggregate decode throughput (a batched stack's tokens share the
hour). Only with a price the user gave (``--price-per-hour``); never a guessed price."""

from __future__ import annotations


def usd_per_million_tokens(price_per_hour_usd: float, tok_per_s: float) -> float:
    return price_per_hour_usd / (tok_per_s * 3600.0) * 1e6


def parse_price_per_hour(text: str) -> float:
    """US dollars per hour from ``"2.5"`` or ``"$2.50"``: a finite number above zero, else ValueError."""
    cleaned = str(text).strip().removeprefix("$").strip()
    try:
        value = float(cleaned)
    except ValueError:
        raise ValueError(f"{text!r} is not a price in US dollars per hour (e.g. 2.5)") from None
    if not (0 < value < float("inf")):
        raise ValueError(f"{text!r}: a price per hour must be above 0")
    return value
