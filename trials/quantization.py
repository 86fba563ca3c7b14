"""Weight quantization, measured: the same model at fp32, bf16, fp16, 8-bit and 4-bit weights.

Why: decode reads every weight once per generated token, so fewer bytes per weight should mean more
tokens per second and less memory, at some cost in quality. Neither half is guaranteed, which is why
it is measured: bitsandbytes LLM.int8 quantizes the activations and dequantizes on every matmul (on
CPU it also casts activations to fp16) and is often slower than 16-bit weights at batch 1; NF4 keeps
4-bit codes plus one absmax per 64 weights and dequantizes block by block; GPTQ keeps 4-bit codes
plus a scale and a zero per group, chosen with calibration data to minimize each layer's output
error. Embeddings, norms and the (tied) output head stay unquantized, so on a small-vocabulary model
a 4-bit model is nowhere near 8x smaller than fp32: ``quantized_weight_fraction`` says how much of
the model the quantizer touched.

Precisions (``Stack.precision``) and how they load:

* ``fp32`` / ``bf16`` / ``fp16``: plain dtypes (``trials.models``); fp16 on CUDA only.
* ``int8``: ``BitsAndBytesConfig(load_in_8bit=True)`` (LLM.int8, outlier threshold 6.0).
* ``nf4``:  ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")``, block size 64.
* ``gptq``: 4-bit GPTQ through GPTQModel (``pip install -e '.[gptq]'``, an optional extra: it pulls
  torch >= 2.14.1 with CUDA libraries). Without it a gptq trial fails at once with that one line.

Everything a quantizer leaves alone runs in the *compute dtype*, the dtype of the model's reference
precision (``reference_precision``: fp32 on CPU, the published dtype on CUDA, i.e. the highest
precision worth running). A quantized trial therefore differs from its reference in the quantized
linear weights only, and its perplexity delta is the price of quantizing them.

Quality, by one fixed method (``PerplexityMethod``), on the same tokens for every precision:
held-out text of the zoo corpus (``trials.corpus``: the last ~5% of each source's documents, never
trained on; the documents of the model's own zoo set, the ``full`` set's for hub models), each
document tokenized by the model's tokenizer and followed by EOS, exactly as the zoo built its
held-out split. Per source (code / prose / structured, weighted as the zoo weights its own
evaluation) windows of ``context`` tokens start every ``stride`` tokens; the first window scores all
its tokens, later ones only their last ``stride`` tokens, so every scored token sees at least
``context - stride`` tokens of context and none is scored twice (the strided sliding window of
Hugging Face's "Perplexity of fixed-length models"). ``perplexity`` = exp(mean NLL) over the scored
tokens, with log-softmax in fp32 whatever the model's dtype.

Fidelity: greedy outputs of the trial against a run of the reference precision on the same prompts in
the same worker (``trials.run.compare_outputs``); the reference run and its perplexity are measured
once per worker and model, and the tag ``reference_source`` says which trial measured them.

Bytes: ``weights_bytes`` is the real storage (``trials.measure.model_weights_bytes``, which also counts
the scales bitsandbytes keeps beside its parameters); ``weights_bytes_nominal`` is the prediction
"quantized weights x bits + everything else in the compute dtype", and
``hf_memory_footprint_bytes`` is what ``get_memory_footprint()`` claims, logged to show where it is
wrong.

GPTQ calibration and cache: ``CALIBRATION_SAMPLES`` windows of the perplexity context length, evenly
spaced over the *training* split of the same corpus (held-in text: calibration must not see the
held-out text perplexity is measured on), or over a user's text file named by
``$LLM_SWEEPS_GPTQ_CALIBRATION``. The quantized model is saved once under ``quantized_dir()`` (beside
the zoo, ``$LLM_SWEEPS_QUANTIZED_DIR`` to move it), in a folder keyed by the source model's identity,
bits, group size, the calibration tokens and the GPTQModel version, written under a temporary name
and renamed, so later trials and workers load it instead of quantizing again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import pathlib
import shutil
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trials import models
from trials.config import ConfigError, Runtime, Stack, TrialConfig
from trials.corpus import SOURCES, CorpusSpec, Document, build_corpus
from trials.prompts import Prompt
from trials.registry import get_model
from trials.run import TrialResult, WorkerMemo, compare_outputs, finish, measure, trial_prompts

log = logging.getLogger(__name__)

BNB_INSTALL = "pip install bitsandbytes==0.50.2"
GPTQ_INSTALL = ("pip install -e '.[gptq]' (GPTQModel; it installs torch>=2.14.1 with CUDA "
                "libraries, ~6 GB)")
NOMINAL_BITS = {"int8": 8, "nf4": 4, "gptq": 4}
QUANTIZERS = {"int8": "bitsandbytes LLM.int8 (threshold 6.0)",
              "nf4": "bitsandbytes NF4 (block 64)", "gptq": "GPTQModel GPTQ 4-bit"}
GPTQ_BITS = 4
GPTQ_GROUP_SIZES = (128, 64, 32)       # the largest that divides every linear layer's input
CALIBRATION_SAMPLES = 32
CALIBRATION_ENV = "LLM_SWEEPS_GPTQ_CALIBRATION"
QUANTIZED_DIR_ENV = "LLM_SWEEPS_QUANTIZED_DIR"
GPTQ_CARD = "llm_sweeps_gptq.json"
LOGITS_BUDGET = 64 * 1024 * 1024       # fp32 logits per perplexity chunk (elements)

# Extra facts about how a quantized model was made (GPTQ cache hit or miss, ...), by load key.
LOAD_NOTES: dict[tuple[str, str, str], dict[str, str]] = {}


# ------------------------------------------------------------------------------ precisions

def reference_precision(model: str, device: str) -> str:
    """The highest precision worth running: fp32 on CPU, the published dtype on CUDA."""
    return "fp32" if device == "cpu" else get_model(model).dtype


def compute_dtype(model: str, device: str) -> torch.dtype:
    return models.DTYPES[reference_precision(model, device)]


def check_available(precision: str) -> None:
    """One line saying what to install when a quantizer is missing."""
    if precision in ("int8", "nf4") and importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(f"{precision} weights need bitsandbytes: {BNB_INSTALL}")
    if precision == "gptq" and importlib.util.find_spec("gptqmodel") is None:
        raise ConfigError(f"GPTQ needs the optional extra: {GPTQ_INSTALL}")


def load_quantized(name: str, precision: str, device: str, tokenizer) -> torch.nn.Module:
    """The model ``name`` with quantized linear weights (called by ``trials.models``)."""
    check_available(precision)
    if precision == "gptq":
        return _load_gptq(name, device, tokenizer)
    return _load_bnb(name, precision, device)


def bnb_config(precision: str, dtype: torch.dtype):
    from transformers import BitsAndBytesConfig

    if precision == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=dtype)


def _load_bnb(name: str, precision: str, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    # LLM.int8 logs a warning on every matmul whose input is not fp16: on CPU that is every one,
    # and emitting it would be timed as decode.
    logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    entry = get_model(name)
    dtype = compute_dtype(name, device)
    model = AutoModelForCausalLM.from_pretrained(
        entry.path(), quantization_config=bnb_config(precision, dtype), dtype=dtype,
        device_map=device, trust_remote_code=entry.trust_remote_code)
    if precision == "nf4" and device == "cpu":
        unpackable, total = avoid_unpackable_cpu_layers(model)
        LOAD_NOTES[(name, precision, device)] = {"nf4_cpu_kernel": (
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
    from trials import zoo

    return pathlib.Path(os.environ.get(QUANTIZED_DIR_ENV) or zoo.zoo_dir().parent / "quantized").expanduser()


def gptq_group_size(model_config) -> int:
    """The largest of ``GPTQ_GROUP_SIZES`` dividing every linear layer's input width, else -1
    (one group per output channel)."""
    heads = model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    widths = (model_config.hidden_size, model_config.intermediate_size, heads * head_dim)
    return next((g for g in GPTQ_GROUP_SIZES if all(w % g == 0 for w in widths)), -1)


def _model_identity(name: str) -> str:
    """What the source weights are: the zoo recipe and corpus hashes, or the hub id / folder."""
    entry = get_model(name)
    if entry.source == "zoo":
        from trials import zoo

        card = zoo.load_card(entry.location)
        return f"zoo:{card['recipe_hash']}:{card['corpus_hash']}"
    return f"{entry.source}:{entry.location}"


def calibration_samples(name: str, tokenizer) -> tuple[list[torch.Tensor], str]:
    """GPTQ calibration windows (held-in text) and a one-line description of where they came from."""
    method = perplexity_method(name)
    path = os.environ.get(CALIBRATION_ENV)
    if path:
        try:
            text = pathlib.Path(path).expanduser().read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ConfigError(f"${CALIBRATION_ENV}={path} cannot be read: {exc.strerror}") from None
        streams = {"file": _token_stream(tokenizer, [Document("file", path, text)])}
        weights, where = (("file", 1.0),), f"file {path}"
    else:
        corpus = build_corpus(method.corpus)
        streams = {s: _token_stream(tokenizer, corpus.train[s]) for s in SOURCES}
        weights, where = method.weights, f"zoo corpus training split (held-in), corpus {corpus.corpus_hash}"
    samples = []
    for source, count in _split(CALIBRATION_SAMPLES, weights).items():
        stream = streams[source]
        if len(stream) < method.context:
            continue
        span = len(stream) - method.context
        samples += [stream[round(j * span / count):][:method.context] for j in range(count)]
    if not samples:
        raise ConfigError(f"GPTQ calibration text ({where}) is shorter than {method.context} tokens")
    return samples, f"{len(samples)} x {method.context} tokens from {where}"


def _gptq_folder(name: str, group_size: int, samples: list[torch.Tensor]) -> pathlib.Path:
    import gptqmodel

    digest = hashlib.sha256()
    digest.update(json.dumps({"model": _model_identity(name), "bits": GPTQ_BITS, "group": group_size,
                              "gptqmodel": gptqmodel.__version__}, sort_keys=True).encode())
    for sample in samples:
        digest.update(sample.to(torch.int64).numpy().tobytes())
    return quantized_dir() / f"{name}-gptq-w{GPTQ_BITS}g{group_size}-{digest.hexdigest()[:12]}"


def _quantize_gptq(name: str, device: str, tokenizer, group_size: int, samples: list[torch.Tensor],
                   folder: pathlib.Path, calibration: str) -> float:
    """Quantize with GPTQModel and save into ``folder`` (atomically); returns the seconds it took."""
    from gptqmodel import GPTQModel, QuantizeConfig

    started = time.perf_counter()
    qconfig = QuantizeConfig(bits=GPTQ_BITS, group_size=group_size, desc_act=False, sym=True,
                             device="cuda" if device == "cuda" else "cpu")
    source = GPTQModel.load(get_model(name).path(), quantize_config=qconfig,
                            **({"dtype": compute_dtype(name, device)} if device == "cpu" else {}))
    source.quantize([{"input_ids": s.long(), "attention_mask": torch.ones(len(s), dtype=torch.long)}
                     for s in samples], batch_size=1, tokenizer=tokenizer)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".building-{folder.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    source.save(str(tmp))
    seconds = time.perf_counter() - started
    (tmp / GPTQ_CARD).write_text(json.dumps({
        "model": name, "identity": _model_identity(name), "bits": GPTQ_BITS, "group_size": group_size,
        "calibration": calibration, "quantize_s": round(seconds, 2), "device": device}, indent=2) + "\n")
    if (folder / GPTQ_CARD).exists():          # another worker finished first: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    return seconds


def _load_gptq(name: str, device: str, tokenizer) -> torch.nn.Module:
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")   # its CPU loader pool needs two workers
    try:
        from gptqmodel import BACKEND, GPTQModel
    except Exception as exc:  # installed but broken (e.g. a torch it does not support)
        raise ConfigError(f"GPTQ: gptqmodel is installed but does not import "
                          f"({type(exc).__name__}: {exc}); {GPTQ_INSTALL}") from None
    from transformers import AutoConfig

    entry = get_model(name)
    group_size = gptq_group_size(AutoConfig.from_pretrained(entry.path(),
                                                            trust_remote_code=entry.trust_remote_code))
    samples, calibration = calibration_samples(name, tokenizer)
    folder = _gptq_folder(name, group_size, samples)
    if (folder / GPTQ_CARD).exists():
        made = "loaded from the disk cache"
    else:
        log.info("%s: GPTQ-quantizing (%s) into %s", name, calibration, folder)
        seconds = _quantize_gptq(name, device, tokenizer, group_size, samples, folder, calibration)
        made = f"quantized when this worker loaded it ({seconds:.1f} s)"
    backend = BACKEND.TORCH_FUSED if device == "cpu" else BACKEND.AUTO
    quantized = GPTQModel.load(str(folder), device=device, backend=backend,
                               **({"dtype": compute_dtype(name, device)} if device == "cpu" else {}))
    LOAD_NOTES[(name, "gptq", device)] = {
        "gptq_cache": made, "gptq_folder": str(folder), "gptq_calibration": calibration,
        "gptq_group_size": str(group_size), "gptq_backend": str(backend.name)}
    return quantized.model


# ------------------------------------------------------------------------------ perplexity

@dataclass(frozen=True)
class PerplexityMethod:
    """Which held-out text, and how it is cut into scored windows (see the module docstring)."""

    corpus: CorpusSpec
    context: int                                  # tokens per window
    stride: int                                   # tokens between window starts
    windows: int                                  # over all sources, split by ``weights``
    weights: tuple[tuple[str, float], ...]

    def describe(self) -> str:
        mix = "/".join(f"{s} {w:.0%}" for s, w in self.weights)
        return (f"strided sliding window: context {self.context}, stride {self.stride}, "
                f"{self.windows} windows of zoo held-out text ({mix})")


# Windows per method: ~1k scored tokens on the tiny set (tests), ~4k on the full set and hub models.
WINDOWS = {"tiny": 16, "full": 32}
HUB_CONTEXT = 512


def perplexity_method(model: str, windows: int = 0) -> PerplexityMethod:
    """The method for a model: its zoo set's evaluation window and held-out split, else the full set's.

    ``windows`` (a workload's ``eval_windows``) overrides how many windows are scored, e.g. fewer
    where the precision is emulated and every token costs ~20x; 0 keeps the set's default.
    """
    from trials import zoo

    entry = get_model(model)
    if entry.source == "zoo":
        zoo_set = zoo.SETS[zoo.RECIPES[entry.location].zoo_set]
        return PerplexityMethod(zoo_set.corpus, zoo_set.eval_seq_len, zoo_set.eval_seq_len // 2,
                                windows or WINDOWS[zoo_set.name], zoo_set.eval_source_weights)
    full = zoo.SETS["full"]
    return PerplexityMethod(full.corpus, HUB_CONTEXT, HUB_CONTEXT // 2, windows or WINDOWS["full"],
                            full.eval_source_weights)


@dataclass
class Perplexity:
    perplexity: float
    nll_sum: float
    tokens: int                 # scored tokens
    windows: int
    seconds: float
    corpus_hash: str            # of the corpus whose held-out documents were scored


def _split(total: int, weights: tuple[tuple[str, float], ...]) -> dict[str, int]:
    return {source: max(1, round(total * weight)) for source, weight in weights if weight > 0}


def _token_stream(tokenizer, documents) -> torch.Tensor:
    ids: list[int] = []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for doc in documents:
        ids += tokenizer(doc.text, add_special_tokens=False, verbose=False)["input_ids"] + eos
    return torch.tensor(ids, dtype=torch.long)


def heldout_windows(tokenizer, method: PerplexityMethod) -> tuple[torch.Tensor, torch.Tensor, str]:
    """[windows, context] token ids, each window's first scored position, and the corpus hash."""
    corpus = build_corpus(method.corpus)
    rows, first = [], []
    for source, count in _split(method.windows, method.weights).items():
        stream = _token_stream(tokenizer, corpus.heldout[source])
        fits = 0 if len(stream) < method.context else 1 + (len(stream) - method.context) // method.stride
        for i in range(min(count, fits)):
            rows.append(stream[i * method.stride:i * method.stride + method.context])
            first.append(1 if i == 0 else method.context - method.stride)
    if not rows:
        raise ConfigError(f"held-out text is shorter than one perplexity window ({method.context} tokens)")
    return torch.stack(rows), torch.tensor(first), corpus.corpus_hash


def perplexity(loaded: models.LoadedModel, method: PerplexityMethod) -> Perplexity:
    """exp(mean NLL) of the scored tokens of ``heldout_windows``; see the module docstring."""
    started = time.perf_counter()
    windows, first, corpus_hash = heldout_windows(loaded.tokenizer, method)
    positions = torch.arange(1, method.context)                        # target positions
    mask = positions[None, :] >= first[:, None]                        # [windows, context - 1]
    vocab = loaded.model.config.vocab_size
    chunk = max(1, min(8, LOGITS_BUDGET // (method.context * vocab)))
    nll_sum = 0.0
    with torch.inference_mode():
        for i in range(0, len(windows), chunk):
            batch = windows[i:i + chunk].to(loaded.device)
            logits = loaded.model(input_ids=batch, use_cache=False).logits[:, :-1].float()
            nll = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
            nll_sum += float(nll[mask[i:i + chunk].to(nll.device)].double().sum())
    tokens = int(mask.sum())
    return Perplexity(math.exp(nll_sum / tokens), nll_sum, tokens, len(windows),
                      time.perf_counter() - started, corpus_hash)


# ------------------------------------------------------------------------------ bytes

def _quantized_linears(model: torch.nn.Module) -> int:
    """Weights held by quantized linear layers (bitsandbytes / GPTQ modules, not plain nn.Linear)."""
    return sum(m.in_features * m.out_features for m in model.modules()
               if type(m) is not torch.nn.Linear and isinstance(getattr(m, "in_features", None), int)
               and isinstance(getattr(m, "out_features", None), int))


def nominal_weight_bytes(model: torch.nn.Module, precision: str, num_parameters: int,
                         dtype: torch.dtype) -> tuple[int, int]:
    """(predicted bytes, quantized weight count): quantized weights at their nominal bit width,
    every other parameter in ``dtype``; scales, zeros and packing overhead are what it leaves out."""
    if precision not in NOMINAL_BITS:
        return num_parameters * models.DTYPES[precision].itemsize, 0
    quantized = _quantized_linears(model)
    return quantized * NOMINAL_BITS[precision] // 8 + (num_parameters - quantized) * dtype.itemsize, quantized


# ------------------------------------------------------------------------------ the trial

@dataclass
class Reference:
    precision: str
    outputs: dict[str, list[int]]
    perplexity: Perplexity
    num_parameters: int


_REFERENCES = WorkerMemo()


def _reference(config: TrialConfig, prompts: list[Prompt], method: PerplexityMethod) -> tuple[Reference, str]:
    """The reference precision's greedy outputs and perplexity in this worker (measured or reused)."""
    precision = reference_precision(config.model, config.device)
    plain = TrialConfig(group=config.group, model=config.model, device=config.device,
                        stack=Stack(precision=precision, batch_size=config.stack.batch_size),
                        workload=config.workload, repeats=1, seed=config.seed)

    def make() -> Reference:
        loaded = models.load(config.model, precision, config.device)
        measured = measure(plain, loaded, prompts, generate_kwargs={})
        return Reference(precision, measured.outputs(), perplexity(loaded, method),
                         sum(p.numel() for p in loaded.model.parameters()))

    return _REFERENCES.get(plain.config_hash, config.config_hash, make)


def _hf_footprint(model: torch.nn.Module) -> dict[str, float]:
    try:
        return {"hf_memory_footprint_bytes": float(model.get_memory_footprint())}
    except Exception:  # not a PreTrainedModel, or a quantizer it does not understand
        return {}


def run_quantization(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """Speed, memory and perplexity of one precision, and its outputs against the reference's."""
    stack = config.stack
    if stack.kv_bits != 16 or stack.speculation != "none":
        raise ConfigError("the quantization group varies weight precision only "
                          f"(no KV-cache quantization or speculation), got stack {stack.label}")
    loaded = models.load(config.model, stack.precision, config.device)
    prompts = trial_prompts(config, loaded)
    measured = measure(config, loaded, prompts)
    method = perplexity_method(config.model, config.workload.eval_windows)
    quality = perplexity(loaded, method)
    reference, source = _reference(config, prompts, method)
    dtype = compute_dtype(config.model, config.device)
    nominal, quantized = nominal_weight_bytes(loaded.model, stack.precision, reference.num_parameters, dtype)
    metrics = {
        "perplexity": quality.perplexity, "perplexity_tokens": float(quality.tokens),
        "perplexity_windows": float(quality.windows), "perplexity_s": quality.seconds,
        "perplexity_context_tokens": float(method.context), "perplexity_stride_tokens": float(method.stride),
        "reference_perplexity": reference.perplexity.perplexity,
        "perplexity_delta": quality.perplexity - reference.perplexity.perplexity,
        "perplexity_ratio": quality.perplexity / reference.perplexity.perplexity,
        "num_parameters": float(reference.num_parameters),
        "quantized_weight_fraction": quantized / reference.num_parameters,
        "weights_bytes_nominal": float(nominal),
        **_hf_footprint(loaded.model),
        **compare_outputs(measured.outputs(), reference.outputs),
    }
    tags = {"reference_precision": reference.precision, "reference_source": source,
            "compute_dtype": str(dtype).removeprefix("torch."),
            "quantizer": QUANTIZERS.get(stack.precision, "none"),
            "perplexity_method": method.describe(), "perplexity_corpus_hash": quality.corpus_hash,
            **LOAD_NOTES.get((config.model, stack.precision, config.device), {})}
    result = finish(config, runtime, loaded, measured, metrics=metrics, tags=tags)
    result.metrics["bits_per_parameter"] = 8 * result.metrics["weights_bytes"] / reference.num_parameters
    result.raw["perplexity"] = {"method": method.describe(), "nll_sum": quality.nll_sum,
                                "tokens": quality.tokens, "reference_nll_sum": reference.perplexity.nll_sum}
    return result
