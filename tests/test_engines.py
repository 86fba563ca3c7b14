"""The llama.cpp engine beside transformers (the engines group) on SmolLM2, the real model that
ships as a Q4_1 GGUF: the GGUF cache (llama.cpp's converter and quantizer), one trial per factor on
llama.cpp (weights, KV cache, prompt lookup) against transformers on the same prompt ids, a zoo model
through the converter, what each engine refuses, and the section.

llama-cpp-python is installed by ``make setup`` (it compiles llama.cpp once; pip keeps the wheel).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

import tracking
from trials.config import Stack, TrialConfig, Workload
from trials.errors import ConfigError
from trials.run import run_trial

SMOL = "smollm2-135m-instruct"
WORKLOAD = Workload("prose", prompts_per_type=1, max_new_tokens=8, eval_windows=2)   # one prompt
LLAMA = dict(engine="llama_cpp")
STACKS = {                                     # one per factor, and the bases the effects need
    "transformers fp32": Stack("fp32"),
    "llama.cpp shipped q4_1": Stack(precision="q4_1", **LLAMA),
    "llama.cpp f16": Stack(precision="f16", **LLAMA),
    "llama.cpp f16 + q8_0 cache": Stack(precision="f16", kv_bits=8, kv_backend="ggml", **LLAMA),
    "llama.cpp f16 + prompt lookup": Stack(precision="f16", speculation="prompt_lookup", num_draft_tokens=4, **LLAMA),
}


def build_engines_store(folder) -> str:
    """One run per stack above (2 repeats: the effects' intervals need them), logged to a fresh store."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    tracking.prepare_store(uri)
    for name, stack in STACKS.items():
        result = run_trial(TrialConfig("engines", SMOL, stack, WORKLOAD, repeats=2))
        assert result.status == "FINISHED", (name, result.error)
        tracking.log_trial(uri, result)
    return uri


@pytest.fixture(scope="module")
def runs(engines_store):
    frame = tracking.runs_frame(engines_store, "engines")
    return {row["stack"]: row for _, row in frame.iterrows()}


def test_the_gguf_cache_converts_once_and_quantizes_from_the_f16(real_models):
    """SmolLM2's types: the shipped Q4_1 as it is; F16 by llama.cpp's converter from the HF folder
    (itself converted from that Q4_1); Q8_0 by llama.cpp's quantizer from that F16; each built once."""
    from trials.engines.llama_cpp import gguf
    from trials.models import pypi
    from trials.models.registry import get_model

    entry = get_model(SMOL)
    shipped, card = gguf.gguf_file(entry, "q4_1")
    assert card["origin"] == "shipped" and shipped == gguf.shipped_file(entry)
    f16, converted = gguf.gguf_file(entry, "f16")
    assert converted["origin"] == "convert_hf_to_gguf.py from smollm2-135m-instruct"
    assert converted["pre_tokenizer"] == "recognized" and converted["llama_cpp_python"] == "0.3.36"
    path, built = gguf.gguf_file(entry, "q8_0")
    assert built["origin"] == f"llama_model_quantize from {f16.name}"
    stamp = path.stat().st_mtime_ns
    again, _ = gguf.gguf_file(entry, "q8_0")
    assert again == path and path.stat().st_mtime_ns == stamp, "a current type is not built again"
    card_file = json.loads((gguf.gguf_dir(entry) / gguf.CARD_FILE).read_text())
    assert card_file["hf_folder"] == str(pypi.model_path(SMOL))
    assert card_file["types"]["q8_0"]["bytes"] == path.stat().st_size
    assert shipped.stat().st_size < path.stat().st_size < f16.stat().st_size   # 4.5, 8.5, 16 bits a weight


def test_a_zoo_model_runs_on_llama_cpp_through_the_converter(tiny_zoo, tmp_path, monkeypatch, caplog):
    """A model that ships no GGUF (the zoo's tiny-gqa; a user's own model takes the same route) is
    converted by llama.cpp's converter (its tokenizer, trained here, is one the converter does not
    know: the card says what was written) and decodes the fp32 reference's greedy tokens from F16.
    Its 16-element heads do not split into ggml's 32-element cache blocks: the plan leaves the
    quantized caches out, saying why, and a trial asking for one is refused with the same reason."""
    from sweeps.spaces import PROFILES
    from trials import groups
    from trials.engines.llama_cpp import gguf
    from trials.models.registry import get_model

    monkeypatch.setenv(gguf.GGUF_DIR_ENV, str(tmp_path))
    path, card = gguf.gguf_file(get_model("tiny-gqa"), "f16")
    assert path.parent.parent == tmp_path and card["pre_tokenizer"] == "gpt-2 (not recognized by the converter)"
    workload = Workload("mixed", prompts_per_type=1, max_new_tokens=8)
    result = run_trial(TrialConfig("engines", "tiny-gqa", Stack(precision="f16", **LLAMA), workload))
    assert result.status == "FINISHED", result.error
    assert result.tags["gguf_origin"] == "convert_hf_to_gguf.py from tiny-gqa"
    assert result.metrics["fidelity_token_match"] >= 0.9 and result.metrics["tokenizer_parity"] > 0
    with caplog.at_level("INFO"):
        planned = groups.get("engines").plan(["tiny-gqa"], PROFILES["quick"], "cpu")
    labels = {c.stack.label for c in planned}
    assert {"llama_cpp:f16", "llama_cpp:q8_0", "llama_cpp:q4_0", "llama_cpp:f16+lookup(k=4)"} <= labels
    assert not any("ggml" in label for label in labels)
    reason = "packs each head's row in 32-element blocks, and this model's heads have 16 elements"
    assert reason in caplog.text
    with pytest.raises(ConfigError, match=reason):
        run_trial(TrialConfig("engines", "tiny-gqa", Stack(precision="f16", kv_bits=8, kv_backend="ggml", **LLAMA),
                              workload))


def test_one_trial_per_factor_on_llama_cpp_against_transformers(runs):
    base, shipped = runs["llama_cpp:f16"], runs["llama_cpp:q4_1"]
    kv8, lookup = runs["llama_cpp:f16+kv8-ggml"], runs["llama_cpp:f16+lookup(k=4)"]
    reference = runs["fp32"]
    for row in (base, shipped, kv8, lookup):
        assert row["tags.engine"] == "llama_cpp" and row["tags.reference_precision"] == "fp32"
        assert float(row["tok_per_s"]) > 0 and float(row["tok_per_s_ci_low"]) <= float(row["tok_per_s"])
        assert float(row["tokenizer_parity"]) == 1.0, row["tags.tokenizer_parity_prompts"]
        assert float(row["new_tokens_per_prompt"]) == WORKLOAD.max_new_tokens
        assert 0 <= float(row["fidelity_token_match"]) <= 1
        # llama.cpp's own counters: prompt-eval always; eval (one token at a time) except where prompt
        # lookup evaluates several tokens per pass, which llama.cpp counts as prompt eval
        assert float(row["llama_prompt_eval_ms"]) > 0 and row["tags.llama_cpp_python"] == "0.3.36"
        # llama.cpp's own benchmark (built beside the binding, same flags) on the same file, cache and
        # threads, beside ours: its rates, their ratio, its command and build
        assert float(row["llama_bench_tg_tok_per_s"]) > 0 and float(row["llama_bench_pp_tok_per_s"]) > 0, \
            row.get("tags.llama_bench_error")
        assert float(row["llama_bench_tg_ratio"]) == pytest.approx(
            float(row["tok_per_s"]) / float(row["llama_bench_tg_tok_per_s"]), rel=1e-6)
        assert f"-ctk {row['tags.kv_cache_type']}" in row["tags.llama_bench_command"]
        assert row["tags.llama_cpp_build_flags"] and row["tags.llama_bench_build_commit"]
    for row in (base, shipped, kv8):
        assert float(row["llama_eval_tok_per_s"]) > 0
        assert "4-bit-derived" in row["tags.weights_origin"]
    assert float(reference["fidelity_token_match"]) == 1.0 and reference["tags.reference_source"] == "this trial"
    for row in (base, shipped, kv8, reference):     # measured beside the batch-1 bandwidth bound
        bound = float(row["memory_bandwidth_bytes_per_s"]) / float(row["decode_bytes_per_step"])
        assert float(row["roofline_tok_per_s"]) == pytest.approx(bound)
        assert 0 < float(row["roofline_ratio"]) < 1.5, (row["stack"], row["roofline_ratio"])
    # weights: the shipped Q4_1 is the smaller file; F16 of the same values decodes the fp32 reference's tokens
    assert float(shipped["weights_bytes"]) < 0.4 * float(base["weights_bytes"])
    assert float(base["fidelity_token_match"]) >= 0.8, "F16 of the same weights, greedy, 8 tokens"
    # KV cache: q8_0 holds 34 bytes per 32 elements, f16 64: the computed bytes say so, the user code too
    assert float(kv8["kv_cache_bytes"]) / float(base["kv_cache_bytes"]) == pytest.approx(34 / 64, rel=1e-6)
    assert kv8["tags.kv_cache_type"] == "q8_0" and "type_k=llama_cpp.GGML_TYPE_Q8_0" in kv8["tags.user_code"]
    # teacher-forced quality on the same windows: F16 of the same weights is the reference's distribution,
    # a q8_0 cache moves it (no less), the shipped Q4_1 (llama.cpp's Q8 activations) a little more
    assert float(reference["kl_divergence"]) == 0.0 and reference["tags.perplexity_method"].startswith("strided")
    assert float(base["kl_divergence"]) < 1e-3 and abs(float(base["perplexity_ratio"]) - 1) < 0.01
    assert float(kv8["kl_divergence"]) >= float(base["kl_divergence"])
    assert float(shipped["kl_divergence"]) < 0.05 and float(shipped["perplexity_tokens"]) > 0
    assert lookup.get("kl_divergence") is None or pd.isna(lookup["kl_divergence"])
    assert "lossless" in lookup["tags.quality_note"]
    # prompt lookup: lossless (greedy verification), with fewer target passes than tokens where it hits
    assert float(lookup["fidelity_token_match"]) == float(base["fidelity_token_match"])
    assert 0 < float(lookup["target_passes_per_token"]) <= 1.0
    assert "LlamaPromptLookupDecoding(num_pred_tokens=4)" in lookup["tags.user_code"]


@pytest.mark.parametrize("stack, reason", [
    (dict(precision="q4_1", batch_size=2, **LLAMA), "batch 1 only"),
    (dict(precision="q4_1", speculation="draft", draft_model="smollm2-135m-instruct", num_draft_tokens=2, **LLAMA),
     "speculates with prompt_lookup, not 'draft'"),
    (dict(precision="q4_1", kv_bits=4, kv_backend="quanto", **LLAMA), "keeps no 'quanto' KV cache"),
    (dict(precision="fp32", **LLAMA), "unknown precision 'fp32' for the llama_cpp engine"),
    (dict(precision="q8_0"), "unknown precision 'q8_0' for the transformers engine"),
    (dict(precision="fp32", kv_bits=8, kv_backend="ggml"), "keeps no 'ggml' KV cache"),
])
def test_what_an_engine_cannot_run_is_refused_with_the_reason(stack, reason):
    with pytest.raises(ConfigError, match=reason):
        TrialConfig("engines", SMOL, Stack(**stack), WORKLOAD)


def test_other_groups_run_on_transformers_only(caplog):
    from sweeps.spaces import PROFILES
    from trials import groups

    with pytest.raises(ConfigError, match="the baseline group runs on transformers, not on llama_cpp"):
        TrialConfig("baseline", SMOL, Stack(precision="q4_1", engine="llama_cpp"), WORKLOAD)
    planned = groups.get("engines").plan([SMOL], PROFILES["quick"], "cpu")
    labels = {c.stack.label for c in planned}
    assert {"llama_cpp:q4_1", "llama_cpp:f16", "llama_cpp:q8_0", "llama_cpp:q4_0", "llama_cpp:f16+kv8-ggml",
            "llama_cpp:f16+kv4-ggml", "llama_cpp:f16+lookup(k=4)", "nf4"} <= labels


def test_the_section_draws_both_engines_and_each_effect(engines_store):
    from dashboard.app import RenderedSections, open_store, render_section, section_frame
    from dashboard.sections import engines

    runs = open_store(engines_store)
    page = str(render_section(engines, runs))
    assert engines.OVERVIEW_ID in page and engines.ALL_EFFECTS_ID in page
    frame = section_frame(engines, runs)
    assert engines.deep_dive_models(frame) == [SMOL]
    dive = dict(engines.deep_dive(frame, SMOL))
    names = {trace.name for trace in dive[engines.SCATTER_ID].data}
    assert names == {"transformers", "llama_cpp"}
    table = engines.effects(engines._rows(frame))
    llama = table[table["engine"] == "llama_cpp"].set_index("effect")
    assert set(llama.index) == {"4-bit weights vs 16-bit", "8-bit KV cache vs 16", "prompt lookup vs none"}
    for _, row in llama.iterrows():
        assert row["low"] <= row["ratio"] <= row["high"]
    assert str(RenderedSections(runs).deep_dive(engines, SMOL, {})).count("engines-") >= 2
    lines = "\n".join(engines.report(frame))
    assert "| smollm2-135m-instruct | llama_cpp | llama_cpp:q4_1 |" in lines and "4-bit weights vs 16-bit" in lines
    assert "of llama-bench's decode rate" in lines                  # each llama.cpp run beside llama-bench
    assert "beside its engine's own benchmark on the same file" in engines.caption(frame)


def test_a_sweep_file_picks_the_engines(tmp_path):
    """``engines:`` in the engines group's profile section plans those engines only; an engine that
    does not exist is one line naming the valid ones."""
    from sweeps.schema import SchemaError
    from sweeps.sweepfile import load_sweep
    from trials import groups

    path = tmp_path / "mine.yaml"
    path.write_text("groups: [engines]\nmodels: [smollm2-135m-instruct]\n"
                    "profile: {base: quick, engines: {engines: [llama_cpp]}}\n")
    sweep = load_sweep(path)
    planned = groups.get("engines").plan(sweep.models, sweep.profile, "cpu")
    assert planned and {c.stack.engine for c in planned} == {"llama_cpp"}
    path.write_text("groups: [engines]\nprofile: {base: quick, engines: {engines: [vllm]}}\n")
    with pytest.raises((SchemaError, ConfigError), match="vllm"):
        load_sweep(path)


def test_each_engine_owns_the_levels_it_is_compared_at_and_a_sweep_file_may_replace_them(tmp_path):
    """The engines group's weights and caches come from each engine's spec (``Engine.levels``): the
    built-in profiles name none of them; a sweep file's lists (any engine's names) replace them."""
    import yaml

    from sweeps.sizing import PROFILE_DIR
    from sweeps.sweepfile import load_sweep
    from trials import engines, groups

    for path in PROFILE_DIR.glob("*.yaml"):
        section = yaml.safe_load(path.read_text())["profile"]["engines"]
        assert not {"weights", "caches"} & set(section), path.name
    path = tmp_path / "mine.yaml"
    path.write_text("groups: [engines]\nmodels: [smollm2-135m-instruct]\nprofile: {base: quick}\n")
    sweep = load_sweep(path)
    planned = groups.get("engines").plan(sweep.models, sweep.profile, "cpu")
    for name, engine in engines.in_process().items():
        mine = [c.stack for c in planned if c.stack.engine == name]
        assert set(engine.levels_for("quick", "weights")) <= {s.precision for s in mine}, name
        assert set(engine.levels_for("quick", "caches")) == {f"{s.kv_backend}{s.kv_bits}" for s in mine
                                                             if s.kv_bits != 16}, name
    path.write_text("groups: [engines]\nmodels: [smollm2-135m-instruct]\n"
                    "profile: {base: quick, engines: {weights: [q4_0], caches: [ggml8]}}\n")
    sweep = load_sweep(path)
    planned = groups.get("engines").plan(sweep.models, sweep.profile, "cpu")
    on_llama = {(c.stack.precision, c.stack.kv_bits) for c in planned if c.stack.engine == "llama_cpp"}
    assert ("q4_0", 16) in on_llama and ("q8_0", 16) not in on_llama and (on_llama & {(p, 8) for p, _ in on_llama})
    assert not any(c.stack.kv_bits == 4 for c in planned)
