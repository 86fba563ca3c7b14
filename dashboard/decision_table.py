"""The decision at a glance: one compact table per model, what ``llm-recommend`` prints by default and
the best-stack card draws first.

One line per distinct stack, naming every pick it wins (the fastest stack is often the smallest and
the cheapest too: one line, not three copies), with the numbers a choice turns on: engine, tok/s with
its 95 % interval, peak memory, quality against the reference, per-request latency and $/1M output
tokens. The served pick (``dashboard.served``: most requests/s within the SLO) is a line of the same
table. Under the table, why each pick's runner-up lost. The long parts (each pick's code and the
command that reruns it) are behind ``--details`` and, on the card, behind a click.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from dashboard.decision import Decision
from dashboard.limits import Limits, seconds
from dashboard.stack_facts import cost, engine, latency, num, quality, reproduce
from dashboard.served import ServedDecision, why_others
from trials.measurement.cost import usd_per_million_tokens

MB = 2**20
COLUMNS = ("pick", "stack", "engine", "tok/s (95 %)", "peak MB", "quality vs reference", "TTFT / TPOT p95",
           "$/1M tokens")
SHORT = {"speed": "fastest", "throughput": "throughput", "memory": "smallest", "cost": "cheapest",
         "served": "served"}


@dataclass
class Line:
    """One stack of the table and the picks it wins."""

    picks: list[str]
    stack: str
    engine: str
    speed: str
    peak: str
    quality: str
    latency: str
    cost: str
    code: str = ""              # behind --details / a click: the code that turns it on
    command: str = ""           # ... and the command that reruns it (a server: its command line)

    def cells(self) -> list[str]:
        return [", ".join(self.picks), self.stack, self.engine, self.speed, self.peak, self.quality,
                self.latency, self.cost]


@dataclass
class Glance:
    model: str
    limits: str
    lines: list[Line] = field(default_factory=list)
    why: list[str] = field(default_factory=list)        # per pick: why its runner-up lost
    notes: list[str] = field(default_factory=list)      # excluded stacks, roles without a pick, FAILED runs

    def rows(self) -> list[dict]:
        """The table as plain data (``llm-recommend --json``, the card's test)."""
        return [dict(zip(COLUMNS, line.cells())) for line in self.lines]

    def shown(self) -> tuple[list[str], list[list[str]]]:
        """(columns, cells) as printed and drawn: a column empty on every line (no price: no $/1M) is left out."""
        cells = [line.cells() for line in self.lines]
        keep = [i for i in range(len(COLUMNS)) if i < 2 or any(row[i] for row in cells)]
        return [COLUMNS[i] for i in keep], [[row[i] for i in keep] for row in cells]


def _number(value: float) -> str:
    """A tok/s: one decimal, or three significant digits past 100,000 (a wild interval's bound)."""
    return f"{value:.1f}" if abs(value) < 1e5 else f"{value:.3g}"


def _speed(row: pd.Series) -> str:
    low, high = num(row, "tok_per_s_ci_low"), num(row, "tok_per_s_ci_high")
    interval = "1 repeat" if math.isnan(low) else f"{_number(low)}-{_number(high)}"
    return f"{_number(num(row, 'tok_per_s'))} ({interval})"


def _quality(row: pd.Series, rows: pd.DataFrame) -> str:
    q = quality(row, rows)
    if not q.measured:
        return "not measured"
    if q.source == "the reference precision itself":
        return "reference"
    ppl = "" if math.isnan(q.perplexity_ratio) else f", ppl {100 * (q.perplexity_ratio - 1):+.1f} %"
    text = f"KL {q.kl:.4f}{ppl}"
    return text + (" (its base's)" if q.source else "")


def _latency(row: pd.Series) -> str:
    tails = [latency(row, metric) for metric in ("ttft_s", "tpot_s")]
    if not any(tails):
        return ""
    text = " / ".join(seconds(t.value) if t else "n/a" for t in tails)
    return text + (" (max)" if any(t and t.how.startswith("max") for t in tails) else "")


def _dollars(value: float) -> str:
    return "" if math.isnan(value) else f"${value:.3f}"


def _stack_line(row: pd.Series, decision: Decision, picks: list[str]) -> Line:
    command, code = reproduce(row)
    return Line(picks, str(row["name"]), engine(row), _speed(row), f"{num(row, 'peak_mb'):.1f}",
                _quality(row, decision.rows), _latency(row), _dollars(cost(row, decision.limits)), code, command)


def _stack_lines(decision: Decision, objective: str) -> tuple[list[Line], list[str], list[str]]:
    """(lines, why, notes) of the in-process decision: one line per distinct stack, the objective's first."""
    picks = sorted(decision.picks, key=lambda p: p.role != objective)
    lines: dict[str, Line] = {}
    why, notes = [], []
    for pick in picks:
        name = str(pick.row["name"])
        if name in lines:
            lines[name].picks.append(SHORT[pick.role])
        else:
            lines[name] = _stack_line(pick.row, decision, [SHORT[pick.role]])
        why.append(f"{SHORT[pick.role]}: {pick.runner_up}")
        if pick.excluded:
            notes.append(f"{SHORT[pick.role]}, ranked above it but excluded by the limits: {pick.excluded}")
    if decision.closest is not None:
        row, missed = decision.closest
        lines[str(row["name"])] = _stack_line(row, decision, ["closest (none within the limits)"])
        why.append(f"closest misses: {'; '.join(missed)}")
    if decision.note:
        notes.append(f"note: {decision.note}")
    if decision.failed is not None and len(decision.failed):
        notes.append("FAILED: " + "; ".join(f"{r.get('tags.stack_name', '?')} ({_first_line(r.get('tags.error'))})"
                                            for _, r in decision.failed.iterrows()))
    return list(lines.values()), why, notes


def _first_line(error, width: int = 80) -> str:
    return (str(error).splitlines() or ["?"])[0][:width] if isinstance(error, str) and error else "?"


def _served_line(served: ServedDecision, limits: Limits) -> tuple[Line | None, str]:
    """The served pick (or, where none is within the SLO, the closest point) as a line, and why."""
    slo = f"p95 TTFT <= {seconds(served.slo.ttft_s)}, TPOT <= {seconds(served.slo.tpot_s)}" if served.slo else "the SLO"
    if served.pick is not None:
        chosen, point, label = served.pick, served.pick.point, f"served ({served.pick.rate_rps:.2f} req/s)"
    elif served.closest is not None:
        chosen, point, factor = served.closest
        label = f"served: closest, x{factor:.2f} the SLO"
    else:
        return None, f"served: none within {slo} and the quality budget: {served.why}"
    row, q = chosen.row, chosen.quality
    weights, kv = num(row, "weights_bytes"), num(row, "kv_cache_allocated_bytes")
    price = limits.price_per_hour_usd or num(row, "price_per_hour_usd")
    tok = point.get("output_tok_per_s", math.nan)
    line = Line([label], chosen.stack, str(row.get("engine") or ""),
                f"{tok:.1f} (at {point['achieved_rps']:.2f} req/s)",
                "" if math.isnan(weights) else f"{(weights + (0 if math.isnan(kv) else kv)) / MB:.1f} w+KV",
                f"KL {q.kl:.4f} (in-process)" if q.measured else "not measured",
                f"{seconds(point['ttft_s_p95'])} / {seconds(point['tpot_s_p95'])}",
                _dollars(usd_per_million_tokens(price, tok) if price and price == price and tok > 0 else math.nan),
                "", str(row.get("tags.server_command") or ""))
    if served.pick is None:      # the line is the closest stack: why the others are not it
        return line, f"served (none within {slo}): the others: {why_others(chosen, served.candidates)}"
    return line, f"served (most requests/s within {slo}): next: {served.why}"


def glance(decision: Decision | None, served: ServedDecision | None, limits: Limits,
           objective: str = "speed") -> Glance:
    """One model's table from its in-process decision and its served decision (either may be None)."""
    out = Glance(decision.model if decision is not None else served.model, limits.describe())
    if decision is not None:
        out.lines, out.why, out.notes = _stack_lines(decision, objective)
    if served is not None:
        line, why = _served_line(served, limits)
        out.lines += [line] if line else []
        (out.why if line else out.notes).append(why)
    return out


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def render(table: Glance, head: str) -> str:
    """The table as text: ``head``, the aligned table, then why each runner-up lost and the notes."""
    lines = [head]
    if table.lines:
        columns, cells = table.shown()
        lines += [f"  {line}" for line in _aligned([columns, *cells])]
    if table.why:
        lines.append("  why the runner-up lost:")
        lines += [f"    {text}" for text in table.why]
    lines += [f"  {text}" for text in table.notes]
    return "\n".join(lines)
