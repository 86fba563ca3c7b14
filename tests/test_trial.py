"""One trial on the tiny zoo: its numbers are sane and the exact ones are exact."""

import json
import subprocess
import sys

import pytest
import torch

from trials.config import ConfigError, Stack, TrialConfig, Workload
from trials.measurement.kv_footprint import kv_footprint
from trials.models import zoo
from trials.run import run_trial


def _config(model="tiny-gqa", precision="fp32", **kw):
    return TrialConfig(group="baseline", model=model, stack=Stack(precision=precision),
                       workload=Workload("mixed", 1, 8), repeats=2, **kw)


@pytest.mark.parametrize("precision,element_bytes", [("fp32", 4), ("bf16", 2)])
def test_trial_numbers(tiny_zoo, precision, element_bytes):
    result = run_trial(_config(precision=precision))
    m = result.metrics
    card = zoo.load_card("tiny-gqa")

    # KV bytes: the walked cache equals 2 x layers x kv_heads x head_dim x tokens x bytes, to the byte,
    # with the formula written out here from the model card rather than calling the same helper.
    tokens = int(m["kv_cache_tokens"])
    expected = 2 * card["layers"] * card["kv_heads"] * card["head_dim"] * tokens * element_bytes
    assert m["kv_cache_bytes"] == expected == m["kv_cache_bytes_exact"]
    assert card["kv_heads"] < card["attention_heads"], "tiny-gqa should exercise grouped-query KV"
    # the cache holds the prompt and every generated token but the last (never fed back)
    longest = max(r["prompt_tokens"] for r in result.raw["repeats"][0])
    assert tokens == longest + result.config.workload.max_new_tokens - 1

    # weights: the real storage of parameters and buffers
    assert m["num_parameters"] == card["parameters"]
    assert card["parameters"] * element_bytes <= m["weights_bytes"] < card["parameters"] * element_bytes + 65536
    assert m["peak_memory_bytes"] >= m["weights_bytes"]

    assert 0 < m["tok_per_s_min"] <= m["tok_per_s"] <= m["tok_per_s_max"]
    assert 0 < m["ttft_s_min"] <= m["ttft_s"] <= m["ttft_s_max"]
    assert m["tpot_s"] > 0 and m["num_prompts"] == 4
    assert len(result.raw["repeats"]) == 2
    outputs = result.raw["outputs"]
    assert len(outputs) == 4 and all(len(o["token_ids"]) == 8 for o in outputs)
    assert result.tags["env.device"] == "cpu" and result.tags["env.torch"] == torch.__version__


def test_kv_formula_handles_explicit_head_dim():
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         num_hidden_layers=3)
    assert kv_footprint(config).total_bytes(context=10, batch=2, bits=16) == 2 * 3 * 2 * 32 * 10 * 2 * 2


def test_model_is_loaded_once_per_worker(tiny_zoo):
    first = run_trial(_config(model="tiny-mha", precision="bf16"))
    second = run_trial(_config(model="tiny-mha", precision="bf16", seed=1))
    assert second.metrics["model_from_cache"] == 1.0 and second.metrics["model_load_s"] == 0.0
    assert first.config.config_hash != second.config.config_hash


def test_config_hash_is_stable_and_validation_is_one_line(tiny_zoo):
    a, b = _config(), TrialConfig.from_dict(_config().to_dict())
    assert a.config_hash == b.config_hash and len(a.config_hash) == 16
    assert a.config_hash != _config(precision="bf16").config_hash
    bad = [dict(model="nosuchmodel"), dict(group="nosuchgroup"), dict(repeats=0)]
    for change in bad:
        with pytest.raises(ConfigError) as err:
            TrialConfig.from_dict({**_config().to_dict(), **change})
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="k\\) >= 1"):
        Stack(speculation="draft", draft_model="tiny-draft", num_draft_tokens=0).validate()
    with pytest.raises(ConfigError, match="batch_size 1"):
        Stack(speculation="prompt_lookup", num_draft_tokens=2, batch_size=2).validate()


def test_fp16_on_cpu_fails_with_reason(tiny_zoo):
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        run_trial(_config(precision="fp16"))


def test_trial_runs_alone_from_the_command_line(tiny_zoo):
    out = subprocess.run([sys.executable, "-m", "trials.run", "--model", "tiny-gqa", "--precision", "bf16",
                          "--prompts-per-type", "1", "--max-new-tokens", "6", "--repeats", "1",
                          "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == "FINISHED" and result["metrics"]["tok_per_s"] > 0


def test_a_bad_trial_on_the_command_line_is_one_line_and_exit_2(capsys):
    from trials.run import main

    assert main(["--model", "nosuchmodel"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "nosuchmodel" in err and "tiny-gqa" in err


@pytest.mark.cuda
def test_trial_numbers_on_cuda(tiny_zoo):
    result = run_trial(_config(precision="bf16", device="cuda"))
    assert result.metrics["kv_cache_bytes"] == result.metrics["kv_cache_bytes_exact"]
    assert result.tags["memory_method"] == "cuda.max_memory_allocated"
