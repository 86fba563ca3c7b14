"""Greedy generation on transformers, with per-token stamps, under a stack's own arguments.

``prepare`` turns a trial's stack into ``generate()`` keywords by materializing the one description
of ``trials.engines.transformers.arguments`` (so the code a user is shown is what ran), and
``generate_batch`` runs one batch: greedy, exactly ``new_tokens`` new tokens per row (the same
count for every stack, so outputs compare token for token), stamped by a streamer (TTFT, decode
time), with the cache it ended with measured to the byte.
"""

from __future__ import annotations


from trials.config import TrialConfig
from trials.engines.spec import BatchRecord, ModelFacts, Prepared
from trials.engines.transformers import compiled, kv_cache, speculation
from trials.engines.transformers.arguments import ModelTraits, as_code, stack_arguments
from trials.engines.transformers.materialize import materialize_all
from trials.measurement.instruments import TokenTimer, kv_cache_bytes, model_weights_bytes
from trials.measurement.kv_footprint import KVFootprintError, kv_footprint
from trials.models import loading
from trials.models.registry import reference_precision
from trials.prompts import Prompt


class PerCall:
    """A ``generate()`` argument made afresh for every call, e.g. a cache object (``make()``)."""

    def __init__(self, make):
        self.make = make


def traits(config: TrialConfig, loaded: loading.LoadedModel) -> ModelTraits:
    """What about this model changes the stack's arguments (see ``arguments.ModelTraits``)."""
    cross = False
    if config.stack.speculation == "draft":
        cross = not speculation.same_vocabulary(speculation.load_draft(config, loaded), loaded)
    return ModelTraits(sliding_window=kv_cache.has_sliding_layers(loaded.model), cross_tokenizer=cross,
                       cache_argument=kv_cache.cache_kwarg(loaded.model))


def prepare(config: TrialConfig, loaded: loading.LoadedModel, prompts: list[Prompt]) -> Prepared:
    """The stack's ``generate()`` keywords for this trial, and the code that says the same."""
    stack = config.stack
    model_traits = traits(config, loaded)
    arguments = stack_arguments(stack, reference_precision(config.entry(), config.device), model_traits)
    if stack.kv_bits != 16:
        kv_cache.require_backend(stack.kv_backend)
        if stack.kv_backend == "quanto":
            kv_cache.build_quanto_kernels(loaded.device)
    if stack.compile:
        compiled.ready(config)
    supplied = {
        "draft": lambda: speculation.configured_draft(config, loaded),
        "tokenizer": lambda: loaded.tokenizer,
        "assistant_tokenizer": lambda: speculation.load_draft(config, loaded).tokenizer,
        "hybrid_cache": lambda: PerCall(lambda: kv_cache.make_cache(stack, loaded.model)),
        "max_cache_len": lambda: compiled.max_cache_len(config, loaded, prompts),
    }
    return Prepared(materialize_all(arguments.generate, supplied), as_code(arguments))


def generate_batch(loaded: loading.LoadedModel, batch: list[Prompt], new_tokens: int,
                   timer: TokenTimer, generate_kwargs: dict) -> BatchRecord:
    """One batch, greedy, exactly ``new_tokens`` per row, stamped by ``timer``."""
    tokenizer, model = loaded.tokenizer, loaded.model
    texts = [p.text for p in batch]
    # A chat template writes its own BOS where the model wants one; the tokenizer must not add another.
    templated = bool(tokenizer.bos_token) and all(t.startswith(tokenizer.bos_token) for t in texts)
    inputs = tokenizer(texts, return_tensors="pt", padding=True,
                       add_special_tokens=not templated).to(loaded.device)
    generate_kwargs = {k: v.make() if isinstance(v, PerCall) else v for k, v in generate_kwargs.items()}
    timer.reset()
    out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, streamer=timer, return_dict_in_generate=True,
                         pad_token_id=tokenizer.pad_token_id, **generate_kwargs)
    prompt_len = inputs["input_ids"].shape[1]
    generated = out.sequences[:, prompt_len:]
    cache = getattr(out, "cache", None) or out.past_key_values   # transformers < 5.18 names it so
    return BatchRecord(
        prompt_ids=[p.id for p in batch], prompt_tokens=prompt_len,
        ttft_s=timer.ttft_s, decode_s=timer.decode_s,
        new_tokens=generated.shape[1], decode_tokens=timer.decode_tokens,
        kv_cache_bytes=kv_cache_bytes(cache), kv_cache_tokens=int(cache.get_seq_length()),
        output_ids=generated.tolist(),
        texts=tokenizer.batch_decode(generated, skip_special_tokens=True),
    )


def facts(loaded: loading.LoadedModel, record: BatchRecord) -> ModelFacts:
    """What the loop logs about the loaded model: its weight bytes and parameters, the threads torch
    ran on, and the architecture's exact KV bytes for the cache ``record`` ended with (or why not).

    MLA is counted ``expanded`` and sliding layers as transformers' dynamic cache holds them
    (``KVFootprint.held_bytes``): that is what the cache holds, and it is what we measure.
    """
    import torch

    model = loaded.model
    out = ModelFacts(model_weights_bytes(model), sum(p.numel() for p in model.parameters()),
                     float(torch.get_num_threads()))
    bits = torch.finfo(next(model.parameters()).dtype).bits
    try:
        footprint = kv_footprint(model.config, mla="expanded")
        out.kv_cache_bytes_exact = footprint.held_bytes(record.kv_cache_tokens, len(record.prompt_ids), bits)
    except KVFootprintError as exc:
        out.kv_cache_bytes_exact_missing = str(exc)
    return out
