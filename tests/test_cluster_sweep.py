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


@pytest.fixture(scope="module")
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
    """A sweep file's own model (declared there only, with its path) runs on both nodes: the driver
    hands the file's models to every worker with its trial."""
    from trials.models import zoo
    sweep_file = tmp_path / "mine.yaml"
    sweep_file.write_text(f"models:\n  - name: my-tiny\n    path: {zoo.model_path('tiny-gqa')}\n"
                          "    draft: none\n    trust_remote_code: false\ngroups: [baseline]\n"
                          "profile: {base: quick, prompts_per_type: 1, max_new_tokens: 16, repeats: 2}\n")
    sweep = [sys.executable, str(ROOT / "sweeps" / "full.py"), "--address", two_node_cluster.address,
             "--sweep", str(sweep_file), "--budget", "none"]
    local_file = subprocess.run([*sweep, "--tracking-uri", f"sqlite:///{tmp_path}/local.db"],
                                capture_output=True, text=True, timeout=300)
    assert local_file.returncode == 2 and "needs a tracking server" in local_file.stderr

    out = subprocess.run([*sweep, "--tracking-uri", server], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 finished, 0 failed, 0 skipped" in out.stdout
    frame = tracking.runs_frame(server, "baseline")
    assert len(frame) == 2 and (frame["tok_per_s"] > 0).all()
    assert set(frame["model"]) == {"my-tiny"} and set(frame["tags.profile"]) == {"quick+mine"}
    assert frame["tags.ray.node_id"].nunique() == 2, "both nodes should have run trials"
    raw = tracking.read_trial_artifact(server, frame["run_id"].iloc[0])
    assert raw["raw"]["outputs"], "artifacts travel through the server"


def test_waiting_for_gpus_on_a_cluster_without_any_gives_up_in_one_line(two_node_cluster, tmp_path, capsys):
    """Bad input: a GPU sweep on a cluster with no GPU (Ray would wait forever for a GPU worker that
    cluster.yaml cannot start): --wait-for-gpus gives up after --gpu-wait, exit 2, one line, and the
    store is not touched."""
    import ray

    from sweeps.full import main

    store = tmp_path / "mlflow.db"
    try:
        code = main(["--address", two_node_cluster.address, "--wait-for-gpus", "1", "--gpu-wait", "2s",
                     "--tracking-uri", f"sqlite:///{store}"])
    finally:
        ray.shutdown()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err
    assert "waited 2 s for 1 GPU(s) and the cluster has 0" in lines[0]
    assert not store.exists()
