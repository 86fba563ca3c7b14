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


def test_the_sqlite_reader_gives_the_mlflow_api_table(quick_sweep):
    """``sqlite_frame`` reads the store's tables straight (10x faster); it must give the very table
    the MLflow API gives, every group, every column, every run (FINISHED and FAILED alike)."""
    import pandas as pd
    from mlflow import MlflowClient

    from tracking.table import search, sqlite_frame, to_frame

    client, path = MlflowClient(quick_sweep.uri), quick_sweep.uri[len("sqlite:///"):]
    compared = 0
    for group in GROUPS:
        experiment = tracking.experiment_id(quick_sweep.uri, group)
        api = to_frame(search(client, experiment, "attributes.status != 'RUNNING'"))
        direct = sqlite_frame(path, experiment)
        if api.empty:
            assert direct.empty
            continue
        assert set(api.columns) == set(direct.columns), group
        api, direct = (f.set_index("run_id").sort_index()[sorted(api.columns.drop("run_id"))] for f in (api, direct))
        pd.testing.assert_frame_equal(api, direct, check_dtype=False)
        compared += len(api)
    assert compared >= 10


def test_the_runs_cache_reads_only_what_changed(uri):
    """The dashboard's cache: a refresh with nothing new changes nothing; a new run, a rerun of the
    same configuration and a FAILED run each show up on the next refresh, with no full read."""
    cache = tracking.RunsCache(uri)
    assert cache.refresh() and cache.count() == 0
    assert not cache.refresh()
    tracking.log_trial(uri, TrialResult(_config(), "FINISHED", metrics={"tok_per_s": 10.0}))
    assert cache.refresh() and list(cache.frame("baseline")["tok_per_s"]) == [10.0]
    version = cache.version
    assert not cache.refresh() and cache.version == version
    tracking.log_trial(uri, TrialResult(_config(), "FINISHED", metrics={"tok_per_s": 20.0}))   # a rerun
    tracking.log_trial(uri, failed_result(_config("bf16"), RuntimeError("boom")))
    assert cache.refresh() and cache.count() == 3
    assert list(cache.frame("baseline")["tok_per_s"]) == [10.0, 20.0]
    assert list(cache.frame("baseline", latest=True)["tok_per_s"]) == [20.0]      # one per configuration
    assert list(cache.frame("baseline", "FAILED")["tags.error"]) == ["RuntimeError: boom"]
    assert cache.finished_hashes("baseline") == {_config().config_hash}
    assert cache.refresh(full=True) and cache.count() == 3


def test_the_runs_cache_picks_up_a_run_that_ends_later(uri):
    """A run still RUNNING is not charted; once it ends (its end time is the news) it is."""
    from mlflow import MlflowClient

    cache = tracking.RunsCache(uri)
    cache.refresh()
    client = MlflowClient(uri)
    run = client.create_run(tracking.experiment_id(uri, "baseline"), tags={"config_hash": "x"})
    client.log_metric(run.info.run_id, "tok_per_s", 5.0)
    assert not cache.refresh() and cache.count() == 0
    client.set_terminated(run.info.run_id, "FINISHED")
    assert cache.refresh() and list(cache.frame("baseline")["tok_per_s"]) == [5.0]


def test_a_running_sweep_says_what_runs_now_beside_a_sqlite_store(tmp_path):
    """The driver's status file (tracking.live): written atomically beside the store, read while
    fresh, gone from the page once the sweep is done or silent past FRESH_S; a server store has none."""
    import time

    from dashboard.app import live_line
    from tracking import live

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert live_line(uri) == ""                                           # no sweep ever wrote here
    now = time.time()
    tracking.write_live(uri, "sweep-1", {"baseline tiny-gqa fp32": now - 12}, 3, 10)
    line = live_line(uri)
    assert line.startswith("Sweep sweep-1 is running: 3/10 trials done; now: baseline tiny-gqa fp32 (1")
    assert live.read_live(uri, now=now + live.FRESH_S + 1) is None          # a killed sweep goes quiet
    tracking.write_live(uri, "sweep-1", {}, 10, 10)
    assert live_line(uri) == ""                                           # done
    assert live.live_path("http://127.0.0.1:5000") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep-live.json"]   # no temporary left behind
