"""The offline model zoo: the session's tiny set (``tiny_zoo``: built from scratch on a fresh machine
such as CI's, reused from the cache elsewhere), its cards, reloads, staleness rules and CLI."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from trials.measurement.hardware import cpu_profile
from trials.models import zoo

REPO = Path(__file__).resolve().parents[1]
CARD_FIELDS = (
    "name", "role", "family", "architecture", "parameters", "layers", "hidden_size", "attention_heads",
    "kv_heads", "head_dim", "vocab_size", "max_position_embeddings", "training_tokens", "train_steps",
    "heldout_perplexity", "heldout_tokens", "build_seconds", "seed", "recipe_hash", "corpus_hash", "how_made",
    "train_precision",
)
TINY = zoo.ZOO_SETS["tiny"]


@dataclasses.dataclass
class Built:
    root: Path
    cards: dict


@pytest.fixture
def fresh_zoo(tiny_zoo, monkeypatch):
    """The session's tiny zoo (built from scratch where none was cached, as on a fresh CI machine),
    with its cards as the build returned them."""
    monkeypatch.setenv(zoo.ZOO_ENV_VAR, str(tiny_zoo))
    return Built(tiny_zoo, zoo.build("tiny"))


def _run_cli(*args, env_dir):
    env = dict(os.environ, **{zoo.ZOO_ENV_VAR: str(env_dir)})
    return subprocess.run([sys.executable, "-m", "trials.models.zoo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_tiny_zoo_build_and_reload(fresh_zoo):
    # How long a build takes is a benchmark's business (benchmarks/precision.py), not a test's.
    assert zoo.zoo_dir() == fresh_zoo.root
    assert set(fresh_zoo.cards) == set(TINY) == {"tiny-mha", "tiny-gqa", "tiny-draft"}
    for name, card in fresh_zoo.cards.items():
        assert zoo.is_built(name)
        assert zoo.load_card(name) == card
        missing = [f for f in CARD_FIELDS if f not in card]
        assert not missing, f"{name} card lacks {missing}"
        assert card["name"] == name and card["architecture"] == "LlamaForCausalLM"
        assert card["corpus_hash"] == zoo.corpus_hash("tiny")
        assert card["recipe_hash"] == zoo.recipe_hash(name)
        assert len(card["how_made"]) > 200

        folder = zoo.model_path(name)
        assert folder.parent == fresh_zoo.root and (folder / "model.safetensors").exists()
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        assert type(model).__name__ == "LlamaForCausalLM"
        assert card["parameters"] == sum(p.numel() for p in model.parameters())
        cfg = model.config
        assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                cfg.head_dim, cfg.vocab_size, cfg.max_position_embeddings) == (
            card["layers"], card["hidden_size"], card["attention_heads"], card["kv_heads"], card["head_dim"],
            card["vocab_size"], card["max_position_embeddings"])
        assert cfg.max_position_embeddings >= 4096
        assert card["training_tokens"] == card["train_steps"] * card["batch_size"] * card["seq_len"]
        # bf16 autocast only where bf16 is native: emulated, it trains ~10x slower than fp32. (A cached
        # card may come from another CPU setting of this machine, e.g. AVX2 reproduced: its own record.)
        assert card["train_precision"] in ("bf16", "fp32")
        assert ("bf16 autocast" in card["how_made"]) == (card["train_precision"] == "bf16")
    assert zoo.train_precision() == ("bf16" if cpu_profile().bf16_native else "fp32")

    mha, gqa, draft = (fresh_zoo.cards[n] for n in ("tiny-mha", "tiny-gqa", "tiny-draft"))
    assert mha["role"] == gqa["role"] == "target" and draft["role"] == "draft"
    assert mha["default_draft"] == gqa["default_draft"] == "tiny-draft"
    assert set(draft["draft_for"]) == {"tiny-mha", "tiny-gqa"}
    assert mha["kv_heads"] == mha["attention_heads"] and gqa["kv_heads"] < gqa["attention_heads"]
    assert draft["parameters"] < min(mha["parameters"], gqa["parameters"])
    assert (zoo.tokenizer_path("tiny") / "tokenizer.json").exists()


def test_tiny_zoo_reload_gives_identical_logits_and_tokenizer_round_trips(fresh_zoo):
    folder = zoo.model_path("tiny-gqa")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token and tokenizer.eos_token and tokenizer.bos_token
    texts = ["def __init__(self, name):\n        self.name = name\n",
             "The with statement wraps a block — naïve ✓ 😀",
             '{"id": 7, "city": "Oslo"}\nsku,price\nSKU-1,2.50\n| a | b |']
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert ids == raw.encode(text).ids  # no BOS added, same pre-tokenizer as at training
    newline = tokenizer.convert_tokens_to_ids("\u010a")  # byte-level "\n"
    assert tokenizer("a\n\n    b")["input_ids"].count(newline) == 2  # every newline is its own token
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    assert batch["attention_mask"][:, -1].all()  # left padding

    first = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    second = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits_a = first(**batch).logits
        logits_b = second(**batch).logits
    assert torch.equal(logits_a, logits_b)


def test_tiny_targets_beat_draft_on_heldout_perplexity(fresh_zoo):
    cards = fresh_zoo.cards
    draft_ppl = cards["tiny-draft"]["heldout_perplexity"]
    for target in ("tiny-mha", "tiny-gqa"):
        assert cards[target]["heldout_perplexity"] < draft_ppl
    assert zoo.quality_problems("tiny", cards) == []
    # The card's number is real: recompute it from the saved weights.
    model = AutoModelForCausalLM.from_pretrained(zoo.model_path("tiny-mha"), dtype=torch.float32)
    windows = zoo.heldout_windows("tiny")
    assert windows[:, 1:].numel() == cards["tiny-mha"]["heldout_tokens"]
    assert zoo.heldout_perplexity(model, windows) == pytest.approx(cards["tiny-mha"]["heldout_perplexity"],
                                                                   rel=1e-3)


def test_second_tiny_build_rebuilds_nothing(fresh_zoo):
    weights = {n: zoo.model_path(n) / "model.safetensors" for n in TINY}
    mtimes = {n: p.stat().st_mtime_ns for n, p in weights.items()}
    cards = zoo.build("tiny")
    assert cards == {n: zoo.load_card(n) for n in TINY}  # same build_seconds: cached cards, not new ones
    assert {n: p.stat().st_mtime_ns for n, p in weights.items()} == mtimes


def test_recipe_change_marks_model_stale(fresh_zoo, monkeypatch):
    assert all(zoo.is_built(n) for n in TINY)
    old = zoo.RECIPES["tiny-mha"]
    monkeypatch.setitem(zoo.RECIPES, "tiny-mha", dataclasses.replace(old, train_steps=old.train_steps + 1))
    assert not zoo.is_built("tiny-mha")
    assert not zoo.is_built("tiny-draft")  # distilled from tiny-mha: its teacher changed
    assert zoo.is_built("tiny-gqa")
    monkeypatch.setitem(zoo.RECIPES, "tiny-mha", old)
    assert zoo.is_built("tiny-mha") and zoo.is_built("tiny-draft")

    # A card whose stored recipe hash differs (an older recipe) is stale too.
    card_file = zoo.model_path("tiny-gqa") / zoo.CARD_FILE
    original = card_file.read_text()
    try:
        card = json.loads(original)
        card["recipe_hash"] = "0" * 16
        card_file.write_text(json.dumps(card))
        assert not zoo.is_built("tiny-gqa")
    finally:
        card_file.write_text(original)
    assert zoo.is_built("tiny-gqa")


def test_cli_list_help_and_errors(fresh_zoo, tmp_path):
    listed = _run_cli("list", "--set", "tiny", env_dir=fresh_zoo.root)
    assert listed.returncode == 0, listed.stderr
    for name in TINY:
        line = next(line for line in listed.stdout.splitlines() if line.startswith(name))
        assert "built" in line and f"{fresh_zoo.cards[name]['heldout_perplexity']:.2f}" in line

    empty = _run_cli("list", env_dir=tmp_path / "nothing")
    assert empty.returncode == 0 and "missing" in empty.stdout and "zoo-gqa" in empty.stdout

    for args in (["--help"], ["build", "--help"], ["list", "--help"]):
        helped = _run_cli(*args, env_dir=tmp_path)
        assert helped.returncode == 0 and "usage" in helped.stdout

    for args, valid in ((["build", "--set", "huge"], "tiny, full"), (["list", "--set", "huge"], "tiny, full"),
                        (["build", "--set", "tiny", "--model", "zoo-nope"], "tiny-mha")):
        failed = _run_cli(*args, env_dir=tmp_path)
        assert failed.returncode == 2
        lines = failed.stderr.strip().splitlines()
        assert len(lines) == 1 and valid in lines[0], failed.stderr

    with pytest.raises(ValueError, match="valid models"):
        zoo.model_path("zoo-nope")
    with pytest.raises(ValueError, match="valid sets"):
        zoo.build("huge")


def test_growing_by_depth_starts_as_the_same_function(fresh_zoo):
    """zoo-large's recipe: a trained model deepened with identity layers computes what it computed."""
    from transformers import LlamaForCausalLM

    source = AutoModelForCausalLM.from_pretrained(zoo.model_path("tiny-gqa"), dtype=torch.float32).eval()
    recipe = dataclasses.replace(zoo.RECIPES["tiny-gqa"], layers=5, grow_from="tiny-gqa")
    grown = LlamaForCausalLM(zoo._llama_config(recipe, source.config.vocab_size)).eval()
    zoo._grow_by_depth(grown, source)
    ids = zoo.heldout_windows("tiny")[:2]
    with torch.inference_mode():
        assert torch.allclose(grown(input_ids=ids).logits, source(input_ids=ids).logits, atol=1e-4)
    assert sum(p.numel() for p in grown.parameters()) > sum(p.numel() for p in source.parameters())
    with pytest.raises(ValueError, match="cannot grow"):
        zoo._grow_by_depth(source, grown)                   # fewer layers than the source


def test_full_set_recipes_are_consistent():
    """Sources exist in the set and come before what they feed; grown models match their source's width."""
    for name in zoo.ZOO_SETS["full"]:
        r = zoo.RECIPES[name]
        order = list(zoo.ZOO_SETS["full"])
        for source in zoo._sources(name):
            assert source in order and order.index(source) < order.index(name)
        if r.grow_from:
            s = zoo.RECIPES[r.grow_from]
            assert (r.hidden_size, r.attention_heads, r.kv_heads, r.head_dim, r.intermediate_size) == \
                (s.hidden_size, s.attention_heads, s.kv_heads, s.head_dim, s.intermediate_size)
            assert r.layers >= s.layers
    assert zoo._with_teachers(["zoo-large-draft"]) == ["zoo-gqa", "zoo-large", "zoo-gqa-draft",
                                                       "zoo-large-draft"]
