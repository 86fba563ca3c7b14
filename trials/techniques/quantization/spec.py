"""The quantization group's declaration: fp32/bf16/int8/nf4/GPTQ weights, with perplexity."""

from trials.models.registry import perplexity_method, reference_precision
from trials.config import Stack
from trials.techniques.spec import (DeviceCheck, ProfileKey, Technique, built_in, only_weights_and_batch,
                                    shrink_eval_windows)

NAME = "quantization"


def cost(config, estimate) -> float:
    """The reference precision's outputs and perplexity (once per model and workload), then this
    precision's passes and perplexity windows."""
    s, w = config.stack, config.workload
    method = perplexity_method(config.entry(), w.eval_windows)
    ppl_tokens = method.windows * method.context
    ref = estimate.step(config.model, reference_precision(config.entry(), config.device)) or estimate.cost
    reference = (estimate.generate_s(ref, w.max_new_tokens, repeats=1, batch=s.batch_size)
                 + ppl_tokens * ref.scored_s)
    return (estimate.once((NAME, config.model, w, s.batch_size), reference)
            + estimate.plain + ppl_tokens * estimate.cost.scored_s)


def device_checks(setup) -> list[DeviceCheck]:
    """On a device: the 16/32-bit precisions, then bitsandbytes' int8 and NF4 kernels."""
    return [DeviceCheck(Stack(precision=setup.fast), min_budget_s=30),
            DeviceCheck(Stack(precision=setup.other)),
            DeviceCheck(Stack(precision="int8"), needs=setup.bnb_missing, min_budget_s=5),
            DeviceCheck(Stack(precision="nf4"), needs=setup.bnb_missing, min_budget_s=5)]


SPEC = Technique(
    NAME, "Weight quantization: fp32/bf16/int8/nf4/GPTQ weights", order=4,
    guard=only_weights_and_batch(NAME),
    **built_in(NAME, "run_quantization"),
    reference="the reference precision's greedy outputs and perplexity, once per worker, model "
              "and workload (tag reference_source)",
    profile_keys={"precisions": ProfileKey("precision", many=True),
                  "eval_windows": ProfileKey("int", low=1, high=100_000, optional=True)},
    cost=cost, calibrates_reference=True, shrink=shrink_eval_windows,
    device_checks=device_checks,
)
