"""Size a sweep to this machine: calibrate each model's step cost, estimate every trial, shrink to a budget.

Why: the same plan takes 35 minutes on a CPU with native bf16 and many hours on an AVX2-only one,
where a bf16 step is ~20x slower. So before a sweep starts, the driver measures what a step costs
here (``calibrate``: per model and precision, one prefill and a few decode steps at batch 1 on the
threads a trial gets), estimates each planned trial from its workload (``trial_seconds``: decode
steps and prefill tokens, counted the way the group's runner generates, plus reference runs a worker
makes once), and when the total exceeds ``--budget`` shrinks the workloads (``fit``):

* by one global *level* for every trial, each level halving new tokens, prompts per type (and
  perplexity windows) or taking one repeat away, down to floors (``MIN_NEW_TOKENS``, one prompt per
  type, ``MIN_REPEATS`` repeats, so a 95 % interval is still worth drawing: with 3 repeats t is
  4.30, with 2 it is 12.71 and a tok/s interval spans orders of magnitude). Never the set of trials: every
  chart keeps every bar, with less data behind it.
* trials in a precision this device only emulates (bf16 on an AVX2 CPU) shrink further, each to at
  most ``emulated_cap_s``, so that the bar stays on the chart, measured honestly, without taking
  the budget of the rest. Their runs carry ``precision_native=False``.

In stages: the trials whose models need no build (real models, converted in seconds; a user's own)
start while the zoo trains (``sweeps.zoo_beside``), so they are fitted first, to the budget's share by
trial count (``first_stage_budget``), and the zoo's trials, fitted once the zoo is built and
calibrated, get what the first stage's estimate leaves (``later_stage_budget``). Always in these
stages, built zoo or not, so the same machine always plans the same configs.

Calibrations are cached per machine and per purpose (``cache_file``: the main job's
``~/.cache/llm-inference-sweeps/calibration.json``, or ``$LLM_SWEEPS_CALIBRATION``; a sweep file's
beside it, so one sweep's calibration never changes another's plan; keyed by CPU, torch version,
threads and the model's identity), and each sweep keeps the step costs it used in its store
(``sweeps.record``), which ``calibrate`` prefers (``recorded``): a rerun against a store plans the
same configs (same ``config_hash``) and skips finished ones instead of measuring again what a
slightly different calibration would have chosen. ``--recalibrate`` measures afresh.

The estimate is a model, not a measurement: the sweep prints it before it starts and the
measured time when it ends, so the two can be compared.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trials import groups
from trials import engines
from trials.config import TrialConfig
from trials.errors import ConfigError
from trials.models import pypi, zoo
from trials.models.registry import ModelEntry, reference_precision
from trials.prompts import workload_prompts
from trials.worker import WORKER

log = logging.getLogger("sweeps.budget")

CACHE_ENV_VAR = "LLM_SWEEPS_CALIBRATION"   # moves the cache file (tests use a fresh one)
MAIN_PURPOSE = "main"                      # the main job's calibration (no sweep file)


def cache_file(purpose: str = MAIN_PURPOSE) -> Path:
    """The calibration cache of one purpose (``sweeps.record.purpose``): the main job's file, or for
    a sweep file ``calibration.<purpose>.json`` beside it, so that one sweep's calibration (a
    ``--recalibrate`` of a small sweep of one's own) never changes another's plan."""
    main = Path(os.environ.get(CACHE_ENV_VAR)
                or Path.home() / ".cache" / "llm-inference-sweeps" / "calibration.json")
    return main if purpose == MAIN_PURPOSE else main.with_name(f"{main.stem}.{purpose}{main.suffix or '.json'}")


CALIBRATION_FORMAT = 1
PREFILL_TOKENS = 32
DECODE_STEPS = 4
WARMUP_TOKENS = 2                 # trials.loop.WARMUP_TOKENS
MIN_NEW_TOKENS = 16
MIN_NEW_TOKENS_EMULATED = 8
MIN_REPEATS = 3                   # a profile may ask for fewer (a deterministic byte count needs no more)
TRIAL_OVERHEAD_S = 2.0            # Ray's per-trial overhead with reused actors, plus bookkeeping
# On one CPU thread a decode step at batch b costs ~(1 + growth (b - 1)) steps at batch 1 for the
# zoo's models; `llm-report` prints the growth each model showed in a store's
# batching runs (README, "Why the sizes").
BATCH_STEP_GROWTH = 0.07
# Each level: (divisor of new tokens, divisor of prompts per type and perplexity windows, repeats
# taken away). Level 0 is the profile as written.
LEVELS = ((1, 1, 0), (2, 1, 0), (2, 2, 0), (2, 2, 1), (4, 2, 1), (4, 4, 1), (4, 4, 2), (8, 4, 2),
          (8, 8, 2), (16, 8, 2), (16, 16, 3))


@dataclass(frozen=True)
class StepCost:
    """What a model costs here in one precision, at batch 1 on the trial's threads."""

    decode_s: float          # one decode step (median of a few, with a KV cache)
    prefill_token_s: float   # per token of a PREFILL_TOKENS-token prefill
    load_s: float
    measured_at: str = ""


# ------------------------------------------------------------------------------ calibration

def _fingerprint(threads: int, device: str) -> str:
    import torch

    from trials.measurement.hardware import cpu_profile

    p = cpu_profile()
    gpu = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else ""
    return f"{p.model}|{p.capability}|bf16={p.bf16_native}|torch={torch.__version__}|threads={threads}|{gpu}"


def _model_identity(entry: ModelEntry) -> str:
    """What makes two calibrations of one name comparable: the zoo recipe, the converted GGUF's
    sha256 (real models from PyPI), or the folder/hub id."""
    if entry.source == "zoo":
        return zoo.recipe_hash(entry.location)
    if entry.source == "pypi" and pypi.is_converted(entry.location):
        return pypi.load_card(entry.location)["gguf_sha256"][:16]
    return entry.location


def _key(model: ModelEntry, precision: str, device: str, threads: int) -> str:
    return f"{model.name}|{precision}|{device}|{_model_identity(model)}|{_fingerprint(threads, device)}"


CACHE_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError)


def _load_cache(path: Path) -> dict:
    data = json.loads(path.read_text())
    entries = data["entries"] if data.get("format") == CALIBRATION_FORMAT else {}
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise TypeError("entries are not a mapping of mappings")
    return entries


def _read_cache(path: Path | None = None) -> dict:
    """The cached step costs; none where there is no cache, and, said in one line, where it is damaged
    (not JSON, or not the shape this module writes): then every model is measured again."""
    path = path or cache_file()
    try:
        return _load_cache(path)
    except FileNotFoundError:
        return {}
    except CACHE_ERRORS as exc:
        log.warning("calibration cache %s is damaged (%s): measuring again", path, type(exc).__name__)
        return {}


def _write_cache(measured: dict, path: Path | None = None) -> None:
    """Add ``measured`` to the cache, over what the file holds now (not what it held when the
    calibration began: the zoo's calibration beside the first trials writes the same file)."""
    path = path or cache_file()
    try:
        entries = _load_cache(path)
    except CACHE_ERRORS:
        entries = {}
    entries.update(measured)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"format": CALIBRATION_FORMAT, "entries": entries}, indent=1))
    os.replace(tmp, path)


def measure_step_cost(model: ModelEntry, precision: str, device: str) -> StepCost:
    """Load the model, time one prefill of PREFILL_TOKENS tokens and DECODE_STEPS decode steps."""
    import torch

    from trials.models import loading
    loaded = loading.load(model, precision, device)
    net = loaded.model
    vocab = net.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (1, PREFILL_TOKENS), generator=generator).to(loaded.device)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        net(input_ids=ids[:, :4])                             # first call: lazy init, kernel choice
        sync()
        started = time.perf_counter()
        out = net(input_ids=ids, use_cache=True)
        sync()
        prefill_s = time.perf_counter() - started
        cache, token, steps = out.cache, out.logits[:, -1:].argmax(-1), []
        for _ in range(DECODE_STEPS):
            started = time.perf_counter()
            out = net(input_ids=token, cache=cache, use_cache=True)
            sync()
            steps.append(time.perf_counter() - started)
            cache, token = out.cache, out.logits[:, -1:].argmax(-1)
    return StepCost(decode_s=statistics.median(steps), prefill_token_s=prefill_s / PREFILL_TOKENS,
                    load_s=loaded.load_s, measured_at=time.strftime("%Y-%m-%d %H:%M:%S"))


def calibrate(pairs: set[tuple[ModelEntry, str]], device: str, threads: int, recalibrate: bool = False,
              cache: Path | None = None, recorded: dict | None = None,
              measure: bool = True) -> dict[tuple[str, str], StepCost]:
    """Step costs for every (model, precision), by (model name, precision): as ``recorded`` (the
    store's sweep records, by calibration key: what sized its finished trials), else from the
    per-machine ``cache`` file (the main job's by default), else measured now and cached
    (``recalibrate``: measured now, whatever is recorded or cached; ``measure`` False: only what is
    known, nothing measured, nothing written).

    A pair that cannot load here (a missing optional package, a hub model without a network) gets no
    entry: its trials fail at once with that reason, so they cost nothing.
    """
    import torch

    cache = cache or cache_file()
    known = {} if recalibrate else {**_read_cache(cache), **(recorded or {})}
    costs: dict[tuple[str, str], StepCost] = {}
    todo = []
    for model, precision in sorted(pairs, key=lambda pair: (pair[0].name, pair[1])):
        entry = known.get(_key(model, precision, device, threads))
        try:
            costs[(model.name, precision)] = StepCost(**entry)
        except TypeError:                    # not cached, or an entry of another shape: measured again
            todo.append((model, precision))
    if not todo or not measure:
        return costs
    log.info("calibrating %d model/precision pair(s) on %d thread(s): one prefill and %d decode "
             "steps each", len(todo), threads, DECODE_STEPS)
    measured: dict[str, dict] = {}
    previous_threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(threads)
    try:
        for i, (model, precision) in enumerate(todo, 1):
            try:
                cost = measure_step_cost(model, precision, device)
            except (ConfigError, ImportError) as exc:
                log.info("  [%d/%d] %s %s: not calibrated (%s)", i, len(todo), model.name, precision,
                         str(exc).splitlines()[0])
                continue
            except OSError as exc:      # weights not here: a hub id offline, a folder gone
                log.warning("  [%d/%d] %s %s: cannot load it here, not calibrated (%s); its trials fail "
                            "the same way unless the workers can reach it", i, len(todo), model.name, precision,
                            str(exc).splitlines()[0])
                continue
            finally:
                WORKER.drop_models()
            costs[(model.name, precision)] = cost
            measured[_key(model, precision, device, threads)] = asdict(cost)
            log.info("  [%d/%d] %s %s: %.1f ms per decode step, %.2f ms per prefill token",
                     i, len(todo), model.name, precision, cost.decode_s * 1e3, cost.prefill_token_s * 1e3)
    finally:
        torch.set_num_threads(previous_threads)
    _write_cache(measured, cache)
    return costs


def keyed(pairs: set[tuple[ModelEntry, str]], costs: dict[tuple[str, str], StepCost], device: str,
          threads: int) -> dict[str, dict]:
    """The step costs of ``pairs`` by calibration key (model, precision, device, the model's identity,
    this machine): what a sweep's record keeps, and what ``calibrate(recorded=...)`` reads back."""
    return {_key(model, precision, device, threads): asdict(costs[(model.name, precision)])
            for model, precision in pairs if (model.name, precision) in costs}


def calibrated_precision(config: TrialConfig) -> str:
    """The precision whose step cost estimates ``config``: its own, or for an engine the budget does
    not calibrate (``Engine.calibrated``) the default engine's reference precision, an upper bound there."""
    if engines.get(config.stack.engine).calibrated:
        return config.stack.precision
    return reference_precision(config.entry(), config.device)


def pairs_needed(configs: list[TrialConfig]) -> set[tuple[ModelEntry, str]]:
    """(model entry, precision) pairs whose step cost the estimate of ``configs`` reads."""
    pairs = set()
    for c in configs:
        pairs.add((c.entry(), calibrated_precision(c)))
        if c.stack.draft_model:
            pairs.add((c.entry(c.stack.draft_model), c.stack.precision))
        if groups.get(c.group).calibrates_reference:
            pairs.add((c.entry(), reference_precision(c.entry(), c.device)))
    return pairs


# ------------------------------------------------------------------------------ estimate

def _prompts(config: TrialConfig) -> tuple[int, float]:
    """Number of prompts and their mean length in tokens (a chars/4 estimate unless set exactly)."""
    prompts = workload_prompts(config.workload.prompt_set, config.workload.prompts_per_type)
    tokens = config.workload.context_tokens or statistics.mean(len(p.text) for p in prompts) / 4
    return len(prompts), tokens


def _generate_s(cost: StepCost, prompts: int, prompt_tokens: float, new_tokens: int, repeats: int,
                batch: int) -> float:
    """Warm-up plus ``repeats`` timed passes of trials.loop.measure."""
    batches = math.ceil(prompts / batch)
    step = cost.decode_s * (1 + BATCH_STEP_GROWTH * (batch - 1))
    decode = batches * (repeats * new_tokens + WARMUP_TOKENS) * step
    prefill = batches * (repeats + 1) * batch * prompt_tokens * cost.prefill_token_s
    return decode + prefill


class Estimate:
    """What a technique's cost model (``Technique.cost``) needs for one trial: this machine's step
    costs, the trial's prompts, and the arithmetic every technique shares."""

    def __init__(self, config: TrialConfig, costs: dict[tuple[str, str], StepCost], cost: StepCost,
                 references: set):
        self.config, self.costs, self.cost, self.references = config, costs, cost, references
        self.prompts, self.prompt_tokens = _prompts(config)
        w, s = config.workload, config.stack
        self.plain = self.generate_s(cost, w.max_new_tokens, config.repeats, s.batch_size)

    def step(self, model: str | None, precision: str) -> StepCost | None:
        """The calibrated step cost of ``model`` in ``precision`` (None where it could not load)."""
        return self.costs.get((model, precision))

    def generate_s(self, cost: StepCost, new_tokens: int, repeats: int, batch: int) -> float:
        """Warm-up plus ``repeats`` timed passes of the trial's prompts (``trials.loop.measure``)."""
        return _generate_s(cost, self.prompts, self.prompt_tokens, new_tokens, repeats, batch)

    def draft_s(self) -> float:
        """The draft model's steps of a speculative trial: k per round, about two tokens per target
        pass (0 for prompt lookup, or a draft that could not load)."""
        s, w = self.config.stack, self.config.workload
        draft = self.step(s.draft_model, s.precision) if s.draft_model else None
        if draft is None:
            return 0.0
        return w.max_new_tokens * self.config.repeats * self.prompts / 2 * s.num_draft_tokens * draft.decode_s

    def teacher_forced_s(self, cost: StepCost) -> float:
        """One teacher-forced pass at ``cost``: each prompt pre-filled, then its last new tokens fed."""
        return self.prompts * (self.prompt_tokens * cost.prefill_token_s
                               + self.config.workload.max_new_tokens * cost.decode_s)

    def once(self, key, seconds: float) -> float:
        """``seconds`` the first time ``key`` is met (a reference a worker measures once), else 0."""
        if key in self.references:
            return 0.0
        self.references.add(key)
        return seconds


def trial_seconds(config: TrialConfig, costs: dict[tuple[str, str], StepCost],
                  references: set | None = None) -> float:
    """Estimated seconds of one trial: its technique's cost model (``Technique.cost``; the loop's
    timed passes where it has none), loading, and the per-trial overhead. ``references`` collects
    reference runs already counted (a worker measures a group's reference once and reuses it)."""
    references = set() if references is None else references
    precision = calibrated_precision(config)
    cost = costs.get((config.model, precision))
    if cost is None:
        return TRIAL_OVERHEAD_S                                  # fails at once (missing package)
    estimate = Estimate(config, costs, cost, references)
    technique = groups.get(config.group)
    total = TRIAL_OVERHEAD_S + (technique.cost(config, estimate) if technique.cost else estimate.plain)
    for other in map(groups.get, config.also_charted_by):     # groups that chart the same run: their
        if other.shared_cost is not None:                     # own numbers on it, the measurement once
            total += other.shared_cost(config.charted_as(other.name), estimate)
    return total + estimate.once(("load", config.model, precision), cost.load_s)


def estimate_seconds(configs: list[TrialConfig], costs: dict[tuple[str, str], StepCost]) -> float:
    references: set = set()
    return sum(trial_seconds(c, costs, references) for c in configs)


# ------------------------------------------------------------------------------ shrinking

def shrink(config: TrialConfig, level: int, emulated: bool = False) -> TrialConfig:
    """``config`` with its workload cut to ``level`` of ``LEVELS`` (level 0: unchanged)."""
    if level == 0:
        return config
    tokens_div, prompts_div, fewer_repeats = LEVELS[min(level, len(LEVELS) - 1)]
    w = config.workload
    min_tokens = MIN_NEW_TOKENS_EMULATED if emulated else MIN_NEW_TOKENS
    workload = replace(
        w, max_new_tokens=max(min(w.max_new_tokens, min_tokens), w.max_new_tokens // tokens_div),
        prompts_per_type=max(1, w.prompts_per_type // prompts_div))
    for technique in map(groups.get, config.charts):          # as every group that charts it shrinks it
        if technique.shrink is not None:
            workload = technique.shrink(config, workload, prompts_div)
    repeats = max(min(config.repeats, MIN_REPEATS), config.repeats - fewer_repeats)
    return replace(config, workload=workload, repeats=repeats)


@dataclass
class Fit:
    """What ``fit`` chose: the configs to run and why."""

    configs: list[TrialConfig]
    level: int
    estimate_s: float            # all trials, summed (one worker's worth of time)
    unscaled_s: float
    budget_s: float | None
    emulated: list[tuple[TrialConfig, int, float]]   # (config, its own level, its estimate)

    def describe_level(self, level: int | None = None) -> str:
        level = self.level if level is None else level
        if level == 0:
            return "the profile as written"
        tokens, prompts, repeats = LEVELS[min(level, len(LEVELS) - 1)]
        parts = [f"new tokens /{tokens}" if tokens > 1 else "",
                 f"prompts per type /{prompts}" if prompts > 1 else "",
                 f"repeats -{repeats}" if repeats else ""]
        return f"level {level}: " + ", ".join(p for p in parts if p) + \
            f" (floors: {MIN_NEW_TOKENS} new tokens, 1 prompt per type, {MIN_REPEATS} repeats)"


def fit(configs: list[TrialConfig], costs: dict[tuple[str, str], StepCost], budget_s: float | None,
        workers: int, emulated_cap_s: float | None = None) -> Fit:
    """Shrink the workloads (one level for all, more for emulated precisions) to fit ``budget_s``
    of wall time on ``workers`` parallel trials. The set of trials never changes."""
    from trials.measurement.hardware import precision_is_native

    unscaled = estimate_seconds(configs, costs)
    if budget_s is None:
        return Fit(list(configs), 0, unscaled, unscaled, None, [])
    cap = emulated_cap_s if emulated_cap_s is not None else max(20.0, budget_s / 60)
    is_emulated = [not precision_is_native(c.stack.precision, c.device) for c in configs]

    def at(level: int) -> tuple[list[TrialConfig], list]:
        out, emulated = [], []
        for c, emu in zip(configs, is_emulated):
            if not emu:
                out.append(shrink(c, level))
                continue
            own = level
            while own < len(LEVELS) - 1 and trial_seconds(shrink(c, own, True), costs) > cap:
                own += 1
            shrunk = shrink(c, own, True)
            out.append(shrunk)
            emulated.append((shrunk, own, trial_seconds(shrunk, costs)))
        return out, emulated

    for level in range(len(LEVELS)):
        shrunk, emulated = at(level)
        total = estimate_seconds(shrunk, costs)
        if total / max(1, workers) <= budget_s or level == len(LEVELS) - 1:
            return Fit(shrunk, level, total, unscaled, budget_s, emulated)
    raise AssertionError("unreachable")


def first_stage_budget(budget_s: float | None, first: int, total: int) -> float | None:
    """The first stage's wall time: the budget's share by trial count (all of it for one stage)."""
    if budget_s is None or total == 0:
        return budget_s
    return budget_s * first / total


def later_stage_budget(budget_s: float | None, first: Fit | None, workers: int) -> float | None:
    """What the first stage's estimate left of the budget (at least a second: the floors then)."""
    if budget_s is None:
        return None
    used = first.estimate_s / max(1, workers) if first is not None else 0.0
    return max(1.0, budget_s - used)


def parse_budget(text: str) -> float | None:
    """'30m', '90s', '1.5h', '45' (minutes) -> seconds; 'none' or '0' -> no budget."""
    value = text.strip().lower()
    if value in ("none", "0", "off"):
        return None
    units = {"s": 1, "m": 60, "min": 60, "h": 3600}
    for suffix in sorted(units, key=len, reverse=True):
        if value.endswith(suffix):
            number, scale = value[:-len(suffix)], units[suffix]
            break
    else:
        number, scale = value, 60
    try:
        seconds = float(number) * scale
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):                 # nan, inf: float() reads them, no clock does
        raise ValueError(f"budget {text!r} is not a duration; use e.g. 30m, 90s, 1.5h or none")
    if seconds <= 0:
        raise ValueError(f"budget {text!r} must be positive (or 'none')")
    return seconds


def format_calibration(costs: dict[tuple[str, str], StepCost], device: str) -> str:
    from trials.measurement.hardware import precision_is_native

    width = max([len("model"), *(len(model) for model, _ in costs)]) + 2
    lines = [f"  {'model':<{width}}{'precision':<11}{'decode ms/step':>15}{'prefill ms/token':>18}{'load s':>8}"]
    for (model, precision), c in sorted(costs.items()):
        note = "" if precision_is_native(precision, device) else "  (emulated on this CPU)"
        lines.append(f"  {model:<{width}}{precision:<11}{c.decode_s * 1e3:>15.1f}{c.prefill_token_s * 1e3:>18.2f}"
                     f"{c.load_s:>8.1f}{note}")
    return "\n".join(lines)
