"""Compiled decoding: transformers' static KV cache with ``torch.compile`` of the decoding step.

What GPU users reach for first. ``generate(cache_implementation="static", compile_config=...)``
preallocates the cache and compiles the model's forward for the one-token decode step (inductor;
on CPU it generates C++ and needs a compiler, ``g++``). The prefill runs uncompiled. The arguments
are the stack's description (``arguments.COMPILE``); this module gets a trial ready for them.

To compile once per trial rather than once per prompt, the cache is sized for the trial's worst
case (``max_cache_len``: the longest prompt plus the new tokens), so every call, the loop's warm-up
included, decodes with the same shapes. The compilation therefore happens in the warm-up, which the
loop times apart (``warmup_s``: it holds the compile time) and never counts in ``tok_per_s``.
Transformers auto-compiles only on CUDA unless told otherwise; ``_compile_all_devices`` tells it to
compile here too, so the same code path is measured on CPU and on CUDA.

Shapes are static, but not every cache is: a sliding-window layer's static cache (Gemma-3) keeps its
length in a Python int that dynamo guards on, so with ``dynamic=False`` every decode step compiled a
new graph until dynamo's recompile limit (8) and then ran the step eagerly, uncompiled. The default,
``dynamic=None``, makes that int symbolic at its first change: two graphs, and every step compiled.
Each compiled trial records how many graphs dynamo compiled during it and whether it gave up
(``compile_graphs``, tag ``compile_fallback``), so a "compiled" number that was not is said so.

Inductor caches compiled kernels on disk (``/tmp/torchinductor_<user>``) under a key that does not
include ATen's CPU capability: on one machine run as AVX-512 and then as AVX2
(``ATEN_CPU_CAPABILITY=avx2``, how the project reproduces an AVX2-only CPU), the AVX2 process
loaded the AVX-512 build's kernels and its greedy output matched the uncompiled one on 8 % of
tokens (100 % with a fresh cache). So the cache is kept per capability, unless
``TORCHINDUCTOR_CACHE_DIR`` says where it goes.
"""

from __future__ import annotations

import os
import shutil

from trials.config import TrialConfig
from trials.engines.transformers.arguments import COMPILE
from trials.errors import ConfigError
from trials.models import loading
from trials.prompts import Prompt

BACKEND, MODE = dict(COMPILE.kwargs)["backend"], dict(COMPILE.kwargs)["mode"]


def dynamo_counts() -> tuple[int, int]:
    """(graphs dynamo has compiled in this process, times it hit its recompile limit and ran eagerly)."""
    from torch._dynamo.utils import counters

    gave_up = sum(n for reason, n in counters.get("unimplemented", {}).items() if "recompile limit" in reason.lower())
    return counters.get("stats", {}).get("unique_graphs", 0), gave_up


def compile_record(before: tuple[int, int]) -> tuple[dict, dict]:
    """Metrics and tags of a compiled trial, from ``dynamo_counts()`` taken before it."""
    graphs, gave_up = (now - then for now, then in zip(dynamo_counts(), before))
    fallback = (f"eager after dynamo's recompile limit ({gave_up} time(s)): the step was not compiled"
                if gave_up else "none")
    return {"compile_graphs": float(graphs)}, {"compile_fallback": fallback}


def max_cache_len(config: TrialConfig, loaded: loading.LoadedModel, prompts: list[Prompt]) -> int:
    """The longest prompt of the trial in tokens, plus its new tokens: one cache shape for all."""
    longest = max(len(loaded.tokenizer(p.text)["input_ids"]) for p in prompts)
    return longest + config.workload.max_new_tokens


def keep_kernels_per_capability() -> str:
    """Point inductor's kernel cache at a folder of this CPU capability, unless the user chose one
    (inductor writes its own default into ``TORCHINDUCTOR_CACHE_DIR`` the first time it looks, e.g.
    while transformers loads a model: that one is not a choice); the folder it uses."""
    import torch
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
            default_cache_dir(), f"cpu-{torch.backends.cpu.get_cpu_capability().lower()}")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def ready(config: TrialConfig) -> None:
    """Before compiling: inductor's kernels cached per CPU capability, and a C++ compiler on a CPU."""
    keep_kernels_per_capability()
    if config.device == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
        raise ConfigError("compiled decoding on CPU needs a C++ compiler (inductor generates C++): "
                          "apt-get install g++")


def describe() -> str:
    return (f"static cache + torch.compile ({BACKEND}, mode {MODE}) of the decode step; compiled in "
            f"the warm-up (warmup_s)")
