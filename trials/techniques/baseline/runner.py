"""The baseline group: a model at a weight precision with nothing else switched on.

Nothing to compare against and nothing added to ``generate()``: load, measure, summarize. Every
other group's trials are read against these numbers on the dashboard.
"""

from __future__ import annotations

from trials import engines
from trials.config import Runtime, TrialConfig
from trials.loop import TrialResult, finish, measure, trial_prompts
from trials.models import loading


def run_baseline(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """Load, measure, summarize (the group's guard keeps KV quantization and speculation out)."""
    loaded = loading.load(config.entry(), config.stack.precision, config.device)
    prompts = trial_prompts(config, loaded)
    prepared = engines.backend(config.stack).prepare(config, loaded, prompts)
    return finish(config, runtime, loaded, measure(config, loaded, prompts, generate_kwargs=prepared.kwargs),
                  tags={"user_code": prepared.code})
