"""llama-server's scheduling step, and the inter-token latency a ``-b`` gives while prompts arrive.

Why: llama-server builds one batch per step: one token from every decoding slot, then prompt tokens of
waiting slots until the batch holds ``-b`` (``n_batch``) tokens; the rest of a prompt waits for the
next step. Every decoding slot's next token waits for the whole step, so while a prompt of P tokens
is prefilled, each decoding slot sits through ceil(P / b) "mixed" steps of up to b + active tokens.
With the default ``-b`` 2048 a whole prompt lands in one step (one long stall); a small ``-b`` splits
it into shorter stalls, more of them: once stalls reach the tail the p95 ITL is smaller, but it
reaches the tail at a lower rate, and the prompt's own TTFT grows a little.

A step's time against the tokens in it is close to a line on a CPU: a fixed part (reading the
weights once, the graph, the threads' barriers) and a part per token (the matmuls). ``StepCurve``
holds that line, fitted by least squares to measured (tokens, seconds) samples (llama-bench:
``trials.engines.llama_server.step_curve``); ``predict_itl_p95`` and ``tpot_cannot_meet`` turn it
into a predicted p95 ITL per ``-b`` and a skip rule, logged beside the measured ones.

Pure arithmetic: no torch, no numpy (the dashboard imports it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_STEP_TOKENS = 2048      # llama-server's -b when none is given (Stack.step_tokens 0)
MIN_STEP_TOKENS = 64            # llama.cpp raises a smaller -b to this (llama.cpp#14046)
MIXED_SHARE_P95 = 0.05          # a gap kind holding at least this share of all gaps sets the p95
FIXED_POINT_ROUNDS = 100


@dataclass(frozen=True)
class StepCurve:
    """Seconds of one step against the tokens in it: ``t(n) = fixed_s + per_token_s * n``.

    ``samples``: the (tokens, seconds) pairs it was fitted to; ``residual``: the fit's root mean
    square relative residual (0.05: the measured steps stray ~5 % from the line)."""

    fixed_s: float
    per_token_s: float
    samples: tuple[tuple[int, float], ...] = ()
    residual: float = 0.0

    @classmethod
    def fit(cls, samples) -> StepCurve:
        """Least squares over (tokens, seconds) pairs, on relative residuals (weights 1 / seconds^2):
        the samples span ~1 to 256 tokens, and plain least squares would fit the long steps and miss
        the decode step (a few tokens) by its own size, while the ITL is made of both. At least two
        distinct token counts, every seconds positive (ValueError otherwise). Exact on data that lie
        on a line. A negative slope (noise on a nearly flat curve) is not a step that gets cheaper
        with more tokens: the curve is then flat."""
        pairs = tuple(sorted((int(n), float(s)) for n, s in samples))
        if len({n for n, _ in pairs}) < 2:
            raise ValueError(f"a step curve needs samples at two token counts or more, got {pairs}")
        if any(n < 1 or not (s > 0 and math.isfinite(s)) for n, s in pairs):
            raise ValueError(f"a step's tokens must be >= 1 and its seconds positive and finite, got {pairs}")
        weights = [1 / s ** 2 for _, s in pairs]
        total = sum(weights)
        mean_n = sum(w * n for w, (n, _) in zip(weights, pairs)) / total
        mean_s = sum(w * s for w, (_, s) in zip(weights, pairs)) / total
        slope = (sum(w * (n - mean_n) * (s - mean_s) for w, (n, s) in zip(weights, pairs))
                 / sum(w * (n - mean_n) ** 2 for w, (n, _) in zip(weights, pairs)))
        slope = max(slope, 0.0)
        fixed = mean_s - slope * mean_n
        residual = math.sqrt(sum(((fixed + slope * n) / s - 1) ** 2 for n, s in pairs) / len(pairs))
        return cls(fixed, slope, pairs, residual)

    def seconds(self, tokens: float) -> float:
        """One step holding ``tokens`` tokens (a fractional count: the expected step)."""
        return self.fixed_s + self.per_token_s * tokens

    def with_overhead(self, seconds: float) -> StepCurve:
        """The curve with ``seconds`` more per step: a server's own work each step beyond the model's
        compute that llama-bench times (sampling, streaming each token over HTTP, its scheduler)."""
        return StepCurve(self.fixed_s + max(0.0, seconds), self.per_token_s, self.samples, self.residual)

    def as_dict(self) -> dict:
        return {"fixed_s": self.fixed_s, "per_token_s": self.per_token_s, "residual": self.residual,
                "samples": [list(p) for p in self.samples]}


def effective_step_tokens(step_tokens: int) -> int:
    """The ``-b`` llama-server runs with: 0 is its default (2048), below 64 is raised to 64."""
    if not isinstance(step_tokens, int) or step_tokens < 0:
        raise ValueError(f"step_tokens must be an integer >= 0 (0: the server's default), not {step_tokens!r}")
    return DEFAULT_STEP_TOKENS if step_tokens == 0 else max(MIN_STEP_TOKENS, step_tokens)


def _check(slots: int, prompt_tokens: int, new_tokens: int) -> None:
    for name, value in (("slots", slots), ("prompt_tokens", prompt_tokens), ("new_tokens", new_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, not {value!r}")


@dataclass(frozen=True)
class ItlPrediction:
    """What ``predict_itl_p95`` worked out, for a note beside the number."""

    itl_s_p95: float
    decode_step_s: float         # a step of the decoding slots alone
    mixed_step_s: float          # a step that also carries a prompt chunk of min(b, P) tokens
    mixed_share: float           # share of a decoding slot's gaps that are mixed steps
    active: float                # expected slots decoding (Little's law, 1..slots)
    step_tokens: int             # the -b in effect


def predict_itl(curve: StepCurve, step_tokens: int, slots: int, prompt_tokens: int, new_tokens: int,
                rate_rps: float) -> ItlPrediction:
    """The whole prediction behind ``predict_itl_p95`` (see there)."""
    _check(slots, prompt_tokens, new_tokens)
    if not (rate_rps >= 0 and math.isfinite(rate_rps)):
        raise ValueError(f"rate_rps must be finite and >= 0, not {rate_rps!r}")
    b = effective_step_tokens(step_tokens)
    mixed_per_s = rate_rps * math.ceil(prompt_tokens / b)
    active, share = 1.0, 0.0
    for _ in range(FIXED_POINT_ROUNDS):     # monotone from 1 and bounded by slots: it converges
        decode_s = curve.seconds(active)
        mixed_s = curve.seconds(active + min(b, prompt_tokens))
        room = 1.0 - mixed_per_s * (mixed_s - decode_s)
        share = 1.0 if room <= 0 else min(1.0, mixed_per_s * decode_s / room)
        mean_gap_s = share * mixed_s + (1 - share) * decode_s
        following = min(float(slots), max(1.0, rate_rps * new_tokens * mean_gap_s))
        if abs(following - active) < 1e-9:
            break
        active = following
    decode_s, mixed_s = curve.seconds(active), curve.seconds(active + min(b, prompt_tokens))
    p95 = mixed_s if share >= MIXED_SHARE_P95 else decode_s
    return ItlPrediction(p95, decode_s, mixed_s, share, active, b)


def predict_itl_p95(curve: StepCurve, step_tokens: int, slots: int, prompt_tokens: int, new_tokens: int,
                    rate_rps: float) -> float:
    """The p95 inter-token latency (seconds) llama-server's decoding slots see at ``rate_rps``
    Poisson arrivals of P = ``prompt_tokens``-token prompts asking ``new_tokens`` tokens each, with
    ``-b`` = ``step_tokens`` (0: the default 2048; floored at 64) and ``slots`` parallel slots.

    A decoding slot's gaps are steps of two kinds: decode-only steps, t_d = t(active), and mixed
    steps that also carry a prompt chunk, t_m = t(active + min(b, P)) (the largest chunk; a prompt
    takes ceil(P / b) of them). Mixed steps come at m = rate x ceil(P / b) per second, and Poisson
    arrivals see a decoding slot as time does, so the share of its gaps that are mixed is f = m x
    (mean gap) with mean gap = f t_m + (1 - f) t_d: f = m t_d / (1 - m (t_m - t_d)), and 1 once the
    mixed steps fill the time (saturated). The p95 is t_m when f >= 5 %, else t_d: the nearest-rank
    p95 of a two-valued gap distribution, a step in the rate (a smaller b has more, shorter mixed
    steps: it reaches the step at a lower rate, and steps to less). ``active``, the expected slots
    decoding, is Little's law: rate x the request's decode time (new_tokens mean gaps), between 1 and
    ``slots``, solved as a fixed point. Not modelled: several prompts prefilled in one step, the
    context's attention cost, HTTP and sampling work outside the step."""
    return predict_itl(curve, step_tokens, slots, prompt_tokens, new_tokens, rate_rps).itl_s_p95


def prompt_chunks(prompt_tokens: int, step_tokens: int) -> list[int]:
    """The prompt tokens each step carries while a P-token prompt is prefilled with ``-b`` = b:
    ceil(P / b) chunks, all b but the last."""
    b = effective_step_tokens(step_tokens)
    return [min(b, prompt_tokens - start) for start in range(0, prompt_tokens, b)]


def tpot_one_arrival(curve: StepCurve, step_tokens: int, slots: int, prompt_tokens: int, new_tokens: int) -> float:
    """The TPOT (s) of a request during whose decode one other prompt arrives (``tpot_cannot_meet``'s
    rule); a decode step alone with one slot; 0 below two new tokens."""
    _check(slots, prompt_tokens, new_tokens)
    if new_tokens < 2:
        return 0.0
    if slots == 1:
        return curve.seconds(1)
    gaps, decode_s = new_tokens - 1, curve.seconds(2)
    stall_s = sum(curve.seconds(c + 1) - decode_s for c in prompt_chunks(prompt_tokens, step_tokens))
    return (gaps * decode_s + stall_s) / gaps


def tpot_cannot_meet(curve: StepCurve, step_tokens: int, slots: int, prompt_tokens: int, new_tokens: int,
                     tpot_limit_s: float) -> str | None:
    """Why ``-b`` = ``step_tokens`` cannot meet the TPOT limit, in one line (ms); None when it can.

    The rule: a ``-b`` cannot meet the limit when even ONE other prompt arriving during a request's
    decode puts that request over it. That request's TPOT is then its (new_tokens - 1) gaps of a
    two-slot decode step t(2), plus the prompt's ceil(P / b) mixed steps' extra time, t(c + 1) - t(2)
    for each chunk c (``prompt_chunks``: b tokens, the last one the rest), over (new_tokens - 1).
    Any load at all brings such arrivals, so a configuration failing this has no capacity worth
    searching for. With one slot no prompt joins a decode (it queues): the TPOT is then t(1). A
    request of one token has no gaps: nothing to miss.

    On a linear curve the extra time is the prompt's per-token cost whatever b is (a smaller b
    spreads the same work over more, shorter stalls): ``-b`` shapes the ITL's tail
    (``predict_itl_p95``) far more than the TPOT."""
    _check(slots, prompt_tokens, new_tokens)
    if not (tpot_limit_s > 0):
        raise ValueError(f"tpot_limit_s must be positive, not {tpot_limit_s!r}")
    b = effective_step_tokens(step_tokens)
    if new_tokens < 2:
        return None
    if slots == 1:
        tpot = curve.seconds(1)
        if tpot <= tpot_limit_s:
            return None
        return (f"-b {b}, 1 slot: a decode step alone takes {tpot * 1e3:.1f} ms, over the "
                f"{tpot_limit_s * 1e3:.0f} ms TPOT limit")
    gaps, chunks = new_tokens - 1, prompt_chunks(prompt_tokens, b)
    decode_s = curve.seconds(2)
    stall_s = sum(curve.seconds(c + 1) - decode_s for c in chunks)
    tpot = (gaps * decode_s + stall_s) / gaps
    if tpot <= tpot_limit_s:
        return None
    return (f"-b {b}: one {prompt_tokens}-token prompt arriving during a {new_tokens}-token decode adds "
            f"{stall_s * 1e3:.1f} ms over {len(chunks)} mixed step(s) to {gaps} gaps of {decode_s * 1e3:.1f} ms: "
            f"TPOT {tpot * 1e3:.1f} ms > the {tpot_limit_s * 1e3:.0f} ms limit")
