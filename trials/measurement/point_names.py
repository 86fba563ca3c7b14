"""The names of a served run's per-point metrics: written by the serving and capacity runners, read
back by the dashboard, the decision and the capacity search, all through this module.

A served trial drives its server at several load points and logs each point's summary under a
prefix: ``c<N>_`` closed loop with N requests in flight (``c1_``: one request at a time, the single
stream), ``r<i>_`` the i-th Poisson rate of the serving ladder, ``p<i>_`` the i-th capacity probe,
and ``p<i>r_`` that probe's repeat (run again after a noisy neighbour; kept in the artifact).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

CONCURRENCY, RATE, PROBE = "c", "r", "p"
_NAME = re.compile(r"^(?P<kind>[crp])(?P<number>\d+)(?P<repeat>r?)_(?P<metric>.+)$")


@dataclass(frozen=True, order=True)
class Point:
    """One load point of a run: its kind, its number (concurrency, or 1-based order) and whether it
    is a probe's repeat."""

    kind: str
    number: int
    repeat: bool = False

    @property
    def prefix(self) -> str:
        return f"{self.kind}{self.number}{'r' if self.repeat else ''}_"

    @property
    def name(self) -> str:
        """The point as the artifact and the log say it: ``c1``, ``r2``, ``p3r``."""
        return self.prefix[:-1]

    def metric(self, name: str) -> str:
        return self.prefix + name


SINGLE = Point(CONCURRENCY, 1)          # one request at a time


def concurrency(level: int) -> Point:
    return Point(CONCURRENCY, int(level))


def rate(index: int) -> Point:
    return Point(RATE, int(index))


def probe(index: int, repeat: bool = False) -> Point:
    return Point(PROBE, int(index), repeat)


def parse(column: str) -> tuple[Point, str] | None:
    """``"r2_ttft_s_p95"`` -> ``(Point("r", 2), "ttft_s_p95")``; None for a column that names no point."""
    match = _NAME.match(str(column))
    if match is None or (match["repeat"] and match["kind"] != PROBE):
        return None
    return Point(match["kind"], int(match["number"]), bool(match["repeat"])), match["metric"]


def split(run: Mapping, kinds: str = CONCURRENCY + RATE + PROBE, repeats: bool = False) -> dict[Point, dict]:
    """A run's per-point metrics of ``kinds``, by point in order, each without its prefix; missing
    values (None, NaN) left out, and repeats unless asked for."""
    out: dict[Point, dict] = {}
    for column, value in run.items():
        parsed = parse(column)
        if parsed is None or parsed[0].kind not in kinds or (parsed[0].repeat and not repeats):
            continue
        if value is None or (isinstance(value, float) and value != value):
            continue
        out.setdefault(parsed[0], {})[parsed[1]] = value
    return dict(sorted(out.items()))
