"""What the planned engines need built on this machine, built beside the first trials
(sweeps.setup_beside): which commands a plan needs, a finished one's report and machine-sharing window,
its niceness, and a build stopped midway (Ctrl-C, the sweep's end) leaving no process behind."""

import os
import re
import time

import psutil
import pytest

from sweeps.setup_beside import NICENESS, SetupBeside, commands_needed
from trials.config import Stack, TrialConfig, Workload
from trials.engines.llama_cpp import tools

TOOLS = ("trials.engines.llama_cpp.tools", "build")
WORKLOAD = Workload(prompts_per_type=1, max_new_tokens=4)


def test_a_plan_needs_llama_cpps_tools_once_where_an_engine_of_it_is_planned():
    transformers = TrialConfig("engines", "zoo-gqa", Stack(precision="bf16"), WORKLOAD)
    binding = TrialConfig("engines", "zoo-gqa", Stack(precision="q4_0", engine="llama_cpp"), WORKLOAD)
    server = TrialConfig("serving", "zoo-gqa", Stack(precision="q4_0", engine="llama_server"), WORKLOAD)
    assert commands_needed([transformers]) == []
    assert commands_needed([transformers, binding, server]) == [TOOLS]


def test_a_setup_runs_niced_and_reports_its_last_line_and_its_window(tmp_path):
    before = time.time()
    setup = SetupBeside([("timeit", "-n", "1", "-r", "1", "import time; time.sleep(2)")], tmp_path).start()
    (_, process, log), = setup.jobs
    assert psutil.Process(process.pid).nice() == NICENESS
    assert not setup.done() and setup.window()[1] >= setup.window()[0]
    process.wait(timeout=60)
    assert setup.done()
    line, = setup.finish()
    assert line.startswith("`python -m timeit -n 1 -r 1") and re.search(rf"done in \d+ s \(log: {log}\)$", line), line
    assert "per loop" in log.read_text()
    assert setup.finish() == []                   # said once
    start, end, host, what = setup.window()
    assert before <= start < end <= time.time() and end - start >= 1.5
    assert what.startswith("building: `python -m timeit") and host == os.uname().nodename
    setup.stop()                                  # ended already: nothing to do
    failing = SetupBeside([("json.tool", "/no/such/file.json")], tmp_path).start()
    failing.jobs[0][1].wait(timeout=60)
    line, = failing.finish()
    assert "failed (exit code 2)" in line and "No such file" in line, line


def test_a_running_setup_is_said_among_what_runs_until_it_ends(tmp_path, capsys):
    from ray import cloudpickle

    from sweeps.progress import ProgressPrinter

    printer = ProgressPrinter(total=1)
    setup = SetupBeside([("timeit", "-n", "1", "-r", "1", "import time; time.sleep(1)")], tmp_path).start()
    poll = setup.said_by(printer)
    printer.watch = poll                                   # as run_tune polls it
    assert cloudpickle.loads(cloudpickle.dumps(printer)).running == printer.running   # Tune pickles its callbacks
    building = "building: `python -m timeit -n 1 -r 1 import time; time.sleep(1)`"
    assert list(printer.running) == [building]
    poll()
    assert list(printer.running) == [building]            # still running
    setup.jobs[0][1].wait(timeout=60)
    poll()
    assert printer.running == {}
    assert re.search(r"beside the trials: done in \d+ s \(log: ", capsys.readouterr().out)
    poll()
    assert "done in" not in capsys.readouterr().out          # said once


@pytest.mark.faults
def test_a_build_stopped_midway_leaves_no_process_and_no_scratch_folder(tmp_path, monkeypatch):
    """The real build of llama.cpp's tools into an empty cache root, stopped once its compiler runs:
    every process it started (pip, cmake, the compilers) is gone, and so is its scratch folder."""
    monkeypatch.setenv(tools.TOOLS_ENV_VAR, str(tmp_path / "tools"))
    setup = SetupBeside([TOOLS], tmp_path).start()
    (_, process, log), = setup.jobs
    seen, deadline = {}, time.monotonic() + 300         # pid -> (process, its name when seen)
    try:
        while time.monotonic() < deadline and process.poll() is None:
            _note_descendants(process.pid, seen)
            if any("cmake" in name for _, name in seen.values()):
                break
            time.sleep(0.2)
        assert process.poll() is None, log.read_text()[-2000:]
        assert any("cmake" in name for _, name in seen.values()), "no cmake in 300 s: " + log.read_text()[-2000:]
        _note_descendants(process.pid, seen)
    finally:
        setup.stop()
    _, alive = psutil.wait_procs([p for p, _ in seen.values()], timeout=30)
    assert not alive, [name for p, name in seen.values() if p in alive]
    assert process.poll() is not None
    assert not [p for p in (tmp_path / "tools").iterdir() if p.is_dir()], list((tmp_path / "tools").iterdir())


def _note_descendants(pid: int, seen: dict) -> None:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for child in children:
        try:
            seen.setdefault(child.pid, (child, child.name()))
        except psutil.NoSuchProcess:
            pass
