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
    """The cache under test, each prompt generated and teacher-forced over its last ``max_new_tokens``
    tokens. The full-precision cache is its own reference; another needs the reference: one pass and
    its teacher-forced predictions, once per worker, model and workload (``runner.reference``)."""
    s, w = config.stack, config.workload
    teacher_forced = estimate.teacher_forced_s(estimate.cost)
    key = (NAME, config.model, s.precision, w)
    if s.kv_bits == 16:
        return estimate.once(key, 0.0) + estimate.plain + teacher_forced     # this worker now holds it
    one_pass = estimate.generate_s(estimate.cost, w.max_new_tokens, 1, s.batch_size)
    factor = HQQ_FACTOR if s.kv_backend == "hqq" else 1.0
    return estimate.once(key, one_pass + teacher_forced) + (estimate.plain + teacher_forced) * factor


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
