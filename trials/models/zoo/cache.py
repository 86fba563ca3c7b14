"""Where the zoo lives on disk, the hashes that say whether a cached build is current, and its cards.

Models live under ``zoo_dir()`` (``~/.cache/llm-inference-sweeps/zoo``, or ``$LLM_SWEEPS_ZOO_DIR``).
Each ``model_card.json`` stores a ``recipe_hash`` (the model's recipe, its set's tokenizer/corpus
recipe, the teacher's and grown-from model's recipe hashes, and ``ZOO_FORMAT_VERSION``) and the
``corpus_hash`` (the actual corpus text). A model is rebuilt only when either differs, or with
``--force``. Folders are written under a temporary name and renamed, and the card is written last,
so an interrupted build never looks built. The card also records each file's size, checked on use
with the weights' own header (``damage``): a damaged folder is not built, and is built again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil

from trials.models import integrity
from trials.models.corpus import build_corpus
from trials.models.zoo.recipes import RECIPES, SETS, SPECIAL_TOKENS, _check_model, _check_set

ZOO_ENV_VAR = "LLM_SWEEPS_ZOO_DIR"
DEFAULT_ZOO_DIR = "~/.cache/llm-inference-sweeps/zoo"
# Bump when training/eval code changes in a way that changes the weights or card numbers.
ZOO_FORMAT_VERSION = 4

CARD_FILE = "model_card.json"
TOKENIZER_CARD_FILE = "tokenizer_card.json"
CORPUS_IDS_FILE = "corpus_ids.pt"


# --- paths --------------------------------------------------------------------------------

def zoo_dir() -> pathlib.Path:
    """Root of the zoo cache: ``$LLM_SWEEPS_ZOO_DIR`` or ``~/.cache/llm-inference-sweeps/zoo``."""
    return pathlib.Path(os.environ.get(ZOO_ENV_VAR) or DEFAULT_ZOO_DIR).expanduser()


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


MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def _is_current(card: dict | None, name: str) -> bool:
    return bool(card) and card.get("recipe_hash") == recipe_hash(name) \
        and card.get("corpus_hash") == corpus_hash(_check_model(name).zoo_set)


def is_built(name: str) -> bool:
    """True when the model's folder is complete, matches its current recipe and corpus, and its
    files are whole (``damage``)."""
    folder = model_path(name)
    card = _read_json(folder / CARD_FILE)
    return _is_current(card, name) and integrity.folder_damage(folder, MODEL_FILES, card.get("files")) is None


def damage(name: str) -> str | None:
    """What is wrong with a model folder whose card says it is built and current: a file missing, or
    not the size the card recorded, or weights cut short (``trials.models.integrity``); None when
    it is whole, or not built (nothing to call damaged)."""
    folder = model_path(name)
    card = _read_json(folder / CARD_FILE)
    return integrity.folder_damage(folder, MODEL_FILES, card.get("files")) if _is_current(card, name) else None


def load_card(name: str) -> dict:
    """The model's ``model_card.json`` (FileNotFoundError if it was never built)."""
    path = model_path(name) / CARD_FILE
    card = _read_json(path)
    if card is None:
        raise FileNotFoundError(f"zoo model {name!r} is not built ({path} missing); "
                                f"run: python -m trials.models.zoo build --set {RECIPES[name].zoo_set}")
    return card


# --- writing folders ----------------------------------------------------------------------

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
