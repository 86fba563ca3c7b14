"""The engines group's declaration: the same models and prompts on every engine, and each
optimization's effect per engine."""

from trials import engines
from trials.models.registry import perplexity_method, reference_precision
from trials.techniques.spec import ProfileKey, Technique, built_in, shrink_eval_windows

NAME = "engines"


def guard(stack) -> str | None:
    if stack.batch_size != 1 or stack.compile or stack.speculation == "draft":
        return (f"the engines group compares engines at batch 1 on weights, KV cache and prompt lookup "
                f"(no batch, compiled decoding or draft model), got stack {stack.label}")
    return None


def cost(config, estimate) -> float:
    """The reference precision on the same prompts (once per model and workload), the trial's passes
    (an engine the budget does not calibrate is estimated at the default engine's step: an upper
    bound), and for a stack whose quality is scored the perplexity windows through the reference and
    the stack."""
    w = config.workload
    ref = estimate.step(config.model, reference_precision(config.entry(), config.device)) or estimate.cost
    return (estimate.once((NAME, config.model, w), estimate.generate_s(ref, w.max_new_tokens, 1, 1))
            + estimate.plain + shared_cost(config, estimate))


def shared_cost(config, estimate) -> float:
    """The perplexity windows through the reference and the stack, for a stack whose quality is
    scored: once per measurement (``TrialConfig.measurement_hash``), so a run another group measured
    and this group charts counts them once, whichever runner scores them."""
    s = config.stack
    if s.speculation != "none" or (s.kv_bits != 16 and not engines.get(s.engine).cache_scored):
        return 0.0
    method = perplexity_method(config.entry(), config.workload.eval_windows)
    ref = estimate.step(config.model, reference_precision(config.entry(), config.device)) or estimate.cost
    windows = method.windows * method.context * (ref.scored_s + estimate.cost.scored_s)
    return estimate.once((NAME, "windows", config.measurement_hash), windows)


SPEC = Technique(
    NAME, "Engines: the same optimizations on every engine", order=6,
    guard=guard,
    **built_in(NAME, "run_engine_trial"),
    reference="the default engine at the model's reference precision on the same prompt token ids, once "
              "per worker, model and workload (tag reference_source)",
    profile_keys={"weights": ProfileKey("weight", many=True, optional=True),        # else each engine's own
                  "caches": ProfileKey("cache", many=True, optional=True),         # (``Engine.levels``)
                  "lookup_k": ProfileKey("int", low=1, high=64),
                  "eval_windows": ProfileKey("int", low=1, high=100_000, optional=True),
                  "engines": ProfileKey("engine", many=True, optional=True)},
    cost=cost, calibrates_reference=True, shrink=shrink_eval_windows, engines=None,
    shared_numbers="trials.techniques.engines.runner:numbers_on_shared_run", shared_cost=shared_cost,
)
