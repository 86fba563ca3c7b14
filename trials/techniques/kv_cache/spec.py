"""The kv_cache group's declaration: 16/8/4/2-bit caches at growing contexts."""

from trials.config import Stack
from trials.techniques.spec import DeviceCheck, ProfileKey, Technique, built_in

NAME = "kv_cache"
HQQ_FACTOR = 1.5        # HQQ optimizes every group at prefill and every residual refill


def guard(stack) -> str | None:
    if stack.speculation != "none":
        return f"the kv_cache group measures the cache without speculation, got stack {stack.label}"
    return None


def cost(config, estimate) -> float:
    """The full-precision reference (once per model and workload), then the cache under test, each
    with a teacher-forced pass over the last ``max_new_tokens`` tokens of every prompt."""
    s, w = config.stack, config.workload
    teacher_forced = estimate.teacher_forced_s(estimate.cost)
    total = estimate.once((NAME, config.model, s.precision, w), estimate.plain + teacher_forced)
    factor = HQQ_FACTOR if s.kv_backend == "hqq" else 1.0
    return total + (estimate.plain + teacher_forced) * factor


def device_checks(setup) -> list[DeviceCheck]:
    """On a device: the full cache and a 4-bit one at the long context."""
    return [DeviceCheck(Stack(precision=setup.fast), long_context=True, min_budget_s=30),
            DeviceCheck(Stack(precision=setup.fast, kv_bits=4, kv_backend=setup.kv_backend),
                        long_context=True, needs=setup.kv_missing, min_budget_s=30)]


SPEC = Technique(
    NAME, "KV-cache quantization: 16/8/4/2-bit caches at growing contexts", order=2,
    guard=guard,
    **built_in(NAME, "run_kv_cache"),
    reference="the full-precision cache on the same prompts, measured once per worker, model "
              "and workload, reused for 30 minutes (tag reference_source)",
    profile_keys={"contexts": ProfileKey("int", many=True, low=16, high=10_000_000),
                  "caches": ProfileKey("cache", many=True)},
    cost=cost,
    device_checks=device_checks,
)
