"""The transformers serve engine's declaration (torch-free): transformers' own OpenAI-compatible
server (``transformers serve``, the ``serving`` extra), continuous batching over a paged KV cache,
serving the HF folders the transformers engine loads (whose folder it builds on: its in-process
greedy tokens are the parity reference, its scores the served stacks' quality).

What it runs, and what it refuses (with why):

- weights: fp32 and bf16 (``--dtype``). fp16 is not offered on a CPU (the transformers engine refuses
  it there too). int8/nf4 are not offered: its ``--quantization bnb-4bit`` adds double quantization
  (not the project's nf4 weights, so neither parity nor quality would compare like for like), and
  it has no GPTQ.
- ``batch_size`` is the most sequences in flight: the paged KV cache is sized to hold exactly
  ``batch_size`` sequences of the trial's longest prompt plus its new tokens (``--cb-num-blocks``
  blocks of ``--cb-block-size`` tokens, one block per sequence); the scheduler admits a request only
  when a block is free (the CLI has no max-concurrent-sequences option of its own).
- no quantized KV cache (the paged cache holds the weights' dtype only), no speculation (continuous
  batching runs no assisted generation), no compiled decoding (the serving group drives servers
  eagerly; ``--compile`` is not used).
- models that need remote code are refused: the server runs with ``--no-trust-remote-code``.
"""

from trials.engines.spec import Engine

NAME = "transformers_serve"
BUILDS_ON = "transformers"
PRECISIONS = ("fp32", "bf16")
SLOTS_MAX = 64
EXTRA = "pip install -e '.[serving]'"


def guard(stack) -> str | None:
    if stack.compile:
        return "compiled decoding is not served: transformers serve runs continuous batching eagerly here"
    if stack.step_tokens:
        return "transformers serve has no per-step token budget to set (llama-server's -b): step_tokens must be 0"
    if stack.batch_size > SLOTS_MAX:
        return f"transformers serve is driven here with at most {SLOTS_MAX} sequences in flight (batch_size), got {stack.batch_size}"
    return None


def model_refusal(name: str, config: dict | None, stack) -> str | None:
    if config and config.get("auto_map"):
        return f"{name} needs remote code (auto_map in its config.json): transformers serve runs with --no-trust-remote-code"
    return None


SPEC = Engine(NAME, "transformers serve (continuous batching)", PRECISIONS, {}, guard, "transformers",
              "trials.engines.transformers_serve.backend",
              sixteen_bit=("bf16", "fp32"), proposers=(), devices=("cpu",), model_refusal=model_refusal,
              color="#AB63FA", version_tag="transformers_serve_version",
              serves=True, builds_on=(BUILDS_ON,), requires=("fastapi", "uvicorn", "openai", "rich"),
              install=EXTRA, start_s=25.0,
              caption="transformers' own server (transformers serve --continuous-batching) on 127.0.0.1, its paged KV "
                      "cache sized to hold batch_size sequences, fed the project's prompts as text (the same token ids "
                      "as the in-process engine, checked), greedy with end-of-sequence suppressed.")
