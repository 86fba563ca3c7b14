"""The main job end to end: real Ray Tune (local), a real sqlite MLflow store, the real CLI."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

import tracking
from conftest import mlflow_server
from sweeps import budget
from trials.hardware import cpu_profile

ROOT = Path(__file__).resolve().parents[1]
MODELS = "tiny-mha,tiny-gqa"


def sweep(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, str(ROOT / "sweeps" / "full.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def swept_store(tiny_zoo, tmp_path_factory):
    """Two sweeps into one store: the first runs every baseline trial, the second none."""
    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    uri = f"sqlite:///{db}"
    # the default budget: calibrate (into a fresh cache), estimate, then run; the second sweep reuses
    # the calibration, so it plans the same configs and skips them all
    env = {**os.environ, budget.CACHE_ENV_VAR: str(db.parent / "calibration.json")}
    first = sweep("--groups", "baseline", "--models", MODELS, "--tracking-uri", uri, env=env)
    second = sweep("--groups", "baseline", "--models", MODELS, "--tracking-uri", uri, env=env)
    return uri, first, second


def test_sweep_writes_finished_runs_cpu(swept_store):
    uri, first, _ = swept_store
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    frame = tracking.runs_frame(uri, "baseline")
    assert len(frame) == 4, first.stdout[-3000:]
    assert set(frame["model"]) == {"tiny-mha", "tiny-gqa"}
    assert set(frame["precision"]) == {"fp32", "bf16"}
    assert (frame["status"] == "FINISHED").all() and (frame["tok_per_s"] > 0).all()
    assert frame["tags.config_hash"].is_unique
    assert (frame["kv_cache_bytes"] == frame["kv_cache_bytes_exact"]).all()
    assert (frame["num_threads"] == 1).all(), "torch threads must follow the CPUs Ray granted"
    for column in ("tags.env.device_name", "tags.env.torch", "tags.env.transformers", "tags.env.ray",
                   "tags.env.mlflow", "tags.env.git_sha", "tags.env.host", "tags.env.cpu_model",
                   "tags.env.cpu_capability", "tags.env.bf16_native", "tags.env.bf16_matmul_ratio"):
        assert frame[column].notna().all() and (frame[column] != "").all(), column
    native = frame.set_index("precision")["tags.precision_native"]
    assert set(native["fp32"]) == {"True"}
    assert set(native["bf16"]) == {str(cpu_profile().bf16_native)}
    for needle in ("Calibration (what one step costs here", "tiny-gqa", "Estimated: ~", "Phases: zoo"):
        assert needle in first.stdout, (needle, first.stdout[-3000:])
    raw = tracking.read_trial_artifact(uri, frame["run_id"].iloc[0])
    assert raw["raw"]["outputs"] and raw["raw"]["repeats"]
    assert "4 finished, 0 failed, 0 skipped" in first.stdout
    assert "mlflow ui --backend-store-uri" in first.stdout and "dashboard/app.py" in first.stdout


def test_second_sweep_skips_everything_cpu(swept_store):
    uri, _, second = swept_store
    assert second.returncode == 0, second.stderr[-3000:]
    assert "0 finished, 0 failed, 4 skipped" in second.stdout
    assert len(tracking.runs_frame(uri, "baseline", status=None)) == 4


def test_dry_run_prints_the_plan_cpu(swept_store):
    uri, _, _ = swept_store
    out = sweep("--groups", "baseline", "--models", MODELS, "--tracking-uri", uri, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "total: 4 trials, 4 already finished" in out.stdout
    assert "tiny-gqa" in out.stdout


@pytest.mark.parametrize("args,needle", [
    (["--models", "nosuchmodel"], "nosuchmodel"),
    (["--groups", "nosuchgroup"], "valid: baseline"),
    (["--workers", "abc"], "'abc' is not an integer"),
    (["--tracking-uri", "sqlite:////nonexistent/dir/mlflow.db"], "does not exist"),
    (["--tracking-uri", "http://127.0.0.1:9/"], "unreachable"),
    (["--profile", "huge"], "invalid choice"),
    (["--budget", "soon"], "not a duration"),
])
def test_bad_input_is_one_line_and_touches_nothing_cpu(swept_store, args, needle):
    uri, _, _ = swept_store
    db = Path(uri[len("sqlite:///"):])
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    full_args = args if "--tracking-uri" in args else [*args, "--tracking-uri", uri]
    out = sweep(*full_args, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_mlflow_server_shows_the_same_runs_cpu(swept_store, tmp_path):
    """What the MLflow UI shows comes from `mlflow server` on the same store: the same runs."""
    uri, _, _ = swept_store
    with mlflow_server(uri, tmp_path / "artifacts") as base:
        experiment = requests.get(f"{base}/api/2.0/mlflow/experiments/get-by-name",
                                  params={"experiment_name": "baseline"}, timeout=10).json()
        runs = requests.post(f"{base}/api/2.0/mlflow/runs/search", timeout=10,
                             json={"experiment_ids": [experiment["experiment"]["experiment_id"]]}).json()
        served = {r["info"]["run_id"] for r in runs["runs"]}
        assert served == set(tracking.runs_frame(uri, "baseline", status=None)["run_id"])
        assert set(tracking.runs_frame(base, "baseline")["run_id"]) == served
