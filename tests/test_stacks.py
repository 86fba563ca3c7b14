"""The stacks group: combined stacks as single trials, effect estimates, the section's three pieces.

The effect arithmetic is checked on a synthetic design whose effects are known (no model involved);
the runner on the tiny zoo, where a combined stack must show every part at work in its one trial; the
section, as the app builds it (tests/page.py), against a store filled with the 2^3 design of
tiny-gqa (Chromium draws it, and its quality-budget boxes redraw the card: tests/test_every_chart.py).
"""

from __future__ import annotations

import html
import json
import math
import random

import pandas as pd
import pytest

import tracking
from sweeps.spaces import PROFILES
from trials.config import ConfigError, Stack, TrialConfig, Workload
from trials.measurement.hardware import fast_precision
from trials.measurement.kv_footprint import kv_footprint
from trials.models import loading
from trials.models.registry import get_model
from trials.run import run_trial
from trials.stats.factorial import FACTOR_TAG, effects, stack_factors, t_interval
from trials.techniques.stacks.space import plan as stacks_space

STACKS = PROFILES["quick"].settings("stacks", get_model("tiny-gqa"), "cpu")   # the quick profile's stacks settings
FACTORS = ("weights", "kv", "spec", "compile")     # binary, tagged; the engine is read from the run
SYNTHETIC = FACTORS[:3]
TRUE = {"weights": 0.30, "kv": -0.10, "spec": 0.0, "weights x kv": 0.20, "weights x spec": 0.0,
        "kv x spec": 0.0}           # effects on log tok/s: mean(+) - mean(-)


def _synthetic(noise: float = 0.01, repeats: int = 4, drop=lambda x: False) -> pd.DataFrame:
    """A 2^3 design whose log tok/s has exactly the effects in TRUE, plus seeded noise per repeat."""
    rng = random.Random(0)
    rows = []
    for levels in pd.MultiIndex.from_product([[-1, 1]] * 3):
        x = dict(zip(SYNTHETIC, levels))
        if drop(x):
            continue
        mean = math.log(100.0) + sum(TRUE[f] / 2 * x[f] for f in SYNTHETIC) \
            + TRUE["weights x kv"] / 2 * x["weights"] * x["kv"]
        logs = [mean + rng.gauss(0, noise) for _ in range(repeats)]
        m = sum(logs) / repeats
        rows.append({"model": "m", "log_tok_per_s_mean": m, "tok_per_s_repeats": float(repeats),
                     "log_tok_per_s_var": sum((v - m) ** 2 for v in logs) / (repeats - 1),
                     "peak_memory_bytes": 1e6 * math.exp(0.25 * x["weights"]),   # weights: x e^0.5
                     **{f"tags.{FACTOR_TAG}{f}": str(int(x[f] > 0)) for f in SYNTHETIC}})
    return pd.DataFrame(rows)


def test_effects_recover_a_known_design_with_intervals_that_cover_them():
    found, notes = effects(_synthetic())
    assert not notes
    speed = {e.term: e for e in found if e.response == "tok_per_s"}
    assert set(speed) == set(TRUE)
    for term, true in TRUE.items():
        e = speed[term]
        assert e.ci_low <= true <= e.ci_high, (term, e)
        assert e.significant == (true != 0.0) or abs(true) < 1e-9 and e.significant in (False, True)
    assert speed["weights"].significant and speed["weights x kv"].significant
    assert speed["weights"].ratio == pytest.approx(math.exp(0.30), rel=0.02)
    memory = {e.term: e for e in found if e.response == "peak_memory_bytes"}
    assert memory["weights"].estimate == pytest.approx(0.5) and memory["kv"].estimate == pytest.approx(0.0)
    assert memory["weights"].significant is None and math.isnan(memory["weights"].ci_low)


def test_runs_of_one_repeat_give_effects_without_intervals():
    """One repeat logs no variance: the estimates stand, their intervals are NaN (not an error)."""
    frame = _synthetic().drop(columns="log_tok_per_s_var").assign(tok_per_s_repeats=1.0)
    speed = {e.term: e for e in effects(frame)[0] if e.response == "tok_per_s"}
    assert speed["weights"].estimate == pytest.approx(0.30, abs=0.05)
    assert math.isnan(speed["weights"].ci_low) and speed["weights"].significant is None


def test_noise_larger_than_an_effect_is_not_significant():
    speed = {e.term: e for e in effects(_synthetic(noise=0.5, repeats=2))[0] if e.response == "tok_per_s"}
    assert speed["kv"].significant is False and speed["kv"].ci_low < 0 < speed["kv"].ci_high


def test_combinations_that_cannot_run_leave_only_their_interaction_out():
    """kv and spec never on together (as in the stacks group): the other terms are still fitted, by
    least squares, and cover the truth (the model has no kv x spec interaction)."""
    found, notes = effects(_synthetic(drop=lambda x: x["kv"] > 0 and x["spec"] > 0))
    speed = {e.term: e for e in found if e.response == "tok_per_s"}
    assert set(speed) == set(TRUE) - {"kv x spec"}
    for term, e in speed.items():
        assert e.ci_low <= TRUE[term] <= e.ci_high, (term, e)
    assert "kv x spec: never on together" in notes["m"]


def test_too_few_combinations_give_no_effects_and_say_why():
    found, notes = effects(_synthetic(drop=lambda x: x["weights"] > 0 and (x["kv"] > 0 or x["spec"] > 0)))
    assert [e for e in found if e.term == "weights x kv"] == []
    found, notes = effects(_synthetic(drop=lambda x: x["weights"] > 0))
    assert not [e for e in found if "weights" in e.term] and "weights: only one level ran" in notes["m"]


def test_the_engine_is_a_factor_with_one_level_per_engine():
    """Three engines (the default and two others, named by the runs' engine column), each with its own
    effect on log tok/s against the default: each ``engine:<name>`` effect recovers its engine's
    difference from the default engine, beside the binary factors; two engines are never on together."""
    true = {"a": 0.4, "b": -0.3}
    frames = []
    for engine, shift in (("transformers", 0.0), *true.items()):
        frame = _synthetic(drop=lambda x: x["spec"] > 0)
        frame["log_tok_per_s_mean"] += shift
        frames.append(frame.assign(engine=engine))
    found, notes = effects(pd.concat(frames, ignore_index=True))
    speed = {e.term: e for e in found if e.response == "tok_per_s"}
    for name, shift in true.items():
        e = speed[f"engine:{name}"]
        assert e.estimate == pytest.approx(shift, abs=0.03) and e.ci_low <= shift <= e.ci_high, (name, e)
    assert speed["weights"].estimate == pytest.approx(TRUE["weights"], abs=0.03)
    assert "engine:a x engine:b: never on together" in notes["m"]


def test_the_t_interval_is_students():
    low, high = t_interval([1.0, 2.0, 3.0])              # mean 2, sd 1, t(0.975, 2) = 4.3027
    assert (high - low) / 2 == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
    assert all(math.isnan(v) for v in t_interval([5.0]))


def test_the_space_is_the_design_per_target_with_stated_parts(tiny_zoo):
    configs = stacks_space(["tiny-gqa", "tiny-draft"], PROFILES["quick"], "cpu")
    assert {c.model for c in configs} == {"tiny-gqa"}
    batched = [c for c in configs if c.stack.batch_size != 1]
    assert [c.stack.design_name for c in batched] == [f"b{STACKS['batch_size']}", f"nf4+kv4+b{STACKS['batch_size']}"]
    configs = [c for c in configs if c.stack.batch_size == 1]
    # the engine factor's level 1: the design's llama.cpp half (tiny-gqa's 16-element heads do not split
    # into ggml's cache blocks: weights x prompt lookup only), from llama.cpp's own F16 base
    llama = [c.stack for c in configs if c.stack.engine == "llama_cpp"]
    assert [s.design_name for s in llama] == ["llama_cpp:f16", "llama_cpp:spec", "llama_cpp:q4_0", "llama_cpp:q4_0+spec"]
    assert all(not stack_factors(s)["kv"] for s in llama)          # the engine factor: the run's engine
    assert {s.num_draft_tokens for s in llama if s.speculation != "none"} == {STACKS["draft_k"]}
    configs = [c for c in configs if c.stack.engine == "transformers"]
    cells = [stack_factors(c.stack) for c in configs]
    assert len({tuple(f.values()) for f in cells}) == len(configs) == 7       # 16 less the 9 refused
    assert not any(f["kv"] and f["spec"] or f["compile"] and (f["kv"] or f["spec"] or f["weights"]) for f in cells)
    assert len({c.config_hash for c in configs}) == 7
    base = configs[0].stack
    assert base == Stack(precision=fast_precision("cpu")) and base.design_name == fast_precision("cpu")
    spec = [c.stack for c in configs if c.stack.speculation != "none"]
    assert {(s.draft_model, s.num_draft_tokens) for s in spec} == {("tiny-draft", STACKS["draft_k"])}
    assert all(c.repeats >= 2 for c in configs)          # an interval needs two repeats
    assert [c.stack.design_name for c in configs][-1] == "nf4+kv4"
    assert "compile" in {c.stack.design_name for c in configs}
    assert "nf4+compile" not in {c.stack.design_name for c in configs}


def test_combinations_that_cannot_run_are_refused_with_the_reason():
    with pytest.raises(ConfigError, match="QuantizedCache cannot be cropped"):
        _stack_config(False, True, True)
    with pytest.raises(ConfigError, match="static cache, which neither a quantized KV cache nor speculation"):
        _stack_config(False, False, True, compile_=True)
    with pytest.raises(ConfigError, match="no KV-cache quantization, speculation or compiled decoding"):
        TrialConfig(group="baseline", model="tiny-gqa", stack=Stack(compile=True))
    # transformers decodes a bitsandbytes (or GPTQ) model uncompiled whatever it is told (its
    # quantizer is not compileable): a "compiled" NF4 number would be an uncompiled one
    with pytest.raises(ConfigError, match="transformers does not compile"):
        _stack_config(True, False, False, compile_=True)


def _stack_config(weights: bool, kv: bool, spec: bool, model: str = "tiny-gqa",
                  compile_: bool = False) -> TrialConfig:
    stack = Stack(precision="nf4" if weights else fast_precision("cpu"), compile=compile_,
                  **(dict(kv_bits=4, kv_backend="quanto", kv_group_size=32) if kv else {}),
                  **(dict(speculation="draft", draft_model="tiny-draft", num_draft_tokens=2) if spec else {}))
    return TrialConfig(group="stacks", model=model, stack=stack, workload=Workload("mixed", 1, 12), repeats=2)


def test_a_combined_stack_is_one_trial_with_every_part_at_work(tiny_zoo):
    result = run_trial(_stack_config(True, True, False))
    assert result.status == "FINISHED", result.error
    m, tags = result.metrics, result.tags
    assert tags["stack_name"] == "nf4+kv4"
    assert [tags[f"{FACTOR_TAG}{f}"] for f in FACTORS] == ["1", "1", "0", "0"]
    # 4-bit weights: far fewer bytes than the base precision's
    base_bytes = loading.load("tiny-gqa", fast_precision("cpu"), "cpu").model
    assert m["weights_bytes"] < sum(p.numel() for p in base_bytes.parameters()) * 2
    # a 4-bit cache in the very generate() that was timed: fewer bytes than the full cache's formula
    full = kv_footprint("tiny-gqa").total_bytes(int(m["kv_cache_tokens"]), 1, 32)
    assert m["kv_cache_bytes"] < full
    assert 0 <= m["fidelity_token_match"] <= 1 and m["kl_divergence"] >= 0
    assert m["speedup_vs_baseline"] == pytest.approx(m["tok_per_s"] / m["baseline_tok_per_s"])
    assert m["tok_per_s_ci_low"] <= m["tok_per_s_ci_high"]
    assert tags["baseline_source"].startswith(("this trial", "reused"))
    spec = run_trial(_stack_config(True, False, True))              # 4-bit target, 4-bit draft
    assert spec.tags["proposer"] == "tiny-draft" and spec.tags["stack_name"] == "nf4+spec"
    assert spec.metrics["weights_bytes"] == m["weights_bytes"]       # the same 4-bit target


def test_speculation_alone_is_lossless_against_the_base(tiny_zoo):
    result = run_trial(_stack_config(False, False, True))
    assert result.metrics["lossless_vs_baseline"] == 1.0
    assert "kl_divergence" not in result.metrics or fast_precision("cpu") != "fp32"


# ------------------------------------------------------------------------------ the section

def build_stacks_store(folder) -> str:
    """The stacks design of tiny-gqa (7 cells: compile only with the base weights, and kv, spec and
    compile never together), run in this process and logged through the real tracking API (the session's
    ``stacks_store`` fixture, conftest.py)."""
    uri = tracking.resolve_uri(f"sqlite:///{folder}/mlflow.db")
    tracking.prepare_store(uri)
    for weights in (False, True):
        for kv, spec in ((False, False), (True, False), (False, True)):
            tracking.log_trial(uri, run_trial(_stack_config(weights, kv, spec)))
    tracking.log_trial(uri, run_trial(_stack_config(False, False, False, compile_=True)))
    batched = _stack_config(True, True, False)
    tracking.log_trial(uri, run_trial(TrialConfig.from_dict({**batched.to_dict(),
                                                            "stack": {**batched.to_dict()["stack"], "batch_size": 4}})))
    return uri


def test_compiled_decoding_compiles_in_the_warm_up_and_keeps_the_outputs(stacks_store):
    frame = tracking.runs_frame(stacks_store, "stacks").set_index("tags.stack_name")
    compiled = frame.loc["compile"]
    assert "torch.compile" in compiled["tags.parts"] and compiled["compile_warmup_s"] > 0
    assert compiled["compile_warmup_s"] > frame.loc[fast_precision("cpu"), "warmup_s"]
    assert 0.9 <= compiled["fidelity_token_match"] <= 1 and compiled["tok_per_s"] > 0
    assert compiled["tags.compile_fallback"] == "none"            # the step ran compiled


def test_compiled_kernels_are_cached_per_cpu_capability(tmp_path, monkeypatch):
    """Inductor's on-disk kernels, built as AVX-512, were loaded by an AVX2 process on the same
    machine (how the project reproduces an AVX2-only CPU) and decoded wrong tokens: each capability
    keeps its own cache, even after inductor wrote its default (as loading a model does), unless the
    user set TORCHINDUCTOR_CACHE_DIR."""
    import os
    import subprocess
    import sys

    from trials.engines.transformers import compiled

    from conftest import ROOT
    code = ("from trials.engines.transformers import compiled\n"
            "from torch._inductor.runtime.cache_dir_utils import cache_dir\n"
            "cache_dir()\n"                                   # inductor writes its default, as a load does
            "print(compiled.keep_kernels_per_capability())")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**env, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].endswith("cpu-avx2")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))             # the user's choice stands
    assert compiled.keep_kernels_per_capability() == str(tmp_path)


def test_a_compile_that_gave_up_and_ran_eagerly_is_said_so():
    """Dynamo guards on a Python int it cannot make symbolic under dynamic=False (as a sliding-window
    cache's length was): each new value compiles a new graph until the recompile limit, then the
    code runs eagerly. The trial's record must say so instead of calling the number compiled."""
    import torch

    from trials.engines.transformers.compiled import compile_record, dynamo_counts

    class Holder:
        length = 0

    holder = Holder()
    step = torch.compile(lambda x: x * holder.length, backend="eager", dynamic=False)
    before = dynamo_counts()
    for length in range(1, 12):                  # past the limit of 8
        holder.length = length
        assert step(torch.ones(2)).tolist() == [length, length]
    metrics, tags = compile_record(before)
    assert metrics["compile_graphs"] >= 8 and tags["compile_fallback"].startswith("eager after")
    metrics, tags = compile_record(dynamo_counts())
    assert metrics["compile_graphs"] == 0 and tags["compile_fallback"] == "none"


def test_the_code_a_card_shows_is_the_arguments_the_trial_ran_with(stacks_store):
    """One description (trials.engines.transformers.arguments) is both what generate() got and the
    code a user is shown: every run records it (tag user_code), the card shows that, and preparing
    the same config again gives exactly the described keywords with the described values."""
    from dashboard.stack_facts import reproduce, trial_config
    from trials.engines.transformers.arguments import Literal, as_code, stack_arguments
    from trials.engines.transformers.generation import prepare
    from trials.loop import trial_prompts

    frame = tracking.runs_frame(stacks_store, "stacks")
    assert len(frame) >= 8
    for _, row in frame.iterrows():
        config = trial_config(row)
        described = stack_arguments(config.stack, "fp32")          # tiny-gqa: no sliding layers, one tokenizer
        assert reproduce(row)[1] == row["tags.user_code"] == as_code(described), row["tags.stack_name"]
        loaded = loading.load(config.entry(), config.stack.precision, config.device)
        prepared = prepare(config, loaded, trial_prompts(config, loaded))
        assert prepared.code == row["tags.user_code"]
        assert set(prepared.kwargs) == set(described.generate), row["tags.stack_name"]
        for name, value in described.generate.items():
            if isinstance(value, Literal):
                assert prepared.kwargs[name] == value.value, (row["tags.stack_name"], name)
    assert frame["tags.user_code"].str.contains("BitsAndBytesConfig\\(load_in_4bit=True").any()
    assert frame["tags.user_code"].str.contains("assistant_model=draft|prompt_lookup_num_tokens").any()


def test_the_three_pieces_plot_the_store(stacks_store):
    """What the three pieces say, against the store (that Chromium draws them, and that typing in
    the limit boxes redraws the card: tests/test_every_chart.py)."""
    from page import Page, _walk

    from dashboard.decision_table import SHORT

    frame = tracking.runs_frame(stacks_store, "stacks")
    assert len(frame) == 8
    page = Page(stacks_store)
    overview = page.figure("stacks-overview")
    frontier = page.figure("stacks-frontier")
    forest = page.figure("stacks-effects")
    default_card = page.table("stacks-best")
    caption = page.text("stacks-caption")
    # the limits are the user's: loosen the quality budget until every stack is within it
    page.select_model("stacks", frame["model"].iloc[0], max_kl=10, max_ppl_pct=1000)
    card = page.table("stacks-best")
    assert "KL <= 10, perplexity +1000 % at most" in card["title"]
    assert "KL <= 0.02, perplexity +2 % at most" in default_card["title"]
    by_name = dict(zip(frame["tags.stack_name"], frame["tok_per_s"]))
    assert overview["points_drawn"] >= 8
    assert sorted(overview["traces"][0]["x"]) == pytest.approx(sorted(by_name.values()))
    stacks_trace = next(t for t in frontier["traces"] if t["name"] == "stacks")
    assert sorted(stacks_trace["x"]) == pytest.approx(sorted(by_name.values()))
    terms = {t["name"]: t["y"] for t in forest["traces"]}
    assert set(terms["effect on tok/s"]) == {"weights", "kv", "spec", "compile", "weights x kv", "weights x spec"}
    found = {e.term: e.ratio for e in effects(frame)[0] if e.response == "tok_per_s"}
    throughput = next(t for t in forest["traces"] if t["name"] == "effect on tok/s")
    assert dict(zip(throughput["y"], throughput["x"])) == pytest.approx(found)
    picks, stack, engine, speed, peak = ([html.unescape(cell.replace("<br>", " ")) for cell in column]
                                         for column in card["columns"][:5])
    assert picks[0].startswith(SHORT["speed"]) and all(engine_ == "transformers" for engine_ in engine)
    single = frame[frame["batch_size"] == 1]
    assert stack[0] == single.loc[single["tok_per_s"].idxmax(), "tags.stack_name"]
    batched = stack.index("nf4+kv4+b4")
    assert SHORT["throughput"] in picks[batched] and speed[batched].startswith(
        f"{frame.set_index('tags.stack_name').loc['nf4+kv4+b4', 'tok_per_s']:.1f}")
    smallest = frame[frame["peak_memory_bytes"] == frame["peak_memory_bytes"].min()]   # ties: the faster
    assert SHORT["memory"] in picks[stack.index(smallest.loc[smallest["tok_per_s"].idxmax(), "tags.stack_name"])]
    below = page.text("stacks-best-more")
    assert "why not the runner-up, fastest: " in below and any(v in below for v in ("overlap", "no interval"))
    # behind a click: the code (a batched stack says its batch) and the command that reruns exactly that trial
    folds = {page.text(f"stacks-best-more-fold-{i}").split(":")[0]: page.element(f"stacks-best-more-fold-{i}")
             for i in range(len(stack))}
    assert "4 prompts per generate() call" in str(folds["nf4+kv4+b4"]) and "from_pretrained(" in str(folds[stack[0]])
    command = next(c.content for c in _walk(folds[stack[0]]) if type(c).__name__ == "Clipboard"
                   and c.content.startswith("python -m trials.run --config "))
    rerun = TrialConfig.from_dict(json.loads(command.split("--config ", 1)[1].strip("'")))
    assert rerun.config_hash == single.loc[single["tok_per_s"].idxmax(), "tags.config_hash"]
    assert "8 finished stacks" in caption and "not a sum of separate ones" in caption
    assert "QuantizedCache cannot be cropped" in caption


def test_speculation_in_a_stack_uses_the_best_k_the_store_measured(quick_sweep):
    """With the session's speculative runs in the store, the stacks space takes their best k."""
    frame = tracking.runs_frame(quick_sweep.uri, "speculative")
    draft = frame[(frame["model"] == "tiny-gqa") & (frame["speculation"] == "draft")]
    best = int(draft.loc[draft["tok_per_s"].idxmax(), "num_draft_tokens"])
    configs = stacks_space(["tiny-gqa"], PROFILES["quick"], "cpu",
                           runs=lambda group: None if group == "stacks" else tracking.runs_frame(quick_sweep.uri, group))
    assert {c.stack.num_draft_tokens for c in configs if c.stack.speculation == "draft"} == {best}
    # a store whose stacks runs already used a k keeps it, so a rerun plans (and skips) the same trials
    used = pd.DataFrame({"model": ["tiny-gqa"] * 2, "draft_model": ["tiny-draft"] * 2,
                         "num_draft_tokens": [best + 1, best + 2], "start_time": [1, 2]})
    kept = stacks_space(["tiny-gqa"], PROFILES["quick"], "cpu",
                        runs=lambda group: used if group == "stacks" else tracking.runs_frame(quick_sweep.uri, group))
    assert {c.stack.num_draft_tokens for c in kept if c.stack.speculation == "draft"} == {best + 2}
    without = stacks_space(["tiny-gqa"], PROFILES["quick"], "cpu", runs=None)
    assert {c.stack.num_draft_tokens for c in without if c.stack.speculation == "draft"} == {STACKS["draft_k"]}
