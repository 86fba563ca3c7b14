"""The capacity pick: per model, the served configuration that sustains the most requests per second
within the SLO and the quality budget, and what a target rate takes of it.

It reads the capacity group's runs (``trials/techniques/capacity/runner.py``: one llama-server
configuration per run, its capacity = the highest Poisson rate at which >= 90 % of requests met both
p95 limits, with an interval, and a status: measured / lower_bound / infeasible / skipped), the
latest finished run per configuration (``tags.config_hash``), and, for quality, the in-process runs
of the same GGUF and cache (``dashboard.served``'s rule: a configuration without teacher-forced
scores is "quality not measured" and fails the budget, said so).

The SLO is the user's (``--max-ttft``/``--max-tpot``), else the one the model's latest run was
searched under. A capacity only means something under the SLO it was measured against:

* measured under the same SLO: it counts as measured;
* under a stricter (or equal) one on both limits: every request that met the stricter limits meets
  the looser ones, so it counts, as a lower bound, said so (an "infeasible" there says nothing);
* under a looser one: it does not count; what was measured is said.

With a rate R (req/s): ceil(R / capacity) servers like the one measured, their price per hour, and
$/1M output tokens at that load = $/h / (R x output tokens per request x 3600) x 10^6 (the servers
are paid for whole, however busy). Where nothing is feasible, the single-stream p95s of the closest
configuration against the SLO say why.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pandas as pd

from dashboard.limits import Limits, seconds
from dashboard.stack_facts import Quality, misses_quality, num
from dashboard.served import _quality as served_quality
from trials.measurement.cost import usd_per_million_tokens
from trials.measurement.point_names import SINGLE
from trials.stats import runs
from trials.stats.serving import Slo
from trials.techniques.capacity.spec import NAME as GROUP

STATUSES = ("measured", "lower_bound", "infeasible", "skipped")
NO_RUNS = ("no capacity runs in this store: `python sweeps/full.py` runs the capacity search "
           f"(`--groups {GROUP}` for it alone)")
SHOWN = 8                     # configurations listed in the text (--json: every one)
_TOLERANCE = 1e-9


def parse_rate(text: str) -> float:
    """Requests per second from ``"2"``, ``"0.5"`` or ``"2req/s"``: a finite number above 0."""
    cleaned = re.sub(r"\s*(req/s|/s|rps)\s*$", "", str(text).strip(), flags=re.IGNORECASE)
    try:
        value = float(cleaned)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise ValueError(f"{text!r} is not a rate in requests per second (e.g. 2 or 0.5)")
    if not (0 < value < math.inf):
        raise ValueError(f"{text!r}: a rate must be a finite number of requests per second above 0")
    return value


def read(uri: str) -> pd.DataFrame:
    """Every capacity run of the store at ``uri`` (any status)."""
    import tracking

    return tracking.runs_frame(uri, GROUP, status=None)


def latest_capacities(frame: pd.DataFrame) -> pd.DataFrame:
    """The latest FINISHED run per configuration (``tags.config_hash``) that reports a capacity."""
    if frame.empty or "capacity_rps" not in frame.columns:
        return frame.iloc[:0]
    frame = frame[pd.to_numeric(frame["capacity_rps"], errors="coerce").notna()]
    keys = "tags.config_hash" if "tags.config_hash" in frame.columns else ["model", "stack", "device"]
    return runs.latest(frame, keys, finished=True)


def _text(row: pd.Series, name: str) -> str:
    value = row.get(name)
    return value if isinstance(value, str) else ""


def _fit(measured: Slo, target: Slo) -> str:
    """How the SLO a run was measured under stands to ``target``: same, stricter or looser."""
    pairs = ((measured.ttft_s, target.ttft_s), (measured.tpot_s, target.tpot_s))
    if any(math.isnan(m) for m, _ in pairs):
        return "looser"                          # no SLO logged: nothing says it holds for this one
    if all(math.isclose(m, t, rel_tol=_TOLERANCE) for m, t in pairs):
        return "same"
    if all(m <= t * (1 + _TOLERANCE) for m, t in pairs):
        return "stricter"
    return "looser"


def describe_slo(slo: Slo) -> str:
    return f"p95 TTFT <= {seconds(slo.ttft_s)}, TPOT <= {seconds(slo.tpot_s)}"


@dataclass
class Config:
    """One configuration's capacity as the decision reads it."""

    row: pd.Series
    status: str                 # the run's: measured | lower_bound | infeasible | skipped
    measured_slo: Slo           # the SLO the run was searched under
    fit: str                    # same | stricter | looser, against the decision's SLO
    quality: Quality
    misses: list[str]           # quality limits it misses (empty: within the budget)

    @property
    def label(self) -> str:
        return str(self.row.get("stack") or self.row.get("tags.stack") or "?")

    @property
    def rps(self) -> float:
        value = num(self.row, "capacity_rps")
        return 0.0 if math.isnan(value) else value

    @property
    def low(self) -> float:
        return num(self.row, "capacity_rps_low")

    @property
    def high(self) -> float:
        return num(self.row, "capacity_rps_high")

    @property
    def counts(self) -> bool:
        """Measured under the decision's SLO or a stricter one."""
        return self.fit != "looser"

    @property
    def lower_bound(self) -> bool:
        return self.rps > 0 and (self.status == "lower_bound" or self.fit == "stricter" or math.isnan(self.high))

    @property
    def feasible(self) -> bool:
        return self.counts and self.rps > 0

    @property
    def command(self) -> str:
        return _text(self.row, "tags.user_code") or _text(self.row, "tags.server_command")

    @property
    def note(self) -> str:
        return _text(self.row, "tags.capacity_note")

    def interval(self) -> str:
        """``1.80 req/s [1.60, 2.00]``; a lower bound's missing upper end is ``?``."""
        def number(value: float) -> str:
            return "?" if math.isnan(value) else f"{value:.2f}"

        if self.rps <= 0:
            return f"0 req/s ({self.status})"
        return f"{self.rps:.2f} req/s [{number(self.low)}, {number(self.high)}]"

    def standing(self) -> str:
        """What its capacity means for the decision's SLO, in a few words."""
        if self.fit == "looser":
            return f"measured under a looser SLO ({describe_slo(self.measured_slo)}): does not count"
        if self.fit == "stricter":
            if self.rps > 0:
                return f"measured under a stricter SLO ({describe_slo(self.measured_slo)}): a lower bound"
            return (f"{self.status} under a stricter SLO ({describe_slo(self.measured_slo)}): says nothing "
                    "about this one")
        return "a lower bound (the search was cut short)" if self.status == "lower_bound" else self.status

    def short_standing(self) -> str:
        """``standing`` in a table cell: the status, and the SLO's say where it differs."""
        if self.fit == "looser":
            return "looser SLO: not counted"
        if self.fit == "stricter":
            return "lower bound (stricter SLO)" if self.rps > 0 else f"{self.status} (stricter SLO)"
        return self.status

    def single_stream(self, slo: Slo) -> tuple[float, float, float]:
        """(p95 TTFT, p95 TPOT one request at a time, how many times the SLO the worse of the two is)."""
        ttft, tpot = (num(self.row, SINGLE.metric(name)) for name in ("ttft_s_p95", "tpot_s_p95"))
        return ttft, tpot, max(ttft / slo.ttft_s, tpot / slo.tpot_s)


@dataclass
class Replicas:
    """What ``rate_rps`` takes of the pick: servers like the one measured, and their cost."""

    rate_rps: float
    servers: int
    machine: str                              # the kind of machine the capacity was measured on
    price_per_hour_usd: float | None          # one server's
    output_tokens_per_request: float
    usd_per_hour: float | None = None
    usd_per_million_output_tokens: float | None = None

    def describe(self) -> str:
        text = f"for {self.rate_rps:g} req/s: {self.servers} server(s) like this one ({self.machine})"
        if self.usd_per_hour is None:
            return text + "; give --price-per-hour for $/h and $/1M output tokens"
        tokens = "" if math.isnan(self.output_tokens_per_request) else \
            f" ({self.output_tokens_per_request:.0f} output tokens per request)"
        return (f"{text}, ${self.usd_per_hour:.2f}/h at ${self.price_per_hour_usd:g}/h each, "
                f"${self.usd_per_million_output_tokens:.3f} per 1M output tokens at that load{tokens}")


@dataclass
class CapacityDecision:
    model: str
    slo: Slo
    attainment: float
    configs: list[Config]
    pick: Config | None
    why: str                                  # why the others were not picked / why nothing is feasible
    replicas: Replicas | None = None
    closest: tuple[Config, float] | None = None   # nothing feasible: the nearest single stream, x the SLO
    notes: list[str] = field(default_factory=list)


def output_tokens_per_request(row: pd.Series) -> float:
    """The workload's new tokens per request, else the capacity probe's output tok/s over its req/s."""
    tokens = num(row, "max_new_tokens")
    if tokens > 0:
        return tokens
    rate = num(row, "capacity_rps")
    return num(row, "capacity_output_tok_per_s") / rate if rate > 0 else math.nan


def _machine(row: pd.Series) -> str:
    name = _text(row, "tags.env.device_name") or _text(row, "device") or "this machine"
    cores = num(row, "cores_held")
    return name + ("" if math.isnan(cores) else f", {cores:.0f} cores")


def replicas(pick: Config, rate_rps: float, limits: Limits) -> Replicas:
    """Servers for ``rate_rps`` (whole ones: ceil(rate / capacity)) and, with a price, $/h and $/1M."""
    row = pick.row
    servers = math.ceil(rate_rps / pick.rps - 1e-9)
    price = limits.price_per_hour_usd or num(row, "price_per_hour_usd")
    tokens = output_tokens_per_request(row)
    out = Replicas(rate_rps, servers, _machine(row), price if price == price and price else None, tokens)
    if out.price_per_hour_usd is not None:
        out.usd_per_hour = servers * out.price_per_hour_usd
        out.usd_per_million_output_tokens = (usd_per_million_tokens(out.usd_per_hour, rate_rps * tokens)
                                             if tokens > 0 else math.nan)
    return out


def _target(rows: pd.DataFrame, limits: Limits) -> Slo:
    """The user's SLO, each limit not given taken from the model's latest run."""
    last = rows.sort_values("start_time").iloc[-1] if "start_time" in rows.columns else rows.iloc[-1]
    return Slo(limits.max_ttft_s or num(last, "ttft_slo_s"), limits.max_tpot_s or num(last, "tpot_slo_s"))


def _config(row: pd.Series, target: Slo, in_process: pd.DataFrame, limits: Limits) -> Config:
    status = _text(row, "tags.capacity_status") or ("measured" if num(row, "capacity_rps") > 0 else "infeasible")
    quality = served_quality(row, in_process)
    measured = Slo(num(row, "ttft_slo_s"), num(row, "tpot_slo_s"))
    return Config(row, status, measured, _fit(measured, target), quality, misses_quality(quality, limits))


def decide_model(rows: pd.DataFrame, model: str, in_process: pd.DataFrame, limits: Limits,
                 rate_rps: float | None = None) -> CapacityDecision | None:
    mine = rows[rows["model"] == model]
    if mine.empty:
        return None
    target = _target(mine, limits)
    configs = sorted((_config(row, target, in_process, limits) for _, row in mine.iterrows()),
                     key=lambda c: (not c.counts, -c.rps, -(0 if math.isnan(c.low) else c.low), c.label))
    within = [c for c in configs if c.feasible and not c.misses]
    pick = max(within, key=lambda c: (c.rps, 0 if math.isnan(c.low) else c.low), default=None)
    attainment = num(mine.iloc[0], "attainment_target")
    decision = CapacityDecision(model, target, 0.9 if math.isnan(attainment) else attainment, configs, pick, "")
    if pick is not None:
        decision.why = _why_others(pick, configs)
        if rate_rps is not None:
            decision.replicas = replicas(pick, rate_rps, limits)
    else:
        decision.why, decision.closest = _why_none(configs, target)
    looser = [c for c in configs if c.fit == "looser"]
    if looser:
        decision.notes.append(f"{len(looser)} configuration(s) measured under a looser SLO do not count: "
                              + "; ".join(f"{c.label}: {c.interval()} under {describe_slo(c.measured_slo)}"
                                          for c in looser[:3]) + (" ..." if len(looser) > 3 else ""))
    return decision


def _why_others(pick: Config, configs: list[Config], shown: int = 3) -> str:
    """Why the best others (by capacity) were not picked, in one line."""
    said = []
    for other in [c for c in configs if c is not pick and c.counts][:shown]:
        if other.feasible and other.misses:
            said.append(f"{other.label}: {other.interval()} but {' and '.join(other.misses)}")
        elif other.feasible:
            said.append(f"{other.label}: {other.interval()}")
        else:
            said.append(f"{other.label}: {other.standing()}")
    return "; ".join(said) or "no other configuration"


def _why_none(configs: list[Config], slo: Slo) -> tuple[str, tuple[Config, float] | None]:
    """Why no configuration is picked, and the closest one's single stream against the SLO."""
    counting = [c for c in configs if c.counts]
    if not counting:
        return (f"every configuration was measured under a looser SLO than {describe_slo(slo)}: "
                "search again under this one (the sweep file's ttft_slo_ms / tpot_slo_ms)"), None
    sustained = [c for c in counting if c.feasible]
    if sustained:
        best = sustained[0]
        return (f"{len(sustained)} configuration(s) sustain the SLO, none within the quality budget; the highest, "
                f"{best.label} at {best.interval()}, misses: {'; '.join(best.misses)}"), None
    streamed = [(c, c.single_stream(slo)[2]) for c in counting if not math.isnan(c.single_stream(slo)[2])]
    if not streamed:
        skipped = [c for c in counting if c.status == "skipped"]
        first = skipped[0] if skipped else counting[0]
        return (f"no configuration has a capacity within {describe_slo(slo)}; none was served one request at a "
                f"time ({len(skipped)} skipped before any load): {first.label}: {first.note or first.standing()}"), None
    closest, factor = min(streamed, key=lambda pair: pair[1])
    ttft, tpot, _ = closest.single_stream(slo)
    head = (f"nothing sustains {describe_slo(slo)}: the closest, {closest.label}, one request at a time: p95 TTFT "
            f"{seconds(ttft)} (limit {seconds(slo.ttft_s)}), p95 TPOT {seconds(tpot)} (limit {seconds(slo.tpot_s)}), "
            f"x{factor:.2f} the SLO")
    if factor <= 1:
        head += f"; it meets this SLO alone, but its capacity was {closest.standing()}"
    return head + (f" (the run: {closest.note})" if closest.note else ""), (closest, factor)


def decide_capacity(frame: pd.DataFrame, in_process: pd.DataFrame, limits: Limits,
                    models: list[str] | None = None, rate_rps: float | None = None) -> list[CapacityDecision]:
    """Per model with capacity runs: every configuration, the pick and, with ``rate_rps``, its replicas."""
    rows = latest_capacities(frame)
    if rows.empty or "model" not in rows.columns:
        return []
    chosen = models or sorted(rows["model"].dropna().unique())
    return [d for d in (decide_model(rows, m, in_process, limits, rate_rps) for m in chosen) if d is not None]


def models(frame: pd.DataFrame) -> list[str]:
    rows = latest_capacities(frame)
    return sorted(rows["model"].dropna().unique()) if not rows.empty and "model" in rows.columns else []


# ------------------------------------------------------------------------------ what it says

def _quality_text(config: Config) -> str:
    q = config.quality
    if not q.measured:
        return "quality not measured"
    ppl = "" if math.isnan(q.perplexity_ratio) else f", ppl {100 * (q.perplexity_ratio - 1):+.1f} %"
    return f"KL {q.kl:.4f}{ppl}"


def headline(decision: CapacityDecision, limits: Limits) -> str:
    quality = limits.max_kl is not None or limits.max_perplexity_increase is not None
    budget = ", and the quality budget" if quality else ""
    return (f"{decision.model}: capacity (most req/s with >= {100 * decision.attainment:.0f} % of requests within "
            f"{describe_slo(decision.slo)}{budget}; {len(decision.configs)} configurations)")


def pick_line(decision: CapacityDecision) -> str:
    pick = decision.pick
    if pick is None:
        return "none"
    standing = pick.standing()
    bound = "; a lower bound" if pick.lower_bound and "lower bound" not in standing else ""
    return f"{pick.label}: {pick.interval()}, {standing}{bound}"


def render(decision: CapacityDecision, limits: Limits) -> str:
    """One model's capacity block, as ``llm-recommend`` prints it."""
    lines = [headline(decision, limits)]
    pick = decision.pick
    if pick is None:
        lines.append(f"  no configuration qualifies: {decision.why}")
        if decision.closest is not None:
            lines.append(f"      serve the closest: {decision.closest[0].command or '?'}")
    else:
        lines.append(f"  pick: {pick_line(decision)}")
        source = f" ({pick.quality.source})" if pick.quality.source else ""
        lines.append(f"      quality: {_quality_text(pick)}{source}")
        lines.append(f"      serve it: {pick.command or '?'}")
        if decision.replicas is not None:
            lines.append(f"      {decision.replicas.describe()}")
        lines.append(f"      why not the next: {decision.why}")
    rows = [["configuration", "capacity [interval]", "status", "quality"]]
    rows += [[c.label, c.interval(), c.short_standing(), _quality_text(c)]
             for c in decision.configs[:SHOWN]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["    " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    if len(decision.configs) > SHOWN:
        lines.append(f"    ... and {len(decision.configs) - SHOWN} more (--json lists every one)")
    lines += [f"  note: {note}" for note in decision.notes]
    return "\n".join(lines)


def card_lines(decision: CapacityDecision, limits: Limits) -> list[str]:
    """The compact block of the best-stack card: the headline, the pick (or why none), the replicas."""
    lines = [headline(decision, limits).replace(f"{decision.model}: ", "", 1)]
    if decision.pick is None:
        lines.append(f"capacity pick: none: {decision.why}")
    else:
        lines.append(f"capacity pick: {pick_line(decision)}; {_quality_text(decision.pick)}")
        if decision.replicas is not None:
            lines.append(f"capacity {decision.replicas.describe()}")
        lines.append(f"capacity, why not the next: {decision.why}")
    return lines


def _config_dict(config: Config, slo: Slo) -> dict:
    ttft, tpot, factor = config.single_stream(slo)
    q = config.quality
    return {"configuration": config.label, "status": config.status, "capacity_rps": config.rps,
            "capacity_rps_low": config.low, "capacity_rps_high": config.high, "interval": config.interval(),
            "lower_bound": config.lower_bound, "counts": config.counts, "slo_fit": config.fit,
            "measured_slo": {"ttft_s": config.measured_slo.ttft_s, "tpot_s": config.measured_slo.tpot_s},
            "standing": config.standing(),
            "quality": {"measured": q.measured, "kl_divergence": q.kl, "perplexity_ratio": q.perplexity_ratio,
                        "source": q.source}, "quality_misses": config.misses,
            "single_stream": {"ttft_s_p95": ttft, "tpot_s_p95": tpot, "times_the_slo": factor},
            "server_command": config.command, "note": config.note, "run_id": config.row.get("run_id")}


def as_dict(decision: CapacityDecision) -> dict:
    """The capacity decision as plain data (``llm-recommend --json``)."""
    r = decision.replicas
    return {"model": decision.model, "slo": {"ttft_s": decision.slo.ttft_s, "tpot_s": decision.slo.tpot_s,
                                             "attainment": decision.attainment},
            "pick": None if decision.pick is None else {
                **_config_dict(decision.pick, decision.slo),
                "replicas": None if r is None else {
                    "rate_rps": r.rate_rps, "servers": r.servers, "machine": r.machine,
                    "price_per_hour_usd": r.price_per_hour_usd, "usd_per_hour": r.usd_per_hour,
                    "output_tokens_per_request": r.output_tokens_per_request,
                    "usd_per_million_output_tokens": r.usd_per_million_output_tokens}},
            "why": decision.why,
            "closest": None if decision.closest is None else
            {"configuration": decision.closest[0].label, "times_the_slo": decision.closest[1],
             "server_command": decision.closest[0].command},
            "configurations": [_config_dict(c, decision.slo) for c in decision.configs],
            "notes": decision.notes}
