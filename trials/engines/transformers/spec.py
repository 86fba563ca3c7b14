"""The transformers engine's declaration (torch-free)."""

from trials.engines.spec import Engine

PRECISIONS = ("fp32", "bf16", "fp16", "int8", "nf4", "gptq")
QUANTIZED = ("int8", "nf4", "gptq")     # weights a quantizer makes at load time (trials.models.loading)


def guard(stack) -> str | None:
    """Every stack of the seed's axes runs here (each technique guards its own), speculation at batch 1,
    compiled decoding on a 16-bit cache without speculation, on weights torch.compile can trace."""
    if stack.speculation != "none" and stack.batch_size != 1:
        return ("speculative decoding runs at batch_size 1 only "
                f"(transformers' assisted generation), got {stack.batch_size}")
    if stack.compile and (stack.kv_bits != 16 or stack.speculation != "none"):
        return ("compiled decoding runs on transformers' static cache, which neither a quantized KV "
                "cache nor speculation (it must crop its cache) can use")
    if stack.compile and stack.precision in QUANTIZED:
        return (f"compiled decoding and {stack.precision} weights cannot run together: transformers "
                "does not compile a model whose quantizer is not compileable (bitsandbytes, GPTQ), "
                "so generate() would decode uncompiled")
    return None


SPEC = Engine("transformers", "transformers generate()", PRECISIONS, {"hqq": (8, 4, 2), "quanto": (4, 2)},
              guard, "transformers", "trials.engines.transformers.backend",
              sixteen_bit=("bf16", "fp32"),      # bf16, else fp32 where bf16 is emulated (the fast precision)
              four_bit=("nf4", "gptq"), cache_group_size=True, cache_scored=False,
              speculates_on_quantized_cache=False, proposers=("draft", "prompt_lookup"), measures_steps=True,
              as_code="trials.engines.transformers.arguments:code_for", color="#636EFA",
              levels={"default": {"weights": ("nf4",), "caches": ("hqq8", "quanto4")}})
