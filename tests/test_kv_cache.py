"""KV-cache quantization end to end: real caches of the tiny zoo, a real store, the real dashboard.

The bytes tests hold the expectation (``trials.techniques.kv_cache.runner.expected_bytes``) against a walk of the
tensors a real ``generate()`` left in the cache, for every backend and bit width, across prefill
lengths, batch sizes and residual windows that flush (re-quantize) or not. The trial tests run the
kv_cache group's runner as the sweep does; the chart test reads the five charts off the page the app
builds (tests/page.py) and compares them with the store and the calculator (Chromium draws them in
tests/test_every_chart.py).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tracking
from sweeps.spaces import PROFILES
from trials.config import ConfigError, Stack, TrialConfig, Workload
from trials.engines.transformers.arguments import cache_config
from trials.engines.transformers.kv_cache import require_backend
from trials.loop import failed_result
from trials.measurement.instruments import kv_cache_bytes
from trials.measurement.kv_footprint import kv_footprint
from trials.models import loading
from trials.models.registry import get_model, zoo_targets
from trials.prompts import extend_to_tokens, workload_prompts
from trials.run import run_trial
from trials.techniques.kv_cache.runner import expected_bytes, residual_tokens
from trials.techniques.kv_cache.space import check_model
from trials.techniques.kv_cache.space import kv_caches
from trials.techniques.kv_cache.space import plan as kv_cache_space

KV_STACKS = kv_caches(PROFILES["quick"].settings("kv_cache"))   # the quick profile's caches, full first
QUANTIZED = [(bits, backend) for bits, backend in KV_STACKS if bits != 16]


def _trial(model: str, bits: int = 16, backend: str = "none", context: int = 160, new_tokens: int = 12,
           group_size: int = 64, residual: int = 128, repeats: int = 1):
    return TrialConfig(group="kv_cache", model=model, repeats=repeats,
                       stack=Stack(precision="bf16", kv_bits=bits, kv_backend=backend,
                                   kv_group_size=group_size, kv_residual_length=residual),
                       workload=Workload("prose", 1, new_tokens, context_tokens=context))


# ------------------------------------------------------------------------------ bytes

@pytest.mark.parametrize("model", ["tiny-gqa", "tiny-mha"])
def test_full_precision_bytes_equal_the_formula_to_the_byte(tiny_zoo, model):
    result = run_trial(_trial(model, context=160))         # longer than the 128-token residual window
    m = result.metrics
    assert m["kv_cache_tokens"] == 160 + 12 - 1
    config = loading.load(model, "bf16", "cpu").model.config
    by_hand = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * (160 + 11) * 2
    assert m["kv_cache_bytes"] == m["kv_cache_bytes_exact"] == m["kv_cache_bytes_expected"] == by_hand
    assert m["kv_cache_bytes_per_token_exact"] * m["kv_cache_tokens"] == by_hand


@pytest.mark.parametrize("model,precision", [("tiny-gqa", "fp32"), ("tiny-mha", "bf16")])
def test_expected_bytes_equal_the_walked_cache_for_every_backend(tiny_zoo, model, precision):
    loaded = loading.load(model, precision, "cpu")
    footprint = kv_footprint(loaded.model.config)
    dtype_bits = torch.finfo(loaded.model.dtype).bits
    vocab = loaded.model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    checked = padded = 0
    # (prompt, new tokens, residual window, batch): odd lengths, a window that flushes twice (and
    # one that never does), two sequences; both leave quanto's 2-bit rows partly filled (padding).
    shapes = ((37, 21, 8, 2), (101, 3, 128, 1))
    for (bits, backend), (prompt, new, residual, batch) in itertools.product(QUANTIZED, shapes):
        stack = Stack(precision=precision, kv_bits=bits, kv_backend=backend, kv_group_size=32,
                      kv_residual_length=residual)
        ids = torch.randint(5, vocab, (batch, prompt), generator=generator)
        with torch.inference_mode():
            out = loaded.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                        max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                        return_dict_in_generate=True, pad_token_id=0,
                                        cache_implementation="quantized", cache_config=cache_config(stack))
        tokens = out.cache.get_seq_length()
        expected = expected_bytes(footprint, stack, tokens, prompt, batch, dtype_bits)
        layer = out.cache.layers[0]
        assert layer.keys.numel() // (batch * layer.keys.shape[1] * layer.keys.shape[-1]) == \
            expected.residual_tokens == residual_tokens(tokens, prompt, residual)
        assert kv_cache_bytes(out.cache) == expected.total, (bits, backend, prompt, new, residual, batch)
        assert expected.total < footprint.total_bytes(tokens, batch, dtype_bits)
        checked += 1
        padded += expected.padding > 0
    assert checked == len(QUANTIZED) * len(shapes) and padded >= 1


def test_hqq_4bit_trial_within_2_percent_of_expected_with_fidelity_metrics(tiny_zoo):
    # 40 new tokens through a 16-token residual window: the cache is re-quantized twice.
    result = run_trial(_trial("tiny-mha", 4, "hqq", context=200, new_tokens=40, residual=16))
    m = result.metrics
    assert result.status == "FINISHED"
    assert abs(m["kv_cache_bytes"] / m["kv_cache_bytes_expected"] - 1) <= 0.02
    assert m["kv_cache_bytes_vs_expected"] == m["kv_cache_bytes"] / m["kv_cache_bytes_expected"]
    assert m["kv_cache_residual_tokens"] == 39 % 16 and m["kv_cache_quantized_tokens"] == 239 - 7
    assert m["kv_cache_bytes"] < m["kv_cache_bytes_exact"] / 2.5      # 4 bits + scales vs 16 bits
    assert 0.0 <= m["fidelity_token_match"] <= 1.0
    assert 0 <= m["first_divergence_token"] <= 40
    assert m["kl_divergence"] >= 0.0 and 0.0 <= m["teacher_forced_top1_match"] <= 1.0
    assert m["teacher_forced_tokens"] == 40
    assert m["perplexity"] > 1 and m["reference_perplexity"] > 1
    assert m["perplexity_delta"] == pytest.approx(m["perplexity"] - m["reference_perplexity"])
    assert result.tags["reference_source"] == "this trial" or "reused" in result.tags["reference_source"]
    assert "hqq 4-bit" in result.tags["kv_cache_method"]


def test_full_precision_trial_is_its_own_reference(tiny_zoo):
    m = run_trial(_trial("tiny-gqa", context=96)).metrics
    assert m["fidelity_token_match"] == 1.0 and m["lossless"] == 1.0
    assert m["kl_divergence"] == 0.0 and m["perplexity_delta"] == 0.0
    assert m["teacher_forced_top1_match"] == 1.0


def test_two_bits_cost_more_fidelity_than_eight(tiny_zoo):
    """Teacher-forced KL must order the precisions; a quantizer that did nothing would fail this."""
    kl = {bits: run_trial(_trial("tiny-mha", bits, "hqq", context=128)).metrics["kl_divergence"]
          for bits in (8, 2)}
    assert 0.0 < kl[8] < kl[2]


# ------------------------------------------------------------------------------ bad input

def test_quanto_8bit_is_a_one_line_config_error(tiny_zoo):
    with pytest.raises(ConfigError) as error:
        _trial("tiny-gqa", 8, "quanto")
    message = str(error.value)
    assert "\n" not in message and "quanto" in message and "4, 2" in message


def test_missing_backend_package_fails_the_run_with_the_install_line(tiny_zoo, monkeypatch):
    monkeypatch.setitem(sys.modules, "optimum.quanto", None)     # as on a worker without it
    with pytest.raises(ConfigError, match="pip install optimum-quanto"):
        require_backend("quanto")
    config = _trial("tiny-mha", 4, "quanto")
    with pytest.raises(ConfigError) as error:
        run_trial(config)
    result = failed_result(config, error.value)
    assert result.status == "FAILED" and "\n" not in result.error
    assert "optimum-quanto" in result.error


def _gpt2_folder(path):
    """A real (random) GPT-2, an architecture the KV calculator does not model, with the tiny tokenizer."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(get_model("tiny-gqa").path())
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tokenizer)))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_unknown_architecture_fails_the_run_with_the_reason(tiny_zoo, tmp_path):
    config = TrialConfig(group="kv_cache", model=_gpt2_folder(tmp_path / "gpt2"),
                         stack=Stack(precision="fp32", kv_bits=4, kv_backend="hqq"),
                         workload=Workload("prose", 1, 4, context_tokens=32), repeats=1)
    with pytest.raises(ConfigError) as error:
        run_trial(config)
    result = failed_result(config, error.value)
    assert result.status == "FAILED" and "\n" not in result.error
    assert "gpt2" in result.error and "cannot model" in result.error


def test_sliding_windows_go_hybrid_while_latent_and_ragged_groups_are_refused(tiny_zoo):
    """Sliding-window layers stay in full precision beside quantized full layers (Gemma-3 runs that
    way: tests/test_real_models.py); MLA's latent cache and a group size that splits a row cannot."""
    sliding = {"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 64,
               "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 16}
    assert {g.kind for g in check_model(_trial("tiny-gqa", 4, "hqq", group_size=32), sliding).groups} == {"sliding"}
    with pytest.raises(ConfigError, match="this model has mla layers"):
        check_model(_trial("tiny-gqa", 4, "hqq", group_size=32), "deepseek-v3")
    config = loading.load("tiny-gqa", "bf16", "cpu").model.config     # K/V row: 2 heads x 16 = 32
    with pytest.raises(ConfigError, match="does not divide"):
        check_model(_trial("tiny-gqa", 4, "hqq", group_size=64), config)
    assert check_model(_trial("tiny-gqa", 4, "hqq", group_size=32), config).num_hidden_layers == 2


# ------------------------------------------------------------------------------ prompts and space

@pytest.mark.parametrize("n_tokens", [7, 96, 256, 700])   # 256: no cut is exact, padded
def test_context_prompts_have_exactly_n_tokens(tiny_zoo, n_tokens):
    tokenizer = loading.load("tiny-gqa", "fp32", "cpu").tokenizer
    prompts = workload_prompts("mixed", 2)
    extended = extend_to_tokens(prompts, tokenizer, n_tokens)
    assert [p.id for p in extended] == [p.id for p in prompts]
    for before, after in zip(prompts, extended):
        assert len(tokenizer(after.text)["input_ids"]) == n_tokens
        if n_tokens == 700:
            assert after.text.endswith(before.text) and len(after.text) > len(before.text)
        else:
            assert before.text.endswith(after.text[-10:])
    assert extend_to_tokens(prompts, tokenizer, n_tokens) == extended


def test_quick_space_plans_every_precision_per_context_in_reference_order():
    configs = kv_cache_space(zoo_targets("full"), PROFILES["quick"], "cpu")
    assert {c.model for c in configs} == set(zoo_targets("full"))
    for model in zoo_targets("full"):
        mine = [c for c in configs if c.model == model]
        contexts = sorted({c.workload.context_tokens for c in mine})
        assert len(contexts) >= 2
        assert len(mine) == len(contexts) * len(KV_STACKS)
        for i in range(0, len(mine), len(KV_STACKS)):            # full precision first, per context
            block = mine[i:i + len(KV_STACKS)]
            assert [(c.stack.kv_bits, c.stack.kv_backend) for c in block] == list(KV_STACKS)
            assert len({c.workload for c in block}) == 1
    assert len({c.config_hash for c in configs}) == len(configs)


# ------------------------------------------------------------------------------ dashboard

def build_kv_store(folder) -> str:
    """KV-cache trials of both tiny models at two contexts, logged through the real tracking API
    (the session's ``kv_store`` fixture, conftest.py)."""
    uri = tracking.resolve_uri(f"sqlite:///{folder}/mlflow.db")
    tracking.prepare_store(uri)
    for context in (64, 160):
        for bits, backend in KV_STACKS:
            tracking.log_trial(uri, run_trial(_trial("tiny-mha", bits, backend, context=context,
                                                     new_tokens=8)))
        for bits, backend in ((16, "none"), (4, "hqq")):
            tracking.log_trial(uri, run_trial(_trial("tiny-gqa", bits, backend, context=context,
                                                     new_tokens=8, group_size=32)))
    return uri


def _measured_trace(figure: dict, name: str) -> dict:
    return next(t for t in figure["traces"] if t["name"] == name)


def _mb(values) -> list[float]:
    return [float(v) / 1024 / 1024 for v in values]


def test_a_context_that_ran_out_of_memory_is_a_cross_on_the_speed_chart(kv_store, tmp_path):
    """A real oom run (its measured peak over --memory-budget) beside the store's runs: the deep
    dive's speed chart marks that context with a red cross (reason on hover); nothing else moves."""
    import shutil

    from dashboard.app import open_store
    from dashboard.reader import failed_runs, section_frame
    from dashboard.sections import kv_cache as section
    from trials.config import Runtime

    shutil.copy(kv_store[len("sqlite:///"):], tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    before = {cid: fig.to_plotly_json() for cid, fig in section.deep_dive(section_frame(section, open_store(uri)), "tiny-mha")}
    result = run_trial(_trial("tiny-mha", 4, "quanto", context=320, new_tokens=8), Runtime(memory_budget_bytes=64 << 10))
    assert result.status == "FAILED" and result.error.startswith("oom: measured peak")
    tracking.log_trial(uri, result)
    runs = open_store(uri)
    charts = dict(section.deep_dive(section_frame(section, runs), "tiny-mha"))
    crosses = [t for t in charts[section.SPEED_ID].data if t.name.endswith("out of memory")]
    assert len(crosses) == 1 and list(crosses[0].x) == [320.0] and list(crosses[0].text) == ["oom"]
    assert crosses[0].name == "4-bit quanto: out of memory"
    assert any("oom: measured peak" in str(cell) for cell in crosses[0].customdata[0])
    for cid, figure in before.items():          # the measured charts are as they were
        now = charts[cid].to_plotly_json()
        assert [t for t in now["data"] if not t["name"].endswith("out of memory")] == figure["data"], cid
    assert failed_runs(section, runs)[0].startswith("1 configuration(s) failed (out-of-memory ones marked on the charts")


def test_five_charts_plot_the_store(kv_store):
    from page import Page

    frame = tracking.runs_frame(kv_store, "kv_cache")
    page = Page(kv_store)
    # 4. at 32k tokens, exact from config: llama-3.1-8b's full cache is 4 GiB exactly
    at_32k = page.figure("kv_cache-32k")
    assert [t["name"] for t in at_32k["traces"]] == ["16-bit (full)", "8-bit", "4-bit"]
    full = at_32k["traces"][0]
    assert full["y"][full["x"].index("llama-3.1-8b")] == 4.0
    assert {"tiny-mha", "tiny-gqa"} <= set(full["x"])
    for trace, bits in zip(at_32k["traces"], (16, 8, 4)):
        i = trace["x"].index("tiny-mha")
        assert trace["y"][i] * 1024 ** 3 == kv_footprint("tiny-mha").total_bytes(32768, 1, bits)
    assert at_32k["bars_drawn"] == 3 * len(full["x"])
    # 5. full cache vs context, per model
    context = page.figure("kv_cache-context")
    assert len(context["traces"]) == len(full["x"]) and context["lines_drawn"] == len(full["x"])
    caption = page.text("kv_cache-caption")
    assert "exact from config" in caption and "Integrity: measured bytes equal the expected bytes " \
        f"exactly in {len(frame)} of {len(frame)} runs" in caption

    # the deep dive opens on the first model (tiny-gqa), then switches to tiny-mha
    gqa = frame[(frame["model"] == "tiny-gqa") & (frame["kv_bits"] == 16)].sort_values("kv_cache_tokens")
    memory = page.figure("kv_cache-memory")
    assert _measured_trace(memory, "16-bit (full), measured")["y"] == _mb(gqa["kv_cache_bytes"])
    page.select_model("kv_cache", "tiny-mha")
    mha = frame[frame["model"] == "tiny-mha"].assign(
        context_tokens=lambda f: f["context_tokens"].astype(int)).sort_values("kv_cache_tokens")
    full_rows, four_hqq = mha[mha["kv_bits"] == 16], mha[(mha["kv_bits"] == 4) & (mha["kv_backend"] == "hqq")]
    assert _measured_trace(page.figure("kv_cache-memory"), "16-bit (full), measured")["y"] \
        == _mb(full_rows["kv_cache_bytes"])

    # 1. the cache itself: measured points, the exact line, the expected 4-bit line
    memory = page.figure("kv_cache-memory")
    assert _measured_trace(memory, "4-bit hqq, measured")["y"] == _mb(four_hqq["kv_cache_bytes"])
    assert _measured_trace(memory, "expected, 4-bit hqq")["y"] == _mb(four_hqq["kv_cache_bytes_expected"])
    assert _measured_trace(memory, "4-bit quanto, measured")["x"] == [float(v) for v in four_hqq["kv_cache_tokens"]]
    exact = _measured_trace(memory, "formula, 16-bit (exact)")
    top = exact["x"][-1]
    assert exact["y"][-1] == pytest.approx(_mb([full_rows["kv_cache_bytes_exact"].iloc[-1]])[0]
                                           * top / full_rows["kv_cache_tokens"].iloc[-1])
    hashes = {c[5] for c in _measured_trace(memory, "16-bit (full), measured")["customdata"]}
    assert hashes == set(full_rows["tags.config_hash"])

    # 2. the cache overtakes the weights: crossovers where formula x batch = weights
    weights = page.figure("kv_cache-weights")
    per_token = float(full_rows["kv_cache_bytes_per_token_exact"].iloc[-1])
    weight_bytes = float(full_rows["weights_bytes"].iloc[-1])
    for batch in (1, 16):
        cross = _measured_trace(weights, f"crossover, batch {batch}")
        assert cross["x"][0] == pytest.approx(weight_bytes / (per_token * batch))
    assert any("projected" in t["name"] for t in weights["traces"])

    # 3. the trade-off: one line per backend through 16 -> 8 -> 4 -> 2 bits at the longest context
    tradeoff = page.figure("kv_cache-tradeoff")
    longest = mha[mha["context_tokens"] == 160]
    hqq = [t for t in tradeoff["traces"] if t["name"] == "hqq"]
    assert len(hqq) == 2                                         # token match and KL panels
    expected = longest[longest["kv_backend"].isin(["none", "hqq"])].sort_values("kv_bits", ascending=False)
    assert hqq[0]["y"] == [float(v) for v in expected["fidelity_token_match"]]
    assert hqq[1]["y"] == [float(v) for v in expected["kl_divergence"]]
    assert len([t for t in tradeoff["traces"] if t["name"] == "quanto"][0]["x"]) == 3
    speed = page.figure("kv_cache-speed")
    assert len(speed["traces"]) == len(KV_STACKS)


def test_an_interrupted_quanto_build_does_not_hang_the_next_trial():
    """quanto builds its C++ kernels on first use under torch's build lock, a file that Ctrl-C during
    that build leaves behind; torch then waits on it forever, at every later load. A trial's cache
    set-up (``build_quanto_kernels``, in a fresh process as a worker is) must remove it and go on."""
    from optimum.quanto.library.extensions import get_extension

    from conftest import ROOT

    build = Path(get_extension("quanto_cpp").build_directory)
    build.mkdir(parents=True, exist_ok=True)
    (build / "lock").touch()                   # what an interrupted first build leaves
    code = "from trials.engines.transformers.kv_cache import build_quanto_kernels; build_quanto_kernels('cpu'); print('ready')"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ready", done.stderr[-2000:]
    assert "removed the build lock" in done.stderr
    assert not (build / "lock").exists()
