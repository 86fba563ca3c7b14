"""Static batching end to end: the runner on real tiny models and the three charts as the app builds
them (tests/page.py; Chromium draws them in tests/test_every_chart.py). The memory boundary's sweep
runs on the 2-node cluster (tests/test_cluster_sweep.py).

Greedy outputs of every batched row must equal the same prompt decoded alone (fp32 on CPU); the KV
cache must grow with the batch exactly as the architecture's formula says; a trial over the memory
budget must become a FAILED run whose reason starts with ``oom`` while the sweep goes on.
"""

from __future__ import annotations

import pytest

import tracking
from trials.config import ConfigError, Runtime, Stack, TrialConfig, Workload
from trials.loop import compare_outputs, measure, trial_prompts
from trials.measurement.instruments import model_weights_bytes
from trials.models import loading
from trials.prompts import workload_prompts
from trials.run import run_trial
from trials.config import parse_memory_budget
from trials.techniques.batching.runner import base_id, batch_rows, equal_length_prompts
from trials.worker import WORKER

TINY = Workload("mixed", 1, 8)          # 4 prompts (one per type), 8 new tokens


def _config(model: str, batch: int, workload: Workload = TINY, repeats: int = 1) -> TrialConfig:
    return TrialConfig(group="batching", model=model, stack=Stack(batch_size=batch),
                       workload=workload, repeats=repeats)


def _kv_bytes_by_hand(model: str, tokens: int, rows: int) -> int:
    """K and V, every layer, every KV head, fp32: the Llama formula written out."""
    c = loading.load(model, "fp32", "cpu").model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4 * tokens * rows


def test_runner_matches_batch1_and_kv_grows_with_the_batch(tiny_zoo):
    WORKER.reset()                          # as a fresh worker: batch 1 measures what the others reuse
    results = {b: run_trial(_config("tiny-gqa", b)) for b in (1, 2, 4, 8)}
    prompt_tokens = results[1].metrics["prompt_tokens"]
    for batch, result in results.items():
        m = result.metrics
        assert result.status == "FINISHED", result.error
        assert m["outputs_match_batch1"] == 1.0 and m["rows_not_matching_batch1"] == 0
        assert m["prompt_tokens"] == prompt_tokens == m["prompt_tokens_mean"]
        assert m["num_prompts"] == max(4, batch) and m["distinct_prompts"] == 4
        tokens = int(prompt_tokens) + TINY.max_new_tokens - 1       # the last token is never cached
        assert m["kv_cache_tokens"] == tokens
        assert m["kv_cache_bytes"] == m["kv_cache_bytes_exact"] == _kv_bytes_by_hand("tiny-gqa", tokens, batch)
        assert m["kv_cache_bytes"] == batch * results[1].metrics["kv_cache_bytes"]
        assert m["per_stream_tok_per_s"] * batch == pytest.approx(m["tok_per_s"])
        assert m["roofline_tok_per_s"] == pytest.approx(
            batch * m["memory_bandwidth_bytes_per_s"] / m["decode_bytes_per_step"])
        assert m["roofline_ratio"] == pytest.approx(m["tok_per_s"] / m["roofline_tok_per_s"])
        assert m["decode_bytes_per_step"] > m["weights_bytes"]
        assert m["predicted_peak_memory_bytes"] == (m["weights_bytes"] + m["predicted_kv_cache_bytes"]
                                                    + m["predicted_activation_bytes"])
        assert m["predicted_kv_cache_bytes"] == _kv_bytes_by_hand("tiny-gqa", tokens + 1, batch)
    assert results[1].tags["batch1_reference"].startswith("this trial")
    assert results[2].tags["batch1_reference"].startswith("reused: measured ")
    assert results[1].config.config_hash in results[2].tags["batch1_reference"]   # batch 1 measured it
    assert results[1].tags["bandwidth_source"] == "this trial"
    assert results[2].tags["bandwidth_source"].startswith("reused: measured ")
    reused = [o["prompt_id"] for o in results[8].raw["outputs"]]
    assert len(set(reused)) == 8 and sum("#1" in pid for pid in reused) == 4


@pytest.mark.parametrize("model", ["tiny-gqa", "tiny-mha"])
def test_left_padding_gives_batch1_outputs_when_lengths_differ(tiny_zoo, model):
    """The prompts as written (not cut): a batch of 4 is left-padded to its longest prompt."""
    config = _config(model, 4)
    loaded = loading.load(model, "fp32", "cpu")
    prompts = trial_prompts(config, loaded)
    lengths = {len(loaded.tokenizer(p.text)["input_ids"]) for p in prompts}
    assert len(lengths) > 1, "the test needs prompts of different lengths"
    batched = measure(config, loaded, prompts, generate_kwargs={}, batch_size=4, repeats=1)
    alone = measure(config, loaded, prompts, generate_kwargs={}, batch_size=1, repeats=1)
    assert batched.repeats[0][0].prompt_tokens == max(lengths)
    assert compare_outputs(batched.outputs(), alone.outputs())["lossless"] == 1.0


def test_prompts_are_cut_to_one_length_and_rows_fill_every_batch(tiny_zoo):
    tokenizer = loading.load("tiny-gqa", "fp32", "cpu").tokenizer
    original = workload_prompts("mixed", None)
    cut, length = equal_length_prompts(original, tokenizer)
    assert length == min(len(tokenizer(p.text)["input_ids"]) for p in original)
    assert {len(tokenizer(p.text)["input_ids"]) for p in cut} == {length}
    assert all(o.text.endswith(c.text) and o.id == c.id for o, c in zip(original, cut))
    for batch in (1, 5, 48, 128):
        rows = batch_rows(cut, batch)
        assert len(rows) % batch == 0 and len(rows) >= max(batch, len(cut))
        assert len({r.id for r in rows}) == len(rows)
        assert all(r.text == cut[i % len(cut)].text and base_id(r.id) == cut[i % len(cut)].id
                   for i, r in enumerate(rows))


def test_prompts_are_cut_right_when_the_tokenizer_adds_a_bos_token(tiny_zoo):
    import copy

    from tokenizers.processors import TemplateProcessing

    tokenizer = copy.deepcopy(loading.load("tiny-gqa", "fp32", "cpu").tokenizer)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|bos|> $A", special_tokens=[("<|bos|>", tokenizer.bos_token_id)])
    assert tokenizer("")["input_ids"] == [tokenizer.bos_token_id]
    original = workload_prompts("mixed", None)
    cut, length = equal_length_prompts(original, tokenizer)
    assert {len(tokenizer(p.text)["input_ids"]) for p in cut} == {length}
    assert all(o.text.endswith(c.text) for o, c in zip(original, cut))


@pytest.mark.parametrize("text, value", [("1073741824", 2**30), ("2GiB", 2 * 2**30), ("512MiB", 2**29),
                                         ("1.5GB", 1_500_000_000), (" 64 kib ", 65536)])
def test_memory_budget_sizes(text, value):
    assert parse_memory_budget(text) == value


@pytest.mark.parametrize("text", ["", "2XB", "-1GiB", "lots", "0", "GiB"])
def test_bad_memory_budget_is_a_config_error(text):
    with pytest.raises(ConfigError, match="memory budget"):
        parse_memory_budget(text)


def test_budget_smaller_than_the_model_is_an_oom_failed_run(tiny_zoo):
    weights = model_weights_bytes(loading.load("tiny-gqa", "fp32", "cpu").model)
    result = run_trial(_config("tiny-gqa", 2), Runtime(memory_budget_bytes=weights // 2))
    assert result.status == "FAILED" and result.error.startswith("oom: predicted peak")
    assert result.metrics["memory_budget_bytes"] == weights // 2
    assert result.metrics["predicted_peak_memory_bytes"] > weights
    assert "tok_per_s" not in result.metrics


def test_bad_memory_budget_for_one_trial_is_one_line_and_exit_2(capsys):
    from trials.run import main

    assert main(["--group", "batching", "--memory-budget", "lots"]) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "memory budget" in lines[0], out.err
    assert out.out == ""


# ------------------------------------------------------------------------------------ the charts

@pytest.fixture
def batching_store(tmp_path, tiny_zoo) -> str:
    """tiny-gqa and tiny-mha at batch 1, 2, 4; tiny-gqa at batch 8 over a budget (oom)."""
    uri = tracking.resolve_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tracking.prepare_store(uri)
    for model in ("tiny-gqa", "tiny-mha"):
        for batch in (1, 2, 4):
            tracking.log_trial(uri, run_trial(_config(model, batch)))
    oom = run_trial(_config("tiny-gqa", 8), Runtime(memory_budget_bytes=4 * 2**20))
    assert oom.status == "FAILED" and oom.error.startswith("oom")
    tracking.log_trial(uri, oom)
    return uri


def _by_name(figure: dict) -> dict[str, dict]:
    return {t["name"]: t for t in figure["traces"]}


def _store_values(uri: str, column: str) -> dict[str, dict[float, float]]:
    frame = tracking.runs_frame(uri, "batching")
    return {model: dict(zip(part["batch_size"], part[column])) for model, part in frame.groupby("model")}


def test_batching_charts_plot_the_store_with_roofline_and_boundary(batching_store):
    from page import Page

    page = Page(batching_store)
    throughput = _by_name(page.figure("batching-throughput"))
    per_stream = _by_name(page.figure("batching-per-stream"))
    memory_raw = page.figure("batching-memory")
    memory = _by_name(memory_raw)
    caption = page.text("batching-caption")
    measured = _store_values(batching_store, "tok_per_s")
    roofline = _store_values(batching_store, "roofline_tok_per_s")
    for model in ("tiny-gqa", "tiny-mha"):
        for name, expected in ((model, measured[model]), (f"{model} roofline", roofline[model])):
            trace = throughput[name]
            assert dict(zip(trace["x"], trace["y"])) == pytest.approx(expected), name
        assert per_stream[model]["x"] == [1, 2, 4] and len(per_stream[model]["y"]) == 3
        assert memory[model]["x"] == [1, 2, 4] and len(memory[f"{model} predicted"]["y"]) == 3
        assert all(c[5] for c in throughput[model]["customdata"])         # config hash in the hover
    assert memory_raw["points_drawn"] >= 7 and memory_raw["lines_drawn"] >= 4
    assert memory["tiny-gqa oom"]["x"] == [8] and "tiny-mha oom" not in memory
    assert memory_raw["shapes"] == 1
    assert any("memory budget 4 MiB" in a for a in memory_raw["annotations"])
    assert "6 of 6 trials" in caption and "1 configuration(s) did not fit" in caption
