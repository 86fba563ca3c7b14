"""Speculation on transformers: the draft model a stack proposes with, set up as assisted generation
wants it (a constant k per round). The ``generate()`` keywords are the stack's description
(``arguments.generate_arguments``); prompt lookup needs nothing here.
"""

from __future__ import annotations

from trials.config import TrialConfig
from trials.errors import ConfigError
from trials.models import loading


def load_draft(config: TrialConfig, target: loading.LoadedModel) -> loading.LoadedModel:
    """The trial's draft model.

    A model used as its own draft (the test of the counting: acceptance must be exactly 1) gets a
    separate copy, so that its passes as a draft are not counted as target passes.
    """
    if config.stack.draft_model == config.model:
        return loading.load_copy(config.entry(), config.stack.precision, config.device)
    return loading.load(config.entry(config.stack.draft_model), config.stack.precision, config.device)


def same_vocabulary(draft: loading.LoadedModel, target: loading.LoadedModel) -> bool:
    """Same token ids (plain assisted generation), else the draft's text is re-tokenized."""
    return (draft.model.config.vocab_size == target.model.config.vocab_size
            and draft.tokenizer.get_vocab() == target.tokenizer.get_vocab())


def configured_draft(config: TrialConfig, target: loading.LoadedModel):
    """The draft model, set to propose a constant k tokens per round (``num_assistant_tokens`` on
    its generation config: given to ``generate()`` it is ignored). A draft of another tokenizer with
    the same vocabulary size cannot draft: transformers tells the two kinds apart by size alone."""
    stack = config.stack
    loaded = load_draft(config, target)
    draft = loaded.model
    settings = draft.generation_config
    settings.num_assistant_tokens = stack.num_draft_tokens
    settings.num_assistant_tokens_schedule = "constant"
    settings.assistant_confidence_threshold = 0.0
    if not same_vocabulary(loaded, target) and draft.config.vocab_size == target.model.config.vocab_size:
        raise ConfigError(f"draft {stack.draft_model!r} has a different tokenizer than target "
                          f"{config.model!r} but the same vocab_size; transformers' assisted generation "
                          "would mix their token ids, and its cross-tokenizer mode needs the sizes to differ")
    return draft
