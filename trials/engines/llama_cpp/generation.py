"""Greedy generation on llama.cpp (llama-cpp-python), with per-token stamps, under a stack's arguments.

``load`` opens the stack's GGUF (``gguf.gguf_file``) with its KV cache type (``type_k``/``type_v``,
flash attention on for every cache, so that the cache type is the only difference) and, for prompt
lookup, ``LlamaPromptLookupDecoding(num_pred_tokens=k)``. The prompts are the transformers
tokenizer's token ids of the same text, fed to llama.cpp as they are: both engines see identical
inputs, and ``tokenizer_parity`` says on how many prompts llama.cpp's own tokenizer agrees.
``generate_batch`` runs one prompt (batch 1): ``Llama.generate`` at temperature 0 (greedy), the
end-of-sequence tokens suppressed as transformers' ``min_new_tokens`` does, stopped after exactly
``new_tokens``; each token is stamped as it arrives (TTFT, decode time), and the target passes
(``Llama.eval`` calls) are counted for speculation. llama.cpp's own counters (prompt-eval and eval
milliseconds) travel beside the stamps.
"""

from __future__ import annotations

import json
import pathlib
import time
from dataclasses import dataclass, field, replace

from trials.config import TrialConfig
from trials.engines.llama_cpp import gguf
from trials.engines.llama_cpp.binding import require_llama_cpp, threads
from trials.engines.llama_cpp.spec import BYTES_PER_ELEMENT, KV_TYPES, model_refusal
from trials.engines.spec import ModelFacts
from trials.errors import ConfigError
from trials.measurement.instruments import TokenTimer
from trials.models.registry import model_config
from trials.prompts import Prompt
from trials.worker import WORKER



@dataclass
class LoadedGGUF:
    name: str
    precision: str              # the GGUF type
    device: str
    model: object               # llama_cpp.Llama
    tokenizer: object           # the transformers tokenizer of the same model (identical prompt ids)
    load_s: float
    path: pathlib.Path
    card: dict                  # gguf.gguf_file's entry: origin, bytes, file
    eos_ids: tuple[int, ...]
    n_ctx: int
    from_cache: bool = False
    counts: dict = field(default_factory=lambda: {"eval_calls": 0, "eval_tokens": 0})


def eos_ids(folder: pathlib.Path, tokenizer) -> tuple[int, ...]:
    """The end-of-sequence ids transformers' ``min_new_tokens`` suppresses (generation config's
    ``eos_token_id``, else the tokenizer's)."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((folder / name).read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if value is not None:
            ids = value if isinstance(value, list) else [value]
            break
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    return tuple(int(i) for i in ids)


class GgmlType(str):
    """A ggml type by name (``q8_0``): ``llama_cpp.GGML_TYPE_Q8_0`` when run, and in the user's code."""


@dataclass(frozen=True)
class PromptLookup:
    """llama-cpp-python's prompt-lookup proposer with ``k`` tokens per round."""

    k: int


def llama_arguments(stack, n_ctx: int, *, scoring: bool = False) -> dict[str, object]:
    """``Llama(...)``'s keywords for ``stack`` (beside the model path, the seed and the threads): the
    one description both run (``materialize``) and shown to the user (``as_code``). Flash attention is
    on for every cache, so that the cache type is the only difference (llama.cpp needs it for a
    quantized V cache). ``scoring``: logits for every position of one window in one batch."""
    kv = GgmlType(KV_TYPES[stack.kv_bits])
    arguments: dict[str, object] = {"n_ctx": n_ctx, "n_batch": n_ctx if scoring else 512,
                                    "type_k": kv, "type_v": kv, "flash_attn": True}
    if scoring:
        arguments.update(n_ubatch=n_ctx, logits_all=True)
    elif stack.speculation == "prompt_lookup":
        arguments["draft_model"] = PromptLookup(stack.num_draft_tokens)
    return arguments


def materialize(arguments: dict[str, object]) -> dict[str, object]:
    """The keywords with the binding's objects in place of their descriptions."""
    llama_cpp = require_llama_cpp()

    def real(value):
        if isinstance(value, GgmlType):
            return getattr(llama_cpp, f"GGML_TYPE_{value.upper()}")
        if isinstance(value, PromptLookup):
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            return LlamaPromptLookupDecoding(num_pred_tokens=value.k)
        return value
    return {name: real(value) for name, value in arguments.items()}


def open_llama(path: pathlib.Path, arguments: dict[str, object], seed: int, n_threads: int | None = None):
    """A ``llama_cpp.Llama`` on ``path`` with ``arguments``, on ``n_threads`` (default: the trial's threads)."""
    llama_cpp = require_llama_cpp()
    n_threads = n_threads or threads()
    return llama_cpp.Llama(model_path=str(path), n_threads=n_threads, n_threads_batch=n_threads, seed=seed,
                           verbose=False, **materialize(arguments))


def load(config: TrialConfig, tokenizer, n_ctx: int) -> LoadedGGUF:
    """The stack's GGUF in a context of ``n_ctx`` tokens, from this worker's cache when possible."""
    stack, entry = config.stack, config.entry()
    key = ("llama_cpp", entry, stack.precision, stack.kv_bits, stack.speculation, stack.num_draft_tokens, n_ctx)
    if key in WORKER.models:
        WORKER.models.move_to_end(key)
        # the same counts dict: the wrapped eval below counts into it (generate_batch takes differences)
        return replace(WORKER.models[key], from_cache=True)
    refused = model_refusal(entry.name, model_config(entry), stack)
    if refused:                                # llama.cpp itself says only "Failed to create llama_context"
        raise ConfigError(refused)
    for old in [k for k in WORKER.models if k[0] == "llama_cpp"]:
        del WORKER.models[old]                 # one llama.cpp context per worker
    path, card = gguf.gguf_file(entry, stack.precision)
    started = time.perf_counter()
    model = open_llama(path, llama_arguments(stack, n_ctx), config.seed)
    loaded = LoadedGGUF(entry.name, stack.precision, config.device, model, tokenizer,
                        time.perf_counter() - started, path, card,
                        eos_ids(pathlib.Path(entry.path()), tokenizer), n_ctx)
    counts = loaded.counts
    evaluate = model.eval

    def counted_eval(tokens):
        counts["eval_calls"] += 1
        counts["eval_tokens"] += len(tokens)
        return evaluate(tokens)

    model.eval = counted_eval
    model._init_sampler = lambda **_: _greedy_without_eos(model, loaded.eos_ids)
    WORKER.models[key] = loaded
    return loaded


def _greedy_without_eos(model, eos_ids: tuple[int, ...]):
    """Greedy, with the end-of-sequence ids at -inf: exactly ``new_tokens`` tokens, as transformers'
    ``min_new_tokens`` makes them."""
    from llama_cpp import _internals

    sampler = _internals.LlamaSampler()
    if eos_ids:
        sampler.add_logit_bias(model.n_vocab(), {i: float("-inf") for i in eos_ids})
    sampler.add_greedy()
    return sampler


def prompt_ids(loaded: LoadedGGUF, prompt: Prompt) -> list[int]:
    """The transformers tokenizer's ids of the prompt (a chat template writes its own BOS)."""
    tokenizer = loaded.tokenizer
    templated = bool(tokenizer.bos_token) and prompt.text.startswith(tokenizer.bos_token)
    return tokenizer(prompt.text, add_special_tokens=not templated)["input_ids"]


def own_ids(loaded: LoadedGGUF, prompt: Prompt) -> list[int]:
    """llama.cpp's own tokenization of the same text (BOS as the GGUF says)."""
    tokenizer = loaded.tokenizer
    templated = bool(tokenizer.bos_token) and prompt.text.startswith(tokenizer.bos_token)
    return loaded.model.tokenize(prompt.text.encode(), add_bos=not templated, special=templated)


def perf_counters(loaded: LoadedGGUF) -> dict[str, float]:
    """llama.cpp's own counters since the last reset: prompt-eval and eval milliseconds and tokens."""
    import llama_cpp

    data = llama_cpp.llama_perf_context(loaded.model._ctx.ctx)
    return {"prompt_eval_ms": data.t_p_eval_ms, "eval_ms": data.t_eval_ms,
            "prompt_eval_tokens": float(data.n_p_eval), "eval_tokens": float(data.n_eval)}


@dataclass
class GGUFRecord:
    """One prompt's generation, in the shape of the transformers engine's ``BatchRecord``."""

    prompt_ids: list[str]
    prompt_tokens: int
    ttft_s: float
    decode_s: float
    new_tokens: int
    decode_tokens: int
    kv_cache_bytes: int
    kv_cache_tokens: int
    output_ids: list[list[int]]
    texts: list[str]
    llama_perf: dict = field(default_factory=dict)
    target_passes: int = 0


def kv_bytes_per_token(loaded: LoadedGGUF, kv_bits: int) -> int:
    """K and V bytes per token over all layers at the cache's ggml type (f16: 2 bytes an element;
    q8_0: 34 bytes per 32; q4_0: 18 per 32), from the GGUF's own metadata."""
    meta = loaded.model.metadata
    arch = meta.get("general.architecture", "")
    layers = int(meta[f"{arch}.block_count"])
    heads = int(meta.get(f"{arch}.attention.head_count_kv") or meta[f"{arch}.attention.head_count"])
    key_dim = int(meta.get(f"{arch}.attention.key_length")
                  or int(meta[f"{arch}.embedding_length"]) // int(meta[f"{arch}.attention.head_count"]))
    value_dim = int(meta.get(f"{arch}.attention.value_length") or key_dim)
    per_element = BYTES_PER_ELEMENT[KV_TYPES[kv_bits]]
    return int(layers * heads * (key_dim + value_dim) * per_element)


def generate_batch(loaded: LoadedGGUF, batch: list[Prompt], new_tokens: int, timer: TokenTimer,
                   generate_kwargs: dict) -> GGUFRecord:
    """One prompt (batch 1), greedy, exactly ``new_tokens`` tokens, each stamped as it arrives."""
    import llama_cpp

    [prompt] = batch
    ids = prompt_ids(loaded, prompt)
    model = loaded.model
    model.reset()
    llama_cpp.llama_perf_context_reset(model._ctx.ctx)
    calls_before = loaded.counts["eval_calls"]
    out: list[int] = []
    timer.reset()
    for token in model.generate(ids, temp=0.0, repeat_penalty=1.0, reset=True):
        timer.stamp()
        out.append(int(token))
        if len(out) == new_tokens:
            break
    passes = loaded.counts["eval_calls"] - calls_before - 1      # the prompt's pass aside
    held = len(ids) + new_tokens - 1
    return GGUFRecord(
        prompt_ids=[prompt.id], prompt_tokens=len(ids), ttft_s=timer.ttft_s, decode_s=timer.decode_s,
        new_tokens=len(out), decode_tokens=timer.decode_tokens,
        kv_cache_bytes=held * kv_bytes_per_token(loaded, generate_kwargs.get("kv_bits", 16)),
        kv_cache_tokens=held, output_ids=[out],
        texts=[loaded.tokenizer.decode(out, skip_special_tokens=True)],
        llama_perf=perf_counters(loaded), target_passes=passes)


def facts(loaded: LoadedGGUF, record: GGUFRecord) -> ModelFacts:
    """What the loop logs about the loaded model: the GGUF's tensor bytes and parameters (llama.cpp's
    own count), the threads it ran on, and the KV bytes its cache type holds for ``record``'s tokens
    (computed from ggml's block sizes: llama.cpp exposes no per-sequence cache size to measure)."""
    import llama_cpp as binding

    handle = loaded.model._model.model
    return ModelFacts(float(binding.llama_model_size(handle)), float(binding.llama_model_n_params(handle)),
                      float(threads()), float(record.kv_cache_bytes),
                      metrics={"gguf_file_bytes": float(loaded.path.stat().st_size)})


def _render(value) -> str:
    if isinstance(value, GgmlType):
        return f"llama_cpp.GGML_TYPE_{value.upper()}"
    if isinstance(value, PromptLookup):
        return f"LlamaPromptLookupDecoding(num_pred_tokens={value.k})"
    return repr(value)


def as_code(config: TrialConfig, n_ctx: int) -> str:
    """The same stack in a user's llama-cpp-python code, rendered from ``llama_arguments``."""
    arguments = llama_arguments(config.stack, n_ctx)
    lines = ["import llama_cpp", "from llama_cpp import Llama"]
    if any(isinstance(v, PromptLookup) for v in arguments.values()):
        lines.append("from llama_cpp.llama_speculative import LlamaPromptLookupDecoding")
    keywords = ", ".join(f"{name}={_render(value)}" for name, value in arguments.items())
    lines.append(f'llm = Llama(model_path="<{config.model}>.{config.stack.precision}.gguf", {keywords})')
    lines.append("tokens = list(llm.generate(llm.tokenize(prompt.encode()), temp=0.0))  # greedy")
    return "\n".join(lines)
