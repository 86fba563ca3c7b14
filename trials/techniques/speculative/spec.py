"""The speculative group's declaration: a draft model or prompt lookup proposes k tokens."""

from trials.config import Stack
from trials.techniques.spec import DeviceCheck, ProfileKey, Technique, built_in

NAME = "speculative"
K = ProfileKey("int", many=True, low=1, high=64)     # draft tokens per round: beyond 64 none is accepted


def guard(stack) -> str | None:
    if stack.speculation == "none":
        return "the speculative group needs speculation 'draft' or 'prompt_lookup'"
    if stack.kv_bits != 16:
        return f"the speculative group keeps the full-precision KV cache, got stack {stack.label}"
    return None


def cost(config, estimate) -> float:
    """The no-speculation baseline of the same prompts (once per model and workload), then the
    speculative run: about as long, give or take the speedup, plus the draft's steps."""
    s, w = config.stack, config.workload
    total = estimate.once((NAME, config.model, s.precision, w), estimate.plain)
    return total + estimate.plain + estimate.draft_s()


def device_checks(setup) -> list[DeviceCheck]:
    """On a device: prompt lookup and the draft model, k = 4."""
    return [DeviceCheck(Stack(precision=setup.fast, speculation="prompt_lookup", num_draft_tokens=4)),
            DeviceCheck(Stack(precision=setup.fast, speculation="draft", draft_model=setup.draft,
                              num_draft_tokens=4))]


SPEC = Technique(
    NAME, "Speculative decoding: a draft model or prompt lookup proposes k tokens", order=1,
    guard=guard,
    **built_in(NAME, "run_speculative"),
    reference="the same prompts without speculation, measured once per worker, model and "
              "workload, reused for 15 minutes (tag baseline_source)",
    profile_keys={"draft_k": K, "lookup_k": K},
    cost=cost,
    device_checks=device_checks,
)
