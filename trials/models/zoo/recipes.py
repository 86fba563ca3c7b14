"""The zoo's recipes: what each set (corpus, tokenizer, evaluation) and each model is made of.

Everything that determines a build lives here as frozen data, so ``cache.recipe_hash`` can tell
when a cached model is out of date. The reasons behind the sizes: README, "Why the sizes".
"""

from __future__ import annotations

from dataclasses import dataclass

from trials.models.corpus import CorpusSpec

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|pad|>", "<|bos|>", "<|endoftext|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)  # ids 0, 1, 2

# Share of training windows (and of held-out windows) per source. Code is the hard part and the
# one the gate checks; the generated structured text is learned quickly.
SOURCE_MIX = (("code", 0.75), ("prose", 0.15), ("structured", 0.1))


@dataclass(frozen=True)
class SetRecipe:
    """What the models of one zoo set share: corpus, tokenizer, and how they are evaluated."""

    name: str
    vocab_size: int
    corpus: CorpusSpec
    eval_seq_len: int
    eval_windows: int  # held-out windows of eval_seq_len tokens, split over sources by eval_source_weights
    eval_source_weights: tuple[tuple[str, float], ...] = SOURCE_MIX
    tokenizer_min_frequency: int = 2


@dataclass(frozen=True)
class ModelRecipe:
    name: str
    role: str  # "target" | "draft"
    family: str
    default_draft: str | None  # targets: the draft to pair with; drafts: None
    zoo_set: str  # "tiny" | "full"
    hidden_size: int
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    train_steps: int
    batch_size: int
    seq_len: int
    learning_rate: float
    warmup_steps: int
    draft_for: tuple[str, ...] = ()  # drafts: the targets it serves
    distill_from: str | None = None  # drafts: the teacher model
    grow_from: str | None = None     # start from this trained model's weights, deepened if it has
                                     # fewer layers (see training._grow_by_depth)
    distill_weight: float = 0.0  # weight of KL(teacher || student) in the loss
    source_weights: tuple[tuple[str, float], ...] = SOURCE_MIX
    max_position_embeddings: int = 4096
    seed: int = 0


SETS: dict[str, SetRecipe] = {
    "tiny": SetRecipe("tiny", vocab_size=512,
                      corpus=CorpusSpec(code_bytes=300_000, prose_bytes=100_000, structured_bytes=100_000),
                      eval_seq_len=128, eval_windows=24),
    "full": SetRecipe("full", vocab_size=4096,
                      corpus=CorpusSpec(code_bytes=2_400_000, prose_bytes=500_000, structured_bytes=600_000),
                      eval_seq_len=256, eval_windows=96),
}

_TINY = dict(zoo_set="tiny", seq_len=128, batch_size=8, warmup_steps=10)
# Sized so the full set trains within 15 minutes on any 2-core x86-64, in fp32 where bf16 is
# emulated (a model costs ~6 x parameters x tokens FLOPs). In this budget more, smaller steps win
# (README, "Why the sizes": the runs that chose them). Drafts' steps also run the teacher's forward
# pass.
_FULL_TARGET = dict(zoo_set="full", seq_len=256, batch_size=2, warmup_steps=20)
_FULL_DRAFT = dict(zoo_set="full", seq_len=256, batch_size=2, warmup_steps=20)

_RECIPE_LIST = [
    ModelRecipe("tiny-mha", "target", "tiny-mha", "tiny-draft", hidden_size=64, layers=2,
                attention_heads=4, kv_heads=4, head_dim=16, intermediate_size=192,
                train_steps=200, learning_rate=3e-3, seed=11, **_TINY),
    ModelRecipe("tiny-gqa", "target", "tiny-gqa", "tiny-draft", hidden_size=64, layers=2,
                attention_heads=4, kv_heads=2, head_dim=16, intermediate_size=192,
                train_steps=200, learning_rate=3e-3, seed=12, **_TINY),
    ModelRecipe("tiny-draft", "draft", "tiny-mha", None, hidden_size=32, layers=1,
                attention_heads=2, kv_heads=1, head_dim=16, intermediate_size=96,
                train_steps=60, learning_rate=3e-3, draft_for=("tiny-mha", "tiny-gqa"),
                distill_from="tiny-mha", distill_weight=0.8, seed=13, **_TINY),
    # Full set, in the order the scheduler starts them (a model waits for the ones it is trained
    # from). zoo-large exists for speculative decoding: a draft only pays when a target step costs
    # many draft steps, and on a CPU per-pass overhead puts a floor under a small draft's step, so
    # the target must be much deeper. Trained from scratch in this budget such a target stays poor,
    # so it is grown by depth from the trained zoo-gqa (24 layers instead of 6): it starts at
    # zoo-gqa's quality and costs several of its steps. Its draft starts from zoo-gqa-draft
    # (distilled from zoo-gqa, so it already agrees with much of what zoo-large predicts) and is
    # then distilled from zoo-large alone (no cross-entropy term): it learns to agree with the
    # target, which is what a speculative draft is for, and stays below it in quality. The runs
    # behind these choices: README, "Why the sizes".
    ModelRecipe("zoo-gqa", "target", "gqa", "zoo-gqa-draft", hidden_size=256, layers=6,
                attention_heads=8, kv_heads=2, head_dim=32, intermediate_size=768,
                train_steps=480, learning_rate=1.5e-3, seed=23, **_FULL_TARGET),
    ModelRecipe("zoo-mha", "target", "mha", "zoo-mha-draft", hidden_size=256, layers=4,
                attention_heads=8, kv_heads=8, head_dim=32, intermediate_size=768,
                train_steps=560, learning_rate=1.5e-3, seed=22, **_FULL_TARGET),
    ModelRecipe("zoo-large", "target", "large", "zoo-large-draft", hidden_size=256, layers=24,
                attention_heads=8, kv_heads=2, head_dim=32, intermediate_size=768,
                train_steps=240, learning_rate=1e-3, grow_from="zoo-gqa", seed=27, **_FULL_TARGET),
    ModelRecipe("zoo-gqa-draft", "draft", "gqa", None, hidden_size=128, layers=2,
                attention_heads=4, kv_heads=2, head_dim=32, intermediate_size=384,
                train_steps=200, learning_rate=2e-3, draft_for=("zoo-gqa",),
                distill_from="zoo-gqa", distill_weight=0.8, seed=26, **_FULL_DRAFT),
    ModelRecipe("zoo-mha-draft", "draft", "mha", None, hidden_size=128, layers=2,
                attention_heads=4, kv_heads=4, head_dim=32, intermediate_size=384,
                train_steps=200, learning_rate=2e-3, draft_for=("zoo-mha",),
                distill_from="zoo-mha", distill_weight=0.8, seed=25, **_FULL_DRAFT),
    ModelRecipe("zoo-large-draft", "draft", "large", None, hidden_size=128, layers=2,
                attention_heads=4, kv_heads=2, head_dim=32, intermediate_size=384,
                train_steps=300, learning_rate=1e-3, draft_for=("zoo-large",), grow_from="zoo-gqa-draft",
                distill_from="zoo-large", distill_weight=1.0, seed=28, **_FULL_DRAFT),
]
RECIPES: dict[str, ModelRecipe] = {r.name: r for r in _RECIPE_LIST}
ZOO_SETS: dict[str, tuple[str, ...]] = {
    set_name: tuple(r.name for r in _RECIPE_LIST if r.zoo_set == set_name) for set_name in SETS
}


def _check_set(set_name: str) -> SetRecipe:
    if set_name not in SETS:
        raise ValueError(f"unknown zoo set {set_name!r}; valid sets: {', '.join(SETS)}")
    return SETS[set_name]


def _check_model(name: str) -> ModelRecipe:
    if name not in RECIPES:
        raise ValueError(f"unknown zoo model {name!r}; valid models: {', '.join(RECIPES)}")
    return RECIPES[name]


def _sources(name: str) -> list[str]:
    """The models ``name`` is trained from (its teacher, the model it is grown from)."""
    r = RECIPES[name]
    return [n for n in (r.distill_from, r.grow_from) if n]


def _with_teachers(names: list[str]) -> list[str]:
    wanted, todo = set(names), list(names)
    while todo:
        for source in _sources(todo.pop()):
            if source not in wanted:
                wanted.add(source)
                todo.append(source)
    return [n for n in RECIPES if n in wanted]  # recipe order: sources before what they feed
