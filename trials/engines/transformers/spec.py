"""The transformers engine's declaration (torch-free)."""

from trials.engines.spec import Engine

PRECISIONS = ("fp32", "bf16", "fp16", "int8", "nf4", "gptq")


def guard(stack) -> str | None:
    """Every stack of the seed's axes runs here (each technique guards its own), speculation at batch 1."""
    if stack.speculation != "none" and stack.batch_size != 1:
        return ("speculative decoding runs at batch_size 1 only "
                f"(transformers' assisted generation), got {stack.batch_size}")
    return None


SPEC = Engine("transformers", "transformers generate()", PRECISIONS, {"hqq": (8, 4, 2), "quanto": (4, 2)},
              guard, "transformers", "trials.engines.transformers.backend",
              sixteen_bit=("bf16", "fp32"),      # bf16, else fp32 where bf16 is emulated (the fast precision)
              four_bit=("nf4", "gptq"), cache_group_size=True, cache_scored=False,
              speculates_on_quantized_cache=False, proposers=("draft", "prompt_lookup"), measures_steps=True,
              as_code="trials.engines.transformers.arguments:code_for", color="#636EFA")
