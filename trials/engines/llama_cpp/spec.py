"""The llama.cpp engine's declaration (torch-free): GGUF weight types, ggml KV caches, prompt lookup.

Weights are GGUF files (``trials.engines.llama_cpp.gguf``): the types llama.cpp's own converter and
quantizer make from any model's HF folder (F16, Q8_0, Q4_0, ...), and the type a real model ships in
(SmolLM2: Q4_1, Gemma-3: Q4_K_M). The KV cache is ``type_k``/``type_v`` f16 (``kv_bits`` 16), q8_0 (8)
or q4_0 (4), with flash attention on (llama.cpp needs it for a quantized V cache); a quantized cache
packs each head's row in 32-element blocks (``cache_refusal``). Speculation is prompt lookup
(``LlamaPromptLookupDecoding``); the binding generates one sequence at a time, so batch 1 only.
"""

from trials.engines.spec import Engine

NAME = "llama_cpp"
GGUF_TYPES = ("f16", "q8_0", "q4_0", "q4_1", "q4_k_m")
KV_TYPES = {16: "f16", 8: "q8_0", 4: "q4_0"}          # kv_bits -> ggml type of K and V


def guard(stack) -> str | None:
    if stack.kv_bits not in KV_TYPES:
        return f"llama.cpp's KV cache types here are f16, q8_0 and q4_0 (kv_bits 16, 8, 4), not {stack.kv_bits}-bit"
    if stack.speculation == "draft":
        return ("llama-cpp-python speculates with a prompt-lookup proposer (LlamaPromptLookupDecoding); "
                "a draft model is not measured on llama.cpp here")
    if stack.batch_size != 1:
        return ("llama-cpp-python's Llama generates one sequence at a time: batch 1 only on llama.cpp "
                f"(got batch {stack.batch_size})")
    if stack.compile:
        return "compiled decoding is a transformers technique (torch.compile); llama.cpp runs its own kernels"
    return None


GGML_BLOCK = 32                                       # elements per block of q8_0 and q4_0


def head_dim(config: dict) -> int | None:
    """A decoder's attention head size from its ``config.json`` (None where the config does not say)."""
    config = config.get("text_config", config)
    if config.get("head_dim"):
        return int(config["head_dim"])
    if config.get("hidden_size") and config.get("num_attention_heads"):
        return int(config["hidden_size"]) // int(config["num_attention_heads"])
    return None


def cache_refusal(model: str, config: dict | None, kv_bits: int) -> str | None:
    """Why llama.cpp cannot hold ``model``'s K and V in ``kv_bits``, or None (also where the config is
    not on disk: the trial then finds out)."""
    size = head_dim(config) if config and kv_bits != 16 else None
    if size is None or size % GGML_BLOCK == 0:
        return None
    return (f"{model}: llama.cpp's {KV_TYPES[kv_bits]} cache packs each head's row in {GGML_BLOCK}-element "
            f"blocks, and this model's heads have {size} elements")


SPEC = Engine(NAME, "llama.cpp (llama-cpp-python)", GGUF_TYPES, ("ggml",), guard, "llama_cpp",
              "trials.engines.llama_cpp.generation",
              calibrated=False,     # the budget's transformers reference step: an upper bound here
              sixteen_bit=("f16",), four_bit=("q4_0", "q4_1", "q4_k_m"), color="#EF553B")
