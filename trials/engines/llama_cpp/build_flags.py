"""The CMake flags llama.cpp is built with here, and the instruction sets they need of a CPU.

One line of flags (the ``cmake_flags`` file, which the Makefile's ``LLAMA_CPP_CMAKE`` reads too, or
``$LLM_SWEEPS_LLAMA_CMAKE`` where the binding was built with others) builds the binding and its tools;
a build is checked against this CPU's ``/proc/cpuinfo`` flags on every use.
"""

from __future__ import annotations

import os
import pathlib
import shlex

from trials.errors import ConfigError

CMAKE_ENV_VAR = "LLM_SWEEPS_LLAMA_CMAKE"          # the flags, where the binding was built with others
FLAGS_FILE = pathlib.Path(__file__).with_name("cmake_flags")
# ggml's CMake options for x86 instruction sets -> their /proc/cpuinfo flag names.
INSTRUCTION_SETS = {"GGML_SSE42": "sse4_2", "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma",
                    "GGML_F16C": "f16c", "GGML_BMI2": "bmi2", "GGML_AVX_VNNI": "avx_vnni",
                    "GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512vbmi", "GGML_AVX512_VNNI": "avx512_vnni",
                    "GGML_AVX512_BF16": "avx512_bf16", "GGML_AMX_TILE": "amx_tile", "GGML_AMX_INT8": "amx_int8",
                    "GGML_AMX_BF16": "amx_bf16"}
# What ggml turns on by itself in a build that is not native (ggml/CMakeLists.txt: INS_ENB).
PORTABLE_DEFAULTS = ("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C")


def cmake_flags() -> list[str]:
    """The binding's CMake flags: ``$LLM_SWEEPS_LLAMA_CMAKE``, else the ``cmake_flags`` file."""
    text = os.environ.get(CMAKE_ENV_VAR) or FLAGS_FILE.read_text()
    return shlex.split(text)


def _options(flags: list[str]) -> dict[str, str]:
    """``-DNAME=VALUE`` flags as {NAME: VALUE} (the last wins, as in CMake; ``-DNAME:BOOL=ON`` too)."""
    options = {}
    for flag in flags:
        if flag.startswith("-D") and "=" in flag:
            name, _, value = flag[2:].partition("=")
            options[name.split(":")[0]] = value
    return options


def _on(value: str) -> bool:
    return value.upper() in ("ON", "1", "TRUE", "YES", "Y")


def is_native(flags: list[str]) -> bool:
    """Whether the build is for this CPU's own instructions (ggml's default, unless GGML_NATIVE=OFF)."""
    return _on(_options(flags).get("GGML_NATIVE", "ON"))


def cpu_flags() -> set[str]:
    """This CPU's instruction-set flags, as /proc/cpuinfo names them (empty where it says none)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def required_instruction_sets(flags: list[str]) -> list[str]:
    """The instruction sets a build with ``flags`` uses: those the flags (or ggml's defaults) turn on,
    and for a native build every one this CPU has."""
    options, native = _options(flags), is_native(flags)
    wanted = {cpu for name, cpu in INSTRUCTION_SETS.items()
              if _on(options.get(name, "ON" if name in PORTABLE_DEFAULTS and not native else "OFF"))}
    if native:
        wanted |= set(INSTRUCTION_SETS.values()) & cpu_flags()
    return sorted(wanted)


def check_cpu(required: list[str], where: str) -> None:
    missing = sorted(set(required) - cpu_flags())
    if missing:
        raise ConfigError(f"llama.cpp's tools {where} need instruction sets this CPU lacks "
                          f"({', '.join(missing)}); build them for it with other flags (${CMAKE_ENV_VAR})")
