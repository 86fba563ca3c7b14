r"""An offline zoo of small trained Llama models, loadable through the normal Hugging Face path.

Why this exists: the machines this project runs on have no GPU and no model hub, yet the sweeps
need real models (trained weights, a real tokenizer, target/draft pairs, MHA vs GQA shapes).
So the project trains its own, in minutes, from text every Python install has, and saves them
exactly as the hub would ship them: each model folder alone loads with
``AutoTokenizer.from_pretrained(folder)`` and
``AutoModelForCausalLM.from_pretrained(folder, dtype=...)``.

Usage::

    python -m trials.models.zoo build [--set tiny|full] [--force] [--model NAME]
    python -m trials.models.zoo list [--set tiny|full|all]

The modules, one job each (their docstrings hold the design choices):

* ``recipes``: the sets (corpus, tokenizer vocab, evaluation) and the models' recipes. The corpus
  (``trials.models.corpus``) is stdlib ``.py`` source (code), ``pydoc_data/topics.py`` (English
  prose) and seeded generated JSON / CSV / markdown tables (structured), ~3.5 MB for ``full`` and
  ~0.5 MB for ``tiny``.
* ``cache``: where models live, the hashes that decide a rebuild, the model cards.
* ``tokenizer``: each set's byte-level BPE tokenizer, with every newline its own token.
* ``training``: training one model (AdamW, warmup + cosine, fixed seeds; drafts distilled from their
  target, zoo-large grown by depth from zoo-gqa) in the precision this CPU runs fastest.
* ``workers``: one spawned, single-threaded process per model, teachers before their drafts.
* ``quality``: held-out perplexity, greedy samples, and the gate a built set must pass.
* ``builder``: ``build``, which runs the above for a set and skips what is up to date.
* ``cli``: the command line.

Step counts are sized so that the full set trains within 15 minutes in fp32 on a 2-core AVX2 CPU
(``benchmarks/precision.py`` prints this CPU's fp32 vs bf16 step times). Each model's card holds what
its build measured (parameters, held-out perplexity, tokens, seconds, training precision, greedy
samples); ``python -m trials.models.zoo list`` prints them. Builds are deterministic per machine, not
across machines (CPU kernels and the training precision differ). These are toys, undertrained for
their size: Python-shaped, repetitive text, fine for measuring inference mechanics (speed, memory,
perplexity deltas, draft agreement), not for their text. What moved quality most in this budget:
isolating newlines in the tokenizer (before, models fell into endless newlines), dropping table-like
stdlib files and weighting code 75% (README, "Why the sizes").
"""

import logging

from trials.models.zoo.recipes import (
    _FULL_DRAFT, _FULL_TARGET, _RECIPE_LIST, _TINY, BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, RECIPES, SETS, SOURCE_MIX,
    SPECIAL_TOKENS, ZOO_SETS, ModelRecipe, SetRecipe, _check_model, _check_set, _sources, _with_teachers,
)
from trials.models.zoo.cache import (
    CARD_FILE, CORPUS_IDS_FILE, DEFAULT_ZOO_DIR, TOKENIZER_CARD_FILE, ZOO_ENV_VAR, ZOO_FORMAT_VERSION,
    _digest, _fresh_tmp_folder, _read_json, _replace_folder, corpus_hash, damage, is_built, load_card, model_path,
    recipe_hash, tokenizer_is_current, tokenizer_path, tokenizer_recipe_hash, zoo_dir,
)
from trials.models.zoo.tokenizer import _wrap_tokenizer, build_tokenizer
from trials.models.zoo.quality import (
    CODE_PROMPTS, SAMPLE_NEW_TOKENS, ZooQualityError, greedy_samples, heldout_perplexity, heldout_windows,
    looks_like_python, quality_problems,
)
from trials.models.zoo.training import (
    PROGRESS_EVERY_S, _grow_by_depth, _how_made, _llama_config, _lr_factor, _sample_batch, train_model,
    train_precision,
)
from trials.models.zoo.workers import _run_training, _train_in_worker
from trials.models.zoo.builder import build
from trials.models.zoo.cli import _fail, _status, format_table, main

log = logging.getLogger("trials.models.zoo")
