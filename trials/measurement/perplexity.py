"""Held-out perplexity: the one place next-token NLL over text windows is computed.

Used by the zoo (each model's card) and by the quantization group (each precision against its
reference). The text and its windows are a ``trials.models.corpus.PerplexityMethod`` (which held-out
documents, context, stride, how many windows per source; ``trials.models.registry.perplexity_method``
picks one per model). Per source, windows of ``context`` tokens start every ``stride`` tokens; the
first window scores all its tokens, later ones only their last ``stride`` tokens, so every scored
token sees at least ``context - stride`` tokens of context and none is scored twice (the strided
sliding window of Hugging Face's "Perplexity of fixed-length models"). ``perplexity`` = exp(mean
NLL) over the scored tokens, with log-softmax in fp32 whatever the model's dtype.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trials.errors import ConfigError
from trials.models.corpus import PerplexityMethod, build_corpus

LOGITS_BUDGET = 64 * 1024 * 1024       # fp32 logits per scoring chunk (elements)


@dataclass
class Perplexity:
    perplexity: float
    nll_sum: float
    tokens: int                 # scored tokens
    windows: int
    seconds: float
    corpus_hash: str            # of the corpus whose held-out documents were scored


def split_windows(total: int, weights: tuple[tuple[str, float], ...]) -> dict[str, int]:
    """``total`` windows shared among sources by weight (at least one per weighted source)."""
    return {source: max(1, round(total * weight)) for source, weight in weights if weight > 0}


def token_stream(tokenizer, documents) -> torch.Tensor:
    """Documents tokenized one by one, each followed by EOS, as one stream of ids."""
    ids: list[int] = []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for doc in documents:
        ids += tokenizer(doc.text, add_special_tokens=False, verbose=False)["input_ids"] + eos
    return torch.tensor(ids, dtype=torch.long)


def text_windows(tokenizer, method: PerplexityMethod) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``heldout_windows`` of ``method.text_file``: one token stream; with ``method.bos`` each window
    is BOS + ``context - 1`` text tokens (scored from the first text token in the first window)."""
    text = open(method.text_file, encoding="utf-8").read()
    stream = torch.tensor(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"], dtype=torch.long)
    span = method.context - 1 if method.bos else method.context
    fits = 0 if len(stream) < span else 1 + (len(stream) - span) // method.stride
    if fits < method.windows:
        raise ConfigError(f"{method.text_file} holds {len(stream)} tokens: {fits} windows of {span}, "
                          f"{method.windows} asked")
    rows, first = [], []
    for i in range(method.windows):
        row = stream[i * method.stride:i * method.stride + span]
        if method.bos:
            row = torch.cat([torch.tensor([tokenizer.bos_token_id]), row])
        rows.append(row)
        first.append(1 if i == 0 else method.context - method.stride)
    return torch.stack(rows), torch.tensor(first), hashlib.sha256(text.encode()).hexdigest()[:16]


def heldout_windows(tokenizer, method: PerplexityMethod) -> tuple[torch.Tensor, torch.Tensor, str]:
    """[windows, context] token ids, each window's first scored position, and the corpus hash."""
    if method.text_file:
        return text_windows(tokenizer, method)
    corpus = build_corpus(method.corpus)
    rows, first = [], []
    for source, count in split_windows(method.windows, method.weights).items():
        stream = token_stream(tokenizer, corpus.heldout[source])
        fits = 0 if len(stream) < method.context else 1 + (len(stream) - method.context) // method.stride
        for i in range(min(count, fits)):
            rows.append(stream[i * method.stride:i * method.stride + method.context])
            first.append(1 if i == 0 else method.context - method.stride)
    if not rows:
        raise ConfigError(f"held-out text is shorter than one perplexity window ({method.context} tokens)")
    return torch.stack(rows), torch.tensor(first), corpus.corpus_hash


def score_windows(model: torch.nn.Module, windows: torch.Tensor,
                  first: torch.Tensor | None = None) -> tuple[float, int]:
    """(sum of next-token NLL, tokens scored) over ``windows`` [n, context]; row i scores its targets
    from position ``first[i]`` on (every target when ``first`` is None)."""
    context = windows.shape[1]
    first = torch.ones(len(windows), dtype=torch.long) if first is None else first
    mask = torch.arange(1, context)[None, :] >= first[:, None]          # [n, context - 1]
    device = next(model.parameters()).device
    chunk = max(1, min(8, LOGITS_BUDGET // (context * model.config.vocab_size)))
    nll_sum = 0.0
    with torch.inference_mode():
        for i in range(0, len(windows), chunk):
            batch = windows[i:i + chunk].to(device)
            logits = model(input_ids=batch, use_cache=False).logits[:, :-1].float()
            nll = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
            nll_sum += float(nll[mask[i:i + chunk].to(nll.device)].double().sum())
    return nll_sum, int(mask.sum())


def perplexity(model: torch.nn.Module, tokenizer, method: PerplexityMethod) -> Perplexity:
    """exp(mean NLL) of the scored tokens of ``heldout_windows``."""
    started = time.perf_counter()
    windows, first, corpus_hash = heldout_windows(tokenizer, method)
    nll_sum, tokens = score_windows(model, windows, first)
    return Perplexity(math.exp(nll_sum / tokens), nll_sum, tokens, len(windows),
                      time.perf_counter() - started, corpus_hash)
