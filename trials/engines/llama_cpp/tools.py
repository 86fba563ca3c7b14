"""llama.cpp's own tools, ``llama-bench`` and ``llama-server``, built once beside the Python binding.

One build of llama.cpp serves the binding and its tools: the tools' own sources (from the same
llama-cpp-python source package as the installed binding, its ``vendor/llama.cpp``, fetched with pip
as ``convert.py`` fetches it) are compiled and linked against the binding's installed shared libraries
(libllama, libllama-common, libmtmd, libggml*; ``tools_cmake/CMakeLists.txt``), so a tool's number and
the binding's come from the very same code and instructions, and only the tools compile here. The
binding's CMake flags are the one line in ``cmake_flags`` that the Makefile's ``LLAMA_CPP_CMAKE`` reads
too (or ``$LLM_SWEEPS_LLAMA_CMAKE`` where the binding was built with others). One folder per version,
flags and binding install (the libraries' folder and sha256; per CPU for a native build) under
``~/.cache/llm-inference-sweeps/llama-cpp-tools`` (or ``$LLM_SWEEPS_LLAMA_TOOLS_DIR``), with a card:
version, flags, commands, the libraries linked, each binary's size and sha256, the instruction sets the
build needs (checked against this CPU on every use) and the build info the tools print. ``make setup``
builds them, and a local sweep beside its first trials (``sweeps.setup_beside``: the trials that use them
wait for it); a missing or damaged folder is built again on use.

Usage::

    python -m trials.engines.llama_cpp.tools build    # build (or confirm) the tools; their card
    python -m trials.engines.llama_cpp.tools info     # the card, or that they are not built
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

from trials.engines.llama_cpp import convert
from trials.engines.llama_cpp.binding import INSTALL
from trials.errors import ConfigError, one_line_errors

TOOLS_ENV_VAR = "LLM_SWEEPS_LLAMA_TOOLS_DIR"      # the cache root (the folders of each build are inside)
CMAKE_ENV_VAR = "LLM_SWEEPS_LLAMA_CMAKE"          # the flags, where the binding was built with others
DEFAULT_ROOT = "~/.cache/llm-inference-sweeps/llama-cpp-tools"
FLAGS_FILE = pathlib.Path(__file__).with_name("cmake_flags")
CARD_FILE = "build_card.json"
FORMAT_VERSION = 2
BINARIES = ("llama-bench", "llama-server")
# The tools' project (only their own sources; the rest is the binding's libraries) and its options:
# a release build, no web UI (nothing fetched at build time).
TOOLS_PROJECT = pathlib.Path(__file__).with_name("tools_cmake")
TOOL_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF")
# The binding's shared libraries the tools link (site-packages/lib, where llama-cpp-python installs
# them with their CMake configs; the copies in llama_cpp/lib that the binding loads are the same files).
LINKED = ("libllama.so", "libllama-common.so", "libmtmd.so", "libggml.so", "libggml-base.so", "libggml-cpu.so")
# ggml's CMake options for x86 instruction sets -> their /proc/cpuinfo flag names.
INSTRUCTION_SETS = {"GGML_SSE42": "sse4_2", "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma",
                    "GGML_F16C": "f16c", "GGML_BMI2": "bmi2", "GGML_AVX_VNNI": "avx_vnni",
                    "GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512vbmi", "GGML_AVX512_VNNI": "avx512_vnni",
                    "GGML_AVX512_BF16": "avx512_bf16", "GGML_AMX_TILE": "amx_tile", "GGML_AMX_INT8": "amx_int8",
                    "GGML_AMX_BF16": "amx_bf16"}
# What ggml turns on by itself in a build that is not native (ggml/CMakeLists.txt: INS_ENB).
PORTABLE_DEFAULTS = ("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C")
BUILD_TIMEOUT_S = 3 * 3600
SAFE_EXTRACT = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}   # Python 3.10.12+, 3.11.4+
BUILD_NOTE = "a few minutes of compiling, once per binding install"


class ToolError(RuntimeError):
    """A tool that ran and failed (or ran out of time): the command and its last lines of stderr."""


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


def _check_cpu(required: list[str], where: str) -> None:
    missing = sorted(set(required) - cpu_flags())
    if missing:
        raise ConfigError(f"llama.cpp's tools {where} need instruction sets this CPU lacks "
                          f"({', '.join(missing)}); build them for it with other flags (${CMAKE_ENV_VAR})")


def binding_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"llama.cpp's tools are built beside llama-cpp-python: {INSTALL}") from None


def binding_libs() -> pathlib.Path:
    """The folder of the installed binding's shared libraries and CMake configs (ConfigError, with the
    reinstall command, where one is missing)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        raise ConfigError(f"llama.cpp's tools are built beside llama-cpp-python: {INSTALL}")
    folder = pathlib.Path(spec.origin).parent.parent / "lib"
    for name in (*LINKED, "cmake/llama/llama-config.cmake"):
        if not (folder / name).exists():
            raise ConfigError(f"the installed llama-cpp-python has no {name} in {folder}, which llama.cpp's "
                              f"tools link: reinstall it ({INSTALL})")
    return folder


def linked_libraries(folder: pathlib.Path) -> dict[str, str]:
    """sha256 of each library the tools link, by name."""
    return {name: _sha256((folder / name).resolve()) for name in LINKED}


def tools_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get(TOOLS_ENV_VAR) or DEFAULT_ROOT).expanduser()


def build_key(version: str, flags: list[str], libs: pathlib.Path, linked: dict[str, str]) -> str:
    """``<version>-<hash>``: the hash of the flags, the binding's libraries (their folder, which the
    tools' run path names, and sha256) and, for a native build, this CPU's flags."""
    text = " ".join([*flags, *TOOL_FLAGS, str(libs), *sorted(f"{k}={v}" for k, v in linked.items())])
    if is_native(flags):
        text += "\ncpu: " + " ".join(sorted(cpu_flags()))
    return f"{version}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def read_card(folder: pathlib.Path) -> dict | None:
    try:
        card = json.loads((folder / CARD_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return card if isinstance(card, dict) else None


def damage(folder: pathlib.Path) -> str | None:
    """What is wrong with a tools folder against its card (``"not built"`` where it has none); None
    when every binary is there with the card's size and sha256."""
    card = read_card(folder)
    if card is None:
        return "not built" if not folder.exists() else f"no readable {CARD_FILE}"
    if card.get("format_version") != FORMAT_VERSION:
        return f"card format {card.get('format_version')}, not {FORMAT_VERSION}"
    for name in BINARIES:
        expected = card.get("binaries", {}).get(name)
        path = folder / name
        if not expected:
            return f"the card lists no {name}"
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the card says {expected['bytes']}"
        if _sha256(path) != expected["sha256"]:
            return f"{name}'s sha256 differs from the card's"
    return None


def tools_dir(build: bool = True) -> pathlib.Path:
    """The folder holding ``llama-bench`` and ``llama-server`` for the installed binding's version and
    flags, checked against its card; built first where missing or damaged (one process builds, others
    wait on a file lock; with ``build`` False a caller still waits for a build under way). ConfigError
    where this CPU lacks an instruction set the build needs, or where it is not built and ``build`` is
    False."""
    version, flags, libs = binding_version(), cmake_flags(), binding_libs()
    _check_cpu(required_instruction_sets(flags), "for these flags")
    linked = linked_libraries(libs)
    folder = tools_root() / build_key(version, flags, libs, linked)
    lock = folder.parent / f".{folder.name}.lock"
    problem = damage(folder)
    if problem is not None and not build and lock.exists():
        with locked(lock):                  # a build under way (a sweep's, beside its first trials): wait for it
            problem = damage(folder)
    if problem is not None:
        if not build:
            raise ConfigError(f"llama.cpp's tools in {folder}: {problem}; build them with: "
                              "python -m trials.engines.llama_cpp.tools build")
        folder.parent.mkdir(parents=True, exist_ok=True)
        with locked(lock):
            problem = damage(folder)         # another process may have built them meanwhile
            if problem is not None:
                if problem != "not built":
                    print(f"llama.cpp tools: {folder} is damaged ({problem}): building again",
                          file=sys.stderr, flush=True)
                _build(folder, version, flags, libs, linked)
    _check_cpu(read_card(folder)["required_instruction_sets"], f"in {folder}")
    return folder


def server_binary() -> pathlib.Path:
    """``llama-server`` of the installed binding's llama.cpp (built if needed)."""
    return tools_dir() / "llama-server"


@contextlib.contextmanager
def locked(path: pathlib.Path):
    """An exclusive ``flock`` on ``path`` for the block (one build, or one measurement, at a time)."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cmake(scratch: pathlib.Path) -> str:
    """A cmake: the system's, else the one pip installs (the binding's build fetched it the same way)."""
    found = shutil.which("cmake")
    if found:
        return found
    target = scratch / "cmake-package"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), "cmake"],
                   check=False, capture_output=True, timeout=1800)
    done = subprocess.run([sys.executable, "-c", "import cmake; print(cmake.CMAKE_BIN_DIR)"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)})
    binary = pathlib.Path(done.stdout.strip() or "/nonexistent") / "cmake"
    if not binary.is_file():
        raise ConfigError("building llama.cpp's tools needs cmake: apt-get install cmake (or pip install cmake)")
    return str(binary)


BUILD_CORE_S_ESTIMATE = 360.0   # a prior for the budget, not a measurement: each card keeps its own build_s


def beside_estimate_s() -> float:
    """For a sweep's budget (``sweeps.setup_beside``): the core-seconds a ``build`` would take here, 0
    where the tools are built and whole. An estimate (compiling two tools against the binding's
    libraries); the sweep's summary prints what the build took."""
    version, flags, libs = binding_version(), cmake_flags(), binding_libs()
    folder = tools_root() / build_key(version, flags, libs, linked_libraries(libs))
    return 0.0 if damage(folder) is None else BUILD_CORE_S_ESTIMATE


def _build(folder: pathlib.Path, version: str, flags: list[str], libs: pathlib.Path, linked: dict[str, str]) -> None:
    """Build the tools against the binding's libraries ``libs`` in a temporary folder beside ``folder``
    and move them into place, card last."""
    started = time.monotonic()
    print(f"llama.cpp tools: building llama.cpp's llama-bench and llama-server ({BUILD_NOTE}) into {folder}",
          file=sys.stderr, flush=True)
    log_path = folder.parent / f"{folder.name}.build.log"
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.") as tmp:
        scratch = pathlib.Path(tmp)
        sdist = convert.download_sdist(version, scratch, "llama.cpp tools", hint="")
        with tarfile.open(sdist) as archive:
            archive.extractall(scratch / "src", **SAFE_EXTRACT)
        sdist.unlink()
        source = next((scratch / "src").glob("*/vendor/llama.cpp"), None)
        if source is None:
            raise ConfigError(f"{sdist.name} holds no vendor/llama.cpp")
        cores = len(os.sched_getaffinity(0))
        configure = ["cmake", "-S", str(TOOLS_PROJECT), "-B", "build", f"-DLLAMA_SOURCE={source}",
                     f"-DBINDING_LIBS={libs}", *TOOL_FLAGS]
        compile_ = ["cmake", "--build", "build", "-j", str(cores), "--target", *BINARIES]
        cmake = _cmake(scratch)
        with log_path.open("w") as log:
            for command in (configure, compile_):
                log.write(f"$ {shlex.join(command)}\n")
                log.flush()
                done = run_killable([cmake, *command[1:]], BUILD_TIMEOUT_S, check=False,
                                    cwd=source.parent.parent, stdout=log, stderr=subprocess.STDOUT)
                if done.returncode != 0:
                    lines = [line for line in log_path.read_text().splitlines() if line.strip()] or ["no output"]
                    raise ConfigError(f"building llama.cpp's tools failed at `{shlex.join(command)}`: "
                                      f"{lines[-1].strip()} (log: {log_path})")
        staged = scratch / "tools"
        staged.mkdir()
        built = source.parent.parent / "build" / "bin"
        for name in BINARIES:
            shutil.copy2(built / name, staged / name)
        card = {"format_version": FORMAT_VERSION, "llama_cpp_python": version, "flags": flags,
                "tool_flags": list(TOOL_FLAGS), "native": is_native(flags),
                "binding_libs": str(libs), "linked": linked,
                "commands": [shlex.join(configure), shlex.join(compile_)], "cores": cores,
                "build_s": round(time.monotonic() - started, 1),
                "binaries": {name: {"bytes": (staged / name).stat().st_size, "sha256": _sha256(staged / name)}
                             for name in BINARIES},
                "required_instruction_sets": required_instruction_sets(flags),
                **_build_info(staged)}
        (staged / CARD_FILE).write_text(json.dumps(card, indent=2))
        if folder.exists():
            os.replace(folder, scratch / "damaged")     # removed with the temporary folder
        os.replace(staged, folder)
    print(f"llama.cpp tools: built in {card['build_s']:.0f} s: {folder}", file=sys.stderr, flush=True)


def _build_info(folder: pathlib.Path) -> dict:
    """What the tools say of themselves without a model: ``llama-server --version`` (version, commit,
    compiler, target) and ggml's system info (the CPU features compiled in), which the server prints
    before it loads a model (here one that does not exist, so it stops there)."""
    server = str(folder / "llama-server")
    version = _said([server, "--version"])
    probe = _said([server, "-m", str(folder / "no-model.gguf"), "-lv", "4", "--host", "127.0.0.1", "--port", "0"])
    system = next((line.split("system_info: ", 1)[1] for line in probe.splitlines() if "system_info: " in line), "")
    return {"build_info": " ".join(version.split()), "system_info": system.strip()}


def _said(command: list[str], timeout_s: float = 60) -> str:
    """stdout and stderr of a command expected to exit by itself (whatever its exit code)."""
    try:
        done = run_killable(command, timeout_s, check=False)
        return f"{done.stdout}\n{done.stderr}"
    except ToolError as exc:
        return str(exc)


def llama_bench(gguf_path: str | os.PathLike, threads: int, prompt_tokens: int = 128, gen_tokens: int = 32,
                repeats: int = 3, cache_type: str = "f16", flash_attn: bool = True, timeout_s: float = 600,
                folder: pathlib.Path | None = None) -> dict:
    """``llama-bench`` on one GGUF: prompt processing (``pp<prompt_tokens>``) and generation
    (``tg<gen_tokens>``) tokens per second, mean and standard deviation over ``repeats``, with the
    build, CPU, backends and exact command as ``llama_bench_*`` tags. A cross-check of the binding's
    numbers by llama.cpp's own benchmark. ToolError if it fails or outlives ``timeout_s`` (then its
    whole process group is killed, as on any exception). ``folder``: the tools' folder where the caller
    already checked it (``tools_dir``), else found and checked here."""
    rows, command = llama_bench_rows(gguf_path, threads, (prompt_tokens,) if prompt_tokens else (), gen_tokens,
                                     repeats, cache_type, flash_attn, timeout_s, folder)
    result = {}
    for phase, tokens in (("pp", prompt_tokens), ("tg", gen_tokens)):
        row = next((r for r in rows if (r["n_prompt"], r["n_gen"]) == ((tokens, 0) if phase == "pp" else (0, tokens))),
                   None)
        if tokens and row is None:
            raise ToolError(f"`{shlex.join(command)}` printed no {phase}{tokens} row")
        result[f"llama_bench_{phase}_tok_per_s"] = row["avg_ts"] if row else None
        result[f"llama_bench_{phase}_tok_per_s_std"] = row["stddev_ts"] if row else None
    first = rows[0]
    for key in ("build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_type", "model_size",
                "model_n_params", "n_threads", "type_k", "type_v", "flash_attn", "n_batch", "n_ubatch"):
        result[f"llama_bench_{key}"] = first.get(key)
    result["llama_bench_command"] = shlex.join(command)
    return result


def llama_bench_rows(gguf_path: str | os.PathLike, threads: int, prompt_sizes: tuple[int, ...] = (128,),
                     gen_tokens: int = 32, repeats: int = 3, cache_type: str = "f16", flash_attn: bool = True,
                     timeout_s: float = 600, folder: pathlib.Path | None = None,
                     batch_tokens: int | None = None) -> tuple[list[dict], list[str]]:
    """``llama-bench``'s JSON rows (one per test: ``pp<p>`` for each of ``prompt_sizes``, ``tg<gen_tokens>``
    unless 0) and the command that printed them. ``batch_tokens``: its ``-b`` and ``-ub`` (a prompt of
    at most that many tokens is then one step); llama-bench's defaults otherwise."""
    for name, value, least in (("threads", threads, 1), ("gen_tokens", gen_tokens, 0), ("repeats", repeats, 1),
                               *(("prompt_tokens", p, 1) for p in prompt_sizes),
                               *((("batch_tokens", batch_tokens, 1),) if batch_tokens is not None else ())):
        if not isinstance(value, int) or value < least:
            raise ConfigError(f"llama_bench: {name} must be an integer >= {least}, not {value!r}")
    if not prompt_sizes and not gen_tokens:
        raise ConfigError("llama_bench: prompt_tokens and gen_tokens are both 0: nothing to measure")
    if not pathlib.Path(gguf_path).is_file():
        raise ConfigError(f"llama_bench: no GGUF file {gguf_path}")
    command = [str((folder or tools_dir()) / "llama-bench"), "-m", str(gguf_path), "-t", str(threads),
               "-p", ",".join(str(p) for p in prompt_sizes) or "0", "-n", str(gen_tokens), "-r", str(repeats),
               "-fa", "on" if flash_attn else "off", "-ctk", cache_type, "-ctv", cache_type, "-o", "json"]
    if batch_tokens is not None:
        command[-2:-2] = ["-b", str(batch_tokens), "-ub", str(batch_tokens)]
    done = run_killable(command, timeout_s)
    try:
        rows = json.loads(done.stdout)
    except ValueError:
        raise ToolError(f"`{shlex.join(command)}` printed no JSON: {_tail(done.stderr)}") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ToolError(f"`{shlex.join(command)}` printed no rows: {_tail(done.stderr)}")
    return rows, command


def run_killable(command: list[str], timeout_s: float, check: bool = True, **popen) -> subprocess.CompletedProcess:
    """Run ``command`` in its own process group (output captured unless ``popen`` says where). On a
    timeout, an exception or Ctrl-C the whole group is killed before this raises: nothing is left
    running (a build's compilers included). ToolError on a timeout, or a failure where ``check``."""
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, text=True, start_new_session=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _, stderr = _kill_group(process)
        raise ToolError(f"`{shlex.join(command)}` ran past {timeout_s:g} s and was stopped: {_tail(stderr)}") from None
    except BaseException:
        _kill_group(process)
        raise
    if check and process.returncode != 0:
        code = process.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"failed (exit code {code})"
        raise ToolError(f"`{shlex.join(command)}` {how}: {_tail(stderr)}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen) -> tuple[str, str]:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.communicate()


def _tail(stderr: str, lines: int = 3) -> str:
    kept = [line.strip() for line in (stderr or "").splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "no output on stderr"


def _summary(folder: pathlib.Path, card: dict) -> str:
    sizes = ", ".join(f"{name} {card['binaries'][name]['bytes'] / 2**20:.1f} MiB" for name in BINARIES)
    return "\n".join([str(folder), f"llama-cpp-python {card['llama_cpp_python']}, flags: {' '.join(card['flags'])}",
                      f"built in {card['build_s']:.0f} s on {card['cores']} cores; {sizes}",
                      f"linked against the binding's libraries in {card['binding_libs']}",
                      f"needs: {', '.join(card['required_instruction_sets']) or 'nothing beyond x86-64'}",
                      f"build: {card['build_info']}", f"system info: {card['system_info']}"])


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


@one_line_errors("python -m trials.engines.llama_cpp.tools")
def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(
        prog="python -m trials.engines.llama_cpp.tools",
        description="llama.cpp's llama-bench and llama-server, built from the installed llama-cpp-python's "
                    f"source with its flags ({FLAGS_FILE.name} or ${CMAKE_ENV_VAR}); cache: ${TOOLS_ENV_VAR} "
                    f"or {DEFAULT_ROOT}.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help=f"build the tools, or confirm they are built ({BUILD_NOTE})",
                   description=f"Build llama-bench and llama-server once ({BUILD_NOTE}), or check the "
                               "build against its card; prints the folder and the card's summary.")
    sub.add_parser("info", help="print the build card, or say the tools are not built",
                   description="Print the tools' build card (JSON), or say they are not built.")
    args = parser.parse_args(argv)
    if args.command == "build":
        folder = tools_dir()
        print(_summary(folder, read_card(folder)))
        return 0
    libs = binding_libs()
    folder = tools_root() / build_key(binding_version(), cmake_flags(), libs, linked_libraries(libs))
    problem = damage(folder)
    if problem is not None:
        print(f"llama.cpp's tools are not usable in {folder}: {problem} "
              "(python -m trials.engines.llama_cpp.tools build)")
        return 1
    print(json.dumps(read_card(folder), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
