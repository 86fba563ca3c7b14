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
divergence, not loss; it is shown, and is a limit only when asked (``min_token_match``). Defaults:

* ``max_kl`` = 0.02 nats per token and ``max_perplexity_increase`` = 2 %. On the main job's stores,
  the stacks users call near-lossless (bf16, an 8-bit KV cache, 8-bit and shipped 4-bit GGUF types)
  lie far below these limits, and the stacks that visibly degrade (a 4-bit or 2-bit KV cache, NF4,
  4-bit types requantized from a 4-bit file) far above: the limits sit in that gap, so every model
  gets a recommendation and a harmful stack is refused (the measured values: ``llm-report``, the
  results page).

A stack without its own scores is not assumed good: it is "quality not measured" and fails the
budget, except (1) the reference precision itself with a full cache (KL 0 by definition) and (2)
speculation, whose teacher-forced scores are those of the same stack without it (speculation
changes who proposes tokens, never the distribution that verifies them): those take the sibling's
scores and say so.

Latency limits are checked per request: the p95 of TTFT / time per output token where a run has at
least ``trials.measurement.latency.MIN_SAMPLES_P95`` requests, else the largest sample (said, with the count).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields

import pandas as pd

from trials.config import Stack, TrialConfig, Workload
from trials.engines import DEFAULT as DEFAULT_ENGINE
from trials import engines
from trials.measurement.latency import MIN_SAMPLES_P95
from trials.measurement.cost import usd_per_million_tokens
from trials.models.registry import entry_from_dict, reference_precision

MB = 2**20
BATCH_CODE_MARK = "prompts per generate() call"


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


# ------------------------------------------------------------------------------ one stack's facts

def _num(row: pd.Series, name: str) -> float:
    value = pd.to_numeric(row.get(name), errors="coerce")
    return float(value) if value is not None and pd.notna(value) else math.nan


@dataclass
class Quality:
    kl: float = math.nan
    perplexity_ratio: float = math.nan
    source: str = ""          # where the scores come from when not the run's own
    measured: bool = True


def engine(row: pd.Series) -> str:
    """The run's engine (runs from before the param existed ran on the default one)."""
    value = row.get("engine")
    return value if isinstance(value, str) and value else DEFAULT_ENGINE


def _sibling_key(row: pd.Series) -> tuple:
    return (engine(row), row.get("precision"), _num(row, "kv_bits"),
            row.get("kv_backend"), _num(row, "batch_size"), str(row.get("compile")))


def quality(row: pd.Series, rows: pd.DataFrame) -> Quality:
    """The stack's teacher-forced scores against the reference precision (see the module docstring
    for the two cases that take them from elsewhere)."""
    kl, ratio = _num(row, "kl_divergence"), _num(row, "perplexity_ratio")
    if math.isnan(ratio) and _num(row, "reference_perplexity") > 0:
        ratio = _num(row, "perplexity") / _num(row, "reference_perplexity")
    if not math.isnan(kl):
        return Quality(kl, ratio)
    reference = str(row.get("tags.reference_precision") or "")
    kv_bits = _num(row, "kv_bits")
    if row.get("precision") == reference and (kv_bits == 16 or math.isnan(kv_bits)) and engine(row) == DEFAULT_ENGINE:
        return Quality(0.0, 1.0, "the reference precision itself")
    if str(row.get("speculation", "none")) not in ("none", "", "nan"):
        same = rows[(rows["model"] == row["model"]) & (rows["speculation"].astype(str) == "none")]
        for _, other in same.iterrows():
            if _sibling_key(other) == _sibling_key(row) and not math.isnan(_num(other, "kl_divergence")):
                inherited = quality(other, rows)
                return Quality(inherited.kl, inherited.perplexity_ratio,
                               f"{other['name']}'s scores (speculation does not change the distribution)")
    return Quality(measured=False)


@dataclass
class Latency:
    value: float
    how: str            # "p95 of 24 requests" / "max of 12 requests (too few for a p95)"


def latency(row: pd.Series, metric: str) -> Latency | None:
    """The per-request tail of ``ttft_s`` or ``tpot_s`` that a limit is checked against."""
    samples = _num(row, "latency_samples")
    if math.isnan(samples):     # runs from before the count was logged: every prompt of every repeat
        samples = _num(row, "num_prompts") * _num(row, "repeats")
    p95 = _num(row, f"{metric}_p95")
    if not math.isnan(p95):
        return Latency(p95, f"p95 of {samples:.0f} requests")
    top = _num(row, f"{metric}_max")
    if math.isnan(top):
        return None
    count = "" if math.isnan(samples) else f" of {samples:.0f} requests"
    return Latency(top, f"max{count}; a p95 needs {MIN_SAMPLES_P95}")


def cost(row: pd.Series, limits: Limits) -> float:
    """$/1M output tokens: at the limits' price, else at the price the run logged, else NaN."""
    price = limits.price_per_hour_usd or _num(row, "price_per_hour_usd")
    tok = _num(row, "tok_per_s")
    return usd_per_million_tokens(price, tok) if price and price == price and tok > 0 else math.nan


@dataclass(frozen=True)
class Miss:
    """One limit a stack misses: what to say, and how far past the limit it is (measured / limit, a
    minimum's limit / measured; inf: not measured), so that the closest stack can be chosen."""

    text: str
    excess: float


def _past(measured: float, bound: float) -> float:
    return measured / bound if bound > 0 else math.inf


def _quality_misses(q: Quality, limits: Limits) -> list[Miss]:
    found = []
    if (limits.max_kl is not None or limits.max_perplexity_increase is not None) and not q.measured:
        found.append(Miss("quality not measured (no teacher-forced scores)", math.inf))
    if limits.max_kl is not None and q.kl > limits.max_kl:
        found.append(Miss(f"KL {q.kl:.4f} > {limits.max_kl:g}", _past(q.kl, limits.max_kl)))
    if limits.max_perplexity_increase is not None and q.perplexity_ratio > 1 + limits.max_perplexity_increase:
        found.append(Miss(f"perplexity +{100 * (q.perplexity_ratio - 1):.1f} % > +{100 * limits.max_perplexity_increase:g} %",
                          _past(q.perplexity_ratio - 1, limits.max_perplexity_increase)))
    return found


def _misses_quality(q: Quality, limits: Limits) -> list[str]:
    """The quality limits scores ``q`` miss, each with its number (the served pick's budget)."""
    return [m.text for m in _quality_misses(q, limits)]


def _misses(row: pd.Series, rows: pd.DataFrame, limits: Limits) -> list[Miss]:
    found = _quality_misses(quality(row, rows), limits)
    match = _num(row, "fidelity_token_match")
    if limits.min_token_match is not None and match < limits.min_token_match:
        found.append(Miss(f"token match {match:.3f} < {limits.min_token_match:g}", _past(limits.min_token_match, match)))
    for metric, bound, label in (("ttft_s", limits.max_ttft_s, "TTFT"), ("tpot_s", limits.max_tpot_s, "TPOT")):
        if bound is None:
            continue
        tail = latency(row, metric)
        if tail is None:
            found.append(Miss(f"{label} not measured", math.inf))
        elif tail.value > bound:
            found.append(Miss(f"{label} {seconds(tail.value)} ({tail.how}) > {seconds(bound)}", _past(tail.value, bound)))
    return found


def misses(row: pd.Series, rows: pd.DataFrame, limits: Limits) -> list[str]:
    """The limits this stack misses, each with its number (empty: within every limit)."""
    return [m.text for m in _misses(row, rows, limits)]


# ------------------------------------------------------------------------------ reproducing a run

def _typed(cls, row: pd.Series):
    """A ``Stack`` or ``Workload`` from a run's params (strings), typed by the field's default."""
    values = {}
    for f in fields(cls):
        value = row.get(f.name)
        if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
            continue
        default = getattr(cls(), f.name)
        if isinstance(default, bool):
            value = str(value) == "True"
        elif isinstance(default, int):
            value = int(float(value))
        values[f.name] = value
    return cls(**values)


def trial_config(row: pd.Series) -> TrialConfig:
    """The run's exact config, rebuilt from its params (its config_hash is the run's), a sweep
    file's own model too: its entry travels in the ``declared_models`` param."""
    declared = row.get("declared_models")
    return TrialConfig(group=str(row.get("group") or row.get("tags.group")), model=str(row["model"]), device=str(row.get("device", "cpu")),
                       repeats=int(float(row["repeats"])), seed=int(float(row.get("seed", 0))),
                       stack=_typed(Stack, row), workload=_typed(Workload, row),
                       declared=tuple(entry_from_dict(e) for e in json.loads(declared))
                       if isinstance(declared, str) and declared else ())


def reproduce(row: pd.Series) -> tuple[str, str]:
    """(the command that reruns this trial, the code that turns the stack on): the code the trial
    recorded from the arguments it ran with (tag ``user_code``), else the same description rendered
    for the stack (runs logged before the tag existed); a batched stack says its batch either way."""
    config = trial_config(row)
    command = f"python -m trials.run --config '{json.dumps(config.to_dict())}'"
    code = row.get("tags.user_code")
    if not isinstance(code, str) or not code:
        code = engines.get(config.stack.engine).code(config.stack, reference_precision(config.entry(), config.device))
    if config.stack.batch_size > 1 and BATCH_CODE_MARK not in code:
        code += f"\n# batch: {config.stack.batch_size} {BATCH_CODE_MARK} (padding_side='left')"
    return command, code


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
    if "status" in frame.columns:
        frame = frame[frame["status"] == "FINISHED"]
    keys = [k for k in ("model", "tags.stack_name", "device") if k in frame.columns]
    rows = frame.sort_values("start_time").drop_duplicates(keys, keep="last") if "start_time" in frame else frame
    return rows.assign(peak_mb=pd.to_numeric(rows["peak_memory_bytes"], errors="coerce") / MB,
                       name=rows["tags.stack_name"].astype(str))


def _speed(row: pd.Series) -> str:
    low, high = _num(row, "tok_per_s_ci_low"), _num(row, "tok_per_s_ci_high")
    interval = "one repeat: no interval" if math.isnan(low) else f"95 % {low:.1f}-{high:.1f}"
    return f"{_num(row, 'tok_per_s'):.1f} tok/s ({interval})"


def _overlap(a: pd.Series, b: pd.Series) -> bool | None:
    lows, highs = (_num(a, "tok_per_s_ci_low"), _num(b, "tok_per_s_ci_low")), (_num(a, "tok_per_s_ci_high"), _num(b, "tok_per_s_ci_high"))
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
        return (f"{nxt['name']} at {_num(nxt, 'peak_mb'):.1f} MB vs {_num(best, 'peak_mb'):.1f} MB "
                "(one peak per run: no interval)")
    if role == "cost":
        return (f"{nxt['name']} at ${cost(nxt, limits):.3f} vs ${cost(best, limits):.3f} per 1M tokens "
                f"(from {_speed(nxt)})")
    overlap = _overlap(best, nxt)
    verdict = {True: "the intervals overlap: the difference is within the noise",
               False: f"x{_num(best, 'tok_per_s') / _num(nxt, 'tok_per_s'):.2f} slower, the intervals do not overlap",
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
    found = {index: _misses(row, mine, limits) for index, row in mine.iterrows()}    # each row's, once
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
        if "tags.stack_name" in mine_failed:
            mine_failed = mine_failed.drop_duplicates("tags.stack_name", keep="last")
        out.append(decide_model(rows, model, limits, mine_failed))
    return out


# ------------------------------------------------------------------------------ what a pick says

def facts(row: pd.Series, rows: pd.DataFrame, limits: Limits) -> list[str]:
    """The numbers behind one stack, as the card and the command show them."""
    q = quality(row, rows)
    lines = [f"{_speed(row)}, {_num(row, 'peak_mb'):.1f} MB peak, batch {_num(row, 'batch_size'):.0f}, "
             f"engine {engine(row)}"]
    base = _num(row, "speedup_vs_baseline")
    if not math.isnan(base):
        lines.append(f"x{base:.2f} speed, x{_num(row, 'memory_vs_baseline'):.2f} memory vs the base stack "
                     "measured in the same worker")
    if q.measured:
        ppl = "" if math.isnan(q.perplexity_ratio) else f", perplexity {100 * (q.perplexity_ratio - 1):+.1f} %"
        quality_line = f"quality vs {row.get('tags.reference_precision', 'the reference')}: KL {q.kl:.4f}{ppl}"
        lines.append(quality_line + (f" ({q.source})" if q.source else ""))
    else:
        lines.append("quality: not measured")
    match = _num(row, "fidelity_token_match")
    if not math.isnan(match):
        lines.append(f"greedy token match {match:.3f}, first divergence at token "
                     f"{_num(row, 'first_divergence_token'):.0f} (information, not a limit)")
    tails = [f"{label} {seconds(t.value)} ({t.how})" for metric, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"))
             for t in [latency(row, metric)] if t]
    if tails:
        lines.append("latency: " + ", ".join(tails))
    dollars = cost(row, limits)
    if not math.isnan(dollars):
        price = limits.price_per_hour_usd or _num(row, "price_per_hour_usd")
        lines.append(f"${dollars:.3f} per 1M output tokens at ${price:g}/h")
    energy = _num(row, "energy_j_per_output_token")
    if not math.isnan(energy):
        lines.append(f"energy {energy:.3f} J per output token (measured: {row.get('tags.energy_method', '')})")
    return lines


def as_dict(decision: Decision) -> dict:
    """The decision as plain data (``llm-recommend --json``; the card test compares with it)."""
    def stack(row: pd.Series) -> dict:
        command, code = reproduce(row)
        q = quality(row, decision.rows)
        return {"stack": row["name"], "tok_per_s": _num(row, "tok_per_s"),
                "tok_per_s_ci": [_num(row, "tok_per_s_ci_low"), _num(row, "tok_per_s_ci_high")],
                "peak_mb": _num(row, "peak_mb"), "batch_size": _num(row, "batch_size"),
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

