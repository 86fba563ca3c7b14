"""The llama-server engine's declaration (torch-free): llama.cpp's own HTTP server, built from the
binding's sdist with the same flags (``trials.engines.llama_cpp.tools``), serving the same GGUF files
as the in-process llama.cpp engine (whose folder it builds on).

What the binding cannot do, the server does: continuous batching over ``--parallel`` slots
(``Stack.batch_size`` is the slot count here), and speculation while batching: prompt lookup
(``--spec-type ngram-simple``) or a draft model (``--spec-type draft-simple --spec-draft-model``: a
lower-bit GGUF of the target itself, ``Stack.draft_precision``, so its vocabulary is the target's),
``k`` tokens per round. Its KV cache types are the binding's
(``-ctk/-ctv`` f16, q8_0, q4_0, with flash attention on), so a served stack and an in-process one
differ only in how requests arrive. Every argument of the command line is derived in
``backend.server_arguments``: the one description both run and shown.
"""

from trials.engines.llama_cpp.spec import GGUF_TYPES, TOOLS_BUILD, model_refusal, shipped
from trials.engines.spec import Engine

NAME = "llama_server"
SLOTS_MAX = 64


def guard(stack) -> str | None:
    if stack.compile:
        return "compiled decoding is a transformers technique (torch.compile); llama-server runs llama.cpp's kernels"
    if stack.speculation == "draft" and stack.draft_precision not in GGUF_TYPES:
        return (f"llama-server drafts with a GGUF of the target's own vocabulary: name the draft's type "
                f"(draft_precision, one of {', '.join(GGUF_TYPES)}), got {stack.draft_precision!r}")
    if stack.batch_size > SLOTS_MAX:
        return f"llama-server is driven here with at most {SLOTS_MAX} parallel slots (batch_size), got {stack.batch_size}"
    return None


SPEC = Engine(NAME, "llama.cpp server (llama-server)", GGUF_TYPES, {"ggml": (8, 4)}, guard, "llama_cpp",
              "trials.engines.llama_server.backend",
              calibrated=False, sixteen_bit=("f16",), four_bit=("q4_0", "q4_1", "q4_k_m"),
              proposers=("prompt_lookup", "draft"), devices=("cpu",), model_refusal=model_refusal, shipped=shipped,
              color="#00CC96", weight_word="GGUF weights", version_tag="llama_server_build",
              serves=True, builds_on=("llama_cpp",), server_knobs=("step_tokens", "threads"),
              machine_setup=TOOLS_BUILD,
              caption="llama.cpp's own server (llama-server, built from the binding's source with the same flags) on "
                      "127.0.0.1, continuous batching over its parallel slots, fed the transformers tokenizer's ids "
                      "of the project's prompts, greedy with end-of-sequence suppressed, prompt cache off.")
