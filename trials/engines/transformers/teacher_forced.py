"""Teacher-forced next-token log-probabilities through a transformers cache of the stack's kind.

Each prompt's last ``forced`` tokens (real text) are fed one at a time after its prefix was pre-filled
into a fresh cache of the stack's kind, so every prediction reads the cache under test exactly as
decoding does, and one early error does not compound as it does in greedy outputs. The kv_cache and
stacks groups compare these with the reference's (``trials.measurement.quality.teacher_forced_metrics``).
"""

from __future__ import annotations

import torch

from trials.config import Stack, TrialConfig
from trials.engines.transformers.kv_cache import cache_kwarg, make_cache
from trials.models import loading
from trials.prompts import Prompt


def forced_length(config: TrialConfig, prompt_tokens: int) -> int:
    """How many of a prompt's last tokens are teacher-forced: ``max_new_tokens``, leaving a prefix."""
    return max(1, min(config.workload.max_new_tokens, prompt_tokens - 1))


def teacher_forced_logprobs(loaded: loading.LoadedModel, stack: Stack, prompt: Prompt,
                            forced: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities ``[forced, vocab]`` of the next token, the true tokens ``[forced]``).

    The prefix is pre-filled into a fresh cache of the stack's kind, then the last ``forced`` tokens
    are fed one per step, as decoding feeds them, so each prediction reads the cache under test.
    """
    ids = loaded.tokenizer(prompt.text, return_tensors="pt")["input_ids"].to(loaded.device)
    prefix, targets = ids[:, :-forced], ids[0, -forced:]
    cache = {cache_kwarg(loaded.model): make_cache(stack, loaded.model)}
    with torch.inference_mode():
        out = loaded.model(input_ids=prefix, use_cache=True, logits_to_keep=1, **cache)   # only the last is read
        logits = [out.logits[0, -1]]
        for step in range(forced - 1):
            out = loaded.model(input_ids=targets[None, step:step + 1], use_cache=True, **cache)
            logits.append(out.logits[0, -1])
    return torch.log_softmax(torch.stack(logits).float(), dim=-1).cpu(), targets.cpu()


def teacher_forced(config: TrialConfig, loaded: loading.LoadedModel, prompts: list[Prompt],
                   stack: Stack) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``teacher_forced_logprobs`` of every prompt: (log-probabilities, true tokens) per prompt."""
    pairs = [teacher_forced_logprobs(loaded, stack, p, forced_length(
        config, len(loaded.tokenizer(p.text)["input_ids"]))) for p in prompts]
    return [lp for lp, _ in pairs], [t for _, t in pairs]

