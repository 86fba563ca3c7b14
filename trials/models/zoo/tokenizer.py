"""Each set's tokenizer: byte-level BPE trained on the set's corpus, saved with the tokenized corpus.

Byte-level BPE from ``tokenizers``, one folder per set, saved as ``PreTrainedTokenizerFast`` with
left padding; a copy goes into every model folder. Every newline is its own token (a ``Split``
before the byte-level pre-tokenizer), so an undertrained model does not fall into endless
whitespace tokens. No BOS is added when encoding, and the models are trained that way; documents
are separated by ``<|endoftext|>``.
"""

from __future__ import annotations

import json
import logging
import pathlib
import time

from trials.models.corpus import SOURCES, build_corpus
from trials.models.zoo.cache import (CORPUS_IDS_FILE, TOKENIZER_CARD_FILE, _fresh_tmp_folder, _replace_folder,
                                     tokenizer_path, tokenizer_recipe_hash)
from trials.models.zoo.recipes import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, _check_set

log = logging.getLogger("trials.models.zoo")


def build_tokenizer(set_name: str) -> pathlib.Path:
    """Train the set's byte-level BPE tokenizer and save it with the tokenized corpus."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    s = _check_set(set_name)
    start = time.time()
    corpus = build_corpus(s.corpus)
    log.info("tokenizer-%s: training byte-level BPE (vocab %d) on %.1f MB", set_name, s.vocab_size,
             corpus.total_bytes() / 1e6)
    bpe = Tokenizer(models.BPE())
    # Every newline is its own token; indentation and words follow as separate tokens. With plain
    # GPT-2 splitting, "\n\n    " merges into one of many whitespace tokens, and an undertrained
    # model that emits a lone "\n" falls into endless newlines.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=s.vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=s.tokenizer_min_frequency, show_progress=False)
    bpe.train_from_iterator(corpus.all_train_texts(), trainer)

    eos_id = bpe.token_to_id(EOS_TOKEN)
    ids, counts = {}, {}
    for part_name, part in (("train", corpus.train), ("heldout", corpus.heldout)):
        for source in SOURCES:
            stream = []
            for enc in bpe.encode_batch([doc.text for doc in part[source]]):
                stream.extend(enc.ids)
                stream.append(eos_id)  # documents are separated by end-of-text
            ids[f"{part_name}/{source}"] = torch.tensor(stream, dtype=torch.int32)
            counts[f"{part_name}/{source}"] = len(stream)

    final = tokenizer_path(set_name)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_tmp_folder(final)
    _wrap_tokenizer(bpe, PreTrainedTokenizerFast).save_pretrained(tmp)
    torch.save(ids, tmp / CORPUS_IDS_FILE)
    card = {"set": set_name, "vocab_size": bpe.get_vocab_size(), "special_tokens": list(SPECIAL_TOKENS),
            "recipe_hash": tokenizer_recipe_hash(set_name), "corpus_hash": corpus.corpus_hash,
            "corpus_bytes": corpus.total_bytes(), "token_counts": counts,
            "documents": {part_name: {src: len(part[src]) for src in SOURCES}
                          for part_name, part in (("train", corpus.train), ("heldout", corpus.heldout))},
            "heldout_documents": {src: [d.name for d in corpus.heldout[src]] for src in SOURCES},
            "build_seconds": round(time.time() - start, 2)}
    (tmp / TOKENIZER_CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")
    _replace_folder(tmp, final)
    log.info("tokenizer-%s: done in %.1fs (%d train tokens)", set_name, time.time() - start,
             sum(v for k, v in counts.items() if k.startswith("train/")))
    return final


def _wrap_tokenizer(bpe, fast_cls):
    return fast_cls(tokenizer_object=bpe, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN, bos_token=BOS_TOKEN,
                    unk_token=None, padding_side="left", model_max_length=4096)
