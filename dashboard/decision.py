"""The decision: which stack should each model run, within a quality budget, latency limits and a price.

One function, ``decide``, and two faces that print what it returns: the ``llm-recommend`` command
(``dashboard.recommend``) and the best-stack card of the section that declares ``DECIDES = True``
(the whole-stacks section), both first as one table per model (``dashboard.decision_table``). It reads that group's runs (the latest finished run per model, stack and device; every stack is ONE combined trial) and
picks, per model, among the stacks within every limit:

* **fastest single-stream**: the highest decode tok/s at batch 1 (what one user waits on);
* **highest throughput**: the highest aggregate tok/s at batch > 1, said so (many users at once);
* **smallest**: the lowest peak memory (ties: the faster);
* **cheapest per 1M output tokens**: with a price per hour, the most tokens per hour, any batch.

Each pick comes with its 95 % interval, its quality numbers, why the next-best lost (the runner-up
within the limits, and whether its interval overlaps; the stacks ranked above it that the limits
excluded, and what each misses), the command that reruns the trial and the code that turns the stack on for the
engine it ran on. Where nothing passes: the closest stack and the limit(s) it misses.

Quality is measured against the model's reference precision (tag ``reference_precision``), by
teacher-forced scores, not by greedy text: greedy bf16 output drifts from fp32's within a few tokens
on most models while its next-token distributions differ by KL <= 0.0013, so token match measures
divergence, not loss; it is shown, and is a limit only when asked (``min_token_match``). The limits
and their defaults: ``dashboard.limits``; each stack's facts (quality, latency, cost, misses,
reproduction): ``dashboard.stack_facts``. This module picks and says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from dashboard.limits import DEFAULT_LIMITS, Limits, seconds
from dashboard.stack_facts import misses_with_excess, cost, engine, latency, num, quality, reproduce
from trials.stats.runs import latest

MB = 2**20


# ------------------------------------------------------------------------------ the decision

ROLES = {   # role -> (title, which stacks compete, sort key: best first)
    "speed": "fastest single-stream (batch 1)",
    "throughput": "highest throughput (batch > 1: aggregate over the batch)",
    "memory": "smallest (peak memory)",
    "cost": "cheapest per 1M output tokens",
}
OBJECTIVES = tuple(ROLES)


@dataclass
class Pick:
    role: str
    row: pd.Series
    runner_up: str = ""        # the next-best within the limits, and whether it is a real difference
    excluded: str = ""         # the stacks ranked above it that the limits excluded, and what each misses

    @property
    def title(self) -> str:
        return ROLES[self.role]


@dataclass
class Decision:
    model: str
    limits: Limits
    rows: pd.DataFrame                       # every finished stack of the model, with ``name`` and ``peak_mb``
    picks: list[Pick] = field(default_factory=list)
    closest: tuple[pd.Series, list[str]] | None = None
    failed: pd.DataFrame | None = None
    note: str = ""                           # a role that has no candidate, e.g. no batched stack

    def pick(self, role: str) -> Pick | None:
        return next((p for p in self.picks if p.role == role), None)


def latest_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The latest finished run per model, stack and device, with ``name`` and ``peak_mb``."""
    if frame.empty:
        return frame.assign(name=pd.Series(dtype=str), peak_mb=pd.Series(dtype=float))
    rows = latest(frame, ["model", "tags.stack_name", "device"], finished=True)
    return rows.assign(peak_mb=pd.to_numeric(rows["peak_memory_bytes"], errors="coerce") / MB,
                       name=rows["tags.stack_name"].astype(str))


def _speed(row: pd.Series) -> str:
    low, high = num(row, "tok_per_s_ci_low"), num(row, "tok_per_s_ci_high")
    interval = "one repeat: no interval" if math.isnan(low) else f"95 % {low:.1f}-{high:.1f}"
    return f"{num(row, 'tok_per_s'):.1f} tok/s ({interval})"


def _overlap(a: pd.Series, b: pd.Series) -> bool | None:
    lows, highs = (num(a, "tok_per_s_ci_low"), num(b, "tok_per_s_ci_low")), (num(a, "tok_per_s_ci_high"), num(b, "tok_per_s_ci_high"))
    if any(math.isnan(v) for v in lows + highs):
        return None
    return max(lows) <= min(highs)


def _ordered(rows: pd.DataFrame, role: str, limits: Limits) -> pd.DataFrame:
    speed = pd.to_numeric(rows["tok_per_s"], errors="coerce")
    batch = pd.to_numeric(rows.get("batch_size", pd.Series(1, index=rows.index)), errors="coerce").fillna(1)
    if role == "speed":
        return rows[batch <= 1].assign(_key=-speed[batch <= 1]).sort_values("_key")
    if role == "throughput":
        return rows[batch > 1].assign(_key=-speed[batch > 1]).sort_values("_key")
    if role == "memory":
        return rows.assign(_mb=rows["peak_mb"], _s=-speed).sort_values(["_mb", "_s"])
    costs = rows.apply(lambda r: cost(r, limits), axis=1) if len(rows) else pd.Series(dtype=float)
    return rows[costs.notna()].assign(_key=costs[costs.notna()]).sort_values("_key")


def _runner_up(role: str, best: pd.Series, nxt: pd.Series | None, limits: Limits) -> str:
    if nxt is None:
        return "no other stack within the limits"
    if role == "memory":
        return (f"{nxt['name']} at {num(nxt, 'peak_mb'):.1f} MB vs {num(best, 'peak_mb'):.1f} MB "
                "(one peak per run: no interval)")
    if role == "cost":
        return (f"{nxt['name']} at ${cost(nxt, limits):.3f} vs ${cost(best, limits):.3f} per 1M tokens "
                f"(from {_speed(nxt)})")
    overlap = _overlap(best, nxt)
    verdict = {True: "the intervals overlap: the difference is within the noise",
               False: f"x{num(best, 'tok_per_s') / num(nxt, 'tok_per_s'):.2f} slower, the intervals do not overlap",
               None: "no interval to compare"}[overlap]
    return f"{nxt['name']} at {_speed(nxt)}; {verdict}"


def _excluded(best: pd.Series | None, every: pd.DataFrame, found: dict, shown: int = 3) -> str:
    """The stacks ranked above the pick in its role that the limits excluded, each with what it misses
    (``found``: row index -> its misses)."""
    above = []
    for index, row in every.iterrows():
        if best is not None and row["name"] == best["name"]:
            break
        above.append(f"{row['name']} ({'; '.join(m.text for m in found[index])})")
    more = f"; and {len(above) - shown} more" if len(above) > shown else ""
    return "; ".join(above[:shown]) + more


def decide_model(rows: pd.DataFrame, model: str, limits: Limits = DEFAULT_LIMITS,
                 failed: pd.DataFrame | None = None) -> Decision:
    """The decision for one model from its latest finished stacks (``latest_rows``)."""
    mine = rows[rows["model"] == model]
    decision = Decision(model, limits, mine, failed=failed)
    found = {index: misses_with_excess(row, mine, limits) for index, row in mine.iterrows()}    # each row's, once
    ok = mine[[not found[index] for index in mine.index]]
    notes = []
    for role in OBJECTIVES:
        if role == "cost" and limits.price_per_hour_usd is None and "price_per_hour_usd" not in mine:
            continue
        every, within = _ordered(mine, role, limits), _ordered(ok, role, limits)
        if within.empty:
            if not every.empty and not ok.empty:
                notes.append(f"{ROLES[role]}: none within the limits")
            elif role == "throughput" and every.empty:
                notes.append("no batched stack (batch > 1) was measured")
            continue
        best = within.iloc[0]
        decision.picks.append(Pick(role, best, _runner_up(role, best, within.iloc[1] if len(within) > 1 else None, limits),
                                   _excluded(best, every, found)))
    if ok.empty and not mine.empty:      # the closest: fewest limits missed, then the least far past them
        index = min(found, key=lambda i: (len(found[i]), max(m.excess for m in found[i])))
        decision.closest = (mine.loc[index], [m.text for m in found[index]])
    decision.note = "; ".join(notes)
    return decision


def decide(frame: pd.DataFrame, limits: Limits = DEFAULT_LIMITS, models: list[str] | None = None) -> list[Decision]:
    """Every model's decision from the stacks group's runs (any status: FAILED ones are listed)."""
    if frame.empty or "tags.stack_name" not in frame.columns:
        return []
    rows = latest_rows(frame)
    failed = frame[frame["status"] == "FAILED"] if "status" in frame.columns else frame.iloc[:0]
    chosen = models or sorted(rows["model"].dropna().unique())
    out = []
    for model in chosen:
        mine_failed = failed[failed["model"] == model]
        mine_failed = latest(mine_failed, "tags.stack_name")
        out.append(decide_model(rows, model, limits, mine_failed))
    return out


# ------------------------------------------------------------------------------ what a pick says

def facts(row: pd.Series, rows: pd.DataFrame, limits: Limits) -> list[str]:
    """The numbers behind one stack, as the card and the command show them."""
    q = quality(row, rows)
    lines = [f"{_speed(row)}, {num(row, 'peak_mb'):.1f} MB peak, batch {num(row, 'batch_size'):.0f}, "
             f"engine {engine(row)}"]
    base = num(row, "speedup_vs_baseline")
    if not math.isnan(base):
        lines.append(f"x{base:.2f} speed, x{num(row, 'memory_vs_baseline'):.2f} memory vs the base stack "
                     "measured in the same worker")
    if q.measured:
        ppl = "" if math.isnan(q.perplexity_ratio) else f", perplexity {100 * (q.perplexity_ratio - 1):+.1f} %"
        quality_line = f"quality vs {row.get('tags.reference_precision', 'the reference')}: KL {q.kl:.4f}{ppl}"
        lines.append(quality_line + (f" ({q.source})" if q.source else ""))
    else:
        lines.append("quality: not measured")
    match = num(row, "fidelity_token_match")
    if not math.isnan(match):
        lines.append(f"greedy token match {match:.3f}, first divergence at token "
                     f"{num(row, 'first_divergence_token'):.0f} (information, not a limit)")
    tails = [f"{label} {seconds(t.value)} ({t.how})" for metric, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"))
             for t in [latency(row, metric)] if t]
    if tails:
        lines.append("latency: " + ", ".join(tails))
    dollars = cost(row, limits)
    if not math.isnan(dollars):
        price = limits.price_per_hour_usd or num(row, "price_per_hour_usd")
        lines.append(f"${dollars:.3f} per 1M output tokens at ${price:g}/h")
    energy = num(row, "energy_j_per_output_token")
    if not math.isnan(energy):
        lines.append(f"energy {energy:.3f} J per output token (measured: {row.get('tags.energy_method', '')})")
    return lines


def as_dict(decision: Decision) -> dict:
    """The decision as plain data (``llm-recommend --json``; the card test compares with it)."""
    def stack(row: pd.Series) -> dict:
        command, code = reproduce(row)
        q = quality(row, decision.rows)
        return {"stack": row["name"], "tok_per_s": num(row, "tok_per_s"),
                "tok_per_s_ci": [num(row, "tok_per_s_ci_low"), num(row, "tok_per_s_ci_high")],
                "peak_mb": num(row, "peak_mb"), "batch_size": num(row, "batch_size"),
                "engine": engine(row), "kl_divergence": q.kl,
                "perplexity_ratio": q.perplexity_ratio, "quality_source": q.source or "this run",
                "usd_per_million_output_tokens": cost(row, decision.limits),
                "facts": facts(row, decision.rows, decision.limits), "reproduce": command, "code": code}

    return {"model": decision.model, "limits": decision.limits.describe(),
            "picks": {p.role: {**stack(p.row), "title": p.title, "runner_up": p.runner_up, "excluded": p.excluded}
                      for p in decision.picks},
            "closest": None if decision.closest is None else
            {**stack(decision.closest[0]), "misses": decision.closest[1]},
            "failed": [] if decision.failed is None else
            [{"stack": str(r.get("tags.stack_name", "?")), "error": str(r.get("tags.error", ""))[:300]}
             for _, r in decision.failed.iterrows()],
            "note": decision.note}

