"""The quantization group end to end on the tiny zoo: real bitsandbytes weights, a real sweep into a
real sqlite store, and the four charts as the app builds them (tests/page.py; Chromium draws them
in tests/test_every_chart.py).

One real sweep (``sweeps/full.py --groups quantization`` over tiny-gqa and tiny-mha) feeds most
tests: its numbers must be sane (weights counted to the byte against a hand count from the model
card, one perplexity token set per model, fp32 matching itself token for token), its GPTQ trials must
fail with the one install line when GPTQModel is absent while the sweep goes on, and the dashboard
must draw exactly what the store holds. GPTQ itself is tested where its optional extra is installed
(it pulls a 6 GB CUDA torch, so not in CI): quantize once, cache on disk, load back.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trials.config import ConfigError, Stack, TrialConfig, Workload
from trials.measurement.perplexity import heldout_windows, perplexity, split_windows
from trials.models import loading, quantized_weights, zoo
from trials.models.registry import get_model, perplexity_method
from trials.run import run_trial
from trials.worker import WORKER


def _ppl(loaded, method):
    return perplexity(loaded.model, loaded.tokenizer, method)

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("tiny-gqa", "tiny-mha")
HAS_GPTQ = importlib.util.find_spec("gptqmodel") is not None
CPU_PRECISIONS = ("fp32", "bf16", "int8", "nf4", "gptq")


def _config(precision: str, model: str = "tiny-gqa") -> TrialConfig:
    return TrialConfig(group="quantization", model=model, stack=Stack(precision=precision),
                       workload=Workload("mixed", 1, 8), repeats=1)


# ------------------------------------------------------------------------------ the sweep

@pytest.fixture(scope="module")
def swept(quick_sweep):
    """The session's sweep (tests/conftest.py), which ran the quantization group's quick space over
    the two tiny targets: (store URI, the sweep's quantization counts, its stdout)."""
    return quick_sweep.uri, quick_sweep


def _frame(uri: str, status: str | None = "FINISHED"):
    import tracking

    return tracking.runs_frame(uri, "quantization", status=status)


def test_sweep_fills_the_experiment_and_plans_gptq_only_with_its_extra(swept):
    uri, sweep = swept
    measured = set(CPU_PRECISIONS) if HAS_GPTQ else set(CPU_PRECISIONS) - {"gptq"}
    everything = _frame(uri, status=None)
    assert len(everything) == len(MODELS) * len(measured)
    finished = _frame(uri)
    assert set(finished["precision"]) == measured and set(finished["model"]) == set(MODELS)
    assert (finished["tok_per_s"] > 0).all() and (finished["perplexity"] > 1).all()
    if not HAS_GPTQ:       # not planned, so no FAILED run; the plan says so once, with the install line
        assert sweep.counts("quantization") == (len(finished), 0, 0)
        output = sweep.done.stdout + sweep.done.stderr
        assert output.count("gptq not planned for") == 2          # in the plan, and again in the summary
        assert "not planned: quantization: gptq not planned for" in output
        assert "GPTQ needs the optional extra: pip install -e '.[gptq]'" in output
        from dashboard.sections import quantization
        assert "No GPTQ runs: GPTQ is planned only where its optional extra is installed" in quantization.caption(finished)
    # the sweep's --price-per-hour: every run logs its cost beside its throughput, and per-request latency
    from conftest import SESSION_PRICE_PER_HOUR
    assert (finished["price_per_hour_usd"] == SESSION_PRICE_PER_HOUR).all()
    assert np.allclose(finished["usd_per_million_output_tokens"],
                       SESSION_PRICE_PER_HOUR / (finished["tok_per_s"] * 3600) * 1e6)
    assert (finished["latency_samples"] >= 1).all() and finished["ttft_s_p50"].notna().all()


def test_quality_metrics_are_consistent(swept):
    uri, _ = swept
    frame = _frame(uri)
    for model, part in frame.groupby("model"):
        # the same scored tokens for every precision, and the reference is this model's fp32 run
        assert part["perplexity_tokens"].nunique() == 1 and part["perplexity_tokens"].iloc[0] > 500
        assert (part["tags.reference_precision"] == "fp32").all()
        fp32 = part[part["precision"] == "fp32"].iloc[0]
        assert (part["reference_perplexity"] == fp32["perplexity"]).all()
        assert fp32["fidelity_token_match"] == 1.0 and fp32["lossless"] == 1.0
        assert fp32["perplexity_delta"] == 0.0
        assert part["fidelity_token_match"].between(0, 1).all()
        for _, row in part.iterrows():
            assert row["perplexity_delta"] == pytest.approx(row["perplexity"] - fp32["perplexity"])
        # quantization costs little on these models: every precision within 10% of fp32
        assert (part["perplexity_ratio"] - 1).abs().max() < 0.1, part[["precision", "perplexity"]]


def _hand_counted_bytes(model: str, fp32_weights_bytes: float) -> dict[str, set[int]]:
    """Weight bytes per precision from the model card and the quantizers' documented formats."""
    card = zoo.load_card(model)
    h, inter, heads, kv, hd = (card[k] for k in ("hidden_size", "intermediate_size", "attention_heads",
                                                  "kv_heads", "head_dim"))
    shapes = [(heads * hd, h), (kv * hd, h), (kv * hd, h), (h, heads * hd),   # (out, in): q k v o
              (inter, h), (inter, h), (h, inter)] * card["layers"]            # gate up down
    quantized = sum(o * i for o, i in shapes)
    params = card["parameters"]
    buffers = int(fp32_weights_bytes) - 4 * params              # rotary tables, the same in all
    assert 0 <= buffers < 1024
    rest = 4 * (params - quantized) + buffers                    # unquantized parts stay fp32 on CPU
    int8_scales = 4 * sum(o for o, _ in shapes)                  # one fp32 scale per output row
    nf4_blocks = quantized // 64                                 # one absmax per 64 weights
    codebooks = len(shapes) * 16 * 4                             # a 16-entry fp32 code per layer
    return {"fp32": {4 * params + buffers}, "bf16": {2 * params + buffers},
            "int8": {quantized + int8_scales + rest},
            # absmax is fp32, or bf16 once bitsandbytes repacks for AVX512-BF16 CPUs
            "nf4": {quantized // 2 + nf4_blocks * size + codebooks + rest for size in (4, 2)}}


def test_weights_bytes_are_the_real_storage(swept):
    uri, _ = swept
    frame = _frame(uri)
    for model, part in frame.groupby("model"):
        got = dict(zip(part["precision"], part["weights_bytes"]))
        assert got["nf4"] < got["int8"] < got["bf16"] < got["fp32"]
        for precision, expected in _hand_counted_bytes(model, got["fp32"]).items():
            assert int(got[precision]) in expected, (model, precision, got[precision], expected)
        row = part.set_index("precision")
        # get_memory_footprint() misses the scales bitsandbytes keeps beside its parameters
        assert (row.loc["int8", "weights_bytes"] > row.loc["int8", "hf_memory_footprint_bytes"])
        assert (row.loc["nf4", "weights_bytes"] > row.loc["nf4", "hf_memory_footprint_bytes"])
        assert row.loc["fp32", "weights_bytes"] == row.loc["fp32", "hf_memory_footprint_bytes"]
        # the nominal prediction: quantized weights at 8 / 4 bits, the rest at 4 bytes
        fraction, params = row.loc["int8", "quantized_weight_fraction"], row.loc["int8", "num_parameters"]
        assert row.loc["int8", "weights_bytes_nominal"] == pytest.approx(params * (fraction + 4 * (1 - fraction)))
        assert row.loc["nf4", "weights_bytes_nominal"] == pytest.approx(params * (fraction / 2 + 4 * (1 - fraction)))
        assert (part["peak_memory_bytes"] >= part["weights_bytes"]).all()
        # quantized layers compute in fp32 here, so the KV cache is fp32 too, to the byte
        assert (part["kv_cache_bytes"] == part["kv_cache_bytes_exact"]).all()


# ------------------------------------------------------------------------------ direct trials

def test_int8_and_nf4_load_and_generate(tiny_zoo):
    for precision in ("int8", "nf4"):
        result = run_trial(_config(precision))
        assert result.status == "FINISHED"
        assert all(len(o["token_ids"]) == 8 for o in result.raw["outputs"])
        assert result.tags["quantizer"].startswith("bitsandbytes")
        assert 0 < result.metrics["quantized_weight_fraction"] < 1
        assert 0 <= result.metrics["fidelity_token_match"] <= 1
    loaded = loading.load("tiny-gqa", "nf4", "cpu")
    assert type(loaded.model.model.layers[0].mlp.up_proj).__name__ == "Linear4bit"


def test_perplexity_is_deterministic_on_the_zoo_heldout_split(tiny_zoo):
    loaded = loading.load("tiny-gqa", "fp32", "cpu")
    method = perplexity_method(get_model("tiny-gqa"))
    first, second = _ppl(loaded, method), _ppl(loaded, method)
    assert first.perplexity == second.perplexity and first.tokens == second.tokens
    # every scored token counted once: the first window scores context-1 tokens, later ones `stride`
    counts = split_windows(method.windows, method.weights)
    assert first.tokens == sum(method.context - 1 + (n - 1) * method.stride for n in counts.values())
    # the windows are the zoo's own held-out token stream, cut every `stride` tokens
    windows, starts, _ = heldout_windows(loaded.tokenizer, method)
    heldout = torch.load(zoo.tokenizer_path("tiny") / zoo.CORPUS_IDS_FILE, weights_only=True)
    code = heldout["heldout/code"].long()
    assert torch.equal(windows[0], code[:method.context])
    assert torch.equal(windows[1], code[method.stride:method.stride + method.context])
    assert starts[0] == 1 and starts[1] == method.context - method.stride
    # bf16 scores the very same tokens
    bf16 = _ppl(loading.load("tiny-gqa", "bf16", "cpu"), method)
    assert bf16.tokens == first.tokens and bf16.perplexity != first.perplexity


def test_perplexity_reproduces_the_zoo_cards_with_the_zoos_windows(tiny_zoo):
    """With the zoo's own evaluation (non-overlapping windows, as many as the card used), the same
    code gives the perplexity in the model card: the masking and the held-out split are the zoo's."""
    import dataclasses

    method = perplexity_method(get_model("tiny-mha"))
    zoo_windows = dataclasses.replace(method, stride=method.context, windows=zoo.SETS["tiny"].eval_windows)
    got = _ppl(loading.load("tiny-mha", "fp32", "cpu"), zoo_windows)
    card = zoo.load_card("tiny-mha")
    assert got.tokens == card["heldout_tokens"]
    assert got.perplexity == pytest.approx(card["heldout_perplexity"], abs=1e-3)


def test_nf4_layers_bitsandbytes_cannot_repack_keep_the_generic_path(tmp_path):
    """bitsandbytes 0.50 crashes repacking 4-bit layers whose input width is not a multiple of 64 on
    AVX512-BF16 CPUs (e.g. 864 wide); those layers are kept on the generic path. If bitsandbytes fixes
    the repacking, the first half fails and the workaround can go."""
    from bitsandbytes.functional import has_avx512bf16
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(tmp_path)
    ids = torch.tensor([[1, 2, 3, 4]])

    def load():
        return AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quantized_weights.bnb_config(
            "nf4", "fp32"), dtype=torch.float32, device_map="cpu").eval()

    if has_avx512bf16():
        with pytest.raises(RuntimeError, match="is invalid for input of size"), torch.inference_mode():
            load()(input_ids=ids)
    model = load()
    assert quantized_weights.avoid_unpackable_cpu_layers(model) == (2, 14)     # the two down_proj layers
    with torch.inference_mode():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def test_fp16_on_cpu_and_foreign_stacks_fail_with_a_reason(tiny_zoo):
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        run_trial(_config("fp16"))
    with pytest.raises(ConfigError, match="weight precision and batch size only"):   # the group's guard
        TrialConfig(group="quantization", model="tiny-gqa",
                    stack=Stack(precision="nf4", speculation="prompt_lookup", num_draft_tokens=2),
                    workload=Workload("mixed", 1, 8), repeats=1)


@pytest.mark.skipif(HAS_GPTQ, reason="GPTQModel is installed here; its absence is what is tested")
def test_gptq_without_the_extra_is_one_line(tiny_zoo):
    with pytest.raises(ConfigError) as err:
        run_trial(_config("gptq"))
    assert str(err.value).startswith("GPTQ needs the optional extra: pip install -e '.[gptq]'")
    assert "\n" not in str(err.value)


def test_missing_bitsandbytes_is_one_line(tiny_zoo):
    """With bitsandbytes blocked from importing (as if not installed), int8 fails with the install line."""
    code = ("import sys; sys.modules['bitsandbytes'] = None\n"
            "from trials.run import main\n"
            "sys.exit(main(['--group', 'quantization', '--model', 'tiny-gqa', '--precision', 'int8']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == \
        f"error: int8 weights need bitsandbytes: {quantized_weights.BNB_INSTALL}"


def test_sweep_space_per_device():
    from sweeps.spaces import PROFILES
    from trials.techniques.quantization.space import plan as quantization_space

    cpu = quantization_space(["tiny-gqa", "tiny-draft"], PROFILES["quick"], "cpu")
    cuda = quantization_space(["tiny-gqa"], PROFILES["full"], "cuda")
    assert {c.model for c in cpu} == {"tiny-gqa"}                          # drafts are not swept
    planned = [p for p in CPU_PRECISIONS if HAS_GPTQ or p != "gptq"]      # gptq: only with its extra
    assert [c.stack.precision for c in cpu] == planned
    # fp16 only where it can run (fp16 on CPU is a config error); the reference precision comes first
    cpu_set, cuda_set = {c.stack.precision for c in cpu}, [c.stack.precision for c in cuda]
    assert "fp16" not in cpu_set and set(cuda_set) == cpu_set | {"fp16"}
    assert cpu[0].stack.precision == cuda_set[0] == "fp32"
    assert cpu[0].workload.max_new_tokens < PROFILES["quick"].max_new_tokens
    assert cuda[0].workload == PROFILES["full"].workload()


def test_gptq_group_size_divides_every_layer():
    from transformers import LlamaConfig

    deep = LlamaConfig(hidden_size=320, intermediate_size=864, num_attention_heads=10, head_dim=32)
    assert quantized_weights.gptq_group_size(deep) == 32
    assert quantized_weights.gptq_group_size(LlamaConfig(hidden_size=256, intermediate_size=768,
                                                    num_attention_heads=8, head_dim=32)) == 128
    assert quantized_weights.gptq_group_size(LlamaConfig(hidden_size=112, intermediate_size=300,
                                                    num_attention_heads=4, head_dim=28)) == -1


@pytest.mark.skipif(not HAS_GPTQ, reason="needs the optional extra: pip install -e '.[gptq]' "
                                         "(GPTQModel pulls torch>=2.14.1 with CUDA libraries, ~6 GB)")
def test_gptq_quantizes_once_caches_and_loads(tiny_zoo, tmp_path, monkeypatch):
    monkeypatch.setenv(quantized_weights.QUANTIZED_DIR_ENV, str(tmp_path))
    WORKER.drop_models()
    first = run_trial(_config("gptq"))
    assert first.tags["gptq_cache"].startswith("quantized when this worker loaded it")
    folder = Path(first.tags["gptq_folder"])
    card = json.loads((folder / quantized_weights.GPTQ_CARD).read_text())
    assert card["bits"] == 4 and "held-in" in card["calibration"]
    WORKER.drop_models()
    second = run_trial(_config("gptq"))
    assert second.tags["gptq_cache"] == "loaded from the disk cache"
    assert second.tags["gptq_folder"] == str(folder)
    assert second.metrics["perplexity"] == first.metrics["perplexity"]
    fp32 = run_trial(_config("fp32"))
    assert second.metrics["weights_bytes"] < fp32.metrics["weights_bytes"] / 2
    assert abs(second.metrics["perplexity_ratio"] - 1) < 0.1
    assert 0 <= second.metrics["fidelity_token_match"] <= 1


# ------------------------------------------------------------------------------ the dashboard

CHARTS = ("quantization-pareto", "quantization-perplexity", "quantization-throughput",
          "quantization-memory")


def _assert_deep_dive_matches_store(page, frame, model: str) -> None:
    from dashboard.sections.quantization import pareto_optimal

    rows = frame[frame["model"] == model].sort_values("start_time").drop_duplicates("precision", keep="last")
    expected_ppl = dict(zip(rows["precision"], rows["perplexity"]))
    expected_tps = dict(zip(rows["precision"], rows["tok_per_s"]))

    pareto = page.figure("quantization-pareto")
    points = {t["name"]: (t["x"][0], t["y"][0]) for t in pareto["traces"] if t["name"] != "Pareto-optimal"}
    assert points.keys() == expected_ppl.keys()
    for precision, (x, y) in points.items():
        assert x == pytest.approx(expected_ppl[precision], rel=1e-9)
        assert y == pytest.approx(expected_tps[precision], rel=1e-9)
    front = next(t for t in pareto["traces"] if t["name"] == "Pareto-optimal")
    optimal = rows[pareto_optimal(rows)]
    assert sorted(front["x"]) == pytest.approx(sorted(optimal["perplexity"]))
    assert len(front["x"]) >= 1 and pareto["points_drawn"] >= len(points) + len(front["x"])

    ppl = page.figure("quantization-perplexity")["traces"][0]
    assert dict(zip(ppl["x"], ppl["y"])) == pytest.approx(expected_ppl)
    tps = page.figure("quantization-throughput")
    assert tps["bars_drawn"] == len(rows)
    assert dict(zip(tps["traces"][0]["x"], tps["traces"][0]["y"])) == pytest.approx(expected_tps)
    assert rows["tags.config_hash"].isin([c[5] for c in tps["traces"][0]["customdata"]]).all()
    memory = page.figure("quantization-memory")
    weights = next(t for t in memory["traces"] if t["name"] == "weights (real storage)")
    mb = {p: b / 1024 / 1024 for p, b in zip(rows["precision"], rows["weights_bytes"])}
    assert dict(zip(weights["x"], weights["y"])) == pytest.approx(mb)
    assert {"peak during decode", "nominal: bits x weights"} <= {t["name"] for t in memory["traces"]}


def test_charts_plot_the_store_and_follow_the_model_selector(swept):
    from page import Page

    uri, _ = swept
    frame = _frame(uri)
    page = Page(uri)
    overview = page.figure("quantization-overview")
    assert {t["name"] for t in overview["traces"]} == set(frame["precision"])
    assert sum(len(t["x"]) for t in overview["traces"]) == overview["points_drawn"] == len(frame)
    first, second = sorted(MODELS)                     # the selector starts at the first
    assert page.figure("quantization-pareto")["title"].startswith(first)
    _assert_deep_dive_matches_store(page, frame, first)
    caption = page.text("quantization-caption")
    assert "strided sliding window" in caption and "Ordering check" in caption
    if not HAS_GPTQ:                      # GPTQ was not planned: no FAILED configuration to count
        assert page.element("quantization-failed") is None
    page.select_model("quantization", second)
    assert page.figure("quantization-pareto")["title"].startswith(second)
    _assert_deep_dive_matches_store(page, frame, second)
