"""Which cores a trial may use while the zoo trains beside it (``sweeps.cpus``): real affinity calls
on this machine, a reservation held by a live process (this one) or by a dead one."""

import os
import subprocess
import sys

import pytest

from sweeps import cpus


def test_describe_compresses_runs_of_cores():
    assert cpus.describe({0, 1, 2, 5}) == "0-2,5" and cpus.describe([3]) == "3" and cpus.describe([]) == ""


@pytest.mark.skipif(not cpus.supported() or len(cpus.current()) < 2, reason="needs two cores and sched_setaffinity")
def test_a_trial_avoids_the_reserved_core_while_its_holder_lives(tmp_path):
    machine = sorted(cpus.current())
    path = tmp_path / "reserved.json"
    try:
        with cpus.reservation(path, machine[-1:], "zoo training (tiny set)"):
            assert cpus.reserved(path)["what"] == "zoo training (tiny set)"
            assert cpus.current() == {machine[-1]}              # the holder runs on its core
            text = cpus.pin_trial(path, machine)                # this process as the trial's worker
            assert cpus.current() == set(machine[:-1]) and text == cpus.describe(machine[:-1])
        assert not path.exists()
        assert cpus.pin_trial(path, machine) == cpus.describe(machine), "unpinned again after the build"
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        path.write_text(f'{{"cpus": [{machine[-1]}], "pid": {int(dead.stdout)}, "what": "gone", "since": 0}}')
        assert cpus.reserved(path) is None and cpus.pin_trial(path, machine) == cpus.describe(machine)
        with cpus.away_from(machine[-1:]):
            assert machine[-1] not in cpus.current()
        assert cpus.current() == set(machine)
    finally:
        os.sched_setaffinity(0, set(machine))
