"""The engines group's declaration: the same models and prompts on llama.cpp beside transformers,
and each optimization's effect per engine."""

from trials.techniques.spec import ProfileKey, Technique

NAME = "engines"


def guard(stack) -> str | None:
    if stack.batch_size != 1 or stack.compile or stack.speculation == "draft":
        return (f"the engines group compares engines at batch 1 on weights, KV cache and prompt lookup "
                f"(no batch, compiled decoding or draft model), got stack {stack.label}")
    return None


def cost(config, estimate) -> float:
    """The transformers reference precision on the same prompts (once per model and workload), then
    the trial's passes (llama.cpp's are faster than the estimate's transformers step: an upper bound)."""
    return estimate.once((NAME, config.model, config.workload), estimate.plain) + estimate.plain


SPEC = Technique(
    NAME, "Engines: the same optimizations on llama.cpp beside transformers", order=6,
    guard=guard,
    runner="trials.techniques.engines.runner:run_engine_trial",
    space="trials.techniques.engines.space:plan",
    section="dashboard.sections.engines",
    reference="transformers at the model's reference precision on the same prompt token ids, once "
              "per worker, model and workload (tag reference_source)",
    profile_keys={"gguf_types": ProfileKey("gguf", many=True), "caches": ProfileKey("cache", many=True),
                  "lookup_k": ProfileKey("int", low=1, high=64)},
    cost=cost, engines=("transformers", "llama_cpp"),
)
