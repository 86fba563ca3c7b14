"""The MLflow store: the only module of the project that imports mlflow.

One experiment per chart group (``trials.groups``), one run per trial: params are the flat
config, metrics are the trial's measurements, tags say group, model, ``config_hash`` and the
environment, and ``trial.json`` keeps the raw per-repeat numbers and generated texts. A trial that
failed is a FAILED run whose ``error`` tag is its one-line reason.

The default store is ``sqlite:///<cwd>/mlflow.db``; ``MLFLOW_TRACKING_URI`` or an explicit URI
(an ``mlflow server`` on clusters) override it. SQLite paths are made absolute, because Ray workers
run in other directories than the driver. The driver calls ``prepare_store`` before any trial
starts: it creates the schema and every experiment, with an artifact location beside the database,
so that workers never race to create them and artifacts never land in Ray's temporary folders.
A sqlite store whose schema is not the pinned mlflow's (a newer MLflow migrated it, which this one
cannot read) is refused in one line before MLflow opens it (``check_schema``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from pathlib import Path

import pandas as pd

from tracking import spool
from trials.config import TrialConfig, size_text
from trials.redaction import redact
from trials import groups

TRIAL_ARTIFACT = "trial.json"
_RETRIES = 5
# MLflow retries an HTTP request 7 times with exponential backoff (minutes) by default; a worker whose
# tracking server is away waits ~15 s and then spools its result instead (tracking.spool).
for _name, _value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                      ("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")):
    os.environ.setdefault(_name, _value)


class TrackingError(RuntimeError):
    """The store cannot be used; the message is one line meant for the user."""


def resolve_uri(uri: str | None = None) -> str:
    """Explicit URI, else ``MLFLOW_TRACKING_URI``, else ``mlflow.db`` in the working directory."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        if path and not path.startswith("/") and path != ":memory:":
            uri = "sqlite:///" + str(Path(path).resolve())
    elif "://" not in uri:                       # a bare folder or file path
        raise TrackingError(f"tracking URI {redact(uri)!r} has no scheme; use sqlite:///path/mlflow.db "
                            "or http://host:port")
    return uri


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def reachable_uri(uri: str | None = None, must_exist: bool = False) -> str:
    """``resolve_uri`` then ``check_reachable``: the store a command line names, or ``TrackingError``.
    ``must_exist`` (readers: the dashboard, the export, the report): a sqlite file that is not there
    is an error, not an empty store created in whatever folder the command ran in; and one they may
    not write (a copy of a cluster's store, say) is fine, since they only read."""
    uri = resolve_uri(uri)
    check_reachable(uri, writable=not must_exist)
    path = _sqlite_path(uri)
    if must_exist and path is not None and not path.is_file():
        raise TrackingError(f"no MLflow store at {path}: run a sweep first (python sweeps/full.py), or "
                            "name one with --tracking-uri")
    return uri


def check_reachable(uri: str, timeout_s: float = 5.0, writable: bool = True) -> None:
    """Raise ``TrackingError`` with one line when the store cannot be reached, or (``writable``)
    written."""
    path = _sqlite_path(uri)
    if path is not None:
        if not path.parent.is_dir():
            raise TrackingError(f"tracking store {redact(uri)} is unreachable: folder {path.parent} does not exist")
        if writable and (not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK))):
            raise TrackingError(f"tracking store {redact(uri)} is not writable")
        if not writable and path.exists() and not os.access(path, os.R_OK):
            raise TrackingError(f"tracking store {redact(uri)} is not readable")
        check_schema(uri)
        return
    if uri.startswith(("http://", "https://")):
        import requests

        try:
            response = requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
        except requests.RequestException as exc:
            raise TrackingError(f"tracking server {redact(uri)} is unreachable "
                                f"({type(exc).__name__}); is `mlflow server` running?") from None
        if response.status_code != 200:
            raise TrackingError(f"tracking server {redact(uri)} answered HTTP {response.status_code} on /health")
        return
    raise TrackingError(f"unsupported tracking URI {redact(uri)!r}; use sqlite:///path/mlflow.db or http(s)://")


@functools.cache
def _mlflow_schema() -> tuple[str, frozenset[str], str]:
    """(the installed mlflow's version, every schema revision its migrations know, the newest)."""
    from importlib.metadata import version

    import mlflow.store
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(Path(mlflow.store.__file__).parent / "db_migrations"))
    return version("mlflow"), frozenset(r.revision for r in script.walk_revisions()), script.get_current_head()


SCHEMA_SETTLE_S = 3.0     # an older schema revision that has not moved for this long is not being created


def _revisions(path: Path) -> list[str] | None:
    """The store's alembic revisions, read through a read-only connection (None: no MLflow schema
    yet, or not a sqlite file: MLflow says what it finds)."""
    import sqlite3
    from contextlib import closing

    try:
        with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            return [row[0] for row in db.execute("SELECT version_num FROM alembic_version")]
    except sqlite3.Error:
        return None


def check_schema(uri: str) -> None:
    """``TrackingError`` (one line) where a sqlite store's schema is not the one this mlflow writes: a
    newer MLflow migrated it (this one cannot read it; its own advice, `mlflow db upgrade`, cannot
    help), or it is older than this mlflow (then upgrading helps). Read before MLflow opens the
    store, through a read-only connection: the file is never changed."""
    path = _sqlite_path(uri)
    if path is None or not path.is_file() or path.stat().st_size == 0:
        return
    found = _revisions(path)
    mlflow_version, known, newest = _mlflow_schema()
    if not found or found == [newest]:
        return
    shown = redact(uri)
    unknown = [revision for revision in found if revision not in known]
    if unknown:
        raise TrackingError(
            f"tracking store {shown} was migrated by a newer MLflow: its schema revision {unknown[0]} is not one "
            f"this tool's mlflow {mlflow_version} knows (its newest is {newest}), and this tool needs mlflow "
            f"{mlflow_version}; open that store with the newer mlflow that migrated it, or give --tracking-uri a "
            "copy made before it was migrated")
    # An older revision: or another process is creating this store right now (MLflow migrates a new
    # store step by step, e.g. a second sweep or a dashboard started beside this one): wait while the
    # revision moves, and refuse only one that stands still.
    still_since = time.monotonic()
    while time.monotonic() - still_since < SCHEMA_SETTLE_S:
        time.sleep(0.25)
        now = _revisions(path)
        if not now or now == [newest]:
            return
        if now != found:
            found, still_since = now, time.monotonic()
    raise TrackingError(
        f"tracking store {shown} has schema revision {found[0]}, older than the one this tool's mlflow "
        f"{mlflow_version} reads ({newest}): back it up, then run `mlflow db upgrade {shown}` with mlflow "
        f"{mlflow_version}")


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def artifact_root(uri: str) -> str | None:
    """Where experiments keep artifacts: beside a sqlite file; a server decides for itself."""
    path = _sqlite_path(uri)
    return (path.parent / "mlartifacts").as_uri() if path is not None else None


# MLflow 3's UI opens an experiment without this tag in its GenAI view ("Traces: 0, no data"); with it,
# the runs table (our trials) is what opens.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def prepare_store(uri: str) -> dict[str, str]:
    """Create the schema and every group's experiment (idempotent); returns group -> experiment id."""
    check_reachable(uri)
    client = _client(uri)
    root = artifact_root(uri)
    ids = {}
    for group in groups.NAMES:
        experiment = client.get_experiment_by_name(group)
        if experiment is None:
            location = f"{root}/{group}" if root else None
            ids[group] = client.create_experiment(group, artifact_location=location,
                                                  tags={"chart_group": group, **EXPERIMENT_KIND})
        else:
            ids[group] = experiment.experiment_id
            for key, value in EXPERIMENT_KIND.items():      # stores made before the tag existed
                if experiment.tags.get(key) != value:
                    client.set_experiment_tag(experiment.experiment_id, key, value)
    return ids


def experiment_id(uri: str, group: str) -> str | None:
    """The group's experiment id in the store (None when the store has no such experiment yet)."""
    experiment = _client(uri).get_experiment_by_name(group)
    return experiment.experiment_id if experiment is not None else None


def _experiment_id(client, group: str) -> str:
    experiment = client.get_experiment_by_name(group)
    if experiment is None:
        raise TrackingError(f"experiment {group!r} does not exist; the sweep driver creates it "
                            "(tracking.prepare_store)")
    return experiment.experiment_id


def _finished_runs(uri: str, group: str):
    """Every FINISHED run of ``group``, oldest first, page by page (none: the group has no experiment)."""
    client = _client(uri)
    experiment = client.get_experiment_by_name(group)
    if experiment is None:
        return
    token = None
    while True:
        page = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'",
                                  max_results=1000, page_token=token, order_by=["attributes.start_time ASC"])
        yield from page
        token = page.token
        if not token:
            return


def finished_hashes(uri: str, group: str) -> set[str]:
    """``config_hash`` of every FINISHED run of ``group``: those configs need not run again."""
    return {r.data.tags.get("config_hash", "") for r in _finished_runs(uri, group)} - {""}


def finished_subjects(uri: str, group: str) -> dict[str, str]:
    """``subject_hash`` -> the size of the latest FINISHED run of it in ``group``
    (``TrialConfig.describe_size``): what the store measured, at whatever workload (runs logged
    before the tag existed are not in it)."""
    return {r.data.tags["subject_hash"]: size_text(*(r.data.params.get(k, "?") for k in
                                                     ("max_new_tokens", "prompts_per_type", "repeats")),
                                                   r.data.params.get("context_tokens", "0"))
            for r in _finished_runs(uri, group) if r.data.tags.get("subject_hash")}


def _with_retry(fn):
    """SQLite allows one writer at a time; a worker that finds it busy waits its turn."""
    for attempt in range(_RETRIES):
        try:
            return fn()
        except Exception as exc:  # mlflow wraps the driver's OperationalError in its own types
            if "locked" not in str(exc).lower() or attempt == _RETRIES - 1:
                raise
            time.sleep(0.2 * 2 ** attempt)


def log_trial(uri: str, result, sweep_id: str = "") -> str:
    """Record one ``trials.run.TrialResult`` as a run; returns the run id, or "" when the store
    could not be reached: then the result is spooled on local disk (``tracking.spool``) and delivered
    later, once. A successful log also delivers what this machine spooled for the same store."""
    import uuid

    record = {"result": result.to_dict(), "sweep_id": sweep_id, "trial_key": uuid.uuid4().hex}
    try:
        run_id = write_record(uri, record)
    except Exception as exc:
        if not _unreachable(uri, exc):
            raise

        path = spool.save(uri, record, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
        print(f"warning: tracking store {redact(uri)} unreachable; result spooled to {path} (delivered when it is "
              "back: the next trial, the next sweep, or `python sweeps/full.py --flush`)", flush=True)
        return ""
    deliver_spooled(uri)
    return run_id


def _unreachable(uri: str, exc: Exception) -> bool:
    """The write failed because the store is away (a server down, sqlite locked past the retries),
    not because of what was written."""
    if "locked" in str(exc).lower():
        return True
    try:
        check_reachable(uri, timeout_s=5)
    except TrackingError:
        return True
    return False


def deliver_spooled(uri: str | None = None) -> tuple[int, int]:
    """Deliver spooled results (to ``uri``, or each to its own store); (delivered, left). Never raises."""

    try:
        return spool.deliver(uri, redeliver_record)
    except Exception:  # the spool is best effort on top of the run that was just logged
        return 0, len(spool.pending(uri))


def redeliver_record(uri: str, record: dict) -> str:
    """``write_record`` at most once per trial_key, for a spooled result: a run with that key that
    ended means it was delivered; one still RUNNING (a write cut short when the store went away) is
    deleted and the result written again."""
    client = _client(uri)
    experiment_id = _experiment_id(client, TrialConfig.from_dict(record["result"]["config"]).group)
    for run in client.search_runs([experiment_id], f"tags.trial_key = '{record['trial_key']}'", max_results=10):
        if run.info.status in ("FINISHED", "FAILED", "KILLED"):
            return run.info.run_id
        client.delete_run(run.info.run_id)
    return write_record(uri, record)


def write_record(uri: str, record: dict) -> str:
    """Write one result (``log_trial``'s record: the result as a dict, sweep_id, and a trial_key new
    to the store, tagged on the run) as a run."""
    from mlflow.entities import Metric, Param

    data, key = record["result"], record["trial_key"]
    config = TrialConfig.from_dict(data["config"])
    client = _client(uri)
    experiment_id = _experiment_id(client, config.group)
    tags = {"group": config.group, "model": config.model, "config_hash": config.config_hash,
            "subject_hash": config.subject_hash, "stack": config.stack.label, "sweep_id": record["sweep_id"], "trial_key": key, **data["tags"]}
    if data.get("error"):
        tags["error"] = data["error"][:4000]
    now = int(time.time() * 1000)

    def write() -> str:
        run = client.create_run(experiment_id, run_name=f"{config.model} {config.stack.label}", tags=tags)
        run_id = run.info.run_id
        metrics = [Metric(k, float(v), now, 0) for k, v in data["metrics"].items()
                   if v is not None and math.isfinite(float(v))]
        params = [Param(k, v) for k, v in config.flat_params().items()]
        client.log_batch(run_id, metrics=metrics, params=params, tags=[])
        client.log_text(run_id, json.dumps(data, indent=1), TRIAL_ARTIFACT)
        client.set_terminated(run_id, status=data["status"])
        return run_id

    return _with_retry(write)


def record_machine_sharing(uri: str, sweep_id: str, beside=()) -> list[float]:
    """Tag each run of the sweep with what shared its host during its timed passes (other trials'
    timed passes, from any sweep on the store, and the ``beside`` windows: ``(start, end, host, what)``,
    e.g. the sweep's zoo training): metric ``shared_machine_fraction`` (0: it ran alone) and tag
    ``shared_machine`` saying with how many and which. Returns the tagged runs' fractions."""
    from mlflow.entities import Metric, RunTag

    from tracking.table import machine_sharing

    client = _client(uri)
    frames = [f for e in client.search_experiments() if e.name in groups.implemented()
              for f in [runs_frame(uri, e.name)] if not f.empty]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if frame.empty or "tags.sweep_id" not in frame:
        return []
    mine = set(frame.loc[frame["tags.sweep_id"] == sweep_id, "run_id"])
    now = int(time.time() * 1000)
    tagged = []
    for run_id, (fraction, count, names) in machine_sharing(frame, beside).items():
        if run_id not in mine:
            continue
        text = ("ran alone" if count == 0 else
                f"{count} other job(s) ran during {fraction:.0%} of its timed passes: {names[:400]}")
        _with_retry(lambda: client.log_batch(run_id, metrics=[Metric("shared_machine_fraction", fraction, now, 0)],
                                             tags=[RunTag("shared_machine", text)]))
        tagged.append(fraction)
    return tagged


def runs_frame(uri: str, group: str, status: str | None = "FINISHED") -> pd.DataFrame:
    """Runs of one group as a table (``tracking.table.to_frame``: one row per run, metrics and params
    as plain columns), read now; ``status`` None: every run, with its ``status`` column."""
    from tracking.table import search, to_frame

    client = _client(uri)
    experiment = client.get_experiment_by_name(group)
    if experiment is None:
        return pd.DataFrame()
    return to_frame(search(client, experiment.experiment_id, f"attributes.status = '{status}'" if status else ""))


def read_trial_artifact(uri: str, run_id: str) -> dict:
    """The raw ``trial.json`` of a run (per-repeat numbers, generated texts); ``TrackingError`` (one
    line) where the run has none, or it is not a JSON object (a corrupt or foreign artifact)."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    try:
        text = mlflow.artifacts.load_text(f"runs:/{run_id}/{TRIAL_ARTIFACT}")
    except Exception as exc:   # MLflow raises its own exception types, and OSError for a local file
        raise TrackingError(f"run {run_id} has no readable {TRIAL_ARTIFACT} ({type(exc).__name__})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrackingError(f"{TRIAL_ARTIFACT} of run {run_id} is corrupt: not JSON (line {exc.lineno}, "
                            f"column {exc.colno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise TrackingError(f"{TRIAL_ARTIFACT} of run {run_id} is corrupt: a JSON {type(data).__name__}, "
                            "not an object")
    return data
