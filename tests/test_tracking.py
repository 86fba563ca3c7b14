"""The store on its own: a real sqlite MLflow store in a temporary folder."""

import pytest

import tracking
from trials.config import Stack, TrialConfig, Workload
from trials.groups import NAMES as GROUPS
from trials.loop import TrialResult, failed_result


def _config(precision="fp32"):
    return TrialConfig(group="baseline", model="tiny-gqa", stack=Stack(precision=precision),
                       workload=Workload("mixed", 1, 8), repeats=1)


@pytest.fixture
def uri(tmp_path):
    uri = tracking.resolve_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tracking.prepare_store(uri)
    return uri


def test_prepare_store_creates_every_group_with_artifacts_beside_the_db(uri, tmp_path):
    assert tracking.prepare_store(uri).keys() == set(GROUPS)  # idempotent
    result = TrialResult(_config(), "FINISHED", metrics={"tok_per_s": 12.5}, raw={"outputs": ["x"]})
    run_id = tracking.log_trial(uri, result)
    assert tracking.read_trial_artifact(uri, run_id)["raw"] == {"outputs": ["x"]}
    assert list((tmp_path / "mlartifacts" / "baseline").rglob("trial.json"))


def test_experiments_open_on_their_runs_in_the_mlflow_ui(uri):
    """MLflow 3's UI shows an untagged experiment as a GenAI one (traces, no runs); the kind tag makes
    it open on the runs table, and stores made before the tag get it on the next sweep."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    kind = lambda: {client.get_experiment_by_name(g).tags.get("mlflow.experimentKind") for g in GROUPS}
    assert kind() == {"custom_model_development"}
    client.delete_experiment_tag(client.get_experiment_by_name("baseline").experiment_id, "mlflow.experimentKind")
    assert kind() != {"custom_model_development"}
    tracking.prepare_store(uri)
    assert kind() == {"custom_model_development"}


def test_failed_run_keeps_its_reason_and_is_not_skipped(uri):
    ok = TrialResult(_config(), "FINISHED", metrics={"tok_per_s": 10.0})
    bad = failed_result(_config("bf16"), RuntimeError("boom\nsecond line"))
    tracking.log_trial(uri, ok)
    tracking.log_trial(uri, bad)
    assert tracking.finished_hashes(uri, "baseline") == {_config().config_hash}
    every = tracking.runs_frame(uri, "baseline", status=None)
    failed = every[every["status"] == "FAILED"]
    assert list(failed["tags.error"]) == ["RuntimeError: boom"]
    finished = tracking.runs_frame(uri, "baseline")
    assert list(finished["tok_per_s"]) == [10.0] and list(finished["precision"]) == ["fp32"]
    assert finished["batch_size"].dtype.kind in "if"


def test_relative_sqlite_uri_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.resolve_uri(None) == f"sqlite:///{tmp_path}/mlflow.db"


def test_unreachable_stores_are_one_line_errors(tmp_path):
    for uri, needle in [("sqlite:////nonexistent/dir/x.db", "does not exist"),
                        ("http://127.0.0.1:9", "unreachable"), ("ftp://x", "unsupported")]:
        with pytest.raises(tracking.TrackingError, match=needle) as err:
            tracking.check_reachable(uri, timeout_s=2)
        assert "\n" not in str(err.value)
    with pytest.raises(tracking.TrackingError, match="no scheme"):
        tracking.resolve_uri(str(tmp_path))
