"""The llama.cpp engine's declaration (torch-free): GGUF weight types, ggml KV caches, prompt lookup.

Weights are GGUF files (``trials.engines.llama_cpp.gguf``): the type a real model ships in (SmolLM2:
Q4_1, Gemma-3: Q4_K_M) and the types llama.cpp's own converter and quantizer make from its HF folder
(F16, Q8_0, Q4_0). The KV cache is ``type_k``/``type_v`` f16 (``kv_bits`` 16), q8_0 (8) or q4_0 (4),
with flash attention on (llama.cpp needs it for a quantized V cache). Speculation is prompt lookup
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


SPEC = Engine(NAME, "llama.cpp (llama-cpp-python)", GGUF_TYPES, ("ggml",), guard, "llama_cpp",
              "trials.engines.llama_cpp.generation",
              calibrated=False)     # the budget's transformers reference step: an upper bound here
