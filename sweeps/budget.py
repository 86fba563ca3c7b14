"""Size a sweep to this machine: calibrate each model's step cost, estimate every trial, shrink to a budget.

Why: the same plan takes minutes on a CPU with native bf16 and hours on an AVX2-only one, where a
bf16 step is an order of magnitude slower. So before a sweep starts, the driver measures what a step costs
here (``calibrate``: per model and precision, one prefill and a few decode steps at batch 1 on the
threads a trial gets; a zoo model not trained yet is timed as its recipe's architecture with random
weights, ``trials.models.zoo.stand_in``, so the whole plan is sized before the first trial), estimates
each planned trial from its workload (``trial_seconds``: decode steps and prefill tokens, counted the
way the group's runner generates, plus reference runs a worker makes once), and when the total
exceeds ``--budget`` shrinks the workloads (``fit``):

* by one global *level* for every trial, each level halving new tokens, prompts per type (and
  perplexity windows) or taking one repeat away, down to floors (``MIN_NEW_TOKENS``, one prompt per
  type, ``MIN_REPEATS`` repeats, so a 95 % interval is still worth drawing: with 3 repeats t is
  4.30, with 2 it is 12.71 and a tok/s interval spans orders of magnitude).
* trials in a precision this device only emulates (bf16 on an AVX2 CPU) shrink further, each to at
  most ``emulated_cap_s``, so that the bar stays on the chart, measured honestly, without taking
  the budget of the rest. Their runs carry ``precision_native=False``.

The estimate is in worker-seconds: a trial that holds its node (a server and its load generator)
takes every worker's share. Past the floors, ``sweeps.deferral`` defers the lowest-priority trials
to the next run; the level is chosen from the whole plan, never from what is left of it, so a rerun
on the same store plans the same configs and runs exactly what was deferred.

Each engine's trials are estimated from its own step where it measures one (``Engine.measures_steps``:
llama.cpp times its GGUF of the trial's type with its own kernels), a server from the engine it builds
on (llama.cpp's server from llama.cpp), any other engine from the default engine's step of its
precision (``calibrated_as``): a 4-bit GGUF step is not an fp32 transformers step.

Calibrations are cached per machine and per purpose (``cache_file``: the main job's
``~/.cache/llm-inference-sweeps/calibration.json``, or ``$LLM_SWEEPS_CALIBRATION``; a sweep file's
beside it, so one sweep's calibration never changes another's plan; keyed by CPU, torch version,
threads, the model's identity and, for an engine other than the default, that engine and its
version), and each sweep keeps the step costs it used in its store
(``sweeps.record``), which ``calibrate`` prefers (``recorded``): a rerun against a store plans the
same configs (same ``config_hash``) and skips finished ones instead of measuring again what a
slightly different calibration would have chosen. ``--recalibrate`` measures afresh.

The estimate is a model, not a measurement: the sweep prints it before it starts and, per group,
beside the measured time when it ends.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import os
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from sweeps.deferral import worker_seconds
from trials import groups
from trials import engines
from trials.config import TrialConfig
from trials.engines.spec import StepCost
from trials.errors import ConfigError
from trials.models import pypi, zoo
from trials.models.registry import ModelEntry, reference_precision
from trials.prompts import workload_prompts
from trials.worker import WORKER, model_cache_size

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
TRIAL_OVERHEAD_S = 0.5            # Ray's per-trial overhead with reused actors, plus bookkeeping
# A trial in a fresh worker process (the run's first on each worker; every worker after a trial that
# held the node, whose one-core actors Ray does not keep) imports torch and transformers and loads
# its first model cold: about this much over a warm worker (the zoo's trials in a fresh worker took
# a median 6.5 s outside their timed passes, in a warm one 1.1 s).
WORKER_START_S = 5.0
# On one CPU thread a decode step at batch b costs ~(1 + growth (b - 1)) steps at batch 1 for the
# zoo's models; `llm-report` prints the growth each model showed in a store's
# batching runs (README, "Why the sizes").
BATCH_STEP_GROWTH = 0.07
# A prefill of b rows costs ~b ** exponent rows at batch 1: one larger matmul uses the cores better
# (fitted to the batching group's runs of recorded make runs; `python -m benchmarks.estimate_vs_measured`
# prints each group's estimate beside what it took).
PREFILL_BATCH_EXPONENT = 0.75
# A trained token against a calibration's prefill token: forward and backward, ~3 forward passes; a
# distilled draft's teacher adds its forward. Priors, checked against each build beside the trials
# (the summary prints both): larger training batches run more efficiently per token, but the build
# shares the machine with the trials and builds beside it, and the two roughly cancel.
TRAIN_TOKEN_PREFILLS = 3.0
TEACHER_TOKEN_PREFILLS = 1.0
# Each level: (divisor of new tokens, divisor of prompts per type and perplexity windows, repeats
# taken away). Level 0 is the profile as written.
LEVELS = ((1, 1, 0), (2, 1, 0), (2, 2, 0), (2, 2, 1), (4, 2, 1), (4, 4, 1), (4, 4, 2), (8, 4, 2),
          (8, 8, 2), (16, 8, 2), (16, 16, 3))


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


ENGINE_MARK = "@"
LEGACY_MARK = "legacy|"        # a step cost from a store's record written before engines measured their own


def step_label(engine: str, precision: str) -> str:
    """How a step cost is named (in pairs, costs and cache keys): the precision alone on the default
    engine (the shape every cache and record holds from before engines measured their own steps),
    ``precision@engine`` on another engine."""
    return precision if engine == engines.DEFAULT else f"{precision}{ENGINE_MARK}{engine}"


def engine_of(label: str) -> tuple[str, str]:
    """(engine, precision) of a step label."""
    precision, _, engine = label.partition(ENGINE_MARK)
    return engine or engines.DEFAULT, precision


def _engine_version(engine: str) -> str:
    """The engine's package and version: a new build of it is a new calibration."""
    package = engines.get(engine).package
    try:
        return f"{package}={getattr(importlib.import_module(package), '__version__', '?')}"
    except ImportError:
        return f"{package}=missing"


def _key(model: ModelEntry, label: str, device: str, threads: int) -> str:
    key = f"{model.name}|{label}|{device}|{_model_identity(model)}|{_fingerprint(threads, device)}"
    engine, _ = engine_of(label)
    return key if engine == engines.DEFAULT else f"{key}|{_engine_version(engine)}"


def legacy_entries(calibration: dict[str, dict]) -> dict[str, dict]:
    """A store record's step costs from before engines measured their own, under keys only
    ``calibrate`` reads: such a sweep sized every engine's trials from the default engine's reference
    step, and a rerun against that store sizes them so again (same configs, finished ones skipped)."""
    return {f"{LEGACY_MARK}{key}": cost for key, cost in calibration.items()}


CACHE_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError)


def _load_cache(path: Path) -> dict:
    data = json.loads(path.read_text())
    entries = data["entries"] if data.get("format") == CALIBRATION_FORMAT else {}
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise TypeError("entries are not a mapping of mappings")
    return entries


def read_cache(path: Path | None = None) -> dict:
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


def _current(entries: dict) -> dict:
    """The cached entries measured as this version measures: with the scored prefill apart. An older
    entry's one prefill scored every position, which a generation's does not (Gemma-3's prefill ~2x
    too dear): measured again, not trusted. A store's record is read as it is (it sized its trials)."""
    return {key: entry for key, entry in entries.items() if "scored_token_s" in entry}


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


def measure_step_cost(model: ModelEntry, label: str, device: str, threads: int) -> StepCost:
    """One prefill of PREFILL_TOKENS tokens and DECODE_STEPS decode steps of ``model``, timed by the
    engine the label names (``Backend.step_cost``) on ``threads`` threads."""
    engine, precision = engine_of(label)
    return engines.get(engine).runs().step_cost(model, precision, device, threads, PREFILL_TOKENS, DECODE_STEPS)


def _known(known: dict, model: ModelEntry, label: str, device: str, threads: int) -> StepCost | None:
    """The step cost ``known`` holds for the pair (None: not there, or an entry of another shape). An
    engine-measured pair a store's older record never held takes that record's reference step, as
    that sweep did (``legacy_entries``)."""
    keys = [_key(model, label, device, threads)]
    if label != engine_of(label)[1]:
        keys.append(LEGACY_MARK + _key(model, reference_precision(model, device), device, threads))
    for key in keys:
        try:
            return StepCost(**known[key])
        except (KeyError, TypeError):        # not there, or an entry of another shape: measured again
            continue
    return None


def calibrate(pairs: set[tuple[ModelEntry, str]], device: str, threads: int, recalibrate: bool = False,
              cache: Path | None = None, recorded: dict | None = None,
              measure: bool = True) -> dict[tuple[str, str], StepCost]:
    """Step costs for every (model, step label), by (model name, label; ``step_label``): as
    ``recorded`` (the store's sweep records, by calibration key: what sized its finished trials), else
    from the per-machine ``cache`` file (the main job's by default), else measured now by the label's
    engine and cached (``recalibrate``: measured now, whatever is recorded or cached; ``measure``
    False: only what is known, nothing measured, nothing written).

    A pair that cannot load here (a missing optional package, a hub model without a network) gets no
    entry: its trials fail at once with that reason, so they cost nothing.
    """
    cache = cache or cache_file()
    sources = [] if recalibrate else [recorded or {}, _current(read_cache(cache))]      # the store's record first
    costs: dict[tuple[str, str], StepCost] = {}
    todo = []
    for model, label in sorted(pairs, key=lambda pair: (pair[0].name, pair[1])):
        cost = next((c for c in (_known(s, model, label, device, threads) for s in sources) if c), None)
        if cost is None:
            todo.append((model, label))
        else:
            costs[(model.name, label)] = cost
    if not todo or not measure:
        return costs
    log.info("calibrating %d model/precision pair(s) on %d thread(s): one prefill and %d decode "
             "steps each", len(todo), threads, DECODE_STEPS)
    measured: dict[str, dict] = {}
    with contextlib.ExitStack() as stand_ins:
        _calibrate_each(todo, device, threads, costs, measured, _StandIns(stand_ins))
    _write_cache(measured, cache)
    return costs


class _StandIns:
    """Each zoo model not trained yet as one random-weight stand-in for all its pairs (an engine that
    converts it converts it once), removed when the calibration ends."""

    def __init__(self, stack: contextlib.ExitStack):
        self.stack, self.entries = stack, {}

    def __call__(self, model: ModelEntry) -> ModelEntry:
        if model.source != "zoo" or zoo.is_built(model.location):
            return model
        if model.name not in self.entries:
            from trials.models.zoo.stand_in import stand_in

            folder = self.stack.enter_context(stand_in(model.location))
            self.entries[model.name] = replace(model, source="local", location=str(folder))
        return self.entries[model.name]


def _calibrate_each(todo, device: str, threads: int, costs: dict, measured: dict, stand_ins: _StandIns) -> None:
    """Measure each (model, label) of ``todo`` into ``costs`` and ``measured`` (by calibration key), saying each."""
    for i, (model, label) in enumerate(todo, 1):
        started = time.perf_counter()
        try:
            cost = measure_step_cost(stand_ins(model), label, device, threads)
        except (ConfigError, ImportError) as exc:
            log.info("  [%d/%d] %s %s: not calibrated (%s)", i, len(todo), model.name, label,
                     str(exc).splitlines()[0])
            continue
        except (OSError, ValueError) as exc:      # weights not here: a hub id offline, a folder gone
            log.warning("  [%d/%d] %s %s: cannot load it here, not calibrated (%s); its trials fail "
                        "the same way unless the workers can reach it", i, len(todo), model.name, label,
                        str(exc).splitlines()[0])
            continue
        finally:
            WORKER.drop_models()
        costs[(model.name, label)] = cost
        measured[_key(model, label, device, threads)] = asdict(cost)
        log.info("  [%d/%d] %s %s: %.1f ms per decode step, %.2f ms per prefill token (%.1f s)",
                 i, len(todo), model.name, label, cost.decode_s * 1e3, cost.prefill_token_s * 1e3,
                 time.perf_counter() - started)


def keyed(pairs: set[tuple[ModelEntry, str]], costs: dict[tuple[str, str], StepCost], device: str,
          threads: int) -> dict[str, dict]:
    """The step costs of ``pairs`` by calibration key (model, step label, device, the model's identity,
    this machine): what a sweep's record keeps, and what ``calibrate(recorded=...)`` reads back."""
    return {_key(model, label, device, threads): asdict(costs[(model.name, label)])
            for model, label in pairs if (model.name, label) in costs}


def measuring_engine(name: str) -> str | None:
    """The engine whose own step estimates a trial on engine ``name``: itself where its backend
    measures its steps (``Engine.measures_steps``), else the first engine it builds on that does
    (a server on the in-process engine whose files it serves); None where neither does."""
    engine = engines.get(name)
    for candidate in (engine, *(engines.get(base) for base in engine.builds_on)):
        if candidate.measures_steps:
            return candidate.name
    return None


def calibrated_as(config: TrialConfig, precision: str | None = None) -> str:
    """The step label whose cost estimates ``config`` (or its weights in ``precision``, a draft's): the
    weights on the engine that measures them (``measuring_engine``); for an engine with none, its
    precision on the default engine (``Engine.calibrated``), else the default engine's reference
    precision, an upper bound there."""
    precision = precision or config.stack.precision
    engine = measuring_engine(config.stack.engine)
    if engine is not None:
        return step_label(engine, precision)
    if engines.get(config.stack.engine).calibrated:
        return precision
    return reference_precision(config.entry(), config.device)


def draft_calibrated_as(config: TrialConfig) -> str:
    """The step label of a speculative trial's draft model: its own weights where the stack names them."""
    return calibrated_as(config, config.stack.draft_precision or config.stack.precision)


def pairs_needed(configs: list[TrialConfig]) -> set[tuple[ModelEntry, str]]:
    """(model entry, step label) pairs whose step cost the estimate of ``configs`` reads."""
    pairs = set()
    for c in configs:
        pairs.add((c.entry(), calibrated_as(c)))
        if c.stack.draft_model:
            pairs.add((c.entry(c.stack.draft_model), draft_calibrated_as(c)))
        if groups.get(c.group).calibrates_reference:
            pairs.add((c.entry(), reference_precision(c.entry(), c.device)))
    return pairs


# ------------------------------------------------------------------------------ estimate

def _prompts(config: TrialConfig) -> tuple[int, float, float]:
    """Number of prompts, their mean and their longest length in tokens (a chars/4 estimate unless
    set exactly)."""
    prompts = workload_prompts(config.workload.prompt_set, config.workload.prompts_per_type)
    if config.workload.context_tokens:
        return len(prompts), config.workload.context_tokens, config.workload.context_tokens
    lengths = [len(p.text) / 4 for p in prompts]
    return len(prompts), statistics.mean(lengths), max(lengths)


def _generate_s(cost: StepCost, prompts: int, prompt_tokens: float, new_tokens: int, repeats: int,
                batch: int) -> float:
    """Warm-up plus ``repeats`` timed passes of trials.loop.measure."""
    batches = math.ceil(prompts / batch)
    step = cost.decode_s * (1 + BATCH_STEP_GROWTH * (batch - 1))
    decode = batches * (repeats * new_tokens + WARMUP_TOKENS) * step
    prefill = batches * (repeats + 1) * batch ** PREFILL_BATCH_EXPONENT * prompt_tokens * cost.prefill_token_s
    return decode + prefill


class Workers:
    """The run's worker processes as the estimate walks its trials in run order, each trial to the
    next worker in turn: each worker starts once (``next_trial``), measures a group's reference once
    (``once``) and keeps its last ``trials.worker.model_cache_size()`` models loaded (``load``), so
    interleaved models load again. A trial that holds the node ends every worker: those after it
    start afresh."""

    def __init__(self, workers: int = 1, started: bool = False):
        self.count = max(1, workers)
        self.turn = -1
        self._fresh(started)

    def _fresh(self, started: bool = False) -> None:
        self.references: Counter = Counter()
        self.models: list[list] = [[] for _ in range(self.count)]
        self.started = [started] * self.count
        self.after_node_holder = False

    def next_trial(self, holds_node: bool = False) -> float:
        """The next trial's turn; returns what starting its worker costs (``WORKER_START_S`` where the
        worker is fresh, 0 for a node-holding trial, whose technique's cost model counts its start)."""
        if self.after_node_holder:
            self._fresh()
        self.turn += 1
        if holds_node:
            self.after_node_holder = True
            return 0.0
        worker = self.turn % self.count
        if self.started[worker]:
            return 0.0
        self.started[worker] = True
        return WORKER_START_S

    def once(self, key, seconds: float) -> float:
        if self.references[key] >= self.count:
            return 0.0
        self.references[key] += 1
        return seconds

    def load(self, key, seconds: float) -> float:
        held = self.models[max(0, self.turn) % self.count]
        if key in held:
            held.remove(key)
            held.append(key)
            return 0.0
        held.append(key)
        del held[:-model_cache_size()]
        return seconds


class Estimate:
    """What a technique's cost model (``Technique.cost``) needs for one trial: this machine's step
    costs, the trial's prompts, and the arithmetic every technique shares."""

    def __init__(self, config: TrialConfig, costs: dict[tuple[str, str], StepCost], cost: StepCost,
                 workers: Workers):
        self.config, self.costs, self.cost, self.workers = config, costs, cost, workers
        self.prompts, self.prompt_tokens, self.longest_prompt_tokens = _prompts(config)
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
        draft = self.step(s.draft_model, draft_calibrated_as(self.config)) if s.draft_model else None
        if draft is None:
            return 0.0
        return w.max_new_tokens * self.config.repeats * self.prompts / 2 * s.num_draft_tokens * draft.decode_s

    def teacher_forced_s(self, cost: StepCost) -> float:
        """One teacher-forced pass at ``cost``: each prompt pre-filled, then its last new tokens fed."""
        return self.prompts * (self.prompt_tokens * cost.prefill_token_s
                               + self.config.workload.max_new_tokens * cost.decode_s)

    def once(self, key, seconds: float) -> float:
        """``seconds`` the first time each worker meets ``key`` (a reference a worker measures once
        and reuses), else 0."""
        return self.workers.once(key, seconds)


def trial_seconds(config: TrialConfig, costs: dict[tuple[str, str], StepCost],
                  workers: Workers | None = None) -> float:
    """Estimated seconds of one trial: its technique's cost model (``Technique.cost``; the loop's
    timed passes where it has none), its engine's benchmark beside the loop (``Engine.benchmark_cost``),
    loading its model and draft where its worker does not hold them, and the per-trial overhead.
    ``workers``: what the run's workers already measured and hold (None: one running worker that holds nothing)."""
    workers = Workers(started=True) if workers is None else workers
    technique = groups.get(config.group)
    start = workers.next_trial(technique.holds_node)
    precision = calibrated_as(config)
    cost = costs.get((config.model, precision))
    if cost is None:
        return TRIAL_OVERHEAD_S                                  # fails at once (missing package)
    estimate = Estimate(config, costs, cost, workers)
    total = start + TRIAL_OVERHEAD_S + (technique.cost(config, estimate) if technique.cost else estimate.plain)
    for other in map(groups.get, config.also_charted_by):     # groups that chart the same run: their
        if other.shared_cost is not None:                     # own numbers on it, the measurement once
            total += other.shared_cost(config.charted_as(other.name), estimate)
    total += engines.get(config.stack.engine).benchmark_cost(config, estimate)
    draft = (config.stack.draft_model, draft_calibrated_as(config)) if config.stack.draft_model else None
    draft_cost = estimate.step(*draft) if draft else None
    if draft_cost is not None:
        total += workers.load(draft, draft_cost.load_s)
    return total + workers.load((config.model, precision), cost.load_s)


def priced_alone(config: TrialConfig, costs: dict[tuple[str, str], StepCost]) -> float | None:
    """``trial_seconds`` of a trial the plan did not walk (a search's proposal, handed out while the
    sweep runs) on a worker that holds nothing; None where its step cost was not calibrated."""
    if (config.model, calibrated_as(config)) not in costs:
        return None
    return trial_seconds(config, costs)


def trial_estimates(configs: list[TrialConfig], costs: dict[tuple[str, str], StepCost],
                    workers: int = 1) -> dict[str, float]:
    """Each trial's estimated seconds by ``config_hash``, ``configs`` taken in the order they run on
    ``workers`` worker processes (``Workers``): estimate the trials a run starts, in its order, not
    trials an earlier run finished, whose workers' references and models are gone."""
    run = Workers(workers)
    return {c.config_hash: trial_seconds(c, costs, run) for c in configs}


def estimate_seconds(configs: list[TrialConfig], costs: dict[tuple[str, str], StepCost], workers: int = 1) -> float:
    """The trials' worker-seconds: each trial's estimate, on every worker for a trial that holds its node."""
    estimates = trial_estimates(configs, costs, workers)
    return sum(worker_seconds(c, estimates[c.config_hash], workers) for c in configs)


def zoo_build_seconds(set_names: list[str], costs: dict[tuple[str, str], StepCost]) -> float:
    """What training the zoo's ``set_names`` beside the trials takes of one core, estimated from the
    recipes' tokens and the calibrated prefill cost per token (``TRAIN_TOKEN_PREFILLS`` per trained
    token, a teacher's forward ``TEACHER_TOKEN_PREFILLS``); the summary prints what it took."""
    precision = zoo.train_precision()
    total = 0.0
    for name in (n for set_name in set_names for n in zoo.ZOO_SETS[set_name]):
        recipe = zoo.RECIPES[name]
        own = costs.get((name, precision)) or costs.get((name, "fp32"))
        if own is None:
            continue
        teacher = costs.get((recipe.distill_from, precision)) or costs.get((recipe.distill_from, "fp32"))
        per_token = (TRAIN_TOKEN_PREFILLS * own.scored_s
                     + (TEACHER_TOKEN_PREFILLS * teacher.scored_s if teacher else 0.0))
        total += recipe.train_steps * recipe.batch_size * recipe.seq_len * per_token
    return total


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
    estimate_s: float            # all trials' worker-seconds (``estimate_seconds``)
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
    of wall time on ``workers`` parallel trials. The set of trials never changes here: past the
    floors, ``sweeps.deferral`` chooses which of them wait for the next run."""
    from trials.measurement.hardware import precision_is_native

    unscaled = estimate_seconds(configs, costs, workers)
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
        total = estimate_seconds(shrunk, costs, workers)
        if total / max(1, workers) <= budget_s or level == len(LEVELS) - 1:
            return Fit(shrunk, level, total, unscaled, budget_s, emulated)
    raise AssertionError("unreachable")


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
    kind = max([len("precision") + 2, *(len(precision) + 2 for _, precision in costs)])
    lines = [f"  {'model':<{width}}{'precision':<{kind}}{'decode ms/step':>15}{'prefill ms/token':>18}{'load s':>8}"]
    for (model, precision), c in sorted(costs.items()):
        note = "" if precision_is_native(precision, device) else "  (emulated on this CPU)"
        lines.append(f"  {model:<{width}}{precision:<{kind}}{c.decode_s * 1e3:>15.1f}{c.prefill_token_s * 1e3:>18.2f}"
                     f"{c.load_s:>8.1f}{note}")
    return "\n".join(lines)
