"""A zoo model's stand-in: its recipe's architecture with random weights, for timing before it is trained.

Why: the sweep sizes its whole plan to ``--budget`` before the first trial (``sweeps.budget``), and
on a fresh machine the zoo trains beside the first trials. What a step costs depends on the
architecture, precision and machine, not on the weights, so the recipe's shape with seeded random
weights is timed instead: same layers, heads, vocabulary, same loading path (``from_pretrained``,
quantizers included; an engine that converts a model builds its files in ``derived_dir``, inside the
same temporary root). The folder is temporary and removed after use; it is never mistaken for the
trained model (``is_built`` checks the card, which a stand-in does not have).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from trials.models.zoo.recipes import SETS, SPECIAL_TOKENS, _check_model


MARK = ".stand-in"


def derived_dir(folder: Path) -> Path | None:
    """Where an engine keeps files made from the model in ``folder`` when it is a stand-in (removed with
    it, never in a cache), else None."""
    return folder.parent / "derived" if (folder / MARK).exists() else None


@contextlib.contextmanager
def stand_in(name: str):
    """A temporary folder holding ``name``'s architecture with seeded random weights and a byte-level
    BPE tokenizer of its vocabulary size; removed on exit."""
    import itertools

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from trials.models.zoo.tokenizer import _wrap_tokenizer
    from trials.models.zoo.training import _llama_config

    recipe = _check_model(name)
    vocab_size = SETS[recipe.zoo_set].vocab_size
    root = Path(tempfile.mkdtemp(prefix=f"llm-sweeps-stand-in-{name}-"))
    folder = root / name
    try:
        torch.manual_seed(recipe.seed)
        AutoModelForCausalLM.from_config(_llama_config(recipe, vocab_size)).save_pretrained(folder)
        # a byte-level BPE of the set's size, like the zoo's own (engines that convert the model read it):
        # the specials, the byte alphabet, then merges of byte pairs up to the vocabulary size
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *alphabet])}
        merges = []
        for a, b in itertools.product(alphabet, repeat=2):
            if len(vocab) >= vocab_size:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
        bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        _wrap_tokenizer(bpe, PreTrainedTokenizerFast).save_pretrained(folder)
        (folder / MARK).write_text(f"random weights in {name}'s architecture, for timing only\n")
        yield folder
    finally:
        shutil.rmtree(root, ignore_errors=True)
