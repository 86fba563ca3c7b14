"""CPU taken outside a trial's process tree (``trials.measurement.neighbours``), with real processes.

The machine these tests run on is shared: other processes may take any part of its CPUs at any time.
So no test asserts that nothing is outside; a process outside the tree must show (> 0.5 core: it
spins a whole core, or others take the rest), and the trial's own work is checked in CPU seconds
(which load does not change) and against a measurement of the same window with nothing in the tree.
"""

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest

from dashboard.sections.common import PROVENANCE, neighbour_note
from trials.config import Stack, TrialConfig, Workload
from trials.measurement.neighbours import NOISY_CORES, OutsideCpu
from trials.run import run_trial

needs_proc_stat = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc/stat (Linux)")

# The intermediate process prints the burner's pid and exits: the burner is reparented, out of our tree.
OUTSIDE_BURNER = ("import os\npid = os.fork()\nif pid:\n    print(pid, flush=True)\n    os._exit(0)\n"
                  "while True:\n    pass\n")

# Burns 0.5 s of CPU, says its CPU time, waits for a line, burns 1 s more, says its CPU time, exits.
TRIAL_CHILD = ("import sys, time\n"
               "def burn(s):\n    t = time.process_time()\n    while time.process_time() - t < s:\n        pass\n"
               "burn(0.5); print(time.process_time(), flush=True); sys.stdin.readline()\n"
               "burn(1.0); print(time.process_time(), flush=True)\n")


def _burn(seconds: float) -> None:
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass


@needs_proc_stat
def test_a_process_outside_the_tree_is_outside():
    starter = subprocess.Popen([sys.executable, "-c", OUTSIDE_BURNER], stdout=subprocess.PIPE, text=True)
    burner = int(starter.stdout.readline())
    starter.wait(timeout=10)
    starter.stdout.close()
    try:
        assert burner not in {p.pid for p in psutil.Process().children(recursive=True)}
        with OutsideCpu() as outside:
            time.sleep(1.5)
    finally:
        os.kill(burner, signal.SIGKILL)
    assert outside.outside_cpu_cores > 0.5
    assert outside.tree_cpu_cores < 0.3          # this process slept
    assert outside.noisy and outside.numbers() == ({"outside_cpu_cores": outside.outside_cpu_cores},
                                                   {"noisy_neighbour": "True"})


@needs_proc_stat
def test_the_sweeps_own_processes_are_not_a_neighbour():
    """In a sweep, the node's Ray raylet is a root too (``outside_trial``): the trials it runs beside
    this one are the sweep's plan, not a neighbour. A burner named as such a root counts as the sweep's."""
    from trials.measurement.neighbours import outside_trial

    starter = subprocess.Popen([sys.executable, "-c", OUTSIDE_BURNER], stdout=subprocess.PIPE, text=True)
    burner = int(starter.stdout.readline())
    starter.wait(timeout=10)
    starter.stdout.close()
    try:
        with outside_trial(sweep_pids=(burner,)) as outside:
            time.sleep(1.5)
    finally:
        os.kill(burner, signal.SIGKILL)
    assert outside.tree_cpu_cores > 0.3 and outside.pids == (os.getpid(), burner)


@needs_proc_stat
def test_the_trees_own_work_is_not_outside():
    """A child alive at enter (its CPU until then is not the window's), reaped inside the window, and
    this process's own loop: the tree's CPU seconds are theirs, counted once."""
    child = subprocess.Popen([sys.executable, "-c", TRIAL_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        before = float(child.stdout.readline())          # blocked now: its CPU time stands still
        with OutsideCpu(pids=()) as whole, OutsideCpu() as mine:
            child.stdin.write("go\n")
            child.stdin.flush()
            _burn(0.3)
            after = float(child.stdout.readline())
            child.wait(timeout=60)                       # reaped inside the window
    finally:
        child.kill()
        child.wait()
    expected = (after - before) + 0.3
    assert expected - 0.05 < mine.tree_cpu_s < expected + 0.25    # counted once; its exit and ours are the rest
    assert whole.tree_cpu_s == 0
    # the same window with nothing in the tree: there, all of it was outside
    assert whole.outside_cpu_cores * whole.wall_s - mine.outside_cpu_cores * mine.wall_s > 1.0


def test_without_proc_stat_it_says_so():
    with OutsideCpu(proc_stat="/no/proc/stat") as outside:
        _burn(0.05)
    assert outside.outside_cpu_cores is None and outside.noisy is None
    assert "/no/proc/stat cannot be read" in outside.reason
    metrics, tags = outside.numbers()
    assert metrics == {} and tags["noisy_neighbour"].startswith("unknown: ")
    assert outside.tree_cpu_s > 0                          # the tree is still measured


@needs_proc_stat
def test_a_trial_carries_the_cpu_outside_it(tiny_zoo):
    result = run_trial(TrialConfig(group="baseline", model="tiny-gqa", stack=Stack(precision="fp32"),
                                   workload=Workload("mixed", 1, 8), repeats=2))
    cores = result.metrics["outside_cpu_cores"]
    assert cores >= 0
    assert result.tags["noisy_neighbour"] == str(cores > NOISY_CORES)
    assert result.metrics["trial_s"] > 0


def _find(component, component_id: str):
    if getattr(component, "id", None) == component_id:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, str) and (found := _find(child, component_id)) is not None:
            return found
    return None


def test_the_dashboard_marks_a_noisy_run(tmp_path):
    """Two runs through the real store, one beside a noisy neighbour: its hover says so, the page says so."""
    import tracking
    from dashboard import app
    from dashboard.sections import all_sections
    from trials.loop import TrialResult

    uri = tracking.resolve_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tracking.prepare_store(uri)
    for model, cores in (("tiny-gqa", 0.4), ("tiny-mha", 0.02)):
        config = TrialConfig(group="baseline", model=model, workload=Workload("mixed", 1, 8), repeats=1)
        tracking.log_trial(uri, TrialResult(config, "FINISHED", tags={"noisy_neighbour": str(cores > NOISY_CORES)},
                                            metrics={"tok_per_s": 100.0, "outside_cpu_cores": cores}))
    section = next(s for s in all_sections() if s.GROUP == "baseline")
    rendered = app.render_section(section, app.open_store(uri))

    note = _find(rendered, "baseline-noisy-neighbour").children
    assert note.startswith("1 run(s) shown ran beside a noisy neighbour") and "(up to 0.40)" in note
    shared = PROVENANCE.index("shared")
    beside = {x: t.customdata[i][shared] for t in _find(rendered, "baseline-throughput").figure.data
              for i, x in enumerate(t.x)}
    assert beside["tiny-gqa"].endswith("noisy neighbour: 0.40 cores outside")
    assert "noisy" not in beside["tiny-mha"]
    frame = pd.DataFrame({"tags.noisy_neighbour": ["True"], "outside_cpu_cores": [0.4]})
    assert neighbour_note(frame.drop(columns="tags.noisy_neighbour")) == ""     # runs from before the tag
