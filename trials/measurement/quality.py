"""Quality against a reference, one module for every technique: the reference itself (greedy outputs
and what a group scores beside them, measured once per worker and reused), and the teacher-forced
comparisons: KL divergence of next-token distributions, top-1 agreement and perplexity.

``compare``: a stack on any engine against the model's reference precision (on the default engine),
on the very same token windows: perplexity, the reference's perplexity, and the mean KL divergence
of the candidate's next-token distribution from the reference's.

The windows are ``trials.measurement.perplexity.heldout_windows`` of the model's perplexity method
(the quantization group's text, context and stride), tokenized by the transformers tokenizer; every
engine is fed those ids. Per window the reference and the candidate (its engine's ``scorer``: the
logits of every position) give log-probabilities in fp32 for every position; the
scored positions are the strided sliding window's (no token scored twice). One window at a time: a
262k-token vocabulary (Gemma-3) makes whole batches of logits too large to keep.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from trials.measurement.perplexity import heldout_windows
from trials.worker import WORKER


# ------------------------------------------------------------------------------ the reference

@dataclass
class Reference:
    """What a trial is compared with: the reference stack's greedy outputs on the trial's prompts,
    and what a group scores beside them (teacher-forced log-probabilities and true tokens, a
    perplexity, the parameter count)."""

    precision: str
    outputs: dict[str, list[int]]
    logprobs: list[torch.Tensor] | None = None
    targets: list[torch.Tensor] | None = None
    perplexity: Any = None
    num_parameters: int = 0


def reference(memo: str, reference_hash: str, measured_by: str, make: Callable[[], Reference],
              this_trial: Reference | None = None, max_age_s: float | None = 30 * 60,
              keep_latest: bool = False) -> tuple[Reference, str]:
    """The reference, with where it came from: ``this_trial`` when the trial is the reference stack
    itself, else the one this worker measured recently (the memo ``memo``, keyed by the reference
    config's hash), else ``make()`` now. ``keep_latest`` bounds memory to one reference."""
    store = WORKER.memo(memo, max_age_s=max_age_s, keep_latest=keep_latest)
    if this_trial is not None:
        return store.put(reference_hash, measured_by, this_trial), "this trial"
    return store.get(reference_hash, measured_by, make)


# ------------------------------------------------------------------------------ teacher-forced scores

def kl_per_position(reference: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """KL(reference || candidate) of each row's next-token distribution, from log-probabilities
    (rounding can make an identical pair a hair below 0: clamped)."""
    return (reference.exp() * (reference - candidate)).sum(-1).clamp_min(0.0)


def teacher_forced_metrics(reference: list[torch.Tensor], logprobs: list[torch.Tensor],
                           targets: list[torch.Tensor]) -> dict[str, float]:
    """KL(reference || this), top-1 agreement and perplexities over every teacher-forced position."""
    ref, this, true = torch.cat(reference), torch.cat(logprobs), torch.cat(targets)
    kl = kl_per_position(ref, this)
    nll_ref = -ref.gather(1, true[:, None]).mean()
    nll = -this.gather(1, true[:, None]).mean()
    ppl_ref, ppl = math.exp(float(nll_ref)), math.exp(float(nll))
    return {"kl_divergence": float(kl.mean()), "kl_divergence_max": float(kl.max()),
            "teacher_forced_top1_match": float((ref.argmax(-1) == this.argmax(-1)).float().mean()),
            "teacher_forced_tokens": float(true.numel()),
            "reference_perplexity": ppl_ref, "perplexity": ppl, "perplexity_delta": ppl - ppl_ref,
            "perplexity_ratio": ppl / ppl_ref}


# ------------------------------------------------------------------------------ perplexity windows


@dataclass
class Quality:
    perplexity: float
    reference_perplexity: float
    kl_divergence: float          # nats per scored token, KL(reference || candidate)
    tokens: int
    windows: int
    seconds: float
    corpus_hash: str
    vocab_note: str = ""          # where the two vocabularies differ in size

    def metrics(self) -> dict[str, float]:
        return {"perplexity": self.perplexity, "reference_perplexity": self.reference_perplexity,
                "perplexity_ratio": self.perplexity / self.reference_perplexity,
                "perplexity_delta": self.perplexity - self.reference_perplexity,
                "kl_divergence": self.kl_divergence, "perplexity_tokens": float(self.tokens),
                "perplexity_windows": float(self.windows), "perplexity_s": self.seconds}


def transformers_logits(model) -> Callable[[list[int]], torch.Tensor]:
    def logits(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids], device=model.device), use_cache=False).logits[0]
        return out.float().cpu()
    return logits


def compare(reference_model, tokenizer, method, candidate: Callable[[list[int]], torch.Tensor] | None) -> Quality:
    """The candidate's perplexity and KL against the reference model on ``method``'s windows;
    ``candidate`` None: the reference itself (KL 0)."""
    started = time.perf_counter()
    windows, first, corpus_hash = heldout_windows(tokenizer, method)
    reference = transformers_logits(reference_model)
    nll = nll_ref = kl = 0.0
    tokens, note = 0, ""
    for row, start in zip(windows.tolist(), first.tolist()):
        targets = torch.tensor(row[1:])
        ref = F.log_softmax(reference(row)[:-1], dim=-1)
        cand = ref if candidate is None else F.log_softmax(candidate(row)[:-1].float(), dim=-1)
        if cand.shape[-1] != ref.shape[-1]:
            width = min(cand.shape[-1], ref.shape[-1])
            note = f"vocabularies differ ({ref.shape[-1]} vs {cand.shape[-1]}): compared on the first {width}"
            ref, cand = ref[:, :width], F.log_softmax(cand[:, :width], dim=-1)
        scored = slice(start - 1, None)
        idx = torch.arange(len(targets))[scored]
        nll_ref -= float(ref[idx, targets[scored]].double().sum())
        nll -= float(cand[idx, targets[scored]].double().sum())
        kl += float(kl_per_position(ref[scored], cand[scored]).double().sum())
        tokens += len(idx)
    return Quality(math.exp(nll / tokens), math.exp(nll_ref / tokens), kl / tokens, tokens, len(windows),
                   time.perf_counter() - started, corpus_hash, note)
