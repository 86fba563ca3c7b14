"""The stacks group's declaration: techniques combined in one trial, and each one's effect."""

from trials import engines
from trials.models.registry import reference_precision
from trials.config import Stack
from trials.techniques.spec import DeviceCheck, ProfileKey, Technique, built_in, shrink_eval_windows

NAME = "stacks"
COMPILE_S = 40.0          # torch.compile of the decode step in the warm-up (CPU, inductor)
SPEC_NEEDS_CROP = ("KV-cache quantization and speculation cannot run together: transformers' assisted "
                   "generation must crop the cache after each rejected draft, and QuantizedCache cannot "
                   "be cropped")


def guard(stack) -> str | None:
    crops = engines.get(stack.engine).speculates_on_quantized_cache
    return SPEC_NEEDS_CROP if not crops and stack.kv_bits != 16 and stack.speculation != "none" else None


def cost(config, estimate) -> float:
    """Once per model and workload: the base stack (full repeats) and the reference precision's
    outputs and teacher-forced predictions; then the stack itself, with its draft's steps and, where
    weights or cache are quantized, its own teacher-forced pass. A cell on another engine is measured
    as the engines group measures it (its cost model), beside the same base stack."""
    s, w = config.stack, config.workload
    reference = reference_precision(config.entry(), config.device)
    ref = estimate.step(config.model, reference) or estimate.cost
    forced = estimate.teacher_forced_s(ref)
    total = estimate.once((NAME, config.model, w),
                          estimate.generate_s(ref, w.max_new_tokens, repeats=config.repeats + 1, batch=1) + forced)
    if s.engine != engines.DEFAULT:
        from trials.techniques.engines.spec import cost as engine_cell_cost

        return total + engine_cell_cost(config, estimate)
    total += estimate.draft_s()
    if s.kv_bits != 16 or s.precision != reference:
        total += forced * estimate.cost.decode_s / ref.decode_s
    return total + estimate.plain + (COMPILE_S if s.compile else 0.0)


def shrink(config, workload, prompts_divisor: int):
    """A cell on another engine scores the perplexity windows the engines group scores at the same
    level (``shrink_eval_windows``), so the same stack's quality rests on the same windows in both
    groups; the default engine's cells score teacher-forced prompts, not windows."""
    if config.stack.engine == engines.DEFAULT:
        return workload
    return shrink_eval_windows(config, workload, prompts_divisor)


def select(configs: list, names: list[str], source: str) -> list:
    """The trials whose stack is one of ``names`` (a sweep file's ``stacks:``).

    ``base`` names the design's base stack, whatever precision runs fast here (bf16 where it is
    native, fp32 on a CPU that emulates bf16), so one sweep file serves every machine."""
    from trials.config import Stack
    from trials.errors import ConfigError
    from trials.measurement.hardware import fast_precision

    planned = list(dict.fromkeys(c.stack.design_name for c in configs))
    base = Stack(precision=fast_precision(configs[0].device)).design_name if configs else "none"
    names = [base if name == "base" else name for name in names]
    unknown = [name for name in names if name not in planned]
    if unknown:
        raise ConfigError(f"{source}: stacks: {', '.join(map(repr, unknown))} not in the stacks group's "
                          f"plan here; planned: base ({base} here), {', '.join(n for n in planned if n != base)}")
    return [c for c in configs if c.stack.design_name in names]


def device_checks(setup) -> list[DeviceCheck]:
    """On a device: the base stack, then compiled decoding (the slowest to warm up: last)."""
    return [DeviceCheck(Stack(precision=setup.fast), min_budget_s=30),
            DeviceCheck(Stack(precision=setup.fast, compile=True), min_budget_s=90)]


SPEC = Technique(
    NAME, "How much did optimizations help? Techniques combined in one trial", order=5,
    guard=guard,
    **built_in(NAME, "run_stack"),
    reference="the base stack (fast precision, full cache, no speculation) for speed and memory "
              "(tag baseline_source), the reference precision's greedy outputs and "
              "teacher-forced predictions for quality (tag reference_source); each once per "
              "worker, model and workload, reused for 30 minutes",
    profile_keys={"draft_k": ProfileKey("int", low=1, high=64), "kv_cache": ProfileKey("cache"),
                  "batch_size": ProfileKey("int", low=2, high=65_536),
                  "compile_interactions": ProfileKey("bool")},
    cost=cost, shrink=shrink, calibrates_reference=True, select=select, space_reads_store=True,
    device_checks=device_checks, engines=None, hosts_shared_runs=True,
)
