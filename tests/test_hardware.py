"""What the numbers depend on: the CPU profile, native vs emulated 16-bit matmuls, and the run tags."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trials.measurement import hardware
from trials.measurement.environment import environment_tags

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_profile_is_measured_and_consistent():
    p = hardware.cpu_profile()
    assert p.model and p.capability
    assert p.bf16_matmul_ratio > 0 and p.fp16_matmul_ratio > 0
    assert p.bf16_native == (p.bf16_matmul_ratio <= hardware.NATIVE_MAX_RATIO)
    assert hardware.precision_is_native("fp32", "cpu") and hardware.precision_is_native("nf4", "cpu")
    assert hardware.precision_is_native("bf16", "cpu") == p.bf16_native
    assert hardware.fast_precision("cpu") == ("bf16" if p.bf16_native else "fp32")


@pytest.mark.parametrize("ratio,native", [(0.4, True), (1.9, True), (2.1, False), (42.0, False)])
def test_native_means_within_the_threshold_of_fp32(ratio, native):
    p = hardware.CpuProfile("cpu", "AVX2", False, False, ratio, ratio)
    assert p.bf16_native is native and p.fp16_native is native


def test_environment_tags_say_what_the_numbers_depend_on():
    tags = environment_tags("cpu", sha="abc")
    p = hardware.cpu_profile()
    assert tags["env.cpu_model"] == p.model == tags["env.device_name"]
    assert tags["env.cpu_capability"] == p.capability
    assert tags["env.bf16_native"] == str(p.bf16_native)
    assert float(tags["env.bf16_matmul_ratio"]) == pytest.approx(p.bf16_matmul_ratio)


def test_avx2_can_be_reproduced_through_the_environment():
    """ATEN_CPU_CAPABILITY=avx2 + ONEDNN_MAX_CPU_ISA=AVX2 make torch report (and act as) AVX2."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-m", "trials.measurement.hardware"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    profile = json.loads(out.stdout)
    assert profile["capability"] == "AVX2"
    assert profile["bf16_native"] == (profile["bf16_matmul_ratio"] <= hardware.NATIVE_MAX_RATIO)
