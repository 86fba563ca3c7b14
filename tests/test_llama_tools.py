"""llama.cpp's own tools (trials.engines.llama_cpp.tools): the build `make setup` made, checked against
its card; a damaged copy and a CPU that lacks an instruction set refused; llama-bench's numbers on a
real GGUF; a timed-out llama-bench leaves no process behind.

The tools are a build product of `make setup` (like the venv): these tests use that build and never
build (``tools_dir(build=False)``); copies go to a temporary cache root (``$LLM_SWEEPS_LLAMA_TOOLS_DIR``).
"""

import json
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from trials.engines.llama_cpp import bench, build_flags, tools
from trials.errors import ConfigError
from trials.models import pypi


@pytest.fixture(scope="module")
def built():
    """The tools folder `make setup` built (fails, with the command that builds it, where it did not)."""
    return tools.tools_dir(build=False)


@pytest.fixture(scope="module")
def smollm2_gguf():
    """The smallest real GGUF on the machine: SmolLM2-135M's Q4_1, inside its PyPI package."""
    return pypi.gguf_chunks("smollm2-135m-instruct")[0]


def copied(built, root, monkeypatch):
    """The build copied under a temporary cache root, which ``tools_dir`` then uses."""
    copy = root / built.name
    shutil.copytree(built, copy)
    monkeypatch.setenv(tools.TOOLS_ENV_VAR, str(root))
    return copy


def test_the_card_matches_the_binaries_and_the_binding(built):
    card = tools.read_card(built)
    assert tools.damage(built) is None
    assert card["llama_cpp_python"] == tools.binding_version()
    assert card["flags"] == build_flags.cmake_flags()
    assert card["required_instruction_sets"] == build_flags.required_instruction_sets(card["flags"])
    assert set(card["required_instruction_sets"]) <= build_flags.cpu_flags()
    assert "AVX2 = 1" in card["system_info"] or card["native"], card["system_info"]
    for name in tools.BINARIES:
        assert (built / name).stat().st_size == card["binaries"][name]["bytes"]
    assert tools.server_binary() == built / "llama-server"


def test_a_damaged_binary_is_found_and_not_used(built, tmp_path, monkeypatch):
    copy = copied(built, tmp_path, monkeypatch)
    with (copy / "llama-bench").open("r+b") as f:
        f.truncate(1000)
    assert "llama-bench has 1000 bytes" in tools.damage(copy)
    with pytest.raises(ConfigError, match="llama-bench has 1000 bytes"):
        tools.tools_dir(build=False)
    (copy / "llama-bench").unlink()
    assert tools.damage(copy) == "llama-bench is missing"
    shutil.copy2(built / "llama-bench", copy / "llama-bench")
    with (copy / "llama-server").open("r+b") as f:      # the same size, one byte changed
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert tools.damage(copy) == "llama-server's sha256 differs from the card's"
    (copy / tools.CARD_FILE).unlink()
    assert tools.damage(copy) == f"no readable {tools.CARD_FILE}"
    assert tools.damage(tmp_path / "elsewhere") == "not built"


def test_a_damaged_build_is_built_again_and_says_so(built, tmp_path, monkeypatch, capsys):
    copy = copied(built, tmp_path, monkeypatch)
    (copy / "llama-server").unlink()
    builds = []
    monkeypatch.setattr(tools, "_build", lambda folder, *_: builds.append(folder))   # no real build
    assert tools.tools_dir() == copy and builds == [copy]
    assert "is damaged (llama-server is missing): building again" in capsys.readouterr().err


def test_a_caller_that_never_builds_waits_for_a_build_under_way(built, tmp_path, monkeypatch):
    """A trial's cross-check (``build=False``) that starts while the sweep builds the tools beside it
    waits on the build's lock and gets the tools; with no build under way it is refused at once."""
    monkeypatch.setenv(tools.TOOLS_ENV_VAR, str(tmp_path))
    answer = {}

    def check():
        try:
            answer["folder"] = tools.tools_dir(build=False)
        except Exception as exc:  # noqa: BLE001 - said by the assertion below
            answer["error"] = exc

    with tools.locked(tmp_path / f".{built.name}.lock"):          # a build under way
        waiter = threading.Thread(target=check)
        waiter.start()
        waiter.join(1.5)
        assert waiter.is_alive() and not answer, answer
        shutil.copytree(built, tmp_path / built.name)                # ... that lands
    waiter.join(60)
    assert answer == {"folder": tmp_path / built.name}
    shutil.rmtree(tmp_path / built.name)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="not built; build them with"):
        tools.tools_dir(build=False)
    assert time.monotonic() - started < 5


def test_a_build_for_instructions_this_cpu_lacks_is_refused_in_one_line(built, tmp_path, monkeypatch):
    copy = copied(built, tmp_path, monkeypatch)
    card = tools.read_card(copy)
    card["required_instruction_sets"].append("avx9000")
    (copy / tools.CARD_FILE).write_text(json.dumps(card))
    with pytest.raises(ConfigError, match=r"lacks \(avx9000\)") as refused:
        tools.tools_dir(build=False)
    assert "\n" not in str(refused.value)


def test_builds_are_keyed_by_the_binding_install_and_native_ones_by_the_cpu(monkeypatch):
    version, libs = tools.binding_version(), tools.binding_libs()
    linked = tools.linked_libraries(libs)
    portable = build_flags.cmake_flags()
    assert not build_flags.is_native(portable)
    assert build_flags.required_instruction_sets(portable) == sorted(["sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"])

    def key(flags, folder=libs, shas=linked):
        return tools.build_key(version, flags, folder, shas)

    native = [f for f in portable if not f.startswith("-DGGML_NATIVE")]      # ggml's default: native
    assert build_flags.is_native(native) and key(native) != key(portable)
    before = key(native)
    monkeypatch.setattr(build_flags, "cpu_flags", lambda: {"avx", "sse4_2"})
    assert key(native) != before
    assert key(portable) == key(portable)
    # another install of the binding (other libraries, or the same ones elsewhere) is another build
    assert key(portable, shas={**linked, "libllama.so": "0" * 64}) != key(portable)
    assert key(portable, folder=libs.parent / "elsewhere") != key(portable)


def test_the_tools_run_the_bindings_own_libraries(built):
    """One build of llama.cpp: the tools link the binding's installed libraries, not copies of their own."""
    card, libs = tools.read_card(built), tools.binding_libs()
    assert card["linked"] == tools.linked_libraries(libs) and card["binding_libs"] == str(libs)
    loaded = subprocess.run(["ldd", str(built / "llama-server")], capture_output=True, text=True).stdout
    for name in ("libllama.so", "libggml-cpu.so", "libllama-common.so"):
        line = next(line for line in loaded.splitlines() if name in line)
        assert str(libs) in line, line


def test_llama_bench_measures_a_real_gguf(built, smollm2_gguf):
    result = bench.llama_bench(smollm2_gguf, threads=1, prompt_tokens=16, gen_tokens=8, repeats=1, timeout_s=300)
    assert result["llama_bench_pp_tok_per_s"] > 0 and result["llama_bench_tg_tok_per_s"] > 0
    assert result["llama_bench_pp_tok_per_s_std"] >= 0
    assert result["llama_bench_n_threads"] == 1 and result["llama_bench_build_commit"]
    assert "CPU" in result["llama_bench_backends"]
    assert f"-m {smollm2_gguf} -t 1 -p 16 -n 8 -r 1" in result["llama_bench_command"]


def no_llama_bench_left(built, gguf_path):
    """No llama-bench on this GGUF anywhere, and none among this process's children (other fixtures of
    the suite may keep children of their own: a Ray worker, a browser)."""
    left = [p for p in psutil.process_iter(["exe", "cmdline"])
            if p.info["exe"] == str(built / "llama-bench") and str(gguf_path) in (p.info["cmdline"] or [])]
    mine = [c for c in psutil.Process().children(recursive=True) if c.name() == "llama-bench"]
    return not left and not mine


def test_a_timed_out_llama_bench_leaves_no_process(built, smollm2_gguf):
    with pytest.raises(tools.ToolError, match="ran past 0.5 s"):
        bench.llama_bench(smollm2_gguf, threads=1, prompt_tokens=512, gen_tokens=256, repeats=5, timeout_s=0.5)
    assert no_llama_bench_left(built, smollm2_gguf)


def test_an_interrupted_llama_bench_leaves_no_process(built, smollm2_gguf):
    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)       # Ctrl-C, a second into the run
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            bench.llama_bench(smollm2_gguf, threads=1, prompt_tokens=512, gen_tokens=256, repeats=5, timeout_s=120)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert no_llama_bench_left(built, smollm2_gguf)


def test_a_failed_llama_bench_names_its_command(built, tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(tools.ToolError, match=r"llama-bench -m .*not-a-model.gguf.* failed \(exit code \d+\): .*\S"):
        bench.llama_bench(bad, threads=1, prompt_tokens=16, gen_tokens=0, repeats=1, timeout_s=60)
    with pytest.raises(ConfigError, match="threads must be an integer >= 1"):
        bench.llama_bench(bad, threads=0)


def test_the_command_line(built):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "trials.engines.llama_cpp.tools", *args],
                              capture_output=True, text=True, timeout=120)

    info = run("info")
    assert info.returncode == 0 and json.loads(info.stdout) == tools.read_card(built)
    for command in ("build", "info"):
        assert run(command, "--help").stdout.startswith("usage:")
    bad = run("rebuild")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
