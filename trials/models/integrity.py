"""Cheap checks that a cached model file is what its card says, made each time it is used.

A cache outlives the process that wrote it: a copy cut short, a disk that filled up, a file someone
replaced. Loading such a file fails deep inside llama.cpp or safetensors with a message that names
neither the file nor the cure ("Failed to load model from file"), so each cache checks its files
against its card first (the zoo's, the PyPI conversions', the GGUFs'), and builds a damaged one
again, saying so in one line. The checks cost a ``stat`` and a few bytes read, never a hash of the
weights: the size the card recorded, the format's magic (a GGUF starts with ``GGUF``), and the
length a safetensors file's own header promises.
"""

from __future__ import annotations

import json
import pathlib

GGUF_MAGIC = b"GGUF"
MAX_SAFETENSORS_HEADER = 100 << 20         # the format's own limit on its JSON header


def file_sizes(folder: pathlib.Path, leave_out: tuple[str, ...] = ()) -> dict[str, int]:
    """Every file of ``folder`` (not in subfolders) and its size in bytes: what a card records."""
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file() and p.name not in leave_out}


def gguf_damage(path: pathlib.Path, size: int | None = None) -> str | None:
    """What is wrong with a GGUF file (missing, not the ``size`` its card recorded, no GGUF magic);
    None when it looks whole."""
    if not path.is_file():
        return f"{path.name} is missing"
    actual = path.stat().st_size
    if size is not None and actual != size:
        return f"{path.name} has {actual} bytes, its card says {size}"
    with path.open("rb") as f:
        if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            return f"{path.name} does not start with GGUF's magic bytes"
    return None


def safetensors_damage(path: pathlib.Path) -> str | None:
    """What is wrong with a safetensors file: its header (8 bytes of length, then JSON naming each
    tensor's byte range) must parse and the file must be exactly as long as it says."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= min(size - 8, MAX_SAFETENSORS_HEADER):
            return f"{path.name} is truncated or not a safetensors file (its header runs past its {size} bytes)"
        try:
            header = json.loads(f.read(length))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, RecursionError, TypeError, KeyError, IndexError, AttributeError):
            return f"{path.name}'s header is not a safetensors header"
    if size != 8 + length + end:
        return f"{path.name} has {size} bytes, its header says {8 + length + end}"
    return None


def folder_damage(folder: pathlib.Path, required: tuple[str, ...], recorded: dict | None = None) -> str | None:
    """What is wrong with a model folder: a ``required`` file missing, a file whose size is not the
    one its card ``recorded`` (name -> bytes; cards written before they recorded sizes have none), a
    safetensors file whose header does not match its length. None when it looks whole."""
    for name in required:
        if not (folder / name).is_file():
            return f"{name} is missing"
    for name, size in (recorded if isinstance(recorded, dict) else {}).items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, its card says {size}"
    for path in sorted(folder.glob("*.safetensors")):
        problem = safetensors_damage(path)
        if problem:
            return problem
    return None
