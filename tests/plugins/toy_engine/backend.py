"""The toy engine in a worker (``trials.engines.spec.Backend``: ``load``, ``prepare``, ``generate_batch``,
``facts``, ``trial_facts``, ``scorer``, ``teacher_forced``). It decodes with a hand-written greedy loop
over the model's own forward pass and cache (no ``generate()``): the smallest engine that is still a
real one. The toy server (``toy_server``) serves the same loop and checks its tokens against it.
"""

from __future__ import annotations

import torch

from trials.engines.spec import BatchRecord, ModelFacts, Prepared
from toy_engine.spec import NAME


def load(config):
    from trials.loop import trial_prompts
    from trials.models import loading

    loaded = loading.load(config.entry(), config.stack.precision, config.device)
    return loaded, trial_prompts(config, loaded)


def prepare(config, loaded, prompts) -> Prepared:
    return Prepared({}, "for _ in range(n):\n    out = model(input_ids=ids, past_key_values=cache, use_cache=True)\n"
                        "    ids = out.logits[:, -1:].argmax(-1)  # greedy")


def greedy(model, ids: torch.Tensor, new_tokens: int, kept: dict | None = None):
    """The greedy tokens after ``ids``, one at a time, from the model's own forward pass and cache
    (``kept["cache"]``: the cache so far, where a caller asks for it)."""
    cache, step = None, ids.to(model.device)
    for _ in range(new_tokens):
        with torch.inference_mode():
            out = model(input_ids=step, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        if kept is not None:
            kept["cache"] = cache
        step = out.logits[:, -1:].argmax(-1)
        yield int(step)


def generate_batch(loaded, batch, new_tokens, timer, generate_kwargs) -> BatchRecord:
    from trials.measurement.instruments import kv_cache_bytes

    [prompt] = batch
    ids = loaded.tokenizer(prompt.text, return_tensors="pt")["input_ids"]
    out_ids, kept = [], {}
    timer.reset()
    for token in greedy(loaded.model, ids, new_tokens, kept):
        out_ids.append(token)
        timer.stamp()
    cache = kept["cache"]
    return BatchRecord([prompt.id], ids.shape[1], timer.ttft_s, timer.decode_s, len(out_ids), timer.decode_tokens,
                       kv_cache_bytes(cache), int(cache.get_seq_length()), [out_ids],
                       [loaded.tokenizer.decode(out_ids, skip_special_tokens=True)])


def facts(loaded, record):
    from trials.measurement.instruments import model_weights_bytes

    return ModelFacts(model_weights_bytes(loaded.model), float(sum(p.numel() for p in loaded.model.parameters())),
                      float(torch.get_num_threads()))


def trial_facts(config, loaded, measured, prompts, prepared):
    return {}, {"engine": NAME, "toy_version": "1"}


def scorer(config, loaded, context):
    def logits(ids):
        with torch.inference_mode():
            return loaded.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    return logits


def teacher_forced(config, loaded, prompts, stack):
    return "the toy engine scores over windows only (its scorer)"
