"""What each optimization contributes: main effects and two-way interactions from a 2^n design.

The stacks group runs, per model, the combinations of a few binary factors (weights base / 4-bit,
KV cache 16 / 4-bit, speculation off / on), each combination ONE trial. Coding each factor -1 (off)
/ +1 (on), the effect of a term (one factor, or the product of two) on a response y is, in a
complete design,

    effect = (mean of y where the term is +1) - (mean of y where it is -1)
           = sum_i c_i * y_i / 2^(n-1),      c_i = the term's sign in trial i

With y = log(tok/s), ``exp(effect)`` is the factor by which turning the optimization on multiplies
throughput, averaged over the other factors' levels; an interaction says how much one factor's
effect changes when the other is on (a 4-bit target can make speculation slower). Some combinations
cannot run at all (transformers' assisted generation cannot crop a quantized KV cache, so KV
quantization and speculation never meet): their interaction is not estimable and is left out, and
the remaining terms are fitted by least squares on the -1/+1 coding (``effect`` = 2 x coefficient;
in a complete design exactly the formula above). Each trial's y is the mean of its repeats' log
throughputs, with sample variance s_i^2 over r_i repeats, so with P = (X'X)^-1 X'

    Cov(effects) = 4 P diag(s_i^2 / r_i) P',   df = sum_i (r_i - 1)

and the 95 % interval is effect +- t(0.975, df) * se. An interval that spans zero means the repeats
cannot tell the effect from noise. Peak memory is one measurement per trial (no repeats), so its
effects carry no interval. numpy and pandas only: the dashboard imports it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trials.config import four_bit_weights
from trials.engines import DEFAULT as DEFAULT_ENGINE
from trials.stats.runs import latest

FACTOR_TAG = "factor."          # tags.factor.<name> = "0" | "1" on every stacks run
FACTORS = ("weights", "kv", "spec", "compile")   # the design's binary factors, in the order charts list them
ENGINE_FACTOR = "engine:"       # the engine factor: one -1/+1 column per engine besides the default


def stack_factors(stack) -> dict[str, bool]:
    """Which of the design's binary factors a stack turns on (off: the base stack's level). The
    engine is a factor with one level per engine (``engine_factors``), read from the run's engine."""
    return {"weights": four_bit_weights(stack), "kv": stack.kv_bits != 16,
            "spec": stack.speculation != "none", "compile": stack.compile}


def engine_factors(frame: pd.DataFrame) -> list[str]:
    """``engine:<name>`` for every engine besides the default in a stacks frame. Coded +1 on that
    engine's runs and -1 elsewhere, beside each other, each effect (2 x its coefficient) is that
    engine's difference from the default engine (the level where all are -1), each on its own 16-bit
    base (its weights factor's off level)."""
    if "engine" not in frame:
        return []
    names = frame["engine"].fillna(DEFAULT_ENGINE).replace("", DEFAULT_ENGINE)
    return [f"{ENGINE_FACTOR}{name}" for name in sorted(set(names) - {DEFAULT_ENGINE})]


@dataclass(frozen=True)
class Effect:
    model: str
    response: str               # "tok_per_s" or "peak_memory_bytes"
    term: str                   # "spec" or "weights x kv"
    estimate: float             # on the log scale
    ci_low: float               # NaN where the response has no repeats
    ci_high: float
    cells: int                  # trials in the design

    @property
    def ratio(self) -> float:
        """What turning the term on multiplies the response by (exp of the log effect)."""
        return math.exp(self.estimate)

    @property
    def significant(self) -> bool | None:
        """Whether the 95 % interval excludes zero; None without an interval."""
        if math.isnan(self.ci_low):
            return None
        return self.ci_low > 0 or self.ci_high < 0


def t_quantile(df: int, level: float = 0.975) -> float:
    """Student's t quantile (scipy); NaN for df < 1, where no interval exists."""
    if df < 1:
        return float("nan")
    from scipy import stats

    return float(stats.t.ppf(level, df))


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """The mean's two-sided ``level`` t-interval; NaN bounds with fewer than two values."""
    n = len(values)
    if n < 2:
        return float("nan"), float("nan")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(n - 1, 0.5 + level / 2) * sd / math.sqrt(n)
    return mean - half, mean + half


def factor_columns(frame: pd.DataFrame) -> list[str]:
    """The factor names present in a stacks frame (from the ``tags.factor.*`` columns)."""
    prefix = f"tags.{FACTOR_TAG}"
    names = {c[len(prefix):] for c in frame.columns if c.startswith(prefix)} - {"engine"}   # engine: its column
    if not names:
        return []
    return [f for f in FACTORS if f in names] + sorted(names - set(FACTORS)) + engine_factors(frame)


def cells(frame: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """One model's runs coded -1/+1 in columns named after the factors, the latest run per cell."""
    coded = frame.copy()
    if "batch_size" in coded:                   # batched stacks sit beside the design, not in it
        coded = coded[pd.to_numeric(coded["batch_size"]) == 1]
    for name in factors:       # a run from before a factor existed ran at its base level
        if name.startswith(ENGINE_FACTOR):
            engine = coded["engine"].fillna(DEFAULT_ENGINE).replace("", DEFAULT_ENGINE)
            coded[name] = (engine == name[len(ENGINE_FACTOR):]).map({True: 1, False: -1})
        else:
            coded[name] = coded[f"tags.{FACTOR_TAG}{name}"].fillna("0").astype(str).map({"0": -1, "1": 1})
    coded = coded.dropna(subset=factors)
    return latest(coded, factors)


def estimable_terms(coded: pd.DataFrame, factors: list[str]) -> tuple[list[tuple[str, ...]], list[str]]:
    """Terms the cells can estimate: every main effect whose factor has both levels, every two-way
    interaction whose factors were ever on together; and, for each left out, why."""
    kept, why = [], []
    for term in terms(factors):
        if len(term) == 1:
            ok = coded[term[0]].nunique() == 2
            reason = f"{term[0]}: only one level ran"
        else:
            ok = ((coded[term[0]] == 1) & (coded[term[1]] == 1)).any()
            reason = f"{' x '.join(term)}: never on together (the combination cannot run or failed)"
        (kept if ok else why).append(term if ok else reason)
    return kept, why


def estimate(coded: pd.DataFrame, kept: list[tuple[str, ...]], y: pd.Series, var: pd.Series | None,
             repeats: pd.Series | None) -> list[tuple[tuple[str, ...], float, float, float]] | None:
    """(term, effect, ci_low, ci_high) by least squares on the -1/+1 coding (effect = 2 x the
    coefficient: the +1 mean minus the -1 mean in a complete design, where this is exactly the
    contrast formula above); the interval from the cells' repeat variances. None when the cells
    cannot separate the terms (fewer cells than terms, or a rank-deficient design)."""
    x = np.column_stack([np.ones(len(coded))] + [coded[list(t)].prod(axis=1).to_numpy(float) for t in kept])
    if len(coded) < x.shape[1] or np.linalg.matrix_rank(x) < x.shape[1]:
        return None
    pinv = np.linalg.pinv(x)                          # (X'X)^-1 X'
    beta = pinv @ y.to_numpy(float)
    df = int((repeats - 1).clip(lower=0).sum()) if repeats is not None else 0
    t = t_quantile(df) if var is not None else float("nan")
    if var is not None and not math.isnan(t):
        cov = pinv @ np.diag(var.to_numpy(float) / repeats.to_numpy(float)) @ pinv.T
        se = np.sqrt(np.diag(cov))
    out = []
    for i, term in enumerate(kept, start=1):
        value = 2 * float(beta[i])
        if var is None or math.isnan(t):
            out.append((term, value, float("nan"), float("nan")))
        else:
            out.append((term, value, value - 2 * t * float(se[i]), value + 2 * t * float(se[i])))
    return out


def terms(factors: list[str]) -> list[tuple[str, ...]]:
    """Main effects, then every two-way interaction."""
    return [(f,) for f in factors] + list(itertools.combinations(factors, 2))


def effects(frame: pd.DataFrame) -> tuple[list[Effect], dict[str, str]]:
    """Effects on log throughput (with intervals) and log peak memory, per model; and, per model,
    what could not be estimated and why (terms left out, or no estimate at all)."""
    factors = factor_columns(frame)
    found: list[Effect] = []
    notes: dict[str, str] = {}
    if not factors:
        return found, notes
    for model, part in frame.groupby("model"):
        coded = cells(part, factors)
        kept, why = estimable_terms(coded, factors)
        # a cell measured once has no variance: then the effects have no interval (NaN), not an error
        var = coded.get("log_tok_per_s_var")
        var = None if var is None or var.isna().any() else var
        speed = estimate(coded, kept, coded["log_tok_per_s_mean"], var,
                         coded["tok_per_s_repeats"] if var is not None else None)
        if speed is None:
            notes[model] = (f"{len(coded)} of {2 ** len(factors)} combinations finished: too few to "
                            f"separate {len(kept)} effects")
            continue
        memory = estimate(coded, kept, coded["peak_memory_bytes"].astype(float).map(math.log), None, None)
        for response, rows in (("tok_per_s", speed), ("peak_memory_bytes", memory)):
            found += [Effect(model, response, " x ".join(term), value, low, high, len(coded))
                      for term, value, low, high in rows]
        if why:
            notes[model] = "not estimable: " + "; ".join(why)
    return found, notes
