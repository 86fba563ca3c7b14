"""trials.measurement.kv_footprint: hand-computed KV bytes for real architectures, the zoo cross-check and the CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trials.measurement import instruments
from trials.measurement.kv_footprint import CATALOGUE, KVFootprint, KVFootprintError, kv_footprint, main
from trials.models import zoo

ROOT = Path(__file__).resolve().parents[1]
CTX = 32768  # 32k context, batch 1, 16-bit (2 bytes per element) unless stated

# Hand-computed bytes per token (uncapped) and total at 32k, batch 1, 16-bit.
# Attention layer: 2 (K, V) x kv_heads x head_dim x 2 bytes.
HAND = {
    # 2*32*8*128*2; all 32 layers full attention
    "llama-3.1-8b": (2 * 32 * 8 * 128 * 2, 2 * 32 * 8 * 128 * 2 * CTX),            # 131072 B/token
    "llama-3.1-70b": (2 * 80 * 8 * 128 * 2, 2 * 80 * 8 * 128 * 2 * CTX),           # 327680
    # explicit head_dim 64 (2048/32 = 64 too)
    "llama-3.2-1b": (2 * 16 * 8 * 64 * 2, 2 * 16 * 8 * 64 * 2 * CTX),              # 32768
    # head_dim 128 = 3072/24
    "llama-3.2-3b": (2 * 28 * 8 * 128 * 2, 2 * 28 * 8 * 128 * 2 * CTX),            # 114688
    # head_dim = 896/14 = 64; sliding_window present but use_sliding_window false -> full
    "qwen2.5-0.5b": (2 * 24 * 2 * 64 * 2, 2 * 24 * 2 * 64 * 2 * CTX),              # 12288
    # head_dim = 3584/28 = 128
    "qwen2.5-7b": (2 * 28 * 4 * 128 * 2, 2 * 28 * 4 * 128 * 2 * CTX),              # 57344
    "qwen2.5-72b": (2 * 80 * 8 * 128 * 2, 2 * 80 * 8 * 128 * 2 * CTX),             # 327680
    # every layer capped at the 4096 window
    "mistral-7b-v0.1": (2 * 32 * 8 * 128 * 2, 2 * 32 * 8 * 128 * 2 * 4096),        # 131072
    # explicit head_dim 256 (not 3584/16 = 224); 21 sliding layers (window 4096) + 21 global
    "gemma-2-9b": (2 * 42 * 8 * 256 * 2, 2 * 21 * 8 * 256 * 2 * 4096 + 2 * 21 * 8 * 256 * 2 * CTX),  # 344064
    # MHA (32 kv heads), head_dim 3072/32 = 96, sliding_window 2047 on all layers
    "phi-3-mini-4k": (2 * 32 * 32 * 96 * 2, 2 * 32 * 32 * 96 * 2 * 2047),          # 393216
    # MLA latent: (512 + 64) x 61 layers x 2 bytes, no factor 2 for K/V, no heads
    "deepseek-v3": ((512 + 64) * 61 * 2, (512 + 64) * 61 * 2 * CTX),               # 70272
    # 48 layers, every 4th full attention -> 12 attention layers, 36 linear (no KV); head_dim 256
    "qwen3-next-80b-a3b": (2 * 12 * 2 * 256 * 2, 2 * 12 * 2 * 256 * 2 * CTX),      # 24576
    # 32 layers, attention where i % 8 == 4 -> 4 attention layers, 28 Mamba; head_dim 4096/32 = 128
    "jamba-v0.1": (2 * 4 * 8 * 128 * 2, 2 * 4 * 8 * 128 * 2 * CTX),                # 16384
}


def test_catalogue_is_large_and_cites_hub_ids():
    assert len(CATALOGUE) >= 10
    assert set(HAND) == set(CATALOGUE)
    for name, facts in CATALOGUE.items():
        assert "/" in facts["hub_id"], name


@pytest.mark.parametrize("name", sorted(HAND))
def test_catalogue_matches_hand_computed_values(name):
    per_token, total = HAND[name]
    fp = kv_footprint(name)
    assert isinstance(fp, KVFootprint)
    assert fp.bytes_per_token_uncapped() == per_token
    assert fp.total_bytes(CTX, batch=1, bits=16) == total
    assert fp.bytes_per_token(CTX) == total / CTX
    assert sum(fp.breakdown(CTX).values()) == total


def test_named_values():
    assert kv_footprint("llama-3.1-8b").bytes_per_token_uncapped() == 131072
    assert kv_footprint("deepseek-v3").bytes_per_token_uncapped() == 70272
    assert kv_footprint("gemma-2-9b").bytes_per_token_uncapped() == 344064


def test_sliding_window_caps_at_window():
    mistral = kv_footprint("mistral-7b-v0.1")
    per = 2 * 32 * 8 * 128 * 2
    assert mistral.total_bytes(1000) == per * 1000          # under the window: linear
    assert mistral.total_bytes(4096) == per * 4096
    assert mistral.total_bytes(100_000) == per * 4096       # past it: flat
    assert mistral.bytes_per_token(8192) == per / 2

    gemma = kv_footprint("gemma-2-9b")
    layer = 2 * 8 * 256 * 2                                  # 8192 B per layer per token
    assert gemma.breakdown(CTX) == {"sliding": 21 * layer * 4096, "full": 21 * layer * CTX}
    assert gemma.total_bytes(2048) == 42 * layer * 2048      # both kinds grow until 4096
    # only the 21 global layers grow past the window
    assert gemma.total_bytes(10_000) - gemma.total_bytes(9_000) == 21 * layer * 1000
    assert [g.kind for g in gemma.groups] == ["sliding", "full"]  # layer 0 is sliding


def test_qwen2_use_sliding_window_respected():
    facts = dict(CATALOGUE["qwen2.5-7b"], use_sliding_window=True, sliding_window=4096, max_window_layers=14)
    fp = kv_footprint(facts)
    layer = 2 * 4 * 128 * 2
    assert fp.total_bytes(CTX) == 14 * layer * CTX + 14 * layer * 4096
    assert any("ignored" in n for n in kv_footprint("qwen2.5-7b").notes)


def test_layer_types_interleaved_and_unknown():
    cfg = dict(model_type="gemma3_text", num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
               head_dim=32, hidden_size=64, sliding_window=512)
    # default pattern 6: layers 0-4 sliding, layer 5 global
    assert kv_footprint(cfg).total_bytes(1024) == 5 * 2 * 32 * 2 * 512 + 1 * 2 * 32 * 2 * 1024
    explicit = dict(cfg, layer_types=["full_attention", "sliding_attention"] * 3)
    assert kv_footprint(explicit).total_bytes(1024) == 3 * 128 * 512 + 3 * 128 * 1024
    with pytest.raises(KVFootprintError, match="compressed_sparse_attention"):
        kv_footprint(dict(cfg, layer_types=["compressed_sparse_attention"] * 6))
    with pytest.raises(KVFootprintError, match="layer_types has 2 entries"):
        kv_footprint(dict(cfg, layer_types=["full_attention"] * 2))


def test_mla_latent_vs_expanded():
    latent = kv_footprint("deepseek-v3")
    assert [(g.kind, g.layers, g.elements_per_token) for g in latent.groups] == [("mla", 61, 512 + 64)]
    assert any("expanded" in n for n in latent.notes)
    expanded = kv_footprint("deepseek-v3", mla="expanded")
    # transformers eager: per head K = 128 nope + 64 rope, V = 128; 128 heads
    assert expanded.bytes_per_token_uncapped() == 61 * 128 * (128 + 64 + 128) * 2  # 4997120
    # a naive heads x head_dim x 2 calculator (7168/128 = 56) would say 2*61*128*56*2 = 1748992
    assert latent.bytes_per_token_uncapped() != 2 * 61 * 128 * 56 * 2


def test_hybrid_linear_layers_hold_no_kv():
    fp = kv_footprint("qwen3-next-80b-a3b")
    kinds = {g.kind: g.layers for g in fp.groups}
    assert kinds == {"none": 36, "full": 12}
    assert fp.breakdown(CTX)["none"] == 0
    assert any("no KV" in n for n in fp.notes)
    lt = dict(model_type="qwen3_next", num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, hidden_size=64, layer_types=["linear_attention", "full_attention"] * 2)
    assert kv_footprint(lt).bytes_per_token_uncapped() == 2 * 2 * 2 * 16 * 2


def test_bits_scale_payload():
    fp = kv_footprint("llama-3.1-8b")
    b16 = fp.total_bytes(CTX, batch=4, bits=16)
    assert b16 == 4 * 131072 * CTX
    assert fp.total_bytes(CTX, 4, 8) == b16 // 2
    assert fp.total_bytes(CTX, 4, 4) == b16 // 4
    assert fp.total_bytes(CTX, 4, 2) == b16 // 8
    assert fp.bytes_per_token_uncapped(4) == 32768
    with pytest.raises(KVFootprintError):
        fp.total_bytes(CTX, 1, 3)


def test_unknown_model_type_and_missing_fields_raise():
    with pytest.raises(KVFootprintError, match="rwkv"):
        kv_footprint({"model_type": "rwkv", "num_hidden_layers": 2})
    with pytest.raises(ValueError, match="num_attention_heads"):
        kv_footprint({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64})
    with pytest.raises(KVFootprintError, match="unknown config"):
        kv_footprint("no-such-model")


def test_transformers_config_objects_agree_with_dicts():
    from transformers import Gemma2Config, MistralConfig, Qwen2Config

    for cls, name in [(Gemma2Config, "gemma-2-9b"), (Qwen2Config, "qwen2.5-7b"),
                      (MistralConfig, "mistral-7b-v0.1")]:
        facts = {k: v for k, v in CATALOGUE[name].items() if k not in ("hub_id", "model_type")}
        assert kv_footprint(cls(**facts)).total_bytes(CTX) == HAND[name][1], name


def test_zoo_matches_the_formula_and_a_real_cache(tiny_zoo):
    from transformers import AutoConfig, AutoModelForCausalLM

    for name in ("tiny-mha", "tiny-gqa", "tiny-draft"):
        assert zoo.is_built(name)
        config = AutoConfig.from_pretrained(zoo.model_path(name))
        for tokens, batch in ((1, 1), (37, 3)):
            # 2 (K and V) x layers x kv heads x head dim x tokens x batch x 2 bytes
            want = (2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
                    * tokens * batch * 2)
            assert kv_footprint(name).total_bytes(tokens, batch, 16) == want
            assert kv_footprint(config).total_bytes(tokens, batch, 16) == want
            assert kv_footprint(zoo.model_path(name) / "config.json").total_bytes(tokens, batch, 16) == want

    # tiny-gqa: 2 layers x 2 kv heads x head_dim 16 -> 2*2*2*16*2 = 256 B/token at 16-bit
    assert kv_footprint("tiny-gqa").bytes_per_token_uncapped() == 2 * 2 * 2 * 16 * 2
    model = AutoModelForCausalLM.from_pretrained(zoo.model_path("tiny-gqa"), dtype=torch.float16).eval()
    tokens, batch = 29, 2
    input_ids = torch.randint(3, 512, (batch, tokens))
    with torch.no_grad():
        out = model(input_ids, use_cache=True)
    real = sum(layer.keys.nbytes + layer.values.nbytes for layer in out.past_key_values.layers)
    assert real == kv_footprint("tiny-gqa").total_bytes(tokens, batch, 16) == 256 * tokens * batch
    assert real == instruments.kv_cache_bytes(out.past_key_values)


def test_sliding_window_against_transformers_cache():
    """A tiny random Mistral: under the window the real cache equals the calculator; past it transformers keeps
    window - 1 tokens between steps (documented), one token per layer less than the attended window."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=16)
    torch.manual_seed(0)
    model = MistralForCausalLM(cfg).eval()
    fp = kv_footprint(cfg)
    per_token = 2 * 2 * 2 * 8 * 4  # 2 layers x (K,V) x 2 kv heads x head_dim 8 x 4 bytes (float32)
    for tokens in (10, 40):
        with torch.no_grad():
            out = model(torch.randint(0, 64, (1, tokens)), use_cache=True)
        real = sum(layer.keys.nbytes + layer.values.nbytes for layer in out.past_key_values.layers)
        calc = fp.total_bytes(tokens, 1, bits=32)
        if tokens < 16:
            assert real == calc == per_token * tokens
        else:
            assert calc == per_token * 16
            assert real == per_token * 15


# ---------------------------------------------------------------------------------------------- CLI

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trials.measurement.kv_footprint", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_json_catalogue_name():
    r = _cli("llama-3.1-8b", "--context", "32768", "--batch", "2", "--bits", "8", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["bytes_per_token"] == 131072 / 2
    assert report["total_bytes"] == 2 * 32 * 8 * 128 * 1 * 32768 * 2


def test_cli_text_and_config_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in CATALOGUE["gemma-2-9b"].items() if k != "hub_id"}))
    r = _cli(str(path), "--context", "32768")
    assert r.returncode == 0, r.stderr
    assert "bytes per token" in r.stdout and f"{HAND['gemma-2-9b'][1]:,}" in r.stdout
    assert main([str(tmp_path), "--context", "100", "--json"]) == 0  # a folder holding config.json


def test_cli_zoo_name(tiny_zoo, capsys):
    assert main(["tiny-gqa", "--context", "128", "--batch", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bytes_per_token"] == 256
    assert report["total_bytes"] == 256 * 128 * 8


@pytest.mark.parametrize("args", [["no-such-model"], ["{path}"]])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, args):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "rwkv", "num_hidden_layers": 24}))
    r = _cli(*[a.format(path=path) for a in args])
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kv_footprint: error:"), r.stderr
