r"""An offline zoo of small trained Llama models, loadable through the normal Hugging Face path.

Why this exists: the machines this project runs on have no GPU and no model hub, yet the sweeps
need real models (trained weights, a real tokenizer, target/draft pairs, MHA vs GQA shapes).
So the project trains its own, in minutes, from text every Python install has, and saves them
exactly as the hub would ship them: each model folder alone loads with
``AutoTokenizer.from_pretrained(folder)`` and
``AutoModelForCausalLM.from_pretrained(folder, dtype=...)``.

Usage::

    python -m trials.models.zoo build [--set tiny|full] [--force] [--model NAME]
    python -m trials.models.zoo list [--set tiny|full|all]

Design choices:

* Corpus (see ``trials.models.corpus``): stdlib ``.py`` source (code), ``pydoc_data/topics.py`` (English
  prose) and seeded generated JSON / CSV / markdown tables (structured), ~3.5 MB for ``full`` and
  ~0.5 MB for ``tiny``. The last ~5% of each source's documents are held out; perplexity is
  measured on non-overlapping windows of that held-out text (same windows for every model of a
  set, fp32), so numbers inside a set are comparable.
* Tokenizer: byte-level BPE from ``tokenizers`` (vocab 4096 full, 512 tiny), one folder per set,
  saved as ``PreTrainedTokenizerFast`` with left padding; a copy goes into every model folder.
  Every newline is its own token (a ``Split`` before the byte-level pre-tokenizer), so an
  undertrained model does not fall into endless whitespace tokens. No BOS is added when
  encoding, and the models were trained that way; documents are separated by ``<|endoftext|>``.
* Models: ``LlamaForCausalLM`` with tied embeddings, explicit ``head_dim``,
  ``max_position_embeddings=4096`` (later features sweep long contexts; quality there is not the
  point). Trained from scratch with AdamW, warmup + cosine, fixed step counts and seeds so a
  build is deterministic on one machine. The training precision is chosen per machine
  (``train_precision``): bf16 autocast where the CPU runs bf16 natively (2-3x faster than fp32
  there), fp32 where bf16 is emulated (AVX2-only CPUs, where bf16 is ~20x slower); the card
  records which. Each model trains in its own spawned process with ``torch.set_num_threads(1)``
  (with one job, as beside a sweep's first trials, in the calling process, one after another);
  two run at once on a 2-core machine, with a progress line at least every 20 s. Step counts are
  sized so that the full set trains within 15 minutes in fp32 on a 2-core AVX2 CPU
  (``benchmarks/precision.py`` prints this CPU's fp32 vs bf16 step times).
* Drafts are distilled from their target (loss = w * KL(target || draft) + (1 - w) * CE, on the
  same batches), which raises draft/target agreement for speculative decoding. The full set has
  one draft per target family; the tiny set shares one draft (distilled from ``tiny-mha``) between
  its two targets, so ``draft_for`` is always a list of target names.
* Cache: models live under ``zoo_dir()`` (``~/.cache/llm-inference-sweeps/zoo``, or
  ``$LLM_SWEEPS_ZOO_DIR``). Each ``model_card.json`` stores a ``recipe_hash`` (the model's recipe,
  its set's tokenizer/corpus recipe, the teacher's recipe hash for drafts, and
  ``ZOO_FORMAT_VERSION``) and the ``corpus_hash`` (the actual corpus text). A model is rebuilt
  only when either differs, or with ``--force``. Folders are written under a temporary name and
  renamed, and the card is written last, so an interrupted build never looks built.
* Quality gate at the end of every build: each target's held-out perplexity must be below its
  draft's; failing raises ``ZooQualityError`` (the models stay cached for inspection). In the full
  set every model's greedy continuations of ``CODE_PROMPTS`` (stored in the card as ``samples``)
  are also checked to look like Python (an indented line plus one of ``self.``, ``return``,
  ``def``, ...), as a logged warning only: greedy text of these toys flips with the CPU's
  numerics, and perplexity is what the sweeps depend on.

Each model's card holds what its build measured (parameters, held-out perplexity, tokens, seconds,
training precision, greedy samples); ``python -m trials.models.zoo list`` prints them. Builds are
deterministic per machine, not across machines (CPU kernels and the training precision differ).
These are toys, undertrained for their size: Python-shaped, repetitive text, fine for measuring
inference mechanics (speed, memory, perplexity deltas, draft agreement), not for their text. What
moved quality most in this budget: isolating newlines in the tokenizer (before, models fell into
endless newlines), dropping table-like stdlib files, weighting code 75%, batch 4 x 256. zoo-large
exists for speculative decoding (a target step that costs many draft steps); its draft is distilled
from it with KL only, so it learns to agree with the target rather than to beat it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import math
import multiprocessing
import os
import pathlib
import shutil
import sys
import time
from dataclasses import dataclass

from trials.models.corpus import SOURCES, CorpusSpec, build_corpus

log = logging.getLogger("trials.models.zoo")

ZOO_ENV_VAR = "LLM_SWEEPS_ZOO_DIR"
DEFAULT_ZOO_DIR = "~/.cache/llm-inference-sweeps/zoo"
# Bump when training/eval code changes in a way that changes the weights or card numbers.
ZOO_FORMAT_VERSION = 4

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|pad|>", "<|bos|>", "<|endoftext|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)  # ids 0, 1, 2

CODE_PROMPTS = ("def __init__(self", "import os\n\n\ndef main():")
SAMPLE_NEW_TOKENS = 48
CARD_FILE = "model_card.json"
TOKENIZER_CARD_FILE = "tokenizer_card.json"
CORPUS_IDS_FILE = "corpus_ids.pt"


class ZooQualityError(RuntimeError):
    """A freshly built (or cached) set failed the quality gate."""


# --- recipes ------------------------------------------------------------------------------

# Share of training windows (and of held-out windows) per source. Code is the hard part and the
# one the gate checks; the generated structured text is learned quickly (held-out ppl ~5).
SOURCE_MIX = (("code", 0.75), ("prose", 0.15), ("structured", 0.1))

@dataclass(frozen=True)
class SetRecipe:
    """What the models of one zoo set share: corpus, tokenizer, and how they are evaluated."""

    name: str
    vocab_size: int
    corpus: CorpusSpec
    eval_seq_len: int
    eval_windows: int  # held-out windows of eval_seq_len tokens, split over sources by eval_source_weights
    eval_source_weights: tuple[tuple[str, float], ...] = SOURCE_MIX
    tokenizer_min_frequency: int = 2


@dataclass(frozen=True)
class ModelRecipe:
    name: str
    role: str  # "target" | "draft"
    family: str
    default_draft: str | None  # targets: the draft to pair with; drafts: None
    zoo_set: str  # "tiny" | "full"
    hidden_size: int
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    train_steps: int
    batch_size: int
    seq_len: int
    learning_rate: float
    warmup_steps: int
    draft_for: tuple[str, ...] = ()  # drafts: the targets it serves
    distill_from: str | None = None  # drafts: the teacher model
    grow_from: str | None = None     # start from this trained model's weights, deepened if it has
                                     # fewer layers (see _grow_by_depth)
    distill_weight: float = 0.0  # weight of KL(teacher || student) in the loss
    source_weights: tuple[tuple[str, float], ...] = SOURCE_MIX
    max_position_embeddings: int = 4096
    seed: int = 0


SETS: dict[str, SetRecipe] = {
    "tiny": SetRecipe("tiny", vocab_size=512,
                      corpus=CorpusSpec(code_bytes=300_000, prose_bytes=100_000, structured_bytes=100_000),
                      eval_seq_len=128, eval_windows=24),
    "full": SetRecipe("full", vocab_size=4096,
                      corpus=CorpusSpec(code_bytes=2_400_000, prose_bytes=500_000, structured_bytes=600_000),
                      eval_seq_len=256, eval_windows=96),
}

_TINY = dict(zoo_set="tiny", seq_len=128, batch_size=8, warmup_steps=10)
# Sized so the full set trains within 15 minutes on any 2-core x86-64, in fp32 where bf16 is
# emulated (a model costs ~6 x parameters x tokens FLOPs). In this budget more, smaller steps win
# (README, "Why the sizes": the runs that chose them). Drafts' steps also run the teacher's forward
# pass.
_FULL_TARGET = dict(zoo_set="full", seq_len=256, batch_size=2, warmup_steps=20)
_FULL_DRAFT = dict(zoo_set="full", seq_len=256, batch_size=2, warmup_steps=20)

_RECIPE_LIST = [
    ModelRecipe("tiny-mha", "target", "tiny-mha", "tiny-draft", hidden_size=64, layers=2,
                attention_heads=4, kv_heads=4, head_dim=16, intermediate_size=192,
                train_steps=200, learning_rate=3e-3, seed=11, **_TINY),
    ModelRecipe("tiny-gqa", "target", "tiny-gqa", "tiny-draft", hidden_size=64, layers=2,
                attention_heads=4, kv_heads=2, head_dim=16, intermediate_size=192,
                train_steps=200, learning_rate=3e-3, seed=12, **_TINY),
    ModelRecipe("tiny-draft", "draft", "tiny-mha", None, hidden_size=32, layers=1,
                attention_heads=2, kv_heads=1, head_dim=16, intermediate_size=96,
                train_steps=60, learning_rate=3e-3, draft_for=("tiny-mha", "tiny-gqa"),
                distill_from="tiny-mha", distill_weight=0.8, seed=13, **_TINY),
    # Full set, in the order the scheduler starts them (a model waits for the ones it is trained
    # from). zoo-large exists for speculative decoding: a draft only pays when a target step costs
    # many draft steps, and on a CPU per-pass overhead puts a floor under a small draft's step, so
    # the target must be much deeper. Trained from scratch in this budget such a target stays poor,
    # so it is grown by depth from the trained zoo-gqa (24 layers instead of 6): it starts at
    # zoo-gqa's quality and costs several of its steps. Its draft starts from zoo-gqa-draft
    # (distilled from zoo-gqa, so it already agrees with much of what zoo-large predicts) and is
    # then distilled from zoo-large alone (no cross-entropy term): it learns to agree with the
    # target, which is what a speculative draft is for, and stays below it in quality. The runs
    # behind these choices: README, "Why the sizes".
    ModelRecipe("zoo-gqa", "target", "gqa", "zoo-gqa-draft", hidden_size=256, layers=6,
                attention_heads=8, kv_heads=2, head_dim=32, intermediate_size=768,
                train_steps=480, learning_rate=1.5e-3, seed=23, **_FULL_TARGET),
    ModelRecipe("zoo-mha", "target", "mha", "zoo-mha-draft", hidden_size=256, layers=4,
                attention_heads=8, kv_heads=8, head_dim=32, intermediate_size=768,
                train_steps=560, learning_rate=1.5e-3, seed=22, **_FULL_TARGET),
    ModelRecipe("zoo-large", "target", "large", "zoo-large-draft", hidden_size=256, layers=24,
                attention_heads=8, kv_heads=2, head_dim=32, intermediate_size=768,
                train_steps=240, learning_rate=1e-3, grow_from="zoo-gqa", seed=27, **_FULL_TARGET),
    ModelRecipe("zoo-gqa-draft", "draft", "gqa", None, hidden_size=128, layers=2,
                attention_heads=4, kv_heads=2, head_dim=32, intermediate_size=384,
                train_steps=200, learning_rate=2e-3, draft_for=("zoo-gqa",),
                distill_from="zoo-gqa", distill_weight=0.8, seed=26, **_FULL_DRAFT),
    ModelRecipe("zoo-mha-draft", "draft", "mha", None, hidden_size=128, layers=2,
                attention_heads=4, kv_heads=4, head_dim=32, intermediate_size=384,
                train_steps=200, learning_rate=2e-3, draft_for=("zoo-mha",),
                distill_from="zoo-mha", distill_weight=0.8, seed=25, **_FULL_DRAFT),
    ModelRecipe("zoo-large-draft", "draft", "large", None, hidden_size=128, layers=2,
                attention_heads=4, kv_heads=2, head_dim=32, intermediate_size=384,
                train_steps=300, learning_rate=1e-3, draft_for=("zoo-large",), grow_from="zoo-gqa-draft",
                distill_from="zoo-large", distill_weight=1.0, seed=28, **_FULL_DRAFT),
]
RECIPES: dict[str, ModelRecipe] = {r.name: r for r in _RECIPE_LIST}
ZOO_SETS: dict[str, tuple[str, ...]] = {
    set_name: tuple(r.name for r in _RECIPE_LIST if r.zoo_set == set_name) for set_name in SETS
}


# --- paths and names ----------------------------------------------------------------------

def zoo_dir() -> pathlib.Path:
    """Root of the zoo cache: ``$LLM_SWEEPS_ZOO_DIR`` or ``~/.cache/llm-inference-sweeps/zoo``."""
    return pathlib.Path(os.environ.get(ZOO_ENV_VAR) or DEFAULT_ZOO_DIR).expanduser()


def _check_set(set_name: str) -> SetRecipe:
    if set_name not in SETS:
        raise ValueError(f"unknown zoo set {set_name!r}; valid sets: {', '.join(SETS)}")
    return SETS[set_name]


def _check_model(name: str) -> ModelRecipe:
    if name not in RECIPES:
        raise ValueError(f"unknown zoo model {name!r}; valid models: {', '.join(RECIPES)}")
    return RECIPES[name]


def model_path(name: str) -> pathlib.Path:
    """Folder of a model (it may not exist yet)."""
    return zoo_dir() / _check_model(name).name


def tokenizer_path(set_name: str) -> pathlib.Path:
    return zoo_dir() / f"tokenizer-{_check_set(set_name).name}"


# --- hashes and staleness -----------------------------------------------------------------

def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def tokenizer_recipe_hash(set_name: str) -> str:
    s = _check_set(set_name)
    return _digest({"format": ZOO_FORMAT_VERSION, "vocab_size": s.vocab_size, "corpus": dataclasses.asdict(s.corpus),
                    "min_frequency": s.tokenizer_min_frequency, "special": SPECIAL_TOKENS})


def recipe_hash(name: str) -> str:
    """Hash of everything that determines a model's weights and card numbers, except corpus text."""
    r = _check_model(name)
    parts = {"format": ZOO_FORMAT_VERSION, "recipe": dataclasses.asdict(r),
             "set": dataclasses.asdict(SETS[r.zoo_set]), "tokenizer": tokenizer_recipe_hash(r.zoo_set)}
    if r.distill_from:
        parts["teacher"] = recipe_hash(r.distill_from)
    if r.grow_from:
        parts["grown_from"] = recipe_hash(r.grow_from)
    return _digest(parts)


def corpus_hash(set_name: str) -> str:
    return build_corpus(_check_set(set_name).corpus).corpus_hash


def _read_json(path: pathlib.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):          # missing, unreadable, a file where a folder belongs, bad JSON
        return None


def tokenizer_is_current(set_name: str) -> bool:
    card = _read_json(tokenizer_path(set_name) / TOKENIZER_CARD_FILE)
    return bool(card) and card.get("recipe_hash") == tokenizer_recipe_hash(set_name) \
        and card.get("corpus_hash") == corpus_hash(set_name) \
        and (tokenizer_path(set_name) / CORPUS_IDS_FILE).exists()


def is_built(name: str) -> bool:
    """True when the model's folder is complete and matches its current recipe and corpus."""
    r = _check_model(name)
    folder = model_path(name)
    card = _read_json(folder / CARD_FILE)
    return bool(card) and card.get("recipe_hash") == recipe_hash(name) \
        and card.get("corpus_hash") == corpus_hash(r.zoo_set) \
        and (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()


def load_card(name: str) -> dict:
    """The model's ``model_card.json`` (FileNotFoundError if it was never built)."""
    path = model_path(name) / CARD_FILE
    card = _read_json(path)
    if card is None:
        raise FileNotFoundError(f"zoo model {name!r} is not built ({path} missing); "
                                f"run: python -m trials.models.zoo build --set {RECIPES[name].zoo_set}")
    return card


def _replace_folder(tmp: pathlib.Path, final: pathlib.Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _fresh_tmp_folder(final: pathlib.Path) -> pathlib.Path:
    tmp = final.parent / f".building-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


# --- tokenizer ----------------------------------------------------------------------------

def build_tokenizer(set_name: str) -> pathlib.Path:
    """Train the set's byte-level BPE tokenizer and save it with the tokenized corpus."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    s = _check_set(set_name)
    start = time.time()
    corpus = build_corpus(s.corpus)
    log.info("tokenizer-%s: training byte-level BPE (vocab %d) on %.1f MB", set_name, s.vocab_size,
             corpus.total_bytes() / 1e6)
    bpe = Tokenizer(models.BPE())
    # Every newline is its own token; indentation and words follow as separate tokens. With plain
    # GPT-2 splitting, "\n\n    " merges into one of many whitespace tokens, and an undertrained
    # model that emits a lone "\n" falls into endless newlines.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=s.vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=s.tokenizer_min_frequency, show_progress=False)
    bpe.train_from_iterator(corpus.all_train_texts(), trainer)

    eos_id = bpe.token_to_id(EOS_TOKEN)
    ids, counts = {}, {}
    for part_name, part in (("train", corpus.train), ("heldout", corpus.heldout)):
        for source in SOURCES:
            stream = []
            for enc in bpe.encode_batch([doc.text for doc in part[source]]):
                stream.extend(enc.ids)
                stream.append(eos_id)  # documents are separated by end-of-text
            ids[f"{part_name}/{source}"] = torch.tensor(stream, dtype=torch.int32)
            counts[f"{part_name}/{source}"] = len(stream)

    final = tokenizer_path(set_name)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_tmp_folder(final)
    _wrap_tokenizer(bpe, PreTrainedTokenizerFast).save_pretrained(tmp)
    torch.save(ids, tmp / CORPUS_IDS_FILE)
    card = {"set": set_name, "vocab_size": bpe.get_vocab_size(), "special_tokens": list(SPECIAL_TOKENS),
            "recipe_hash": tokenizer_recipe_hash(set_name), "corpus_hash": corpus.corpus_hash,
            "corpus_bytes": corpus.total_bytes(), "token_counts": counts,
            "documents": {part_name: {src: len(part[src]) for src in SOURCES}
                          for part_name, part in (("train", corpus.train), ("heldout", corpus.heldout))},
            "heldout_documents": {src: [d.name for d in corpus.heldout[src]] for src in SOURCES},
            "build_seconds": round(time.time() - start, 2)}
    (tmp / TOKENIZER_CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")
    _replace_folder(tmp, final)
    log.info("tokenizer-%s: done in %.1fs (%d train tokens)", set_name, time.time() - start,
             sum(v for k, v in counts.items() if k.startswith("train/")))
    return final


def _wrap_tokenizer(bpe, fast_cls):
    return fast_cls(tokenizer_object=bpe, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN, bos_token=BOS_TOKEN,
                    unk_token=None, padding_side="left", model_max_length=4096)


# --- training one model (runs in a worker process) ----------------------------------------

def _llama_config(r: ModelRecipe, vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=r.hidden_size, intermediate_size=r.intermediate_size,
        num_hidden_layers=r.layers, num_attention_heads=r.attention_heads,
        num_key_value_heads=r.kv_heads, head_dim=r.head_dim,
        max_position_embeddings=r.max_position_embeddings, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )


def _sample_batch(streams, weights, batch_size, seq_len, generator):
    import torch

    names = [name for name, _ in weights]
    probs = torch.tensor([w for _, w in weights])
    choice = torch.multinomial(probs, batch_size, replacement=True, generator=generator)
    rows = []
    for c in choice.tolist():
        stream = streams[names[c]]
        start = int(torch.randint(0, len(stream) - seq_len, (1,), generator=generator))
        rows.append(stream[start:start + seq_len])
    return torch.stack(rows).long()


def _lr_factor(step: int, r: ModelRecipe) -> float:
    if step < r.warmup_steps:
        return (step + 1) / r.warmup_steps
    progress = (step - r.warmup_steps) / max(1, r.train_steps - r.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def heldout_windows(set_name: str, ids: dict | None = None):
    """The held-out evaluation batch of a set: [windows, eval_seq_len] token ids, fixed."""
    import torch

    s = _check_set(set_name)
    if ids is None:
        ids = torch.load(tokenizer_path(set_name) / CORPUS_IDS_FILE, weights_only=True)
    weights = dict(s.eval_source_weights)
    rows = []
    for source in SOURCES:
        stream = ids[f"heldout/{source}"]
        wanted = max(1, round(s.eval_windows * weights.get(source, 0.0)))
        available = len(stream) // s.eval_seq_len
        for i in range(min(wanted, available)):
            rows.append(stream[i * s.eval_seq_len:(i + 1) * s.eval_seq_len])
    return torch.stack(rows).long()


def heldout_perplexity(model, windows) -> float:
    """exp(mean next-token NLL) over the windows, every target scored (``trials.measurement.perplexity``)."""
    from trials.measurement.perplexity import score_windows  # torch: imported only by a build

    model.eval()
    nll_sum, tokens = score_windows(model, windows)
    return math.exp(nll_sum / tokens)


def greedy_samples(model, tokenizer, prompts=CODE_PROMPTS, max_new_tokens=SAMPLE_NEW_TOKENS) -> dict[str, str]:
    import torch

    out = {}
    model.eval()
    for prompt in prompts:
        enc = tokenizer(prompt, return_tensors="pt")
        with torch.inference_mode():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        out[prompt] = tokenizer.decode(gen[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


def looks_like_python(text: str) -> bool:
    """Crude check that a continuation is recognisably Python: indentation plus Python words."""
    indented = any(line.startswith("    ") and line.strip() for line in text.splitlines())
    keywords = ("self.", "return", "def ", "if ", "for ", "import ", " = ", "raise ", "None")
    return indented and any(k in text for k in keywords)


def _how_made(r: ModelRecipe, params: int, tokens: int, ppl: float, heldout_tokens: int, precision: str) -> str:
    mix = ", ".join(f"{int(w * 100)}% {src}" for src, w in r.source_weights)
    text = (f"{r.name} is a {params / 1e6:.2f}M-parameter LlamaForCausalLM ({r.layers} layers, hidden "
            f"{r.hidden_size}, {r.attention_heads} attention heads and {r.kv_heads} KV heads of dim {r.head_dim}, "
            f"tied embeddings) trained from scratch on CPU by trials.models.zoo: {r.train_steps} AdamW steps of "
            f"{r.batch_size}x{r.seq_len} tokens ({tokens:,} tokens; peak lr {r.learning_rate:g}, "
            f"{r.warmup_steps} warmup steps then cosine to 10%, {'bf16 autocast' if precision == 'bf16' else 'fp32'}, seed {r.seed}), sampling windows "
            f"{mix} from the '{r.zoo_set}' corpus: Python stdlib source (code), pydoc_data topics (English "
            f"prose) and seeded generated JSON/CSV/markdown tables (structured), tokenized by the set's "
            f"byte-level BPE.")
    if r.grow_from and r.layers > RECIPES[r.grow_from].layers:
        text += (f" It started as a deeper copy of the trained {r.grow_from}: its layers spread over "
                 f"{r.layers}, the others starting as the identity (block expansion), then trained.")
    elif r.grow_from:
        text += f" It started from the trained weights of {r.grow_from}."
    if r.distill_from:
        text += (f" It was distilled from {r.distill_from} on the same batches (loss = {r.distill_weight:g} x "
                 f"KL(teacher || draft) + {1 - r.distill_weight:g} x cross-entropy) to raise its agreement with "
                 f"the target for speculative decoding.")
    text += (f" Held-out perplexity {ppl:.2f} over {heldout_tokens:,} predicted tokens of documents never "
             f"trained on. A toy model for measuring inference mechanics, not for the quality of its text.")
    return text


PROGRESS_EVERY_S = 20.0  # a progress line at least this often while a model trains


def _grow_by_depth(model, source) -> None:
    """Start ``model`` as a deeper copy of the trained ``source`` (same width): source layer ``i``
    goes to position ``i * new / old``, and every other layer starts as the identity (its attention
    output and MLP down projections zeroed, so it adds nothing to the residual stream) and learns
    from there (block expansion, as in LLaMA Pro). The grown model starts at the source's quality
    and costs ``new / old`` times its step: a large target for speculative decoding that a 2-core
    CPU can train in minutes. With as many layers as the source, it is a plain copy (a draft that
    starts from a related draft)."""
    import torch

    old, new = len(source.model.layers), len(model.model.layers)
    if new < old or model.config.hidden_size != source.config.hidden_size:
        raise ValueError(f"cannot grow a {old}-layer, {source.config.hidden_size}-wide model into "
                         f"{new} layers of width {model.config.hidden_size}")
    model.model.embed_tokens.load_state_dict(source.model.embed_tokens.state_dict())
    model.model.norm.load_state_dict(source.model.norm.state_dict())
    placed = {round(i * new / old): i for i in range(old)}
    with torch.no_grad():
        for position, layer in enumerate(model.model.layers):
            if position in placed:
                layer.load_state_dict(source.model.layers[placed[position]].state_dict())
            else:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()


def train_model(name: str, precision: str = "fp32") -> dict:
    """Train one model (its tokenizer and teacher must be built) and save its folder. Returns the card.

    ``precision`` is "bf16" (bf16 autocast, 2-3x faster than fp32 where the CPU has native bf16) or
    "fp32" (everywhere else: emulated bf16 is ~20x slower); ``build`` picks it per machine.
    """
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    r = _check_model(name)
    start = time.time()
    tok_dir = tokenizer_path(r.zoo_set)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    ids = torch.load(tok_dir / CORPUS_IDS_FILE, weights_only=True)
    streams = {src: ids[f"train/{src}"] for src in SOURCES}

    torch.manual_seed(r.seed)
    model = LlamaForCausalLM(_llama_config(r, len(tokenizer)))
    if r.grow_from:
        _grow_by_depth(model, AutoModelForCausalLM.from_pretrained(model_path(r.grow_from), dtype=torch.float32))
    params = sum(p.numel() for p in model.parameters())
    teacher = None
    if r.distill_from:
        teacher = AutoModelForCausalLM.from_pretrained(model_path(r.distill_from), dtype=torch.float32).eval()
    origin = (f"distilling from {r.distill_from}" if teacher else
              f"grown from {r.grow_from}" if r.grow_from else "from scratch")
    log.info("%s: training %.2fM params for %d steps in %s (%s)", name, params / 1e6, r.train_steps, precision,
             origin)
    autocast = precision == "bf16"

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=r.learning_rate, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, r))
    generator = torch.Generator().manual_seed(r.seed)
    model.train()
    train_start, loss_value = time.time(), float("nan")
    last_log = train_start
    for step in range(r.train_steps):
        batch = _sample_batch(streams, r.source_weights, r.batch_size, r.seq_len, generator)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=batch).logits[:, :-1].float()
        targets = batch[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        if teacher is not None:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                teacher_logits = teacher(input_ids=batch).logits[:, :-1].float()
            teacher_logp = F.log_softmax(teacher_logits, dim=-1)
            kl = (teacher_logp.exp() * (teacher_logp - F.log_softmax(logits, dim=-1))).sum(-1).mean()
            loss = r.distill_weight * kl + (1 - r.distill_weight) * loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        loss_value = float(loss.detach())
        now = time.time()
        if now - last_log >= PROGRESS_EVERY_S or step + 1 == r.train_steps:
            last_log, elapsed = now, now - train_start
            log.info("%s: step %d/%d loss %.3f (%.0f tok/s, ~%.0f s left)", name, step + 1, r.train_steps,
                     loss_value, (step + 1) * r.batch_size * r.seq_len / elapsed,
                     elapsed / (step + 1) * (r.train_steps - step - 1))
    train_seconds = time.time() - train_start
    del teacher

    model.eval()
    log.info("%s: scoring held-out perplexity and greedy samples", name)
    windows = heldout_windows(r.zoo_set, ids)
    ppl = heldout_perplexity(model, windows)
    heldout_tokens = windows[:, 1:].numel()
    samples = greedy_samples(model, tokenizer)
    log.info("%s: held-out ppl %.2f; sample %r", name, ppl, samples[CODE_PROMPTS[0]][:80])

    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    final = model_path(name)
    tmp = _fresh_tmp_folder(final)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tokens = r.train_steps * r.batch_size * r.seq_len
    card = {
        "name": name, "role": r.role, "family": r.family, "zoo_set": r.zoo_set,
        "default_draft": r.default_draft if r.role == "target" else None,
        "draft_for": list(r.draft_for) if r.role == "draft" else [],
        "distilled_from": r.distill_from, "grown_from": r.grow_from,
        "architecture": "LlamaForCausalLM", "parameters": params,
        "layers": r.layers, "hidden_size": r.hidden_size, "intermediate_size": r.intermediate_size,
        "attention_heads": r.attention_heads, "kv_heads": r.kv_heads, "head_dim": r.head_dim,
        "vocab_size": len(tokenizer), "max_position_embeddings": r.max_position_embeddings,
        "tie_word_embeddings": True,
        "training_tokens": tokens, "train_steps": r.train_steps, "batch_size": r.batch_size,
        "seq_len": r.seq_len, "learning_rate": r.learning_rate, "final_train_loss": round(loss_value, 4),
        "train_precision": precision, "train_seconds": round(train_seconds, 2), "train_tokens_per_second": round(tokens / train_seconds),
        "heldout_perplexity": round(ppl, 4), "heldout_tokens": heldout_tokens,
        "samples": samples,
        "build_seconds": round(time.time() - start, 2), "seed": r.seed,
        "recipe_hash": recipe_hash(name), "corpus_hash": corpus_hash(r.zoo_set),
        "recipe": dataclasses.asdict(r),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": sys.version.split()[0]},
        "how_made": _how_made(r, params, tokens, ppl, heldout_tokens, precision),
    }
    (tmp / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")
    _replace_folder(tmp, final)
    log.info("%s: built in %.1fs -> %s", name, card["build_seconds"], final)
    return card


def _train_in_worker(name: str, root: str, log_level: int, precision: str) -> dict:
    """Entry point of a spawned worker process: one thread, same zoo folder as the parent."""
    import torch
    import transformers

    os.environ[ZOO_ENV_VAR] = root
    if not logging.getLogger().handlers:
        logging.basicConfig(level=log_level, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    log.setLevel(log_level)
    transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bars in the build log
    torch.set_num_threads(1)
    return train_model(name, precision)


# --- building sets ------------------------------------------------------------------------

def _sources(name: str) -> list[str]:
    """The models ``name`` is trained from (its teacher, the model it is grown from)."""
    r = RECIPES[name]
    return [n for n in (r.distill_from, r.grow_from) if n]


def _with_teachers(names: list[str]) -> list[str]:
    wanted, todo = set(names), list(names)
    while todo:
        for source in _sources(todo.pop()):
            if source not in wanted:
                wanted.add(source)
                todo.append(source)
    return [n for n in RECIPES if n in wanted]  # recipe order: sources before what they feed


def _run_training(names: list[str], jobs: int, precision: str) -> None:
    """Train `names` in spawned processes, at most `jobs` at once, teachers before their drafts."""
    if not names:
        return
    pending = list(names)
    workers = max(1, min(jobs, len(pending)))
    root, level = str(zoo_dir()), log.getEffectiveLevel()
    if jobs == 1:                 # one at a time (beside a sweep's trials): here, in recipe order
        for name in pending:
            _train_in_worker(name, root, level, precision)
        return
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers,
                                                mp_context=multiprocessing.get_context("spawn")) as pool:
        running: dict[concurrent.futures.Future, str] = {}
        while pending or running:
            for name in list(pending):
                if len(running) >= workers:
                    break
                if any(s in pending or s in running.values() for s in _sources(name)):
                    continue
                pending.remove(name)
                running[pool.submit(_train_in_worker, name, root, level, precision)] = name
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                running.pop(future)
                future.result()  # re-raises a worker's error


def train_precision() -> str:
    """bf16 autocast where this CPU runs bf16 natively, else fp32 (see ``trials.measurement.hardware``)."""
    from trials.measurement.hardware import cpu_profile, fast_precision

    precision = fast_precision("cpu")
    profile = cpu_profile()
    log.info("training precision %s: %s CPU (%s), a bf16 matmul takes %.1fx the fp32 time", precision,
             profile.model, profile.capability, profile.bf16_matmul_ratio)
    return precision


def quality_problems(set_name: str, cards: dict[str, dict]) -> list[str]:
    """The quality gate: targets beat their drafts on held-out ppl; full targets write Python."""
    problems = []
    for name, card in cards.items():
        if card["role"] != "target":
            continue
        draft = card.get("default_draft")
        if draft in cards and card["heldout_perplexity"] >= cards[draft]["heldout_perplexity"]:
            problems.append(f"{name}: held-out ppl {card['heldout_perplexity']:.2f} is not below its draft "
                            f"{draft}'s {cards[draft]['heldout_perplexity']:.2f}")
    if set_name == "full":
        for name, card in cards.items():
            for prompt, text in card.get("samples", {}).items():
                if not looks_like_python(text):
                    log.warning("%s: greedy continuation of %r does not look like Python: %r",
                                name, prompt, text)
    return problems


def build(set_name: str = "full", force: bool = False, *, only: list[str] | None = None,
          jobs: int | None = None) -> dict[str, dict]:
    """Build a zoo set (or `only` some of its models, plus their teachers); skip up-to-date models.

    Returns name -> model card for every model asked for. Raises ZooQualityError if the gate fails.
    """
    _check_set(set_name)
    names = list(ZOO_SETS[set_name])
    if only:
        for name in only:
            if _check_model(name).zoo_set != set_name:
                raise ValueError(f"zoo model {name!r} is in set {RECIPES[name].zoo_set!r}, not {set_name!r}")
        names = _with_teachers(list(only))
    start = time.time()
    zoo_dir().mkdir(parents=True, exist_ok=True)
    if force or not tokenizer_is_current(set_name):
        build_tokenizer(set_name)
    todo = [n for n in names if force or not is_built(n)]
    for name in names:
        if name not in todo:
            log.info("%s: up to date, skipped", name)
    if todo:
        jobs = jobs or min(2, os.cpu_count() or 1)
        precision = train_precision()
        log.info("building %s with %d worker process(es) in %s: %s", set_name, jobs, precision, ", ".join(todo))
        _run_training(todo, jobs, precision)
    cards = {name: load_card(name) for name in names}
    if todo:
        log.info("%s set: built %d model(s) in %.1fs", set_name, len(todo), time.time() - start)
    problems = quality_problems(set_name, cards)
    if problems:
        raise ZooQualityError(f"zoo set {set_name!r} failed the quality gate:\n  " + "\n  ".join(problems))
    return cards


# --- command line -------------------------------------------------------------------------

def _status(name: str) -> str:
    if is_built(name):
        return "built"
    return "stale" if (model_path(name) / CARD_FILE).exists() else "missing"


def format_table(set_names: list[str]) -> str:
    header = ("model", "set", "role", "family", "params", "layers", "heads/kv", "head_dim", "ppl", "draft",
              "status")
    rows = [header]
    for set_name in set_names:
        for name in ZOO_SETS[set_name]:
            r = RECIPES[name]
            card = _read_json(model_path(name) / CARD_FILE) or {}
            params = card.get("parameters")
            ppl = card.get("heldout_perplexity")
            pairing = r.default_draft if r.role == "target" else "for " + ",".join(r.draft_for)
            rows.append((name, set_name, r.role, r.family, f"{params / 1e6:.2f}M" if params else "-",
                         str(r.layers), f"{r.attention_heads}/{r.kv_heads}", str(r.head_dim),
                         f"{ppl:.2f}" if ppl else "-", pairing, _status(name)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trials.models.zoo",
        description="Build and list the offline zoo of small trained Llama models "
                    f"(cache: ${ZOO_ENV_VAR} or {DEFAULT_ZOO_DIR}; now {zoo_dir()}).")
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="train the models of a set that are missing or out of date",
                             description="Train the models of a zoo set that are missing or out of date.")
    p_build.add_argument("--set", default=None, metavar="{" + ",".join(SETS) + "}",
                         help="which zoo set (default: full, or the set of the --model given)")
    p_build.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p_build.add_argument("--model", action="append", metavar="NAME",
                         help="build only this model (and its teacher); repeatable. "
                              f"Models: {', '.join(RECIPES)}")
    p_build.add_argument("--jobs", type=int, default=None, help="parallel training processes (default: min(2, CPUs))")
    p_list = sub.add_parser("list", help="show each model: role, params, held-out ppl, built or not",
                            description="Show each zoo model: role, params, held-out ppl, built or not.")
    p_list.add_argument("--set", default="all", metavar="{" + ",".join([*SETS, "all"]) + "}",
                        help="which zoo set (default: all)")
    args = parser.parse_args(argv)

    if args.command == "build" and args.set is None:
        first = (args.model or [None])[0]
        args.set = RECIPES[first].zoo_set if first in RECIPES else "full"
    if args.set not in SETS and not (args.command == "list" and args.set == "all"):
        valid = list(SETS) + (["all"] if args.command == "list" else [])
        return _fail(f"unknown zoo set {args.set!r}; valid sets: {', '.join(valid)}")
    if args.command == "list":
        print(format_table(list(SETS) if args.set == "all" else [args.set]))
        return 0

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for name in args.model or []:
        if name not in ZOO_SETS[args.set]:
            return _fail(f"unknown model {name!r} for set {args.set!r}; valid models: {', '.join(ZOO_SETS[args.set])}")
    start = time.time()
    try:
        build(args.set, force=args.force, only=args.model, jobs=args.jobs)
    except ZooQualityError as exc:
        print(format_table([args.set]))
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_table([args.set]))
    print(f"zoo set {args.set!r} ready in {zoo_dir()} ({time.time() - start:.1f}s)")
    return 0


if __name__ == "__main__":
    # Re-import under the package name so worker processes pickle `trials.models.zoo` functions.
    from trials.models.zoo import main as _main

    sys.exit(_main())
