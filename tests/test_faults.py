"""Faults on real processes: nothing lost, nothing duplicated.

The tracking server goes away: a real ``mlflow server`` is stopped while a trial is logged to it,
then started again on the same port and store. The result must be spooled on local disk (not lost),
then delivered exactly once: by ``python sweeps/full.py --flush`` (a real process), and never again
by a second flush or by the next successful log; and mid-sweep, down for 60 s. A Ray worker killed mid-trial, and the
driver killed with its whole process tree. Marked ``faults``: `make test-faults` and .ci/run run
them, `make test` does not (~5 min).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import tracking
from tracking import spool
from trials.config import Stack, TrialConfig, Workload
from trials.loop import TrialResult

from conftest import mlflow_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _result(tok_per_s: float) -> TrialResult:
    config = TrialConfig(group="baseline", model="tiny-gqa", stack=Stack(precision="fp32"),
                         workload=Workload("mixed", 1, 8), repeats=1)
    return TrialResult(config, "FINISHED", metrics={"tok_per_s": tok_per_s}, raw={"outputs": []})


@pytest.fixture
def spool_folder(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "spool"
    monkeypatch.setenv(spool.SPOOL_ENV, str(folder))
    return folder


def _finished(uri: str) -> list[float]:
    return sorted(tracking.runs_frame(uri, "baseline")["tok_per_s"].tolist())


@pytest.mark.faults
def test_a_tracking_server_outage_spools_and_delivers_exactly_once(tmp_path, spool_folder, monkeypatch):
    import socket

    backend = f"sqlite:///{tmp_path}/server.db"
    artifacts = tmp_path / "artifacts"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")      # fail fast in the test
    with mlflow_server(backend, artifacts, port) as url:
        tracking.prepare_store(url)
        assert tracking.log_trial(url, _result(10.0))
    # the server is down: the result is kept on disk, not lost, and the call does not raise
    assert tracking.log_trial(url, _result(20.0)) == ""
    assert len(spool.pending(url)) == 1
    with mlflow_server(backend, artifacts, port):
        assert _finished(url) == [10.0]                               # not delivered by itself yet
        flush = subprocess.run([sys.executable, str(ROOT / "sweeps" / "full.py"), "--flush"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=300)
        assert flush.returncode == 0, flush.stdout + flush.stderr
        assert "1 delivered, 0 left" in flush.stdout, flush.stdout
        assert _finished(url) == [10.0, 20.0] and not spool.pending()
        again = subprocess.run([sys.executable, str(ROOT / "sweeps" / "full.py"), "--flush"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and "0 delivered" in again.stdout
        tracking.log_trial(url, _result(30.0))                      # a later log delivers nothing twice
        assert _finished(url) == [10.0, 20.0, 30.0]


def test_a_half_written_run_is_replaced_not_duplicated(tmp_path, spool_folder):
    """The store went away between create_run and set_terminated: the spooled result's delivery
    deletes that RUNNING leftover (same trial_key) and writes the run once."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking.prepare_store(uri)
    record = {"result": _result(42.0).to_dict(), "sweep_id": "s", "trial_key": "k" * 32}
    client = MlflowClient(uri)
    client.create_run(tracking.experiment_id(uri, "baseline"), tags={"trial_key": "k" * 32})   # cut short
    spool.save(uri, record, "test")
    assert tracking.deliver_spooled(uri) == (1, 0)
    every = tracking.runs_frame(uri, "baseline", status=None)
    assert list(every["status"]) == ["FINISHED"] and list(every["tok_per_s"]) == [42.0]
    spool.save(uri, record, "test")                                  # the same result spooled twice
    assert tracking.deliver_spooled(uri) == (1, 0)
    assert len(tracking.runs_frame(uri, "baseline", status=None)) == 1


@pytest.mark.faults
def test_a_worker_killed_mid_trial_is_retried_once(tiny_zoo, tmp_path):
    """SIGKILL to the Ray worker running a trial (after it started: its attempt is counted): Tune
    retries it; the store ends with exactly one FINISHED run for that configuration and the dead
    attempt as a FAILED run that says so."""
    import os
    import signal
    import time

    import psutil

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    results = tmp_path / "ray_results"
    # the quick profile as written (no --budget): each trial runs seconds, so the kill lands mid-trial
    sweep = subprocess.Popen([sys.executable, str(ROOT / "sweeps" / "full.py"), "--groups", "baseline",
                              "--models", "tiny-gqa", "--workers", "1", "--tracking-uri", uri,
                              "--storage-path", str(results)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = None
    deadline = time.monotonic() + 600
    while killed is None and time.monotonic() < deadline and sweep.poll() is None:
        if list(results.rglob("attempts.txt")):
            # only this sweep's own workers (its local Ray runs under its driver), never another
            # sweep's running on the same machine
            for proc in psutil.Process(sweep.pid).children(recursive=True):
                try:
                    cmdline = proc.cmdline()
                except psutil.Error:
                    continue
                if any("ImplicitFunc" in part for part in cmdline):
                    os.kill(proc.pid, signal.SIGKILL)
                    killed = proc.pid
                    break
        time.sleep(0.05)
    out, _ = sweep.communicate(timeout=600)
    assert killed, "no trial worker to kill:\n" + out[-3000:]
    assert sweep.returncode == 0, out[-3000:]
    every = tracking.runs_frame(uri, "baseline", status=None)
    assert "tags.error" in every.columns, (every[["status"]], out[-3000:])
    killed_config = every[every["tags.error"].fillna("").str.contains("worker died before reporting")]
    assert len(killed_config) == 1, out[-3000:]
    mine = every[every["tags.config_hash"] == killed_config["tags.config_hash"].iloc[0]]
    assert sorted(mine["status"]) == ["FAILED", "FINISHED"], mine[["status", "tags.error"]]
    assert (every.groupby("tags.config_hash")["status"].apply(lambda s: (s == "FINISHED").sum()) == 1).all()


@pytest.mark.faults
def test_a_killed_driver_resumes_without_running_anything_twice(tiny_zoo, tmp_path):
    """SIGKILL to the sweep's driver and every process it started (its local Ray: GCS, raylet, the
    workers) once the first run is in the store; the same command again runs only the configurations
    without a FINISHED run: in the end each configuration has exactly one FINISHED run (the trial that
    was mid-flight is re-run once)."""
    import time

    import psutil

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = [sys.executable, str(ROOT / "sweeps" / "full.py"), "--groups", "baseline", "--models",
               "tiny-gqa,tiny-mha", "--workers", "1", "--budget", "10s", "--no-defer", "--tracking-uri", uri,
               "--storage-path", str(tmp_path / "ray_results")]
    first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and first.poll() is None:
            try:
                if len(tracking.runs_frame(uri, "baseline")):
                    break
            except Exception:  # the store is being created
                pass
            time.sleep(0.2)
        assert first.poll() is None, "the sweep ended before it could be killed"
    finally:
        try:
            tree = [first, *psutil.Process(first.pid).children(recursive=True)]   # Ray starts in its own sessions
        except psutil.NoSuchProcess:
            tree = [first]
        for proc in tree:
            try:
                proc.kill()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass
        first.wait(timeout=60)
        psutil.wait_procs([p for p in tree if isinstance(p, psutil.Process)], timeout=60)
    before = tracking.runs_frame(uri, "baseline")
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    counts = re.search(r"^  baseline +finished +(\d+) +failed +(\d+) +skipped +(\d+)$", again.stdout, re.M)
    assert counts and int(counts.group(3)) == len(before), again.stdout[-3000:]
    after = tracking.runs_frame(uri, "baseline")
    per_config = after.groupby("tags.config_hash").size()
    assert (per_config == 1).all(), per_config
    assert len(per_config) == len(before) + int(counts.group(1))


@pytest.mark.faults
def test_a_server_down_60_s_mid_sweep_loses_and_duplicates_nothing(tiny_zoo, tmp_path, spool_folder):
    """A real sweep logs to a real ``mlflow server``; once its first run is in, the server is stopped
    for 60 s, then started again on the same port and store. Trials that end meanwhile keep their
    results on disk; the sweep goes on; they are delivered by a later trial, by the sweep's end, or
    by ``--flush``. In the end: every configuration exactly once, FINISHED, and an empty spool."""
    import socket
    import time

    backend, artifacts = f"sqlite:///{tmp_path}/server.db", tmp_path / "artifacts"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, str(ROOT / "sweeps" / "full.py"), "--groups", "baseline,speculative",
               "--models", "tiny-gqa", "--workers", "1", "--budget", "none", "--tracking-uri", url,
               "--storage-path", str(tmp_path / "ray_results"), "--summary-json", str(tmp_path / "summary.json")]
    with mlflow_server(backend, artifacts, port):
        sweep = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and sweep.poll() is None:
            try:
                if len(tracking.runs_frame(url, "baseline")) + len(tracking.runs_frame(url, "speculative")):
                    break
            except Exception:    # the experiments are being created
                pass
            time.sleep(0.5)
        assert sweep.poll() is None, "the sweep ended before the outage"
    down_at = time.monotonic()
    time.sleep(60)                                   # the server is down; the sweep goes on
    with mlflow_server(backend, artifacts, port):
        out, _ = sweep.communicate(timeout=900)
        assert sweep.returncode == 0, out[-4000:]
        spooled_during = "spooled" in out or "Spooled" in out
        flush = subprocess.run([sys.executable, str(ROOT / "sweeps" / "full.py"), "--flush"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=300)
        assert flush.returncode == 0, flush.stdout + flush.stderr
        planned = len(__import__("json").loads((tmp_path / "summary.json").read_text())["outcomes"])
        every = [tracking.runs_frame(url, group, status=None) for group in ("baseline", "speculative")]
    assert not spool.pending(), "the spool still holds results"
    per_config = [frame.groupby("tags.config_hash").size() for frame in every]
    assert all((counts == 1).all() for counts in per_config), per_config          # nothing twice
    assert sum(len(counts) for counts in per_config) == planned                    # nothing lost
    assert all((frame["status"] == "FINISHED").all() for frame in every)
    assert time.monotonic() - down_at > 60 and spooled_during, out[-4000:]


@pytest.mark.faults
def test_ctrl_c_stops_the_sweep_with_130_and_leaves_no_process(tiny_zoo, tmp_path):
    """SIGINT to the sweep's driver (what Ctrl-C sends) once the first run is in the store: the sweep
    stops its trials, keeps what finished, says how many never ran, and exits 130 as a command stopped
    by Ctrl-C does (a script that runs it must not read success); none of its processes is left."""
    import signal
    import time

    import psutil

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = [sys.executable, str(ROOT / "sweeps" / "full.py"), "--groups", "baseline,batching", "--models",
               "tiny-gqa,tiny-mha", "--workers", "1", "--budget", "10s", "--no-defer", "--tracking-uri", uri,
               "--storage-path", str(tmp_path / "ray_results")]
    sweep = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and sweep.poll() is None and tracking.runs_frame(uri, "baseline").empty:
        time.sleep(0.2)
    assert sweep.poll() is None, "the sweep ended before it could be interrupted"
    tree = psutil.Process(sweep.pid).children(recursive=True)
    sweep.send_signal(signal.SIGINT)
    out, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 130, out[-3000:]
    assert re.search(r"\d+ planned trial\(s\) never ran \(interrupted\)", out), out[-3000:]
    assert len(tracking.runs_frame(uri, "baseline")) >= 1
    _, alive = psutil.wait_procs(tree, timeout=60)
    assert not alive, [" ".join(p.cmdline()[:3]) for p in alive if p.is_running()]


@pytest.mark.faults
def test_ctrl_c_while_llama_cpps_tools_build_beside_the_trials_leaves_no_process(tiny_zoo, tmp_path):
    """A sweep that plans llama.cpp trials on a machine without its tools builds them beside its first
    trials (sweeps.setup_beside); Ctrl-C while the compiler runs: exit 130, and no process of the build
    (pip, cmake, the compilers) nor of the sweep is left, nor the build's scratch folder."""
    import os
    import signal
    import time

    import psutil

    root = tmp_path / "tools"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = [sys.executable, str(ROOT / "sweeps" / "full.py"), "--groups", "engines", "--models", "tiny-gqa",
               "--budget", "10s", "--no-defer", "--tracking-uri", uri, "--storage-path", str(tmp_path / "ray_results")]
    sweep = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "LLM_SWEEPS_LLAMA_TOOLS_DIR": str(root)})
    seen, deadline = {}, time.monotonic() + 400
    while time.monotonic() < deadline and sweep.poll() is None:
        try:
            for child in psutil.Process(sweep.pid).children(recursive=True):
                seen.setdefault(child.pid, (child, child.name()))
        except psutil.NoSuchProcess:
            pass
        if any("cmake" in name for _, name in seen.values()):
            break
        time.sleep(0.2)
    assert sweep.poll() is None, "the sweep ended before its tools' build compiled: " + sweep.communicate()[0][-3000:]
    assert any("cmake" in name for _, name in seen.values()), "no cmake seen beside the sweep"
    sweep.send_signal(signal.SIGINT)
    out, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 130, out[-3000:]
    assert "started `python -m trials.engines.llama_cpp.tools build` beside the trials" in out, out[-3000:]
    _, alive = psutil.wait_procs([p for p, _ in seen.values()], timeout=60)
    assert not alive, [name for p, name in seen.values() if p in alive]
    assert not [p for p in root.iterdir() if p.is_dir()], list(root.iterdir())
