"""Training one zoo model from its recipe, and saving it as the hub would ship it.

Models are ``LlamaForCausalLM`` with tied embeddings, explicit ``head_dim`` and
``max_position_embeddings=4096`` (later features sweep long contexts; quality there is not the
point), trained from scratch with AdamW, warmup + cosine, fixed step counts and seeds, so a build is
deterministic on one machine. Drafts are distilled from their target (loss = w * KL(target || draft)
+ (1 - w) * CE, on the same batches), which raises draft/target agreement for speculative decoding.
The training precision is chosen per machine (``train_precision``) and recorded in the card.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time

from trials.models import integrity
from trials.models.corpus import SOURCES
from trials.models.zoo.cache import (CARD_FILE, CORPUS_IDS_FILE, _fresh_tmp_folder, _replace_folder, corpus_hash,
                                     model_path, recipe_hash, tokenizer_path)
from trials.models.zoo.quality import CODE_PROMPTS, greedy_samples, heldout_perplexity, heldout_windows
from trials.models.zoo.recipes import RECIPES, ModelRecipe, _check_model

log = logging.getLogger("trials.models.zoo")

PROGRESS_EVERY_S = 20.0  # a progress line at least this often while a model trains


def train_precision() -> str:
    """bf16 autocast where this CPU runs bf16 natively, else fp32 (see ``trials.measurement.hardware``).

    Native bf16 trains faster than fp32; emulated bf16 (AVX2-only CPUs) is far slower than fp32.
    """
    from trials.measurement.hardware import cpu_profile, fast_precision

    precision = fast_precision("cpu")
    profile = cpu_profile()
    log.info("training precision %s: %s CPU (%s), a bf16 matmul takes %.1fx the fp32 time", precision,
             profile.model, profile.capability, profile.bf16_matmul_ratio)
    return precision


def _llama_config(r: ModelRecipe, vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=r.hidden_size, intermediate_size=r.intermediate_size,
        num_hidden_layers=r.layers, num_attention_heads=r.attention_heads,
        num_key_value_heads=r.kv_heads, head_dim=r.head_dim,
        max_position_embeddings=r.max_position_embeddings, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )


def _sample_batch(streams, weights, batch_size, seq_len, generator):
    import torch

    names = [name for name, _ in weights]
    probs = torch.tensor([w for _, w in weights])
    choice = torch.multinomial(probs, batch_size, replacement=True, generator=generator)
    rows = []
    for c in choice.tolist():
        stream = streams[names[c]]
        start = int(torch.randint(0, len(stream) - seq_len, (1,), generator=generator))
        rows.append(stream[start:start + seq_len])
    return torch.stack(rows).long()


def _lr_factor(step: int, r: ModelRecipe) -> float:
    if step < r.warmup_steps:
        return (step + 1) / r.warmup_steps
    progress = (step - r.warmup_steps) / max(1, r.train_steps - r.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def _how_made(r: ModelRecipe, params: int, tokens: int, ppl: float, heldout_tokens: int, precision: str) -> str:
    mix = ", ".join(f"{int(w * 100)}% {src}" for src, w in r.source_weights)
    text = (f"{r.name} is a {params / 1e6:.2f}M-parameter LlamaForCausalLM ({r.layers} layers, hidden "
            f"{r.hidden_size}, {r.attention_heads} attention heads and {r.kv_heads} KV heads of dim {r.head_dim}, "
            f"tied embeddings) trained from scratch on CPU by trials.models.zoo: {r.train_steps} AdamW steps of "
            f"{r.batch_size}x{r.seq_len} tokens ({tokens:,} tokens; peak lr {r.learning_rate:g}, "
            f"{r.warmup_steps} warmup steps then cosine to 10%, {'bf16 autocast' if precision == 'bf16' else 'fp32'}, seed {r.seed}), sampling windows "
            f"{mix} from the '{r.zoo_set}' corpus: Python stdlib source (code), pydoc_data topics (English "
            f"prose) and seeded generated JSON/CSV/markdown tables (structured), tokenized by the set's "
            f"byte-level BPE.")
    if r.grow_from and r.layers > RECIPES[r.grow_from].layers:
        text += (f" It started as a deeper copy of the trained {r.grow_from}: its layers spread over "
                 f"{r.layers}, the others starting as the identity (block expansion), then trained.")
    elif r.grow_from:
        text += f" It started from the trained weights of {r.grow_from}."
    if r.distill_from:
        text += (f" It was distilled from {r.distill_from} on the same batches (loss = {r.distill_weight:g} x "
                 f"KL(teacher || draft) + {1 - r.distill_weight:g} x cross-entropy) to raise its agreement with "
                 f"the target for speculative decoding.")
    text += (f" Held-out perplexity {ppl:.2f} over {heldout_tokens:,} predicted tokens of documents never "
             f"trained on. A toy model for measuring inference mechanics, not for the quality of its text.")
    return text


def _grow_by_depth(model, source) -> None:
    """Start ``model`` as a deeper copy of the trained ``source`` (same width), by block expansion.

    Source layer ``i`` goes to position ``i * new / old``; every other layer starts as the identity
    (attention output and MLP down projections zeroed) and learns from there (as in LLaMA Pro). The
    grown model starts at the source's quality, which training a deep target from scratch cannot
    reach in the zoo's budget. With as many layers as the source, it is a plain copy.
    """
    import torch

    old, new = len(source.model.layers), len(model.model.layers)
    if new < old or model.config.hidden_size != source.config.hidden_size:
        raise ValueError(f"cannot grow a {old}-layer, {source.config.hidden_size}-wide model into "
                         f"{new} layers of width {model.config.hidden_size}")
    model.model.embed_tokens.load_state_dict(source.model.embed_tokens.state_dict())
    model.model.norm.load_state_dict(source.model.norm.state_dict())
    placed = {round(i * new / old): i for i in range(old)}
    with torch.no_grad():
        for position, layer in enumerate(model.model.layers):
            if position in placed:
                layer.load_state_dict(source.model.layers[placed[position]].state_dict())
            else:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()


def train_model(name: str, precision: str = "fp32") -> dict:
    """Train one model (its tokenizer and teacher must be built) and save its folder. Returns the card.

    ``precision`` is "bf16" (bf16 autocast, for CPUs with native bf16) or "fp32" (everywhere else);
    ``build`` picks it per machine with ``train_precision``.
    """
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    r = _check_model(name)
    start = time.time()
    tok_dir = tokenizer_path(r.zoo_set)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    ids = torch.load(tok_dir / CORPUS_IDS_FILE, weights_only=True)
    streams = {src: ids[f"train/{src}"] for src in SOURCES}

    torch.manual_seed(r.seed)
    model = LlamaForCausalLM(_llama_config(r, len(tokenizer)))
    if r.grow_from:
        _grow_by_depth(model, AutoModelForCausalLM.from_pretrained(model_path(r.grow_from), dtype=torch.float32))
    params = sum(p.numel() for p in model.parameters())
    teacher = None
    if r.distill_from:
        teacher = AutoModelForCausalLM.from_pretrained(model_path(r.distill_from), dtype=torch.float32).eval()
    origin = (f"distilling from {r.distill_from}" if teacher else
              f"grown from {r.grow_from}" if r.grow_from else "from scratch")
    log.info("%s: training %.2fM params for %d steps in %s (%s)", name, params / 1e6, r.train_steps, precision,
             origin)
    autocast = precision == "bf16"

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=r.learning_rate, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, r))
    generator = torch.Generator().manual_seed(r.seed)
    model.train()
    train_start, loss_value = time.time(), float("nan")
    last_log = train_start
    for step in range(r.train_steps):
        batch = _sample_batch(streams, r.source_weights, r.batch_size, r.seq_len, generator)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=batch).logits[:, :-1].float()
        targets = batch[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        if teacher is not None:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                teacher_logits = teacher(input_ids=batch).logits[:, :-1].float()
            teacher_logp = F.log_softmax(teacher_logits, dim=-1)
            kl = (teacher_logp.exp() * (teacher_logp - F.log_softmax(logits, dim=-1))).sum(-1).mean()
            loss = r.distill_weight * kl + (1 - r.distill_weight) * loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        loss_value = float(loss.detach())
        now = time.time()
        if now - last_log >= PROGRESS_EVERY_S or step + 1 == r.train_steps:
            last_log, elapsed = now, now - train_start
            log.info("%s: step %d/%d loss %.3f (%.0f tok/s, ~%.0f s left)", name, step + 1, r.train_steps,
                     loss_value, (step + 1) * r.batch_size * r.seq_len / elapsed,
                     elapsed / (step + 1) * (r.train_steps - step - 1))
    train_seconds = time.time() - train_start
    del teacher

    model.eval()
    log.info("%s: scoring held-out perplexity and greedy samples", name)
    windows = heldout_windows(r.zoo_set, ids)
    ppl = heldout_perplexity(model, windows)
    heldout_tokens = windows[:, 1:].numel()
    samples = greedy_samples(model, tokenizer)
    log.info("%s: held-out ppl %.2f; sample %r", name, ppl, samples[CODE_PROMPTS[0]][:80])

    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    final = model_path(name)
    tmp = _fresh_tmp_folder(final)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tokens = r.train_steps * r.batch_size * r.seq_len
    card = {
        "name": name, "role": r.role, "family": r.family, "zoo_set": r.zoo_set,
        "default_draft": r.default_draft if r.role == "target" else None,
        "draft_for": list(r.draft_for) if r.role == "draft" else [],
        "distilled_from": r.distill_from, "grown_from": r.grow_from,
        "architecture": "LlamaForCausalLM", "parameters": params,
        "layers": r.layers, "hidden_size": r.hidden_size, "intermediate_size": r.intermediate_size,
        "attention_heads": r.attention_heads, "kv_heads": r.kv_heads, "head_dim": r.head_dim,
        "vocab_size": len(tokenizer), "max_position_embeddings": r.max_position_embeddings,
        "tie_word_embeddings": True,
        "training_tokens": tokens, "train_steps": r.train_steps, "batch_size": r.batch_size,
        "seq_len": r.seq_len, "learning_rate": r.learning_rate, "final_train_loss": round(loss_value, 4),
        "train_precision": precision, "train_seconds": round(train_seconds, 2), "train_tokens_per_second": round(tokens / train_seconds),
        "heldout_perplexity": round(ppl, 4), "heldout_tokens": heldout_tokens,
        "samples": samples,
        "build_seconds": round(time.time() - start, 2), "seed": r.seed,
        "recipe_hash": recipe_hash(name), "corpus_hash": corpus_hash(r.zoo_set),
        "recipe": dataclasses.asdict(r),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": sys.version.split()[0]},
        "how_made": _how_made(r, params, tokens, ppl, heldout_tokens, precision),
    }
    card["files"] = integrity.file_sizes(tmp)          # checked on use (cache.damage); the card is not listed
    (tmp / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")
    _replace_folder(tmp, final)
    log.info("%s: built in %.1fs -> %s", name, card["build_seconds"], final)
    return card
