"""What this machine runs fast: CPU model, torch's CPU capability, and whether 16-bit matmuls are native.

Why this exists: machines of the same kind can have different CPUs. On an AVX2-only CPU, bf16 and
fp16 matmuls are emulated (one thread, 512x512: ~200 ms against ~5 ms in fp32), so a bf16 trial or
bf16-autocast training there runs 20-40x slower than on a CPU with AVX-512-BF16 or AMX. A number
measured in an emulated precision says more about the CPU than about the optimization, so every run
records what its numbers depend on (``environment_tags``) and the zoo and the sweep choose their
precision from ``fast_precision``.

"Native" is decided by a measurement, not only by the CPU's flags: a 256x256 matmul in fp32 and in
the 16-bit type, one thread, best of a few tries. A 16-bit matmul within ``NATIVE_MAX_RATIO`` of the
fp32 time counts as native (native bf16 is faster than fp32; emulated is ~20x slower, so the
threshold sits far from both). Measuring also honours ``ATEN_CPU_CAPABILITY=avx2`` plus
``ONEDNN_MAX_CPU_ISA=AVX2``, which make a fast CPU behave like an AVX2 one; the flags are logged
beside the measurement (``*_hw_flag``), so a disagreement is visible.

    python -m trials.measurement.hardware        # prints the profile as JSON
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass
from functools import cache

import torch

NATIVE_MAX_RATIO = 2.0
# The plain (unquantized) precisions and their torch dtypes; quantized ones: trials.models.quantized_weights.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_MATMUL_SIZE = 256
# CPU flags (/proc/cpuinfo "flags" on x86, "Features" on aarch64) that mean hardware 16-bit matmuls.
_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
_FP16_FLAGS = ("avx512_fp16", "amx_fp16", "fphp", "asimdhp")


@dataclass(frozen=True)
class CpuProfile:
    model: str                 # "AMD EPYC", "Intel(R) Xeon(R) Platinum 8480+", ...
    capability: str            # torch.backends.cpu.get_cpu_capability(): AVX2, AVX512, ...
    bf16_hw_flag: bool         # the CPU advertises bf16 matmul instructions
    fp16_hw_flag: bool
    bf16_matmul_ratio: float   # 16-bit matmul time / fp32 matmul time, one thread
    fp16_matmul_ratio: float

    @property
    def bf16_native(self) -> bool:
        return self.bf16_matmul_ratio <= NATIVE_MAX_RATIO

    @property
    def fp16_native(self) -> bool:
        return self.fp16_matmul_ratio <= NATIVE_MAX_RATIO

    def to_dict(self) -> dict:
        return {**asdict(self), "bf16_native": self.bf16_native, "fp16_native": self.fp16_native}


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def _matmul_seconds(dtype: torch.dtype, tries: int = 3) -> float:
    a = torch.randn(_MATMUL_SIZE, _MATMUL_SIZE).to(dtype)
    b = torch.randn(_MATMUL_SIZE, _MATMUL_SIZE).to(dtype)
    torch.mm(a, b)  # first call: kernel selection
    best = float("inf")
    for _ in range(tries):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return best


def _ratios() -> tuple[float, float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fp32 = _matmul_seconds(torch.float32, tries=5)
        return _matmul_seconds(torch.bfloat16) / fp32, _matmul_seconds(torch.float16) / fp32
    finally:
        torch.set_num_threads(threads)


@cache
def cpu_profile() -> CpuProfile:
    """This process's CPU, measured once per process (a few small matmuls)."""
    model, flags = _cpuinfo()
    bf16, fp16 = _ratios()
    return CpuProfile(model=model, capability=torch.backends.cpu.get_cpu_capability(),
                      bf16_hw_flag=any(f in flags for f in _BF16_FLAGS),
                      fp16_hw_flag=any(f in flags for f in _FP16_FLAGS),
                      bf16_matmul_ratio=round(bf16, 3), fp16_matmul_ratio=round(fp16, 3))


def precision_is_native(precision: str, device: str) -> bool:
    """Whether ``precision`` runs at full speed on ``device`` (quantized kinds: their own kernels)."""
    if device == "cuda" or precision not in ("bf16", "fp16"):
        return True
    profile = cpu_profile()
    return profile.bf16_native if precision == "bf16" else profile.fp16_native


def fast_precision(device: str) -> str:
    """bf16 where it is native, else fp32: what to train and run in when the precision is free."""
    return "bf16" if precision_is_native("bf16", device) else "fp32"


def hardware_tags(device: str) -> dict[str, str]:
    """Tags for a run on ``device``: what its numbers depend on."""
    if device == "cuda":
        model, _ = _cpuinfo()
        return {"env.cpu_model": model, "env.cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "env.bf16_native": str(torch.cuda.is_available() and torch.cuda.is_bf16_supported()),
                "env.fp16_native": "True"}
    p = cpu_profile()
    return {"env.cpu_model": p.model, "env.cpu_capability": p.capability,
            "env.bf16_native": str(p.bf16_native), "env.fp16_native": str(p.fp16_native),
            "env.bf16_matmul_ratio": f"{p.bf16_matmul_ratio:g}",
            "env.fp16_matmul_ratio": f"{p.fp16_matmul_ratio:g}",
            "env.bf16_hw_flag": str(p.bf16_hw_flag), "env.fp16_hw_flag": str(p.fp16_hw_flag)}


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(
        prog="python -m trials.measurement.hardware",
        description="What this machine runs fast, as JSON: CPU model, torch's CPU capability, and whether "
                    "bf16/fp16 matmuls are native here (measured: a 256x256 matmul timed against fp32). "
                    "Every run is tagged with the same facts (env.cpu_model, env.cpu_capability, "
                    "env.bf16_native, ...).").parse_args(argv)
    print(json.dumps(cpu_profile().to_dict(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
