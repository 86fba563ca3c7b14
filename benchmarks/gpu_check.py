"""One prepared check of the project's code path on a CUDA GPU: bandwidth, then one trial per chart group.

    benchmarks/gpu_check.sh                         # on the GPU machine (the repo's python, else python3)
    python -m benchmarks.gpu_check --help
    python -m benchmarks.gpu_check --device cpu --small    # the same flow on CPU with tiny configs

What it does, in order:

1. Without a CUDA device (and without ``--device cpu``) it prints one line and exits 0.
2. Memory bandwidth: a large device-to-device copy (2 GiB on a GPU), timed with CUDA events, several
   repeats; GB/s counts the bytes read and the bytes written.
3. Models of real architectures with **random weights**, built from their configs on the device:
   Llama-3.2-1B and Qwen2.5-1.5B, plus a 2-layer draft of each family for speculative decoding.
   The device machine has no network and no model zoo, and the speed and memory of a forward pass do
   not depend on the values of the weights: the same shapes read the same bytes and run the same
   kernels. This is how the LLM-Perf leaderboard (optimum-benchmark, ``no_weights``) measures speed
   and memory. What random weights do NOT give: meaningful text, perplexity or fidelity numbers, and
   a meaningful speculative acceptance. Acceptance needs trained models (a draft only agrees with
   its target when both learned the same text); worse, a random model with tied embeddings echoes
   its last token (its greedy output is one token repeated), so nearly every draft and prompt-lookup
   token is accepted: the speculative rows measure the cost of a round at acceptance ~1 (the
   ceiling for that k and that draft), not the speedup a trained pair would get. Each model is
   saved as a local Hugging Face folder (bf16) with a small byte-level BPE tokenizer trained here in
   seconds on the Python documentation text (``pydoc_data``); token ids only need to be below the
   vocabulary. Both are cross-checked against ``trials.measurement.kv_footprint`` (CATALOGUE, KV bytes/token).
4. One or more trials per chart group through the project's own ``trials.run.run_trial``:
   baseline, kv_cache, batching, quantization, speculative and stacks (see ``plan``). Each trial runs
   in try/except (and under a per-trial time limit): a failure is one line and a FAILED row, and
   the check goes on. int8 / NF4 weights need bitsandbytes; without it they FAIL with the install
   line, which is expected there. A budget (``--budget``) stops starting new trials in time, so
   the check ends, prints its table and writes its JSON before the device's command limit.
5. A Markdown table: tok/s (median of the repeats) with its 95 % interval, CUDA peak memory, weight
   bytes, the batch-1 roofline and measured / roofline; then everything as JSON to
   ``$OUT/gpu_check.json`` (``$OUT`` set: the device tool brings that folder back) or
   ``./gpu_check.json``. The JSON is rewritten after every trial, so a run cut short keeps what it did.

The roofline: decoding one token at batch B reads every weight once plus each row's KV cache, so a
decode step cannot be faster than (bytes it reads) / (memory bandwidth). Hence
``roofline tok/s = B x bandwidth / (weight bytes + KV bytes read per step)``, with the KV cache at the
mean decode context (``≈``: half-way between the prompt and the final length). ``measured / roofline``
says how much of the memory system decoding uses; Hugging Face's eager ``generate()`` at batch 1 on a
fast GPU is usually limited by Python and kernel-launch overhead, far below 1. Speculative decoding
emits several tokens per target pass, so it may exceed the batch-1 roofline.

Run it from the repository root (``python -m benchmarks.gpu_check``): the packages import from there,
so nothing needs installing (``pip install -e .`` not required). Only torch, transformers, tokenizers,
safetensors, numpy are needed; pandas and scipy (imported by ``trials.stats.factorial`` for the
repeats' t-interval) get minimal stand-ins when missing, and the output says so. The device machine's
transformers may be older than the project's pin (5.17 against 5.24): two names the code path reads
changed in between, and ``transformers_compat`` adapts them in this process where they are missing,
saying so (``--no-compat`` shows the failures).

Sizing: two models x 15 trials of 4 prompts x 64 new tokens, 2 repeats, meant to end within the
device tool's 10-minute command limit: no trial starts after ``--budget`` (480 s) and none runs past
``--trial-timeout`` (180 s) or the budget plus 60 s, so with ``timeout_s=600`` the JSON always comes back.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_DEVICE_LINE = "gpu_check: no CUDA device here (torch sees none); nothing to check"
GIB = 2**30

# Special tokens of the check's tokenizer, ids 0, 1, 2 (as the project's zoo has them).
PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|endoftext|>"


# --------------------------------------------------------------------------------- architectures

@dataclass(frozen=True)
class Arch:
    """A real architecture: its published config fields (random weights) and a tiny CPU version."""

    key: str                       # the name in the table
    family: str                    # "llama" | "qwen2"
    catalogue: str | None          # trials.measurement.kv_footprint.CATALOGUE entry to cross-check against
    fields: dict                   # the config.json fields that shape the model
    small: dict                    # overrides for --small (tiny, CPU)


ARCHS: dict[str, Arch] = {a.key: a for a in (
    # meta-llama/Llama-3.2-1B config.json
    Arch("llama-3.2-1b", "llama", "llama-3.2-1b", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, hidden_act="silu",
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}),
         dict(vocab_size=4096, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=8, num_key_value_heads=4, head_dim=16)),
    # Qwen/Qwen2.5-1.5B config.json (not in the CATALOGUE; its KV fields are checked by formula)
    Arch("qwen2.5-1.5b", "qwen2", None, dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, hidden_act="silu",
        max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=True,
        use_sliding_window=False, sliding_window=131072, max_window_layers=21,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         dict(vocab_size=4096, hidden_size=128, intermediate_size=448, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2)),
)}
DRAFT_LAYERS = {False: 2, True: 1}          # draft depth: real configs / --small
# KV bytes per token (16-bit) of the real configs, by hand: 2 (K, V) x layers x kv_heads x head_dim x 2 B.
EXPECTED_KV_BYTES_PER_TOKEN = {"llama-3.2-1b": 2 * 16 * 8 * 64 * 2, "qwen2.5-1.5b": 2 * 28 * 2 * 128 * 2}


def make_config(arch: Arch, small: bool, layers: int | None = None):
    """The transformers config of ``arch`` (tiny with ``small``; ``layers`` overrides the depth)."""
    from transformers import LlamaConfig, Qwen2Config

    fields = {**arch.fields, **(arch.small if small else {})}
    if layers is not None:
        fields["num_hidden_layers"] = layers
    if arch.family == "qwen2":
        fields["max_window_layers"] = min(fields["max_window_layers"], fields["num_hidden_layers"])
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch.family]
    return cls(**fields, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def cross_check(arch: Arch, config, small: bool) -> str:
    """Compare the config with ``trials.measurement.kv_footprint``: its CATALOGUE entry (layers, heads, head_dim)
    and its KV bytes per token with the hand formula; raises on a mismatch, else says what matched."""
    from trials.measurement.kv_footprint import CATALOGUE, kv_footprint

    per_token = kv_footprint(config).bytes_per_token_uncapped(16)
    if small:
        return f"tiny version ({config.num_hidden_layers} layers), KV {per_token} B/token (not checked)"
    checked = []
    if arch.catalogue:
        entry = CATALOGUE[arch.catalogue]
        for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                     "head_dim"):
            if name in entry and entry[name] != getattr(config, name):
                raise ValueError(f"{arch.key}: {name} = {getattr(config, name)} but CATALOGUE"
                                 f"[{arch.catalogue!r}] has {entry[name]}")
        checked.append(f"CATALOGUE[{arch.catalogue!r}] layers/heads/kv heads/head_dim match")
    else:
        checked.append("not in CATALOGUE")
    if per_token != EXPECTED_KV_BYTES_PER_TOKEN[arch.key]:
        raise ValueError(f"{arch.key}: kv_footprint gives {per_token} B/token, the formula "
                         f"{EXPECTED_KV_BYTES_PER_TOKEN[arch.key]}")
    checked.append(f"KV {per_token} B/token (bf16) as by hand")
    return "; ".join(checked)


# --------------------------------------------------------------------------------- tokenizer

def _tokenizer_text() -> list[str]:
    """Local English text to train the tokenizer on: the Python docs' help topics, else stdlib source."""
    try:
        from pydoc_data.topics import topics
        return list(topics.values())
    except ImportError:
        import sysconfig
        files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
        return [f.read_text(errors="replace") for f in files]


def train_tokenizer(vocab_size: int):
    """A byte-level BPE (every byte is a token, so any text encodes) wrapped as a fast tokenizer with
    pad/bos/eos set and left padding, as the project's loop batches prompts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_tokenizer_text(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   padding_side="left", model_max_length=131072)


# --------------------------------------------------------------------------------- models

@dataclass
class Built:
    arch: Arch
    folder: str               # what TrialConfig.model gets (a local folder with config.json)
    draft: str                # the 2-layer draft of the same family and tokenizer
    parameters: int
    check: str                # the CATALOGUE cross-check
    build_s: float


def build_model(config, folder: Path, tokenizer, device: str) -> int:
    """Random weights from ``config``, created on ``device`` in bf16 (transformers' own init, seeded
    by the caller), saved with the tokenizer; returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        setattr(model.generation_config, name, getattr(tokenizer, name))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return parameters


def build_models(keys: list[str], small: bool, device: str, workdir: Path, log) -> dict[str, Built]:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()              # save_pretrained's shard bars
    started = time.perf_counter()
    # 8192 tokens: prompts tokenize to realistic lengths; --small: the tiny vocabulary (ids must fit)
    tokenizer = train_tokenizer(min(ARCHS[k].small["vocab_size"] for k in keys) if small else 8192)
    log(f"tokenizer: byte-level BPE, {len(tokenizer)} tokens, trained in {time.perf_counter() - started:.1f} s")
    built = {}
    for key in keys:
        arch, t0 = ARCHS[key], time.perf_counter()
        torch.manual_seed(0)
        config = make_config(arch, small)
        check = cross_check(arch, config, small)
        folder, draft = workdir / key, workdir / f"{key}-draft{DRAFT_LAYERS[small]}l"
        parameters = build_model(config, folder, tokenizer, device)
        build_model(make_config(arch, small, layers=DRAFT_LAYERS[small]), draft, tokenizer, device)
        built[key] = Built(arch, str(folder), str(draft), parameters, check, time.perf_counter() - t0)
        log(f"model {key}: {parameters / 1e6:.1f}M parameters, random bf16 weights, "
            f"built and saved in {built[key].build_s:.1f} s; {check}")
    return built


# --------------------------------------------------------------------------------- bandwidth

def measure_bandwidth(device: str, nbytes: int, repeats: int = 10) -> dict:
    """Bytes/s of ``dst.copy_(src)`` over ``nbytes`` (read + write counted), best and median: the
    project's own timed copy (``trials.measurement.bandwidth.copy_seconds``, the rooflines' bandwidth)."""
    from trials.measurement.bandwidth import copy_seconds

    times = copy_seconds(device, nbytes, repeats)
    return {"copy_bytes": nbytes, "repeats": repeats, "best_bytes_per_s": 2 * nbytes / min(times),
            "median_bytes_per_s": 2 * nbytes / statistics.median(times)}


# --------------------------------------------------------------------------------- the plan

@dataclass
class Planned:
    group: str
    model: str                 # ARCHS key
    config: object | None      # a TrialConfig, or None when it could not be built
    label: str
    expected_failure: str = "" # a package this machine may lack (the FAILED row says "expected")
    min_budget_s: float = 20   # do not start it with less time than this left
    error: str = ""            # why the config could not be built


def _backend_for_kv() -> tuple[str, str]:
    """The 4-bit KV backend to try (quanto, else hqq) and the package it needs when neither imports."""
    for backend, module in (("quanto", "optimum.quanto"), ("hqq", "hqq")):
        try:
            if importlib.util.find_spec(module) is not None:
                return backend, ""
        except (ImportError, ValueError):
            pass
    return "quanto", "optimum-quanto"


def plan(built: dict[str, Built], args) -> list[Planned]:
    """The trials, model by model, in chart-group order, each technique's own ``device_checks``
    (``trials.techniques.<name>.spec``); compiled decoding last in each model (it is the slowest to
    warm up)."""
    from trials import groups
    from trials.config import TrialConfig, Workload
    from trials.errors import ConfigError
    from trials.techniques.spec import DeviceSetup

    cuda = args.device == "cuda"
    fast, other = ("bf16", "fp16") if cuda else ("fp32", "bf16")   # fp16 is refused on CPU
    short = Workload(prompt_set="mixed", prompts_per_type=1, max_new_tokens=args.new_tokens)
    long = Workload(prompt_set="mixed", prompts_per_type=1, max_new_tokens=args.new_tokens,
                    context_tokens=args.context)
    kv_backend, kv_missing = _backend_for_kv()
    bnb = "" if importlib.util.find_spec("bitsandbytes") else "bitsandbytes"
    out = []
    for key, b in built.items():
        setup = DeviceSetup(args.device, fast, other, kv_backend, kv_missing, bnb,
                            tuple(args.batches), b.draft)
        for technique in groups.GROUPS:
            if technique.name not in args.groups or technique.device_checks is None:
                continue
            for check in technique.device_checks(setup):
                stack, workload = check.stack, long if check.long_context else short
                label = stack.label.replace(f"draft(k={stack.num_draft_tokens})",
                                            f"draft{DRAFT_LAYERS[args.small]}l(k={stack.num_draft_tokens})")
                if workload.context_tokens:
                    label += f" @{workload.context_tokens}"
                try:
                    config = TrialConfig(group=technique.name, model=b.folder, device=args.device,
                                         stack=stack, workload=workload, repeats=args.repeats)
                    out.append(Planned(technique.name, key, config, label, check.needs,
                                       check.min_budget_s))
                except ConfigError as exc:
                    out.append(Planned(technique.name, key, None, label, error=f"ConfigError: {exc}"))
    # compiled decoding last in each model, models in order
    return sorted(out, key=lambda p: (list(built).index(p.model), p.config is not None
                                      and p.config.stack.compile))


# --------------------------------------------------------------------------------- running

class TrialTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise ``TrialTimeout`` in the main thread after ``seconds`` (SIGALRM; a long C call, e.g. one
    compile step, finishes first). No limit when ``seconds`` <= 0 or the platform has no SIGALRM."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise TrialTimeout(f"trial ran past the per-trial limit of {seconds:.0f} s (--trial-timeout)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def run_planned(p: Planned, args, started: float) -> dict:
    """One trial: its result as a dict (``TrialResult.to_dict()``), FAILED or SKIPPED with the reason."""
    from trials.loop import failed_result
    from trials.run import run_trial

    if p.config is None:
        return {"status": "FAILED", "error": p.error, "metrics": {}, "tags": {}, "raw": {}}
    left = args.budget - (time.monotonic() - started) if args.budget > 0 else math.inf
    if left < p.min_budget_s:
        return {"config": p.config.to_dict(), "status": "SKIPPED", "metrics": {}, "tags": {}, "raw": {},
                "error": f"not started: {left:.0f} s of the {args.budget:.0f} s budget left, "
                         f"needs ~{p.min_budget_s:.0f} s"}
    try:
        with time_limit(min(args.trial_timeout, left + 60) if args.trial_timeout > 0 else 0):
            result = run_trial(p.config)
    except Exception as exc:           # any failure is one FAILED row; the check goes on
        result = failed_result(p.config, exc)
    _free(args.device)
    return result.to_dict()


# --------------------------------------------------------------------------------- the table

def roofline(metrics: dict, batch: int, bandwidth: float) -> float | None:
    """Batch-B decode bound: B x bandwidth / (weights + KV read per step), the KV at the mean decode
    context (the final cache scaled back by half the new tokens: it grows linearly while decoding)."""
    weights, kv = metrics.get("weights_bytes"), metrics.get("kv_cache_bytes")
    tokens, new = metrics.get("kv_cache_tokens"), metrics.get("new_tokens_per_prompt")
    if not weights or kv is None or not bandwidth:
        return None
    if tokens and new:
        kv *= max(0.0, tokens - new / 2) / tokens
    return batch * bandwidth / (weights + kv)


def make_row(p: Planned, result: dict, bandwidth: float) -> dict:
    m = result.get("metrics", {})
    batch = p.config.stack.batch_size if p.config else 1
    bound = roofline(m, batch, bandwidth) if result["status"] == "FINISHED" else None
    status = result["status"]
    if status == "FAILED" and p.expected_failure and p.expected_failure in result.get("error", ""):
        status = "FAILED (expected)"
    return {
        "group": p.group, "model": p.model, "stack": p.label, "status": status,
        "tok_per_s": m.get("tok_per_s"), "ci_low": m.get("tok_per_s_ci_low"),
        "ci_high": m.get("tok_per_s_ci_high"), "peak_memory_bytes": m.get("peak_memory_bytes"),
        "weights_bytes": m.get("weights_bytes"), "roofline_tok_per_s": bound,
        "roofline_ratio": (m["tok_per_s"] / bound) if bound and m.get("tok_per_s") else None,
        "trial_s": m.get("trial_s"), "error": result.get("error", ""),
        "extra": {k: m[k] for k in ("speedup", "alpha", "lossless", "kv_cache_bytes",
                                     "kv_cache_compression", "outputs_match_batch1", "warmup_s",
                                     "fidelity_token_match", "perplexity")
                  if k in m},
    }


def _num(value, fmt: str) -> str:
    return "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)


def markdown_table(rows: list[dict]) -> str:
    head = ("| group | model | stack | status | decode tok/s (median) | 95% interval | peak GiB "
            "| weights GiB | roofline tok/s (≈) | measured / roofline | note |")
    lines = [head, "|" + " --- |" * 11]
    for r in rows:
        ci = (f"{r['ci_low']:.1f}-{r['ci_high']:.1f}"
              if r["ci_low"] is not None and math.isfinite(r["ci_low"]) else "")
        note = r["error"].replace("|", "/")[:110] if r["error"] else ""
        if not note and r["extra"]:
            shown = {k: r["extra"][k] for k in ("speedup", "alpha", "kv_cache_compression",
                                                "outputs_match_batch1", "warmup_s") if k in r["extra"]}
            note = ", ".join(f"{k} {v:.3g}" for k, v in shown.items())
        lines.append(f"| {r['group']} | {r['model']} | {r['stack']} | {r['status']} "
                     f"| {_num(r['tok_per_s'], '.1f')} | {ci} "
                     f"| {_num(r['peak_memory_bytes'] and r['peak_memory_bytes'] / GIB, '.3f')} "
                     f"| {_num(r['weights_bytes'] and r['weights_bytes'] / GIB, '.3f')} "
                     f"| {_num(r['roofline_tok_per_s'], '.0f')} | {_num(r['roofline_ratio'], '.3f')} "
                     f"| {note} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------- environment

def _t_ppf(p: float, df: float) -> float:
    """Student's t quantile by bisection on its CDF (regularized incomplete beta, continued fraction)."""
    def betacf(a, b, x):                          # Numerical Recipes' betacf (modified Lentz)
        def guard(v):
            return v if abs(v) > 1e-300 else 1e-300

        c, d = 1.0, 1 / guard(1 - (a + b) * x / (a + 1))
        h = d
        for m in range(1, 300):
            for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                        -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
                d, c = 1 / guard(1 + num * d), guard(1 + num / c)
                h *= d * c
            if abs(d * c - 1) < 1e-15:
                break
        return h

    def cdf(t):
        x = df / (df + t * t)
        front = math.exp(math.lgamma(df / 2 + 0.5) - math.lgamma(df / 2) - math.lgamma(0.5)
                         + df / 2 * math.log(x) + 0.5 * math.log1p(-x)) if 0 < x < 1 else 0.0
        tail = front * betacf(df / 2, 0.5, x) / (df / 2) if x < (df / 2 + 1) / (df / 2 + 2.5) \
            else 1 - front * betacf(0.5, df / 2, 1 - x) / 0.5
        return 1 - tail / 2 if t > 0 else tail / 2

    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def install_standins() -> list[str]:
    """Stand-ins where pandas or scipy is missing, visible to ``trials.stats.factorial`` only: it imports
    pandas at module level (a trial never uses it) and scipy for the repeats' t quantile. transformers
    is imported first, because it probes optional packages when imported; the pandas stand-in leaves
    ``sys.modules`` as soon as ``trials.stats.factorial`` holds it, and scipy is replaced by patching
    ``trials.stats.factorial.t_quantile`` in this process (no file changes)."""
    import transformers  # noqa: F401  (its import-time probes must not see a stand-in)

    notes = []
    if importlib.util.find_spec("pandas") is None:
        sys.modules["pandas"] = types.ModuleType("pandas")
        try:
            import trials.stats.factorial  # noqa: F401
        finally:
            del sys.modules["pandas"]
        notes.append("pandas missing: trials.stats.factorial imported with an empty stand-in (a trial does not use it)")
    if importlib.util.find_spec("scipy") is None:
        import trials.stats.factorial as factorial

        factorial.t_quantile = lambda df, level=0.975: float("nan") if df < 1 else _t_ppf(level, df)
        notes.append("scipy missing: the repeats' t quantile from a pure-Python stand-in "
                     "(trials.stats.factorial.t_quantile patched in this process)")
    return notes


def transformers_compat() -> list[str]:
    """Adapt an older transformers (the device machine's 5.17; the project pins 5.24) to the two names
    the project's code path reads, in this process only, and only where the installed version lacks
    them; each adaptation is reported. ``--no-compat`` leaves transformers as it is.

    * ``generate()``'s output calls its cache ``cache`` in 5.24 (``trials.engines.transformers.generation.generate_batch`` reads
      ``out.cache``); 5.17 calls it ``past_key_values``: without this every trial fails.
    * a model's forward takes ``cache=`` in 5.24 (``trials.engines.transformers.teacher_forced.teacher_forced_logprobs``); 5.17
      takes ``past_key_values=`` and silently ignores an unknown ``cache=``, so each teacher-forced
      step would run without its prefix (wrong KL and perplexity, no error).
    """
    import functools
    import inspect

    from transformers import LlamaForCausalLM, Qwen2ForCausalLM
    from transformers.generation import utils as generation_utils

    notes, outputs = [], []
    for name in dir(generation_utils):
        cls = getattr(generation_utils, name)
        fields = getattr(cls, "__dataclass_fields__", {})
        if (isinstance(cls, type) and name.startswith("Generate") and "past_key_values" in fields
                and "cache" not in fields and not hasattr(cls, "cache")):
            cls.cache = property(lambda self: self.past_key_values)
            outputs.append(name)
    if outputs:
        notes.append(f"transformers compat: generate() outputs ({', '.join(sorted(outputs))}) get "
                     "`.cache` = `.past_key_values` (trials.loop reads out.cache)")

    def renaming(forward):
        @functools.wraps(forward)            # keeps the signature generate() inspects
        def wrapper(self, *args, **kwargs):
            if "cache" in kwargs and "past_key_values" not in kwargs:
                kwargs["past_key_values"] = kwargs.pop("cache")
            return forward(self, *args, **kwargs)
        return wrapper

    models = []
    for cls in (LlamaForCausalLM, Qwen2ForCausalLM):
        parameters = inspect.signature(cls.forward).parameters
        if "cache" not in parameters and "past_key_values" in parameters:
            cls.forward = renaming(cls.forward)
            models.append(cls.__name__)
    if models:
        notes.append(f"transformers compat: {', '.join(models)}.forward(cache=...) passed on as "
                     "past_key_values= (trials.techniques.kv_cache.runner's teacher-forced pass)")
    return notes


def environment(device: str) -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "device": device, "host": platform.node()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), gpu_memory_bytes=props.total_memory,
                   cuda=torch.version.cuda, capability=f"{props.major}.{props.minor}")
    else:
        env["cpu"] = platform.processor() or platform.machine()
    for package in ("tokenizers", "accelerate", "optimum-quanto", "hqq", "bitsandbytes", "numpy",
                    "pandas", "scipy", "safetensors"):
        try:
            env[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            env[package] = "not installed"
    return env


def _clean(obj):
    """JSON-safe: NaN/inf to None, unknown objects to str."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def output_path(args) -> Path:
    if args.out:
        return Path(args.out)
    return Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else Path("gpu_check.json")


# --------------------------------------------------------------------------------- main

def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="benchmarks/gpu_check.py", description=__doc__.split("\n\nWhat it does")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Writes $OUT/gpu_check.json when OUT is set, else ./gpu_check.json (--out overrides).")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default; without one: a one-line message, exit 0) or cpu")
    parser.add_argument("--small", action="store_true",
                        help="tiny versions of the configs (2 layers, hidden 128, vocab 4096): test the flow")
    parser.add_argument("--models", default=",".join(ARCHS), help=f"comma list of {', '.join(ARCHS)}")
    parser.add_argument("--groups", default=None,
                        help="comma list of chart groups to run (default: every group with device checks)")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="new tokens per prompt (default 64; 32 with --small)")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats per trial (default 2)")
    parser.add_argument("--context", type=int, default=None,
                        help="kv_cache prompt length in tokens (default 1024; 512 with --small)")
    parser.add_argument("--batches", default="1,8,32", help="batching ladder (default 1,8,32)")
    parser.add_argument("--budget", type=float, default=480,
                        help="seconds from start after which no new trial starts (default 480; 0: none)")
    parser.add_argument("--trial-timeout", type=float, default=180,
                        help="seconds one trial may run before it is abandoned as FAILED (default 180; 0: none)")
    parser.add_argument("--no-compat", action="store_true",
                        help="do not adapt an older transformers to the names the project reads (see "
                             "transformers_compat); shows what fails without it")
    parser.add_argument("--workdir", default=None, help="where the model folders go (default: a temp dir, removed)")
    parser.add_argument("--out", default=None, help="the JSON file to write")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in ARCHS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; valid: {', '.join(ARCHS)}")
    if args.groups is None:
        from trials import groups
        args.groups = [g.name for g in groups.GROUPS if g.device_checks is not None]
    else:
        args.groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    if args.context is None:
        args.context = 512 if args.small else 1024
    if args.new_tokens is None:
        args.new_tokens = 32 if args.small else 64
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        print(f"gpu_check: torch is not importable here ({exc}); nothing to check", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(NO_DEVICE_LINE)
        return 0

    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)

    os.environ.setdefault("LLM_SWEEPS_MODEL_CACHE", "4")   # keep bf16, fp16, fp32 and the draft loaded
    notes = install_standins()
    if not args.no_compat:
        try:
            notes += transformers_compat()
        except Exception as exc:                 # the check still runs, and says what it could not adapt
            notes.append(f"transformers compat not applied: {type(exc).__name__}: {exc}")
    for note in notes:
        log(note)
    from trials import groups as trial_groups
    unknown = [g for g in args.groups if g not in trial_groups.NAMES]
    if unknown:
        print(f"gpu_check: unknown group(s) {', '.join(unknown)}; valid: {', '.join(trial_groups.NAMES)}",
              file=sys.stderr)
        return 2

    env = environment(args.device)
    log("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    report = {"args": {k: v for k, v in vars(args).items()}, "environment": env, "notes": notes,
              "bandwidth": None, "models": {}, "rows": [], "results": [], "table": ""}
    out_path = output_path(args)

    def save() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(_clean(report), indent=1))

    bandwidth = measure_bandwidth(args.device, 2 * GIB if args.device == "cuda" else 256 * 2**20)
    report["bandwidth"] = bandwidth
    bw = bandwidth["best_bytes_per_s"]
    log(f"bandwidth: {bw / 1e9:.1f} GB/s best, {bandwidth['median_bytes_per_s'] / 1e9:.1f} GB/s median "
        f"({bandwidth['copy_bytes'] / GIB:.2f} GiB device-to-device copy, read + write, "
        f"{bandwidth['repeats']} repeats)")
    save()

    with contextlib.ExitStack() as stack:
        workdir = Path(args.workdir) if args.workdir else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu_check-")))
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            built = build_models(args.models, args.small, args.device, workdir, log)
        except Exception as exc:
            report["error"] = f"building the models failed: {type(exc).__name__}: {exc}"
            log(report["error"])
            save()
            return 1
        report["models"] = {k: {"folder": b.folder, "draft": b.draft, "parameters": b.parameters,
                                "cross_check": b.check, "build_s": b.build_s} for k, b in built.items()}
        planned = plan(built, args)
        log(f"{len(planned)} trials planned; budget {args.budget:.0f} s, per trial {args.trial_timeout:.0f} s")
        from trials.worker import WORKER

        current = None
        for i, p in enumerate(planned, 1):
            if current is not None and p.model != current:
                WORKER.drop_models()             # the previous architecture's models leave the device
                _free(args.device)
            current = p.model
            result = run_planned(p, args, started)
            row = make_row(p, result, bw)
            report["rows"].append(row)
            report["results"].append({"group": p.group, "model": p.model, "stack": p.label, **result})
            what = (f"{row['tok_per_s']:.1f} tok/s" if row["tok_per_s"] is not None else row["error"][:160])
            peak = f", peak {row['peak_memory_bytes'] / GIB:.2f} GiB" if row["peak_memory_bytes"] else ""
            took = f" in {row['trial_s']:.1f} s" if row["trial_s"] else ""
            log(f"{i}/{len(planned)} {p.group} {p.model} {p.label}: {row['status']}{took}: {what}{peak}")
            report["table"] = markdown_table(report["rows"])
            save()

    finished = sum(r["status"] == "FINISHED" for r in report["rows"])
    print()
    print(f"## gpu_check: {env.get('gpu', env.get('cpu'))} ({args.device}{', --small' if args.small else ''})")
    print(f"torch {env['torch']}, transformers {env['transformers']}"
          + (f", CUDA {env['cuda']}" if args.device == "cuda" else "") + f", python {env['python']}")
    print(f"bandwidth: {bw / 1e9:.1f} GB/s (best of {bandwidth['repeats']} copies of "
          f"{bandwidth['copy_bytes'] / GIB:.2f} GiB, read + write; median "
          f"{bandwidth['median_bytes_per_s'] / 1e9:.1f} GB/s)")
    for key, b in built.items():
        print(f"model {key}: {b.parameters / 1e6:.1f}M parameters (random weights); {b.check}")
    for note in notes:
        print(f"note: {note}")
    print("note: random weights: speed and memory are the architecture's; speculative acceptance is not "
          "meaningful (it needs trained models; a random tied-embedding model echoes its last token, so "
          "acceptance is ~1): speculative rows show the cost of a round at full acceptance.")
    print()
    print(report["table"])
    print()
    print(f"{finished}/{len(report['rows'])} trials finished in {time.monotonic() - started:.0f} s; "
          f"JSON: {out_path}")
    report["total_s"] = time.monotonic() - started
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
