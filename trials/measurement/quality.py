"""Teacher-forced quality of a stack on any engine, against the model's reference precision (on the
default engine), on the very same token windows: perplexity, the reference's perplexity, and the
mean KL divergence of the candidate's next-token distribution from the reference's.

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
from typing import Callable

import torch
import torch.nn.functional as F

from trials.measurement.perplexity import heldout_windows


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
        kl += float((ref[scored].exp() * (ref[scored] - cand[scored])).sum().double())
        tokens += len(idx)
    return Quality(math.exp(nll / tokens), math.exp(nll_ref / tokens), kl / tokens, tokens, len(windows),
                   time.perf_counter() - started, corpus_hash, note)
