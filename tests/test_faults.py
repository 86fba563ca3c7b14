"""Faults on real processes: nothing lost, nothing duplicated.

The tracking server goes away: a real ``mlflow server`` is stopped while a trial is logged to it,
then started again on the same port and store. The result must be spooled on local disk (not lost),
then delivered exactly once: by ``python sweeps/full.py --flush`` (a real process), and never again
by a second flush or by the next successful log. Marked ``faults``: `make test-faults` and .ci/run
run it, `make test` does not (two server start-ups, ~25 s).
"""

from __future__ import annotations

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
