"""How a zoo model is scored (held-out perplexity, greedy samples) and the gate a built set must pass.

Perplexity is measured on non-overlapping windows of each set's held-out text (the last ~5% of each
source's documents; the same windows for every model of a set, fp32), so numbers inside a set are
comparable. The gate: each target's held-out perplexity must be below its draft's, else the build
raises ``ZooQualityError`` (the models stay cached for inspection). In the full set every model's
greedy continuations of ``CODE_PROMPTS`` (stored in the card as ``samples``) are also checked to look
like Python, as a logged warning only: greedy text of these toys flips with the CPU's numerics, and
perplexity is what the sweeps depend on.
"""

from __future__ import annotations

import logging
import math

from trials.models.corpus import SOURCES
from trials.models.zoo.cache import CORPUS_IDS_FILE, tokenizer_path
from trials.models.zoo.recipes import _check_set

log = logging.getLogger("trials.models.zoo")

CODE_PROMPTS = ("def __init__(self", "import os\n\n\ndef main():")
SAMPLE_NEW_TOKENS = 48


class ZooQualityError(RuntimeError):
    """A freshly built (or cached) set failed the quality gate."""


def heldout_windows(set_name: str, ids: dict | None = None):
    """The held-out evaluation batch of a set: [windows, eval_seq_len] token ids, fixed."""
    import torch

    s = _check_set(set_name)
    if ids is None:
        ids = torch.load(tokenizer_path(set_name) / CORPUS_IDS_FILE, weights_only=True)
    weights = dict(s.eval_source_weights)
    rows = []
    for source in SOURCES:
        stream = ids[f"heldout/{source}"]
        wanted = max(1, round(s.eval_windows * weights.get(source, 0.0)))
        available = len(stream) // s.eval_seq_len
        for i in range(min(wanted, available)):
            rows.append(stream[i * s.eval_seq_len:(i + 1) * s.eval_seq_len])
    return torch.stack(rows).long()


def heldout_perplexity(model, windows) -> float:
    """exp(mean next-token NLL) over the windows, every target scored (``trials.measurement.perplexity``)."""
    from trials.measurement.perplexity import score_windows  # torch: imported only by a build

    model.eval()
    nll_sum, tokens = score_windows(model, windows)
    return math.exp(nll_sum / tokens)


def greedy_samples(model, tokenizer, prompts=CODE_PROMPTS, max_new_tokens=SAMPLE_NEW_TOKENS) -> dict[str, str]:
    import torch

    out = {}
    model.eval()
    for prompt in prompts:
        enc = tokenizer(prompt, return_tensors="pt")
        with torch.inference_mode():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        out[prompt] = tokenizer.decode(gen[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


def looks_like_python(text: str) -> bool:
    """Crude check that a continuation is recognisably Python: indentation plus Python words."""
    indented = any(line.startswith("    ") and line.strip() for line in text.splitlines())
    keywords = ("self.", "return", "def ", "if ", "for ", "import ", " = ", "raise ", "None")
    return indented and any(k in text for k in keywords)


def quality_problems(set_name: str, cards: dict[str, dict]) -> list[str]:
    """The quality gate: targets beat their drafts on held-out ppl; full targets write Python."""
    problems = []
    for name, card in cards.items():
        if card["role"] != "target":
            continue
        draft = card.get("default_draft")
        if draft in cards and card["heldout_perplexity"] >= cards[draft]["heldout_perplexity"]:
            problems.append(f"{name}: held-out ppl {card['heldout_perplexity']:.2f} is not below its draft "
                            f"{draft}'s {cards[draft]['heldout_perplexity']:.2f}")
    if set_name == "full":
        for name, card in cards.items():
            for prompt, text in card.get("samples", {}).items():
                if not looks_like_python(text):
                    log.warning("%s: greedy continuation of %r does not look like Python: %r",
                                name, prompt, text)
    return problems
