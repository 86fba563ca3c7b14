"""One stack's facts, from its run's row: its quality against the reference precision (its own
teacher-forced scores, or where it has none the two cases that take them from elsewhere), its latency
tails, its cost, the limits it misses and by how much, and the command and code that reproduce it.
What ``dashboard.decision`` picks from, and ``dashboard.served`` and ``dashboard.capacity`` too.

A stack without its own scores is not assumed good: it is "quality not measured" and fails the
budget, except (1) the reference precision itself with a full cache (KL 0 by definition) and (2)
speculation, whose teacher-forced scores are those of the same stack without it (speculation
changes who proposes tokens, never the distribution that verifies them): those take the sibling's
scores and say so. Latency limits are checked per request: the p95 of TTFT / time per output token
where a run has at least ``trials.measurement.latency.MIN_SAMPLES_P95`` requests, else the largest
sample (said, with the count).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields

import pandas as pd

from dashboard.limits import Limits, seconds
from trials import engines
from trials.config import Stack, TrialConfig, Workload
from trials.engines import DEFAULT as DEFAULT_ENGINE
from trials.measurement.cost import usd_per_million_tokens
from trials.measurement.latency import MIN_SAMPLES_P95
from trials.models.registry import entry_from_dict, reference_precision

BATCH_CODE_MARK = "prompts per generate() call"


def num(row: pd.Series, name: str) -> float:
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
    return (engine(row), row.get("precision"), num(row, "kv_bits"),
            row.get("kv_backend"), num(row, "batch_size"), str(row.get("compile")))


def quality(row: pd.Series, rows: pd.DataFrame) -> Quality:
    """The stack's teacher-forced scores against the reference precision (see the module docstring
    for the two cases that take them from elsewhere)."""
    kl, ratio = num(row, "kl_divergence"), num(row, "perplexity_ratio")
    if math.isnan(ratio) and num(row, "reference_perplexity") > 0:
        ratio = num(row, "perplexity") / num(row, "reference_perplexity")
    if not math.isnan(kl):
        return Quality(kl, ratio)
    reference = str(row.get("tags.reference_precision") or "")
    kv_bits = num(row, "kv_bits")
    if row.get("precision") == reference and (kv_bits == 16 or math.isnan(kv_bits)) and engine(row) == DEFAULT_ENGINE:
        return Quality(0.0, 1.0, "the reference precision itself")
    if str(row.get("speculation", "none")) not in ("none", "", "nan"):
        same = rows[(rows["model"] == row["model"]) & (rows["speculation"].astype(str) == "none")]
        for _, other in same.iterrows():
            if _sibling_key(other) == _sibling_key(row) and not math.isnan(num(other, "kl_divergence")):
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
    samples = num(row, "latency_samples")
    if math.isnan(samples):     # runs from before the count was logged: every prompt of every repeat
        samples = num(row, "num_prompts") * num(row, "repeats")
    p95 = num(row, f"{metric}_p95")
    if not math.isnan(p95):
        return Latency(p95, f"p95 of {samples:.0f} requests")
    top = num(row, f"{metric}_max")
    if math.isnan(top):
        return None
    count = "" if math.isnan(samples) else f" of {samples:.0f} requests"
    return Latency(top, f"max{count}; a p95 needs {MIN_SAMPLES_P95}")


def cost(row: pd.Series, limits: Limits) -> float:
    """$/1M output tokens: at the limits' price, else at the price the run logged, else NaN."""
    price = limits.price_per_hour_usd or num(row, "price_per_hour_usd")
    tok = num(row, "tok_per_s")
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


def misses_quality(q: Quality, limits: Limits) -> list[str]:
    """The quality limits scores ``q`` miss, each with its number (the served pick's budget)."""
    return [m.text for m in _quality_misses(q, limits)]


def misses_with_excess(row: pd.Series, rows: pd.DataFrame, limits: Limits) -> list[Miss]:
    found = _quality_misses(quality(row, rows), limits)
    match = num(row, "fidelity_token_match")
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
    return [m.text for m in misses_with_excess(row, rows, limits)]


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
