"""fp32 vs bf16 on this CPU: decode step, prefill and training step times of random Llama models.

    python -m benchmarks.precision                       # ~2M, ~10M, ~38M params, one thread
    python -m benchmarks.precision --quick               # fewer steps, the two smaller shapes
    python -m benchmarks.precision --shapes 38m --threads 2
    python -m benchmarks.precision --env-avx2            # behave like an AVX2-only CPU (see below)

Why: a CPU without bf16 matmul instructions (AVX2 only, no AVX-512-BF16 or AMX) emulates bf16, and a
bf16 trial or bf16-autocast training there is many times slower than fp32, while on a CPU that has
them bf16 is faster. ``trials.measurement.hardware`` decides "native" from one 256x256 matmul; this script shows
what that means for the work the project does: for each shape (random weights from a
``transformers.LlamaConfig``, tied embeddings, like the zoo's models) and ``--threads`` threads,

- decode: one token at batch 1 with a KV cache (after a short prompt), median step time;
- prefill: a ``--prefill-tokens`` prompt in one forward pass, median time per prompt token;
- train: one AdamW step at batch ``--train-batch`` x ``--train-seq``, fp32 against bf16 autocast
  (the zoo's training loop), median step time;

each in fp32 and bf16 with the bf16/fp32 ratio (above 1: bf16 is slower). Every measurement is
warmed up first on a short input. bf16 gets fewer steps than fp32 (``--bf16-steps``) so the whole
run stays near two minutes on an emulating CPU; the table says how many steps each median is over.

Reproducing an AVX2 CPU on a faster one: torch picks its CPU kernels (and oneDNN its ISA) when it is
imported, so set ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` in the environment before
Python starts, or pass ``--env-avx2``, which re-executes this script with both set. The profile
printed first shows the capability torch actually runs with and whether the CPU advertises bf16.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
VOCAB = 4096


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    head_dim: int = 64


SHAPES = {
    "2m": Shape(hidden=192, layers=4, heads=3, kv_heads=1, intermediate=512),
    "10m": Shape(hidden=384, layers=6, heads=6, kv_heads=2, intermediate=1024),
    "38m": Shape(hidden=576, layers=10, heads=9, kv_heads=3, intermediate=1536),
}


def build(shape: Shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def _tokens(*size: int):
    import torch

    return torch.randint(3, VOCAB, size, generator=torch.Generator().manual_seed(1))


def decode_step_s(model, steps: int, warmup: int = 2, prompt: int = 16) -> float:
    """Median time of one batch-1 decode step with a KV cache, after a ``prompt``-token prefill."""
    import torch

    times = []
    with torch.inference_mode():
        out = model(input_ids=_tokens(1, prompt), use_cache=True)
        for i in range(warmup + steps):
            token = out.logits[:, -1:].argmax(-1)
            started = time.perf_counter()
            out = model(input_ids=token, cache=out.cache, use_cache=True)
            times.append(time.perf_counter() - started)
    return statistics.median(times[warmup:])


def prefill_per_token_s(model, tokens: int, repeats: int) -> float:
    """Median time of a ``tokens``-token forward pass (warmed up on 8 tokens), per token."""
    import torch

    ids = _tokens(1, tokens)
    times = []
    with torch.inference_mode():
        model(input_ids=ids[:, :8], use_cache=False)
        for _ in range(repeats):
            started = time.perf_counter()
            model(input_ids=ids, use_cache=False)
            times.append(time.perf_counter() - started)
    return statistics.median(times) / tokens


def train_step_s(model, batch: int, seq: int, steps: int, bf16: bool) -> float:
    """Median time of one AdamW step (forward, backward, update), bf16 autocast or fp32, as the zoo
    trains; warmed up on one step of 16 tokens."""
    import torch

    model = copy.deepcopy(model).float().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(ids) -> float:
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - started

    ids = _tokens(batch, seq)
    step(ids[:, :16])
    return statistics.median(step(ids) for _ in range(steps))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:10.2f}"


def measure_shape(name: str, shape: Shape, args) -> list[tuple[str, float, float, int, int]]:
    """(measurement, fp32 s, bf16 s, fp32 steps, bf16 steps) rows for one shape."""
    import torch

    fp32 = build(shape)
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    params = sum(p.numel() for p in fp32.parameters())
    print(f"\n{name}: {params / 1e6:.2f}M params (hidden {shape.hidden}, {shape.layers} layers, "
          f"{shape.heads} heads / {shape.kv_heads} kv heads, head_dim {shape.head_dim}, "
          f"intermediate {shape.intermediate}, vocab {VOCAB}, tied embeddings)", flush=True)
    steps, few = args.steps, args.bf16_steps
    rows = []
    started = time.perf_counter()
    rows.append(("decode step, batch 1", decode_step_s(fp32, 4 * steps), decode_step_s(bf16, 4 * few),
                 4 * steps, 4 * few))
    rows.append((f"prefill per token ({args.prefill_tokens} tokens)",
                 prefill_per_token_s(fp32, args.prefill_tokens, steps),
                 prefill_per_token_s(bf16, args.prefill_tokens, few), steps, few))
    if not args.no_train:
        rows.append((f"train step ({args.train_batch} x {args.train_seq}, bf16 autocast)",
                     train_step_s(fp32, args.train_batch, args.train_seq, steps, bf16=False),
                     train_step_s(fp32, args.train_batch, args.train_seq, few, bf16=True), steps, few))
    print(f"{'measurement':44s} {'fp32 ms':>10s} {'bf16 ms':>10s} {'bf16/fp32':>10s}  steps fp32/bf16")
    for label, a, b, n_a, n_b in rows:
        print(f"{label:44s} {_ms(a)} {_ms(b)} {b / a:10.2f}  {n_a}/{n_b}")
    print(f"({time.perf_counter() - started:.1f} s)", flush=True)
    return rows


def reexec_as_avx2() -> None:
    """Run this script again with torch limited to AVX2 (both variables are read at import)."""
    argv = [a for a in sys.argv[1:] if a != "--env-avx2"]
    os.chdir(ROOT)
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks.precision", *argv], {**os.environ, **AVX2_ENV})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help=f"comma-separated, of {', '.join(SHAPES)} (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--steps", type=int, default=3,
                        help="fp32 repeats per measurement (decode: 4x this many steps; default 3)")
    parser.add_argument("--bf16-steps", type=int, default=2,
                        help="bf16 repeats per measurement (decode: 4x this many steps; default 2)")
    parser.add_argument("--prefill-tokens", type=int, default=128)
    parser.add_argument("--train-batch", type=int, default=2)
    parser.add_argument("--train-seq", type=int, default=128)
    parser.add_argument("--no-train", action="store_true", help="skip the training steps")
    parser.add_argument("--quick", action="store_true",
                        help="the 2m and 10m shapes only, 2 fp32 repeats")
    parser.add_argument("--env-avx2", action="store_true",
                        help="re-run with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 set")
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = sorted(set(names) - set(SHAPES))
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}; valid: {', '.join(SHAPES)}")
    if args.quick:
        names, args.steps = [n for n in names if n != "38m"] or names, min(args.steps, 2)
    if args.env_avx2 and any(os.environ.get(k) != v for k, v in AVX2_ENV.items()):
        reexec_as_avx2()

    import torch

    from trials.measurement.hardware import cpu_profile

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          + ", ".join(f"{k}={os.environ.get(k, '(unset)')}" for k in AVX2_ENV))
    print("hardware profile (trials.measurement.hardware.cpu_profile):")
    print(json.dumps(cpu_profile().to_dict(), indent=1))

    started = time.perf_counter()
    results = {name: measure_shape(name, SHAPES[name], args) for name in names}
    print("\nbf16 / fp32 time ratios (above 1: bf16 slower):")
    labels = [row[0].split(" (")[0].split(",")[0] for row in next(iter(results.values()))]
    print(f"{'shape':6s} " + " ".join(f"{label:>22s}" for label in labels))
    for name, rows in results.items():
        print(f"{name:6s} " + " ".join(f"{b / a:22.2f}" for _, a, b, _, _ in rows))
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
