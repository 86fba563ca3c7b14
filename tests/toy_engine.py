"""A toy engine, declared from outside the project: a test registers it with
``LLM_SWEEPS_ENGINES=toy_engine`` and runs it through plan -> trial -> store -> section -> export.

One module holds all of it: the declaration (``SPEC``) and the backend (``trials.engines.spec.Backend``:
``load``, ``prepare``, ``generate_batch``, ``facts``, ``trial_facts``, ``scorer``, ``teacher_forced``). It decodes with a
hand-written greedy loop over the model's own forward pass and cache (no ``generate()``): the smallest
engine that is still a real one.
"""

from __future__ import annotations

import torch

from trials.engines.spec import BatchRecord, Engine, ModelFacts, Prepared

NAME = "toy"


def guard(stack) -> str | None:
    return None if stack.batch_size == 1 else "the toy engine decodes one prompt at a time"


SPEC = Engine(NAME, "toy (a greedy loop over forward())", ("fp32",), {}, guard, "toy_engine", "toy_engine",
              sixteen_bit=("fp32",), proposers=(), color="#00CC96",
              caption="a hand-written greedy loop over the model's forward pass.", version_tag="toy_version")


def load(config):
    from trials.loop import trial_prompts
    from trials.models import loading

    loaded = loading.load(config.entry(), config.stack.precision, config.device)
    return loaded, trial_prompts(config, loaded)


def prepare(config, loaded, prompts) -> Prepared:
    return Prepared({}, "for _ in range(n):\n    out = model(input_ids=ids, past_key_values=cache, use_cache=True)\n"
                        "    ids = out.logits[:, -1:].argmax(-1)  # greedy")


def generate_batch(loaded, batch, new_tokens, timer, generate_kwargs) -> BatchRecord:
    from trials.measurement.instruments import kv_cache_bytes

    [prompt] = batch
    ids = loaded.tokenizer(prompt.text, return_tensors="pt")["input_ids"].to(loaded.device)
    out_ids, cache = [], None
    timer.reset()
    with torch.inference_mode():
        step = ids
        for _ in range(new_tokens):
            out = loaded.model(input_ids=step, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            step = out.logits[:, -1:].argmax(-1)
            out_ids.append(int(step))
            timer.stamp()
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
