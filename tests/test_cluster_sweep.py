"""The cluster path on one machine: a real 2-node Ray cluster and a real `mlflow server`.

A cluster run differs from a local one in two ways that can break: the driver joins an existing
cluster (--address), and workers on other nodes must reach the store, so it must be a server.
"""

import subprocess
import sys
from pathlib import Path

import pytest

import tracking
from conftest import mlflow_server

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def two_node_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
def server(tmp_path):
    with mlflow_server(f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "mlartifacts") as url:
        yield url


def test_sweep_on_a_two_node_cluster_logs_to_a_server(tiny_zoo, two_node_cluster, server, tmp_path):
    sweep = [sys.executable, str(ROOT / "sweeps" / "full.py"), "--address", two_node_cluster.address,
             "--groups", "baseline", "--models", "tiny-gqa", "--budget", "none"]
    local_file = subprocess.run([*sweep, "--tracking-uri", f"sqlite:///{tmp_path}/local.db"],
                                capture_output=True, text=True, timeout=300)
    assert local_file.returncode == 2 and "needs a tracking server" in local_file.stderr

    out = subprocess.run([*sweep, "--tracking-uri", server], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 finished, 0 failed, 0 skipped" in out.stdout
    frame = tracking.runs_frame(server, "baseline")
    assert len(frame) == 2 and (frame["tok_per_s"] > 0).all()
    assert frame["tags.ray.node_id"].nunique() == 2, "both nodes should have run trials"
    raw = tracking.read_trial_artifact(server, frame["run_id"].iloc[0])
    assert raw["raw"]["outputs"], "artifacts travel through the server"
