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

Precisions (``Stack.precision``): ``fp32`` / ``bf16`` / ``fp16`` are plain dtypes (``trials.models.loading``;
fp16 on CUDA only); ``int8``, ``nf4`` and ``gptq`` load through ``trials.models.quantized_weights``, which
says how each is made (and how GPTQ calibrates and caches).

Everything a quantizer leaves alone runs in the *compute dtype*, the dtype of the model's reference
precision (``reference_precision``: fp32 on CPU, the published dtype on CUDA, i.e. the highest
precision worth running). A quantized trial therefore differs from its reference in the quantized
linear weights only, and its perplexity delta is the price of quantizing them.

Quality, by one fixed method (``trials.measurement.perplexity``), on the same tokens for every precision:
held-out text of the zoo corpus (``trials.models.corpus``: the last ~5% of each source's documents, never
trained on; the documents of the model's own zoo set, the ``full`` set's for hub models), each
document tokenized by the model's tokenizer and followed by EOS, exactly as the zoo built its
held-out split. Per source (code / prose / structured, weighted as the zoo weights its own
evaluation) windows of ``context`` tokens start every ``stride`` tokens; the first window scores all
its tokens, later ones only their last ``stride`` tokens, so every scored token sees at least
``context - stride`` tokens of context and none is scored twice (the strided sliding window of
Hugging Face's "Perplexity of fixed-length models"). ``perplexity`` = exp(mean NLL) over the scored
tokens, with log-softmax in fp32 whatever the model's dtype.

Fidelity: greedy outputs of the trial against a run of the reference precision on the same prompts in
the same worker (``trials.loop.compare_outputs``); the reference run and its perplexity are measured
once per worker and model, and the tag ``reference_source`` says which trial measured them.

Bytes: ``weights_bytes`` is the real storage (``trials.measurement.instruments.model_weights_bytes``, which also counts
the scales bitsandbytes keeps beside its parameters); ``weights_bytes_nominal`` is the prediction
"quantized weights x bits + everything else in the compute dtype", and
``hf_memory_footprint_bytes`` is what ``get_memory_footprint()`` claims, logged to show where it is
wrong.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from trials import engines
from trials.config import Runtime, Stack, TrialConfig
from trials.loop import TrialResult, compare_outputs, finish, measure, trial_prompts
from trials.measurement import quality
from trials.measurement.hardware import DTYPES
from trials.measurement.perplexity import PerplexityMethod, perplexity
from trials.models import loading
from trials.models.quantized_weights import compute_dtype
from trials.models.registry import perplexity_method, reference_precision
from trials.prompts import Prompt
from trials.worker import WORKER

NOMINAL_BITS = {"int8": 8, "nf4": 4, "gptq": 4}
QUANTIZERS = {"int8": "bitsandbytes LLM.int8 (threshold 6.0)",
              "nf4": "bitsandbytes NF4 (block 64)", "gptq": "GPTQModel GPTQ 4-bit"}


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
        return num_parameters * DTYPES[precision].itemsize, 0
    quantized = _quantized_linears(model)
    return quantized * NOMINAL_BITS[precision] // 8 + (num_parameters - quantized) * dtype.itemsize, quantized


# ------------------------------------------------------------------------------ the trial

def _reference(config: TrialConfig, prompts: list[Prompt], method: PerplexityMethod,
               this_trial: quality.Reference | None = None) -> tuple[quality.Reference, str]:
    """The reference precision's greedy outputs and perplexity in this worker (measured or reused);
    ``this_trial`` when the trial runs the reference precision itself (measured once, not twice)."""
    precision = reference_precision(config.entry(), config.device)
    plain = replace(config, stack=Stack(precision=precision, batch_size=config.stack.batch_size), repeats=1)

    def make() -> quality.Reference:
        loaded = loading.load(config.entry(), precision, config.device)
        measured = measure(plain, loaded, prompts, generate_kwargs={})
        return quality.Reference(precision, measured.outputs(),
                                 perplexity=perplexity(loaded.model, loaded.tokenizer, method),
                                 num_parameters=sum(p.numel() for p in loaded.model.parameters()))

    return quality.reference("quantization.reference", plain.config_hash, config.config_hash, make,
                             this_trial, max_age_s=None)


def _hf_footprint(model: torch.nn.Module) -> dict[str, float]:
    try:
        return {"hf_memory_footprint_bytes": float(model.get_memory_footprint())}
    except Exception:  # not a PreTrainedModel, or a quantizer it does not understand
        return {}


def run_quantization(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """Speed, memory and perplexity of one precision, and its outputs against the reference's."""
    stack = config.stack
    loaded = loading.load(config.entry(), stack.precision, config.device)
    prompts = trial_prompts(config, loaded)
    prepared = engines.backend(config.stack).prepare(config, loaded, prompts)                       # weights only (group guard)
    measured = measure(config, loaded, prompts, generate_kwargs=prepared.kwargs)
    method = perplexity_method(config.entry(), config.workload.eval_windows)
    own = perplexity(loaded.model, loaded.tokenizer, method)
    this_trial = None
    if stack.precision == reference_precision(config.entry(), config.device):
        this_trial = quality.Reference(stack.precision, measured.outputs(), perplexity=own,
                                        num_parameters=sum(p.numel() for p in loaded.model.parameters()))
    reference, source = _reference(config, prompts, method, this_trial)
    dtype = compute_dtype(config.entry(), config.device)
    nominal, quantized = nominal_weight_bytes(loaded.model, stack.precision, reference.num_parameters, dtype)
    metrics = {
        "perplexity": own.perplexity, "perplexity_tokens": float(own.tokens),
        "perplexity_windows": float(own.windows), "perplexity_s": own.seconds,
        "perplexity_context_tokens": float(method.context), "perplexity_stride_tokens": float(method.stride),
        "reference_perplexity": reference.perplexity.perplexity,
        "perplexity_delta": own.perplexity - reference.perplexity.perplexity,
        "perplexity_ratio": own.perplexity / reference.perplexity.perplexity,
        "num_parameters": float(reference.num_parameters),
        "quantized_weight_fraction": quantized / reference.num_parameters,
        "weights_bytes_nominal": float(nominal),
        **_hf_footprint(loaded.model),
        **compare_outputs(measured.outputs(), reference.outputs),
    }
    tags = {"reference_precision": reference.precision, "reference_source": source,
            "compute_dtype": str(dtype).removeprefix("torch."),
            "quantizer": QUANTIZERS.get(stack.precision, "none"),
            "perplexity_method": method.describe(), "perplexity_corpus_hash": own.corpus_hash,
            "user_code": prepared.code,
            **WORKER.load_notes.get((config.entry(), stack.precision, config.device), {})}
    result = finish(config, runtime, loaded, measured, metrics=metrics, tags=tags)
    result.metrics["bits_per_parameter"] = 8 * result.metrics["weights_bytes"] / reference.num_parameters
    result.raw["perplexity"] = {"method": method.describe(), "nll_sum": own.nll_sum,
                                "tokens": own.tokens, "reference_nll_sum": reference.perplexity.nll_sum}
    return result
