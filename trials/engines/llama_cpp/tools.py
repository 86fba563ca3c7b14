"""llama.cpp's own tools, ``llama-bench`` and ``llama-server``, built once beside the Python binding.

One build of llama.cpp serves the binding and its tools: the tools' own sources (from the same
llama-cpp-python source package as the installed binding, its ``vendor/llama.cpp``, fetched with pip
as ``convert.py`` fetches it) are compiled and linked against the binding's installed shared libraries
(libllama, libllama-common, libmtmd, libggml*; ``tools_cmake/CMakeLists.txt``), so a tool's number and
the binding's come from the very same code and instructions, and only the tools compile here. The
binding's CMake flags are the one line in ``cmake_flags`` (``build_flags``) that the Makefile's ``LLAMA_CPP_CMAKE`` reads
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

from trials.engines import process_group
from trials.engines.llama_cpp import build_flags, convert
from trials.engines.llama_cpp.binding import INSTALL
from trials.errors import ConfigError, one_line_errors

TOOLS_ENV_VAR = "LLM_SWEEPS_LLAMA_TOOLS_DIR"      # the cache root (the folders of each build are inside)
DEFAULT_ROOT = "~/.cache/llm-inference-sweeps/llama-cpp-tools"
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
BUILD_TIMEOUT_S = 3 * 3600
SAFE_EXTRACT = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}   # Python 3.10.12+, 3.11.4+
BUILD_NOTE = "a few minutes of compiling, once per binding install"


class ToolError(RuntimeError):
    """A tool that ran and failed (or ran out of time): the command and its last lines of stderr."""


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
    if build_flags.is_native(flags):
        text += "\ncpu: " + " ".join(sorted(build_flags.cpu_flags()))
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
    version, flags, libs = binding_version(), build_flags.cmake_flags(), binding_libs()
    build_flags.check_cpu(build_flags.required_instruction_sets(flags), "for these flags")
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
    build_flags.check_cpu(read_card(folder)["required_instruction_sets"], f"in {folder}")
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
    version, flags, libs = binding_version(), build_flags.cmake_flags(), binding_libs()
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
                "tool_flags": list(TOOL_FLAGS), "native": build_flags.is_native(flags),
                "binding_libs": str(libs), "linked": linked,
                "commands": [shlex.join(configure), shlex.join(compile_)], "cores": cores,
                "build_s": round(time.monotonic() - started, 1),
                "binaries": {name: {"bytes": (staged / name).stat().st_size, "sha256": _sha256(staged / name)}
                             for name in BINARIES},
                "required_instruction_sets": build_flags.required_instruction_sets(flags),
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
        raise ToolError(f"`{shlex.join(command)}` ran past {timeout_s:g} s and was stopped: {stderr_tail(stderr)}") from None
    except BaseException:
        _kill_group(process)
        raise
    if check and process.returncode != 0:
        code = process.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"failed (exit code {code})"
        raise ToolError(f"`{shlex.join(command)}` {how}: {stderr_tail(stderr)}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen) -> tuple[str, str]:
    process_group.stop(process, first=signal.SIGKILL)
    return process.communicate()


def stderr_tail(stderr: str, lines: int = 3) -> str:
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
                    f"source with its flags ({build_flags.FLAGS_FILE.name} or ${build_flags.CMAKE_ENV_VAR}); cache: ${TOOLS_ENV_VAR} "
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
    folder = tools_root() / build_key(binding_version(), build_flags.cmake_flags(), libs, linked_libraries(libs))
    problem = damage(folder)
    if problem is not None:
        print(f"llama.cpp's tools are not usable in {folder}: {problem} "
              "(python -m trials.engines.llama_cpp.tools build)")
        return 1
    print(json.dumps(read_card(folder), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
