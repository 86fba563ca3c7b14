"""Static batching: decode many sequences at once, and find where the memory runs out.

Why it pays: a decode step reads every weight once whatever the batch size, and at batch 1 that read
is most of the step's cost (decode is memory-bandwidth-bound). Decoding B rows per step shares the read,
so aggregate throughput climbs with B until the step becomes compute-bound; each stream gets a little
slower, and the KV cache grows linearly with B until the device's memory runs out.

What a trial does (``run_batching``), composing ``trials.loop``'s pieces (one measurement loop):

* Same prompt length at every batch size. The workload's prompts are cut to the token length of its
  shortest prompt, keeping each prompt's *end* (where the model continues), so rows of a batch are
  never padded and only the batch size changes between trials of a ladder. Left padding itself is
  still checked, by a test that batches prompts of different lengths (``tests/test_batching.py``).
* Rows. A trial decodes ``ceil(N / B) * B`` rows for N prompts (``batch_rows``): every batch is full
  (per-stream throughput is aggregate / B only then), and batches larger than the workload reuse its
  prompts, in order, with distinct ids ``<id>#<round>`` (``code-00#1``), so a batch of 128 from 48
  prompts holds each prompt two or three times.
* ``outputs_match_batch1``: every row's greedy output must equal its prompt's output decoded alone.
  The batch-1 outputs are measured once per worker (``measure(..., batch_size=1, repeats=1)`` on the
  same loaded model, untimed as far as the trial is concerned) and reused by the worker's other trials
  of that model and workload; the tag ``batch1_reference`` says which trial measured them and when.
* The memory boundary. ``predicted_peak_memory_bytes`` = weights + the exact KV cache of B rows at the
  final context (``trials.measurement.kv_footprint``) + an activation estimate (``predict_peak``). A trial whose
  predicted or measured peak exceeds the budget becomes a FAILED run whose reason starts with ``oom``
  and which still carries its predicted (and, if it ran, measured) numbers; nothing crashes. The
  budget is ``Runtime.memory_budget_bytes`` (``--memory-budget``: emulate a smaller device on a CPU),
  and on CUDA also the device's total memory; a real ``torch.cuda.OutOfMemoryError`` is caught and
  ends that model's ladder on the worker: larger batches of the same model fail as ``oom`` unrun.
* The roofline. Decode is bandwidth-bound at best, so one step cannot beat (bytes it must read) /
  (memory bandwidth): the weights once plus every row's KV cache. ``roofline_tok_per_s`` =
  B x bandwidth / (weights + KV at the mean decode context); ``roofline_ratio`` = measured / that.
  The bandwidth is measured once per worker process by a large copy (``memory_bandwidth``; the tag
  ``bandwidth_source`` says which trial measured it).
  Caveat on CPUs: the copy is larger than the last-level cache on purpose (DRAM bandwidth); a model
  small enough to live in that cache may read its weights faster than this ceiling assumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from trials import engines
from trials.config import Runtime, TrialConfig, human_bytes
from trials.errors import ConfigError
from trials.loop import OOM, TrialResult, compare_outputs, failed_result, finish, free_memory, measure, trial_prompts
from trials.measurement.instruments import model_weights_bytes
from trials.measurement.kv_footprint import KVFootprintError, kv_footprint
from trials.models import loading
from trials.prompts import Prompt
from trials.measurement.bandwidth import memory_bandwidth
from trials.stats.theory import roofline_metrics
from trials.worker import WORKER

REUSE_MARK = "#"

class OutOfMemory(ConfigError):
    """The trial does not fit the memory it may use; the message starts with ``oom``."""


# ------------------------------------------------------------------------------ prompts and rows

def _cut(tokenizer, ids: list[int], length: int) -> str | None:
    """Text of consecutive tokens of ``ids`` that tokenizes to exactly ``length`` tokens (special
    tokens included), as late in the prompt as one does."""
    body = length - (len(tokenizer("")["input_ids"]))          # what the tokenizer adds (e.g. BOS)
    for end in range(len(ids), body - 1, -1):
        text = tokenizer.decode(ids[end - body:end])
        if len(tokenizer(text)["input_ids"]) == length:
            return text
    return None


def equal_length_prompts(prompts: list[Prompt], tokenizer) -> tuple[list[Prompt], int]:
    """The prompts cut to the shortest one's token length (ends kept), and that length.

    A cut prompt is decoded back to text (``measure`` tokenizes text); a window whose text does not
    re-tokenize to exactly the length is moved one token earlier until one does.
    """
    lengths = [len(tokenizer(p.text)["input_ids"]) for p in prompts]
    length = min(lengths)
    out = []
    for prompt, total in zip(prompts, lengths):
        if total == length:
            out.append(prompt)
            continue
        text = _cut(tokenizer, tokenizer(prompt.text, add_special_tokens=False)["input_ids"], length)
        if text is None:
            raise ConfigError(f"prompt {prompt.id} cannot be cut to exactly {length} tokens")
        out.append(replace(prompt, text=text))
    return out, length


def batch_rows(prompts: list[Prompt], batch_size: int) -> list[Prompt]:
    """``ceil(N / B) * B`` rows: the prompts in order, reused with ids ``<id>#<round>`` past the end."""
    count = math.ceil(len(prompts) / batch_size) * batch_size
    rows = []
    for i in range(count):
        prompt, round_ = prompts[i % len(prompts)], i // len(prompts)
        rows.append(prompt if round_ == 0 else replace(prompt, id=f"{prompt.id}{REUSE_MARK}{round_}"))
    return rows


def base_id(row_id: str) -> str:
    return row_id.split(REUSE_MARK, 1)[0]


# ------------------------------------------------------------------------------ predicted memory

@dataclass(frozen=True)
class PeakPrediction:
    weights_bytes: int
    kv_bytes: int
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.activation_bytes


def _element_bytes(model: torch.nn.Module) -> int:
    return torch.finfo(next(model.parameters()).dtype).bits // 8


def activation_bytes(config, batch: int, prompt_tokens: int, context: int, element_bytes: int) -> int:
    """An estimate of the largest working set beside weights and cache, the larger of:

    * prefill of B x L tokens: the residual stream and its norm/attention output (4 H), q/k/v
      (H + 2 kv_dim), the MLP's gate, up and product (3 I), plus attention scores B x heads x L x L
      (what an eager attention materializes; SDPA kernels may not, so this is an upper bound);
    * a decode step at the final context T: one layer's K and V expanded to every query head
      (``repeat_kv`` for grouped-query attention) and one layer's K and V copied while the cache
      grows (``torch.cat``);

    plus the last position's logits, kept in fp32 by generate() with two working copies (3 x B x V x 4).
    """
    hidden, inter = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_dim = kv_heads * head_dim
    prefill = (batch * prompt_tokens * (4 * hidden + hidden + 2 * kv_dim + 3 * inter)
               + batch * heads * prompt_tokens * prompt_tokens) * element_bytes
    decode = 2 * batch * context * (heads * head_dim + kv_dim) * element_bytes
    logits = 3 * batch * config.vocab_size * 4
    return max(prefill, decode) + logits


def _kv_bytes(model: torch.nn.Module, context: int, batch: int) -> int | None:
    try:
        footprint = kv_footprint(model.config, mla="expanded")
    except KVFootprintError:
        return None
    return footprint.total_bytes(context, batch, 8 * _element_bytes(model))


def predict_peak(loaded: loading.LoadedModel, batch: int, prompt_tokens: int,
                 new_tokens: int) -> PeakPrediction:
    """Weights + exact KV of ``batch`` rows at the final context + ``activation_bytes``."""
    model = loaded.model
    context = prompt_tokens + new_tokens
    kv = _kv_bytes(model, context, batch) or 0    # 0: an architecture kv_footprint cannot model
    return PeakPrediction(model_weights_bytes(model), kv,
                          activation_bytes(model.config, batch, prompt_tokens, context,
                                           _element_bytes(model)))


# ------------------------------------------------------------------------------ bandwidth, roofline

def decode_bytes_per_step(loaded: loading.LoadedModel, batch: int, prompt_tokens: int,
                          new_tokens: int, measured_kv_bytes: int) -> tuple[float, str]:
    """Bytes one decode step reads, averaged over the decode steps: weights + KV of every row at
    each step's context (prompt + 1 .. prompt + new - 1), and where the KV figure came from."""
    weights = model_weights_bytes(loaded.model)
    contexts = range(prompt_tokens + 1, prompt_tokens + new_tokens)
    kv = [_kv_bytes(loaded.model, c, batch) for c in contexts]
    if kv and None not in kv:
        return weights + sum(kv) / len(kv), "kv_footprint"
    return weights + measured_kv_bytes, "measured final cache (upper bound)"


# ------------------------------------------------------------------------------ batch-1 reference

def _reference_key(config: TrialConfig, prompts: list[Prompt]) -> tuple:
    return (config.entry(), config.stack.precision, config.device, config.workload.max_new_tokens,
            tuple((p.id, p.text) for p in prompts))


def batch1_outputs(config: TrialConfig, loaded: loading.LoadedModel,
                   prompts: list[Prompt]) -> tuple[dict[str, list[int]], str]:
    """Each prompt's greedy output decoded alone (once per worker, before timing), and where it came
    from: ``"this trial"`` or ``"reused: measured N s earlier in this worker (trial <hash>)"``."""
    return WORKER.memo("batching.batch1").get(
        _reference_key(config, prompts), config.config_hash,
        lambda: measure(config, loaded, prompts, generate_kwargs={}, batch_size=1, repeats=1).outputs())


# ------------------------------------------------------------------------------ the ladder's end

def _ladder_key(config: TrialConfig) -> tuple:
    return (config.entry(), config.stack.precision, config.device, config.workload)


def _device_memory_bytes(device: str) -> int | None:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return None


def oom_result(config: TrialConfig, reason: str, metrics: dict[str, float]) -> TrialResult:
    """A FAILED run whose one-line reason starts with ``oom``, keeping what was predicted/measured."""
    result = failed_result(config, OutOfMemory(reason))
    result.metrics.update(metrics)
    return result


# ------------------------------------------------------------------------------ the runner

def _budgets(config: TrialConfig, runtime: Runtime) -> dict[str, int]:
    """The limits a trial's peak must stay under: the emulated budget, and a GPU's own memory."""
    limits = {"memory budget": runtime.memory_budget_bytes,
              "device memory": _device_memory_bytes(config.device)}
    return {name: limit for name, limit in limits.items() if limit}


def _memory_metrics(predicted: PeakPrediction, budgets: dict[str, int]) -> dict[str, float]:
    return {"predicted_peak_memory_bytes": predicted.total_bytes,
            "predicted_kv_cache_bytes": predicted.kv_bytes,
            "predicted_activation_bytes": predicted.activation_bytes,
            "weights_bytes": predicted.weights_bytes,
            **({"memory_budget_bytes": budgets["memory budget"]} if "memory budget" in budgets else {}),
            **({"device_memory_bytes": budgets["device memory"]} if "device memory" in budgets else {})}


def _refused(config: TrialConfig, predicted: PeakPrediction, budgets: dict[str, int]) -> str:
    """Why the trial must not run (a reason starting with ``oom``), or ``""``."""
    batch = config.stack.batch_size
    ended = WORKER.memo("batching.ladder_end").peek(_ladder_key(config))
    if ended is not None and batch >= ended[0][0]:
        failed_at, trial = ended[0]
        return (f"{OOM}: not run, batch {failed_at} of this model already ran out of device memory "
                f"on this worker (trial {trial})")
    for name, limit in budgets.items():
        if predicted.total_bytes > limit:
            return (f"{OOM}: predicted peak {human_bytes(predicted.total_bytes)} exceeds the {name} "
                    f"({human_bytes(limit)}) at batch {batch}")
    return ""


def _overrun(peak_bytes: float, budgets: dict[str, int], batch: int) -> str:
    for name, limit in budgets.items():
        if peak_bytes > limit:
            return (f"{OOM}: measured peak {human_bytes(peak_bytes)} exceeds the {name} "
                    f"({human_bytes(limit)}) at batch {batch}")
    return ""


def _measure_against_batch1(config: TrialConfig, loaded: loading.LoadedModel, prompts: list[Prompt],
                            rows: list[Prompt]):
    """The timed run of ``rows`` in batches, its batch-1 reference outputs and their source."""
    batch, memo = config.stack.batch_size, WORKER.memo("batching.batch1")
    if batch > 1:
        reference, source = batch1_outputs(config, loaded, prompts)
    measured = measure(config, loaded, rows, generate_kwargs={}, batch_size=batch)
    if batch == 1:
        reference, source = measured.outputs(), "this trial (batch 1 is its own reference)"
        if _reference_key(config, prompts) not in memo:
            memo.put(_reference_key(config, prompts), config.config_hash, reference)
    return measured, reference, source


def _batch1_metrics(outputs: dict[str, list[int]], reference: dict[str, list[int]]):
    expected = {rid: reference[base_id(rid)] for rid in outputs}
    match = compare_outputs(outputs, expected)
    mismatched = sorted(rid for rid in outputs if outputs[rid] != expected[rid])
    return {"outputs_match_batch1": match["lossless"],
            "batch1_token_match": match["fidelity_token_match"],
            "batch1_first_divergence_token": match["first_divergence_token"],
            "rows_not_matching_batch1": float(len(mismatched))}, mismatched


def run_batching(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """One rung of a model's batch ladder: fixed-length prompts, B rows per step, checked against
    batch 1, with its predicted peak, its memory boundary and its roofline."""
    batch, new_tokens = config.stack.batch_size, config.workload.max_new_tokens
    loaded = loading.load(config.entry(), config.stack.precision, config.device)
    prompts, prompt_tokens = equal_length_prompts(trial_prompts(config, loaded), loaded.tokenizer)
    rows = batch_rows(prompts, batch)
    predicted = predict_peak(loaded, batch, prompt_tokens, new_tokens)
    budgets = _budgets(config, runtime)
    memory = _memory_metrics(predicted, budgets)
    refused = _refused(config, predicted, budgets)
    if refused:
        return oom_result(config, refused, memory)

    bandwidth, bandwidth_source = memory_bandwidth(config.device, config.config_hash)
    ran_out = ""
    try:
        measured, reference, source = _measure_against_batch1(config, loaded, prompts, rows)
    except torch.OutOfMemoryError as exc:     # CUDA (and a CPU allocator that raises it)
        ran_out = f"{OOM}: batch {batch} ran out of device memory ({str(exc).strip()[:200]})"
    if ran_out:                               # outside the handler: its traceback holds the tensors
        ladder = WORKER.memo("batching.ladder_end")
        ended = ladder.peek(_ladder_key(config))
        if ended is None or batch < ended[0][0]:
            ladder.put(_ladder_key(config), config.config_hash, (batch, config.config_hash))
        free_memory(config.device)
        return oom_result(config, ran_out.splitlines()[0], memory)

    matched, mismatched = _batch1_metrics(measured.outputs(), reference)
    step_bytes, step_source = decode_bytes_per_step(
        loaded, batch, prompt_tokens, new_tokens, max(b.kv_cache_bytes for b in measured.repeats[0]))
    extra = {**memory, **matched, "prompt_tokens": float(prompt_tokens),
             "distinct_prompts": float(len(prompts))}
    tags = {"batch1_reference": source, "roofline_kv_source": step_source,
            "bandwidth_source": bandwidth_source, "user_code": engines.backend(config.stack).prepare(config, loaded, prompts).code,
            "prompt_rule": f"every prompt cut to {prompt_tokens} tokens (the shortest), end kept; "
                           f"{len(rows)} rows from {len(prompts)} prompts"}
    result = finish(config, runtime, loaded, measured, extra, tags,
                    raw={"rows_not_matching_batch1": mismatched})
    metrics = result.metrics
    metrics.update(roofline_metrics(metrics["tok_per_s"], batch, bandwidth, step_bytes))
    metrics["peak_memory_ratio"] = metrics["peak_memory_bytes"] / predicted.total_bytes
    overrun = _overrun(metrics["peak_memory_bytes"], budgets, batch)
    if overrun:
        result.status, result.error = "FAILED", overrun
    return result
