"""The transformers engine in a worker (``trials.engines.spec.Backend``): the model loaded under
the stack's precision (``trials.models.loading``), ``generate()`` with the stack's arguments, its
logits for teacher-forced quality."""

from __future__ import annotations

from trials.config import TrialConfig
from trials.engines.spec import Prepared
from trials.engines.transformers import compiled, generation
from trials.engines.transformers.teacher_forced import teacher_forced   # noqa: F401  (the interface)
from trials.engines.transformers.generation import facts, generate_batch   # noqa: F401  (the interface)
from trials.engines.transformers.step_cost import measure as step_cost   # noqa: F401  (the interface)
from trials.loop import trial_prompts
from trials.measurement.quality import transformers_logits
from trials.models import loading
from trials.models.registry import reference_precision


def load(config: TrialConfig):
    loaded = loading.load(config.entry(), config.stack.precision, config.device)
    return loaded, trial_prompts(config, loaded)


def prepare(config: TrialConfig, loaded, prompts) -> Prepared:
    """The stack's ``generate()`` keywords and code; under compiled decoding, dynamo's counters
    before the warm-up compiles the step (``trial_facts`` reports what it compiled)."""
    prepared = generation.prepare(config, loaded, prompts)
    if config.stack.compile:
        prepared.before = compiled.dynamo_counts()
    return prepared


def trial_facts(config: TrialConfig, loaded, measured, prompts,
                prepared: Prepared) -> tuple[dict[str, float], dict[str, str]]:
    """The engine's tag and, under compiled decoding, the warm-up that compiled the step, the graphs
    dynamo made and whether it gave up (then the step ran eagerly)."""
    metrics, tags = {}, {"engine": config.stack.engine}
    if config.stack.compile:
        graphs, fallback = compiled.compile_record(prepared.before)
        metrics = {"compile_warmup_s": measured.warmup_s, **graphs}
        tags.update(fallback, compile_method=compiled.describe())
    return metrics, tags


def scorer(config: TrialConfig, loaded, context: int):
    """The model's logits for every position (None: the stack is the reference precision itself);
    a quantized cache is not scored teacher-forced (it keeps its last 128 tokens in full precision,
    so a window would not exercise it: the kv_cache group scores it by decoding through it)."""
    stack = config.stack
    if stack.kv_bits != 16:
        return ("a transformers quantized cache keeps 128 tokens in full precision: the kv_cache group "
                "measures its KL by decoding through it")
    if stack.precision == reference_precision(config.entry(), config.device):
        return None
    return transformers_logits(loaded.model)
