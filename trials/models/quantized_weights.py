"""Quantized weights: how a model is loaded with int8, NF4 or GPTQ linear layers (``trials.models.loading``
calls ``load_quantized``; the quantization group measures what it gives).

* ``int8``: ``BitsAndBytesConfig(load_in_8bit=True)`` (LLM.int8, outlier threshold 6.0).
* ``nf4``:  ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")``, block size 64.
* ``gptq``: 4-bit GPTQ through GPTQModel (``pip install -e '.[gptq]'``, an optional extra: it pulls
  torch >= 2.14.1 with CUDA libraries). Without it a gptq trial fails at once with that one line.

Everything a quantizer leaves alone runs in the *compute dtype*, the dtype of the model's reference
precision (``reference_precision``: fp32 on CPU, the published dtype on CUDA, i.e. the highest
precision worth running).

GPTQ calibration and cache: ``CALIBRATION_SAMPLES`` windows of the perplexity context length, evenly
spaced over the *training* split of the same corpus (held-in text: calibration must not see the
held-out text perplexity is measured on), or over a user's text file named by
``$LLM_SWEEPS_GPTQ_CALIBRATION``. The quantized model is saved once under ``quantized_dir()`` (beside
the zoo, ``$LLM_SWEEPS_QUANTIZED_DIR`` to move it), in a folder keyed by the source model's identity,
bits, group size, the calibration tokens and the GPTQModel version, written under a temporary name
and renamed, so later trials and workers load it instead of quantizing again. How a model was made
(cache hit or miss, calibration, kernel path) is kept in ``WORKER.load_notes`` for the trial's tags.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import time

import torch

from trials.engines.transformers.arguments import load_arguments
from trials.engines.transformers.materialize import materialize, materialize_all
from trials.errors import ConfigError
from trials.measurement.hardware import DTYPES
from trials.measurement.perplexity import split_windows, token_stream
from trials.models import integrity, zoo
from trials.models.corpus import SOURCES, Document, build_corpus
from trials.models.registry import ModelEntry, perplexity_method, reference_precision
from trials.worker import WORKER

log = logging.getLogger(__name__)

BNB_INSTALL = "pip install bitsandbytes==0.50.2"
GPTQ_INSTALL = ("pip install -e '.[gptq]' (GPTQModel; it installs torch>=2.14.1 with CUDA "
                "libraries, ~6 GB)")
GPTQ_BITS = 4
GPTQ_GROUP_SIZES = (128, 64, 32)       # the largest that divides every linear layer's input
CALIBRATION_SAMPLES = 32
CALIBRATION_ENV = "LLM_SWEEPS_GPTQ_CALIBRATION"
QUANTIZED_DIR_ENV = "LLM_SWEEPS_QUANTIZED_DIR"
GPTQ_CARD = "llm_sweeps_gptq.json"


# ------------------------------------------------------------------------------ precisions

def compute_dtype(entry: ModelEntry, device: str) -> torch.dtype:
    return DTYPES[reference_precision(entry, device)]


def check_available(precision: str) -> None:
    """One line saying what to install when a quantizer is missing."""
    if precision in ("int8", "nf4") and importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(f"{precision} weights need bitsandbytes: {BNB_INSTALL}")
    if precision == "gptq" and importlib.util.find_spec("gptqmodel") is None:
        raise ConfigError(f"GPTQ needs the optional extra: {GPTQ_INSTALL}")


def load_quantized(entry: ModelEntry, precision: str, device: str, tokenizer) -> torch.nn.Module:
    """The model ``entry`` with quantized linear weights (called by ``trials.models.loading.load``)."""
    check_available(precision)
    if precision == "gptq":
        return _load_gptq(entry, device, tokenizer)
    return _load_bnb(entry, precision, device)


def bnb_config(precision: str, reference: str):
    """bitsandbytes' config for int8 / NF4 weights computing in ``reference`` (a precision name):
    the stack's description (``trials.engines.transformers.arguments``), materialized."""
    return materialize(load_arguments(precision, reference)["quantization_config"])


def _load_bnb(entry: ModelEntry, precision: str, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    # LLM.int8 logs a warning on every matmul whose input is not fp16: on CPU that is every one,
    # and emitting it would be timed as decode.
    logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    arguments = materialize_all(load_arguments(precision, reference_precision(entry, device)))
    model = AutoModelForCausalLM.from_pretrained(entry.path(), **arguments, device_map=device,
                                                 trust_remote_code=entry.trust_remote_code)
    if precision == "nf4" and device == "cpu":
        unpackable, total = avoid_unpackable_cpu_layers(model)
        WORKER.load_notes[(entry, precision, device)] = {"nf4_cpu_kernel": (
            f"{unpackable} of {total} layers use bitsandbytes' generic 4-bit path: their widths do "
            f"not fit its AVX512-BF16 repacking (in % {NF4_BLOCK}, out % {PACK_BLOCK_N})"
            if unpackable else f"all {total} layers may use bitsandbytes' AVX512-BF16 repacking")}
    return model


NF4_BLOCK, PACK_BLOCK_N = 64, 32


def avoid_unpackable_cpu_layers(model: torch.nn.Module) -> tuple[int, int]:
    """Keep bitsandbytes' CPU repacking away from 4-bit layers it cannot repack.

    On CPUs with AVX512-BF16, bitsandbytes 0.50 repacks each ``Linear4bit`` at its first forward for
    a faster kernel, reshaping the absmax to ``(out, in // 64)`` and blocking rows by 32: a layer
    whose input width is not a multiple of 64 (e.g. an 864-wide down_proj) crashes there with
    ``shape '[320, 13]' is invalid``. Those layers keep the generic dequantize-then-matmul path.
    Returns (layers switched to the generic path, 4-bit layers).
    """
    layers = [m for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu")]
    unpackable = [m for m in layers if m.in_features % NF4_BLOCK or m.out_features % PACK_BLOCK_N]
    for module in unpackable:
        module.support_avx512bf16_for_cpu = False
    return len(unpackable), len(layers)


# ------------------------------------------------------------------------------ GPTQ

def quantized_dir() -> pathlib.Path:
    """Where quantized models are cached: ``$LLM_SWEEPS_QUANTIZED_DIR`` or beside the zoo."""
    return pathlib.Path(os.environ.get(QUANTIZED_DIR_ENV) or zoo.zoo_dir().parent / "quantized").expanduser()


def gptq_group_size(model_config) -> int:
    """The largest of ``GPTQ_GROUP_SIZES`` dividing every linear layer's input width, else -1
    (one group per output channel)."""
    heads = model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    widths = (model_config.hidden_size, model_config.intermediate_size, heads * head_dim)
    return next((g for g in GPTQ_GROUP_SIZES if all(w % g == 0 for w in widths)), -1)


def _model_identity(entry: ModelEntry) -> str:
    """What the source weights are: the zoo recipe and corpus hashes, or the hub id / folder."""
    if entry.source == "zoo":
        card = zoo.load_card(entry.location)
        return f"zoo:{card['recipe_hash']}:{card['corpus_hash']}"
    return f"{entry.source}:{entry.location}"


def calibration_samples(entry: ModelEntry, tokenizer) -> tuple[list[torch.Tensor], str]:
    """GPTQ calibration windows (held-in text) and a one-line description of where they came from."""
    method = perplexity_method(entry)
    path = os.environ.get(CALIBRATION_ENV)
    if path:
        try:
            text = pathlib.Path(path).expanduser().read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ConfigError(f"${CALIBRATION_ENV}={path} cannot be read: {exc.strerror}") from None
        streams = {"file": token_stream(tokenizer, [Document("file", path, text)])}
        weights, where = (("file", 1.0),), f"file {path}"
    else:
        corpus = build_corpus(method.corpus)
        streams = {s: token_stream(tokenizer, corpus.train[s]) for s in SOURCES}
        weights, where = method.weights, f"zoo corpus training split (held-in), corpus {corpus.corpus_hash}"
    samples = []
    for source, count in split_windows(CALIBRATION_SAMPLES, weights).items():
        stream = streams[source]
        if len(stream) < method.context:
            continue
        span = len(stream) - method.context
        samples += [stream[round(j * span / count):][:method.context] for j in range(count)]
    if not samples:
        raise ConfigError(f"GPTQ calibration text ({where}) is shorter than {method.context} tokens")
    return samples, f"{len(samples)} x {method.context} tokens from {where}"


def _gptq_folder(entry: ModelEntry, group_size: int, samples: list[torch.Tensor]) -> pathlib.Path:
    import gptqmodel

    digest = hashlib.sha256()
    digest.update(json.dumps({"model": _model_identity(entry), "bits": GPTQ_BITS, "group": group_size,
                              "gptqmodel": gptqmodel.__version__}, sort_keys=True).encode())
    for sample in samples:
        digest.update(sample.to(torch.int64).numpy().tobytes())
    return quantized_dir() / f"{entry.name}-gptq-w{GPTQ_BITS}g{group_size}-{digest.hexdigest()[:12]}"


def _quantize_gptq(entry: ModelEntry, device: str, tokenizer, group_size: int, samples: list[torch.Tensor],
                   folder: pathlib.Path, calibration: str) -> float:
    """Quantize with GPTQModel and save into ``folder`` (atomically); returns the seconds it took."""
    from gptqmodel import GPTQModel, QuantizeConfig

    started = time.perf_counter()
    qconfig = QuantizeConfig(bits=GPTQ_BITS, group_size=group_size, desc_act=False, sym=True,
                             device="cuda" if device == "cuda" else "cpu")
    source = GPTQModel.load(entry.path(), quantize_config=qconfig,
                            **({"dtype": compute_dtype(entry, device)} if device == "cpu" else {}))
    source.quantize([{"input_ids": s.long(), "attention_mask": torch.ones(len(s), dtype=torch.long)}
                     for s in samples], batch_size=1, tokenizer=tokenizer)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".building-{folder.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    source.save(str(tmp))
    seconds = time.perf_counter() - started
    (tmp / GPTQ_CARD).write_text(json.dumps({
        "model": entry.name, "identity": _model_identity(entry), "bits": GPTQ_BITS, "group_size": group_size,
        "calibration": calibration, "quantize_s": round(seconds, 2), "device": device,
        "files": integrity.file_sizes(tmp)}, indent=2) + "\n")
    if (folder / GPTQ_CARD).exists():          # another worker finished first: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    return seconds


def _gptq_whole(folder: pathlib.Path) -> bool:
    """A cached GPTQ folder with its card and its files whole (the card's sizes, the weights' own
    header: ``trials.models.integrity``); a damaged one is said in one line and removed, to be
    quantized again."""
    try:
        card = json.loads((folder / GPTQ_CARD).read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError, RecursionError):
        card = None
    problem = "its card is unreadable" if not isinstance(card, dict) else \
        integrity.folder_damage(folder, (), card.get("files"))
    if problem:
        log.warning("GPTQ cache %s is damaged (%s): quantizing again", folder, problem)
        shutil.rmtree(folder, ignore_errors=True)
    return problem is None


def _load_gptq(entry: ModelEntry, device: str, tokenizer) -> torch.nn.Module:
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")   # its CPU loader pool needs two workers
    try:
        from gptqmodel import BACKEND, GPTQModel
    except Exception as exc:  # installed but broken (e.g. a torch it does not support)
        raise ConfigError(f"GPTQ: gptqmodel is installed but does not import "
                          f"({type(exc).__name__}: {exc}); {GPTQ_INSTALL}") from None
    from transformers import AutoConfig

    group_size = gptq_group_size(AutoConfig.from_pretrained(entry.path(),
                                                            trust_remote_code=entry.trust_remote_code))
    samples, calibration = calibration_samples(entry, tokenizer)
    folder = _gptq_folder(entry, group_size, samples)
    if _gptq_whole(folder):
        made = "loaded from the disk cache"
    else:
        log.info("%s: GPTQ-quantizing (%s) into %s", entry.name, calibration, folder)
        seconds = _quantize_gptq(entry, device, tokenizer, group_size, samples, folder, calibration)
        made = f"quantized when this worker loaded it ({seconds:.1f} s)"
    backend = BACKEND.TORCH_FUSED if device == "cpu" else BACKEND.AUTO
    quantized = GPTQModel.load(str(folder), device=device, backend=backend,
                               **({"dtype": compute_dtype(entry, device)} if device == "cpu" else {}))
    WORKER.load_notes[(entry, "gptq", device)] = {
        "gptq_cache": made, "gptq_folder": str(folder), "gptq_calibration": calibration,
        "gptq_group_size": str(group_size), "gptq_backend": str(backend.name)}
    return quantized.model
