"""A zoo model's stand-in: its recipe's architecture with random weights, for timing before it is trained.

Why: the sweep sizes its whole plan to ``--budget`` before the first trial (``sweeps.budget``), and
on a fresh machine the zoo trains beside the first trials. What a step costs depends on the
architecture, precision and machine, not on the weights, so the recipe's shape with seeded random
weights is timed instead: same layers, heads, vocabulary, same loading path (``from_pretrained``,
quantizers included). The folder is temporary and removed after use; it is never mistaken for the
trained model (``is_built`` checks the card, which a stand-in does not have).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from trials.models.zoo.recipes import SETS, SPECIAL_TOKENS, _check_model


@contextlib.contextmanager
def stand_in(name: str):
    """A temporary folder holding ``name``'s architecture with seeded random weights and a word-level
    tokenizer of its vocabulary size; removed on exit."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from trials.models.zoo.training import _llama_config

    recipe = _check_model(name)
    vocab_size = SETS[recipe.zoo_set].vocab_size
    folder = Path(tempfile.mkdtemp(prefix=f"llm-sweeps-stand-in-{name}-"))
    try:
        torch.manual_seed(recipe.seed)
        AutoModelForCausalLM.from_config(_llama_config(recipe, vocab_size)).save_pretrained(folder)
        specials = list(SPECIAL_TOKENS)
        vocab = {token: i for i, token in enumerate(specials)}
        vocab.update({f"w{i}": i for i in range(len(specials), vocab_size)})
        tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=specials[-1]))
        PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=specials[0]).save_pretrained(folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
