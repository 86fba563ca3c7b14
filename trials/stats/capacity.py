"""Capacity under an SLO: the highest Poisson rate at which a served configuration still gives at
least ``target`` (90 %) of its requests both limits (DistServe's goodput; MLPerf's server scenario
and GuideLLM's goodput profile search for it the same way).

The search is the peers': double from a low rate until a probe misses, then bisect (in log space)
between the highest rate that passed and the lowest that missed until they are within ``precision``
(10 %). A probe is one open-loop point; whether it passes is its attainment (the share of its
requests within both limits) against the target, reported with a 95 % bootstrap interval. Where the
first probe already misses, the rate is halved until one passes. The capacity is the highest
passing rate below the lowest missing one; its interval runs from the highest rate whose
attainment interval lies wholly at or above the target (0 if none) to the lowest missing rate. A
search that runs out of time before the bracket is that narrow reports its highest passing rate as
a lower bound, and says so. Pure: the probe is a function the caller gives (``rate -> Probe``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

TARGET = 0.9                 # share of requests within both limits (DistServe's 90 %)
PRECISION = 0.10             # the bracket's top over its bottom, at most 1 + this
MAX_PROBES = 12              # a search that has not converged by then stops (a lower bound)
MAX_HALVINGS = 4             # below start / 2**4 a configuration serves next to nothing: capacity ~0


@dataclass
class Probe:
    """One open-loop point at ``rate`` req/s: its attainment with a 95 % interval, and whether it passed."""

    rate: float
    attainment: float
    low: float
    high: float
    passed: bool
    point: str = ""                      # the run's point name (``p3``)
    repeated: bool = False               # run again once: something outside the trial took CPU
    outside_cpu_cores: float = math.nan
    stopped: bool = False                # stopped once it could not pass (its attainment: the most it could reach)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Capacity:
    status: str                          # "measured" | "lower_bound"
    rps: float
    low: float
    high: float                          # NaN: no probe missed (a lower bound)
    probes: list[Probe]
    note: str

    @property
    def at(self) -> Probe | None:
        """The probe at the capacity (None when every probe missed)."""
        return next((p for p in self.probes if p.passed and p.rate == self.rps), None)


def attainment_interval(met: list[bool], seed: int = 0, resamples: int = 2000) -> tuple[float, float, float]:
    """The share of ``met`` that is True and its 95 % percentile-bootstrap interval (a binomial
    draw per resample: the same distribution as resampling the requests)."""
    n = len(met)
    if n == 0:
        return math.nan, math.nan, math.nan
    share = sum(met) / n
    draws = np.random.default_rng(seed).binomial(n, share, size=resamples) / n
    low, high = np.quantile(draws, [0.025, 0.975])
    return share, float(low), float(high)


def find_capacity(probe: Callable[[float], Probe], start_rps: float, *, target: float = TARGET,
                  precision: float = PRECISION, time_left: Callable[[], float] = lambda: math.inf,
                  probe_seconds: Callable[[float], float] = lambda rate: 0.0,
                  max_probes: int = MAX_PROBES) -> Capacity:
    """Double from ``start_rps`` (halve where it misses), then bisect to ``precision``. Before each
    probe, ``probe_seconds(rate)`` (its expected length) is checked against ``time_left()``: a probe
    that does not fit ends the search, with what it found kept as a lower bound."""
    if not 0 < start_rps < math.inf:                 # NaN too: it would probe NaN req/s
        raise ValueError(f"start_rps must be > 0 and finite, got {start_rps}")
    probes: list[Probe] = []
    passed, missed = 0.0, math.inf          # highest passing rate, lowest missing rate
    rate, cut = start_rps, ""
    halvings = 0
    while len(probes) < max_probes:
        if probe_seconds(rate) > time_left():
            cut = (f"cut short by the budget before a probe at {rate:.3g} req/s "
                   f"(~{probe_seconds(rate):.0f} s, {max(time_left(), 0):.0f} s left)")
            break
        result = probe(rate)
        probes.append(result)
        if result.passed:
            passed = max(passed, rate)
        else:
            missed = min(missed, rate)
        if passed and missed < math.inf and missed / passed <= 1 + precision:
            break
        if not passed:
            if halvings == MAX_HALVINGS:
                break
            halvings += 1
            rate = rate / 2
        elif missed == math.inf:
            rate = rate * 2
        else:
            rate = math.sqrt(passed * missed)
    else:
        cut = f"no convergence within {max_probes} probes"
    return summarize(probes, passed, missed, target, precision, start_rps, cut)


def summarize(probes: list[Probe], passed: float, missed: float, target: float, precision: float,
              start_rps: float, cut: str) -> Capacity:
    sure = [p.rate for p in probes if p.passed and p.low >= target and p.rate <= passed]
    low = max(sure, default=0.0)
    high = missed if missed < math.inf else math.nan
    converged = passed > 0 and missed < math.inf and missed / passed <= 1 + precision
    if not passed and missed < math.inf and not cut:
        return Capacity("measured", 0.0, 0.0, high, probes,
                        f"every probe missed {100 * target:.0f} % within the SLO, down to {missed:.3g} req/s")
    if converged or (not cut and passed):
        return Capacity("measured", passed, low, high, probes,
                        f"{passed:.3g} req/s passes, {high:.3g} misses: within {100 * precision:.0f} %")
    what = f"at least {passed:.3g} req/s" if passed else "no probe passed"
    reason = cut or "the search stopped"
    return Capacity("lower_bound", passed, low, high, probes,
                    f"a lower bound: {what} after {len(probes)} probe(s); {reason}")
