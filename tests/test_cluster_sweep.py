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
pytestmark = pytest.mark.cluster    # a 2-node cluster and a server: with the fault tests (make test-faults, .ci/run)


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


@pytest.fixture(scope="module")
def cluster_sweep(tiny_zoo, two_node_cluster, tmp_path_factory):
    """One sweep on the 2-node cluster, logging to a real `mlflow server`: the batching group's quick
    ladder for a sweep file's own model (``my-tiny``: tiny-gqa's folder, declared there only) and the
    zoo's tiny-mha, under a memory budget between tiny-gqa's batch-2 and batch-4 predicted peaks:
    (QuickSweep, budget)."""
    from conftest import QuickSweep, between_batch_2_and_4
    from trials.models import zoo

    folder = tmp_path_factory.mktemp("cluster-sweep")
    budget = between_batch_2_and_4("tiny-gqa")
    sweep_file = folder / "mine.yaml"
    sweep_file.write_text(f"models:\n  - name: my-tiny\n    path: {zoo.model_path('tiny-gqa')}\n"
                          "    draft: none\n    trust_remote_code: false\n  - tiny-mha\ngroups: [batching]\n"
                          "profile: {base: quick, prompts_per_type: 1, max_new_tokens: 16, repeats: 2}\n")
    args = ("--address", two_node_cluster.address, "--sweep", str(sweep_file), "--budget", "none",
            "--memory-budget", str(budget))
    with mlflow_server(f"sqlite:///{folder}/mlflow.db", folder / "mlartifacts") as url:
        done = subprocess.run([sys.executable, str(ROOT / "sweeps" / "full.py"), *args, "--tracking-uri", url],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
        sweep = QuickSweep(url, args, {}, done, folder)
        assert done.returncode == 0, sweep.log()
        yield sweep, budget


def test_a_cluster_sweep_needs_a_tracking_server(two_node_cluster, tmp_path, capsys):
    """Workers on other nodes cannot reach a sqlite file: one line, exit 2, nothing written."""
    import ray
    from sweeps.full import main

    store = tmp_path / "local.db"
    try:
        code = main(["--address", two_node_cluster.address, "--groups", "baseline", "--models", "tiny-mha",
                     "--budget", "none", "--tracking-uri", f"sqlite:///{store}"])
    finally:
        ray.shutdown()
    err = capsys.readouterr().err
    assert code == 2 and "needs a tracking server" in err and "Traceback" not in err, err
    assert not store.exists()


def test_sweep_on_a_two_node_cluster_logs_to_a_server(cluster_sweep):
    """A sweep file's own model (declared there only, with its path) runs on both nodes: the driver
    hands the file's models to every worker with its trial; the runs and their artifacts travel
    through the server."""
    sweep, _ = cluster_sweep
    frame = tracking.runs_frame(sweep.uri, "batching", status=None)
    assert set(frame["model"]) == {"my-tiny", "tiny-mha"} and set(frame["tags.profile"]) == {"quick+mine"}
    finished = frame[frame["status"] == "FINISHED"]
    assert len(finished) >= 2 and (finished["tok_per_s"] > 0).all()
    assert frame["tags.ray.node_id"].nunique() == 2, "both nodes should have run trials"
    raw = tracking.read_trial_artifact(sweep.uri, finished["run_id"].iloc[0])
    assert raw["raw"]["outputs"], "artifacts travel through the server"


def test_sweep_records_the_memory_boundary_and_goes_on(cluster_sweep):
    """Under a memory budget between tiny-gqa's batch-2 and batch-4 predicted peaks: what fits
    finishes (a prefix of the ladder), the rest are oom FAILED runs holding their prediction, and the
    sweep went on to the next model."""
    from sweeps.spaces import PROFILES
    from sweeps.sweepfile import load_sweep
    from trials.models.registry import get_model

    sweep, budget = cluster_sweep
    # the zoo model gets the quick ladder; an own model, on a CPU, the real models' (shorter) one
    entries = {e.name: e for e in load_sweep(sweep.folder / "mine.yaml").entries}
    ladders = {m: PROFILES["quick"].settings("batching", entries.get(m) or get_model(m))["batch_sizes"]
               for m in ("my-tiny", "tiny-mha")}
    assert len(ladders["my-tiny"]) >= 4
    frame = tracking.runs_frame(sweep.uri, "batching", status=None)
    assert sweep.counts("batching") == ((frame["status"] == "FINISHED").sum(),
                                        (frame["status"] == "FAILED").sum(), 0)
    for model, part in frame.groupby("model"):
        part = part.set_index("batch_size").sort_index()
        assert list(part.index) == list(ladders[model])
        assert (part["memory_budget_bytes"] == budget).all()
        fits = part["status"] == "FINISHED"
        assert fits.iloc[0] and not fits.iloc[-1] and fits.is_monotonic_decreasing, (model, part["status"])
        for _, row in part[fits].iterrows():
            assert row["outputs_match_batch1"] == 1 and row["peak_memory_bytes"] <= budget
            assert row["predicted_peak_memory_bytes"] <= budget
        for _, row in part[~fits].iterrows():
            # refused by its prediction, or (tiny models: the process's resident-set rise is a few MiB
            # of allocator noise, as large as batch 2's whole prediction) by its measured peak
            # (then the worker runs no larger batch of that model: "oom: not run, batch 2 ...")
            if row["tags.error"].startswith("oom: predicted peak"):
                assert row["predicted_peak_memory_bytes"] > budget
            else:
                assert row["tags.error"].startswith(("oom: measured peak", "oom: not run")), row["tags.error"]
    tiny_gqa = frame[frame["model"] == "my-tiny"].set_index("batch_size")
    finished = sorted(tiny_gqa[tiny_gqa["status"] == "FINISHED"].index)
    assert finished in ([1, 2], [1])                  # where the budget was put (batch 2: noise may tip it)
    assert (tiny_gqa.loc[[4, 8, 16], "predicted_peak_memory_bytes"].dropna() > budget).all()


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
