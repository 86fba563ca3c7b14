"""The served pick: which stack, behind a server, sustains the most requests per second within a
latency SLO and the quality budget, per model.

It reads the serving group's runs (``trials/techniques/serving/runner.py``: one stack behind its
server, a ladder of Poisson rates, each point's p95 TTFT and time per output token with intervals)
and, for quality, the in-process runs of the engine the server builds on (``Engine.builds_on``: the
same GGUF and cache type, whose greedy tokens the serving trial compared with the server's,
``parity_token_match``). A point counts when the server kept up with it and its p95 TTFT and p95
TPOT are within the SLO (``trials.stats.serving.sustainable``); a stack's sustainable rate is its best
such point, and the pick is the stack with the highest one (goodput beside it: requests per second
within both limits). The SLO is the user's (``--max-ttft``/``--max-tpot``), else the one each run
logged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from dashboard.limits import Limits, seconds
from dashboard.stack_facts import Quality, misses_quality, num
from trials import engines
from trials.measurement import point_names
from trials.stats import runs
from trials.measurement.cost import usd_per_million_tokens
from trials.stats.serving import Slo, keeps_up, saturation_rps, sustainable



def groups_read() -> tuple[list[str], list[str]]:
    """(the groups that serve a ladder of rates, the in-process groups that run every engine: where
    quality is scored). A searched serving group (capacity) serves too, but each of its runs is one
    configuration's capacity, not a ladder: ``dashboard.capacity`` decides from it (read here, a run
    of it whose stack label equals a served stack's would replace that stack's ladder)."""
    from trials import groups

    return ([g.name for g in groups.GROUPS if g.serving and g.implemented and not g.search],
            [g.name for g in groups.GROUPS if g.engines is None and not g.serving and g.implemented])


def read(uri: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the serving runs, the in-process runs on every engine) of the store at ``uri``."""
    import tracking

    serving, in_process = groups_read()
    frames = [[tracking.runs_frame(uri, g, status=None) for g in names] for names in (serving, in_process)]
    return tuple(pd.concat(f, ignore_index=True).drop_duplicates("run_id") if any(not x.empty for x in f)
                 else pd.DataFrame() for f in frames)   # a run two groups chart: once


@dataclass
class Served:
    row: pd.Series
    point: dict | None              # the sustainable point, None: no point within the SLO
    slo: Slo
    quality: Quality
    misses: list[str]               # quality limits it misses (empty: within the budget)

    @property
    def rate_rps(self) -> float:
        return float(self.point["achieved_rps"]) if self.point else 0.0

    @property
    def stack(self) -> str:
        return str(self.row.get("stack"))


@dataclass
class ServedDecision:
    model: str
    slo: Slo | None
    candidates: list[Served]
    pick: Served | None
    why: str
    closest: tuple[Served, dict, float] | None = None   # no pick: the stack and point nearest the SLO, how far


def nearest(candidates: list[Served]) -> tuple[Served, dict, float] | None:
    """Where no stack is within the SLO: the point (of a stack within the quality budget, that the
    server kept up with) whose worse p95 is the least far past its limit, and that factor."""
    best = None
    for served in candidates:
        if served.misses:
            continue
        for point in rate_points(served.row):
            if not keeps_up(point):
                continue
            factor = max(point.get("ttft_s_p95", math.inf) / served.slo.ttft_s,
                         point.get("tpot_s_p95", math.inf) / served.slo.tpot_s)
            if best is None or factor < best[2]:
                best = (served, point, factor)
    return best


def rate_points(row: pd.Series) -> list[dict]:
    """The run's Poisson points as the summaries the runner logged (``r<i>_<metric>``)."""
    return [{name: float(number) for name, value in values.items()
             if pd.notna(number := pd.to_numeric(value, errors="coerce"))}
            for values in point_names.split(row, point_names.RATE).values()]


def _quality(row: pd.Series, in_process: pd.DataFrame) -> Quality:
    """The in-process scores of the same GGUF type and cache on the engine the server builds on
    (speculation is lossless: its base stack's scores)."""
    engine = engines.ENGINES.get(str(row.get("engine")))
    if engine is None or in_process.empty:
        return Quality(measured=False)
    same = in_process[(in_process["model"] == row["model"]) & in_process["engine"].isin(engine.builds_on)
                      & (in_process["precision"].astype(str) == str(row.get("precision")))
                      & (pd.to_numeric(in_process["kv_bits"], errors="coerce") == num(row, "kv_bits"))
                      & (in_process["speculation"].astype(str) == "none")]
    same = same[pd.to_numeric(same.get("kl_divergence"), errors="coerce").notna()] if "kl_divergence" in same else same.iloc[:0]
    if same.empty:
        return Quality(measured=False)
    scored = same.sort_values("start_time").iloc[-1] if "start_time" in same else same.iloc[-1]
    return Quality(num(scored, "kl_divergence"), num(scored, "perplexity_ratio"),
                   f"the in-process {scored.get('engine')} run of the same GGUF and cache")


def latest_served(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame
    frame = frame[pd.to_numeric(frame.get("single_stream_rps"), errors="coerce").notna()] if "single_stream_rps" in frame else frame.iloc[:0]
    return runs.latest(frame, ["model", "stack", "device"], finished=True)


def decide_served(serving: pd.DataFrame, in_process: pd.DataFrame, limits: Limits,
                  models: list[str] | None = None) -> list[ServedDecision]:
    """Per model with serving runs: every served stack's sustainable point and the pick."""
    rows = latest_served(serving)
    if rows.empty:
        return []
    out = []
    for model in models or sorted(rows["model"].dropna().unique()):
        mine = rows[rows["model"] == model]
        if mine.empty:
            continue
        candidates = []
        for _, row in mine.iterrows():
            slo = Slo(limits.max_ttft_s or num(row, "ttft_slo_s"), limits.max_tpot_s or num(row, "tpot_slo_s"))
            quality = _quality(row, in_process)
            candidates.append(Served(row, sustainable(rate_points(row), slo), slo, quality,
                                     misses_quality(quality, limits)))
        within = [c for c in candidates if c.point is not None and not c.misses]
        pick = max(within, key=lambda c: (c.rate_rps, c.point.get("goodput_rps", 0.0)), default=None)
        slo = candidates[0].slo if candidates else None
        out.append(ServedDecision(model, slo, candidates, pick, why_others(pick, candidates),
                                  None if pick is not None else nearest(candidates)))
    return out


def why_others(pick: Served | None, candidates: list[Served]) -> str:
    """Why each served stack but ``pick`` (the best three by rate) was not picked, in one line."""
    others = sorted((c for c in candidates if c is not pick), key=lambda c: -c.rate_rps)
    said = []
    for other in others[:3]:
        if other.misses:
            said.append(f"{other.stack}: {'; '.join(other.misses)}")
        elif other.point is None:
            said.append(f"{other.stack}: no point within the SLO")
        else:
            said.append(f"{other.stack}: {other.rate_rps:.2f} req/s")
    return "; ".join(said) or "no other served stack"


def describe(served: Served, limits: Limits) -> list[str]:
    """The numbers behind one served stack, as the command prints them."""
    row, point = served.row, served.point
    lines = []
    if point is None:
        lines.append(f"no point within p95 TTFT <= {seconds(served.slo.ttft_s)} and TPOT <= {seconds(served.slo.tpot_s)}; "
                     f"single stream {num(row, 'single_stream_rps'):.2f} req/s")
        return lines
    lines.append(f"sustains {served.rate_rps:.2f} req/s (offered {point['offered_rps']:.2f}, "
                 f"x{point.get('rate_multiple', math.nan):g} its single-stream rate); goodput "
                 f"{point.get('goodput_rps', math.nan):.2f} req/s within the trial's SLO; saturates at "
                 f"{saturation_rps(rate_points(row)) or 0:.2f} req/s")
    lines.append(f"at that rate: p95 TTFT {seconds(point['ttft_s_p95'])} "
                 f"(95 % {seconds(point.get('ttft_s_p95_low', math.nan))}-{seconds(point.get('ttft_s_p95_high', math.nan))}), "
                 f"p95 TPOT {seconds(point['tpot_s_p95'])}, {point.get('output_tok_per_s', math.nan):.1f} output tok/s, "
                 f"{point.get('requests', math.nan):.0f} requests")
    q = served.quality
    lines.append(f"quality: KL {q.kl:.4f} ({q.source}); server vs in-process greedy tokens: "
                 f"{num(row, 'parity_token_match'):.3f} match" if q.measured else "quality: not measured")
    price = limits.price_per_hour_usd or num(row, "price_per_hour_usd")
    tok = point.get("output_tok_per_s", 0.0)
    if price and price == price and tok > 0:
        lines.append(f"${usd_per_million_tokens(price, tok):.3f} per 1M output tokens at ${price:g}/h at that rate")
    return lines


def render(decision: ServedDecision, limits: Limits) -> str:
    slo = decision.slo
    head = (f"{decision.model}: served (requests/s within p95 TTFT <= {seconds(slo.ttft_s)}, TPOT <= {seconds(slo.tpot_s)}"
            f"{', and the quality budget' if limits.max_kl is not None else ''}; {len(decision.candidates)} served stacks)")
    lines = [head]
    if decision.pick is None:
        lines.append("  none within the SLO and the quality budget; each: " + decision.why)
        if decision.closest is not None:
            served, point, factor = decision.closest
            lines.append(f"  closest: {served.stack} at {point['achieved_rps']:.2f} req/s (offered {point['offered_rps']:.2f}): "
                         f"p95 TTFT {seconds(point['ttft_s_p95'])}, p95 TPOT {seconds(point['tpot_s_p95'])}, "
                         f"x{factor:.2f} the SLO")
            lines.append(f"      serve it: {served.row.get('tags.server_command', '?')}")
        return "\n".join(lines)
    pick = decision.pick
    lines.append(f"  most requests/s within the SLO: {pick.stack}")
    lines += [f"      {line}" for line in describe(pick, limits)]
    lines.append(f"      why not the next: {decision.why}")
    lines.append(f"      serve it: {pick.row.get('tags.server_command', '?')}")
    return "\n".join(lines)


def as_dict(decision: ServedDecision, limits: Limits) -> dict:
    pick = decision.pick
    return {"model": decision.model, "slo": None if decision.slo is None else
            {"ttft_s": decision.slo.ttft_s, "tpot_s": decision.slo.tpot_s},
            "pick": None if pick is None else {"stack": pick.stack, "sustainable_rps": pick.rate_rps,
                                               "point": pick.point, "facts": describe(pick, limits),
                                               "server_command": pick.row.get("tags.server_command")},
            "why": decision.why,
            "closest": None if decision.closest is None else
            {"stack": decision.closest[0].stack, "point": decision.closest[1], "times_the_slo": decision.closest[2],
             "server_command": decision.closest[0].row.get("tags.server_command")}}
