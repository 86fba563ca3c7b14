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
A sqlite path is checked before MLflow opens it (``check_sqlite``, ``check_schema``), because MLflow
creates its tables in whatever file it is given and ends in a SQLAlchemy traceback on anything else:
a folder, a file that is not sqlite or is truncated or damaged, another program's database, a schema
that is not the pinned mlflow's (a newer MLflow migrated it, which this one cannot read) are each
one line. A reader (dashboard, export, report, recommend) never creates or changes a store: an empty
file is refused, not given MLflow's tables; a sqlite file that is not there yet holds no runs (a dry
run reads it without creating it).

Beside the groups, the ``sweeps`` experiment keeps one run per sweep: what sized its trials (its
budget and the calibration its workloads were fitted with, ``sweep.json``), so that the next sweep
on the store can size the same trials the same way (``record_sweep``, ``sweep_records``).
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
CHARTED_BY = "charted_by"                # tag: every group that charts a shared run (sweeps.measure_once)
SWEEPS_EXPERIMENT = "sweeps"             # one run per sweep: what sized it (not a chart group)
SWEEP_ARTIFACT = "sweep.json"
ARTIFACT_FOLDER = "mlartifacts"          # beside a sqlite store: its experiments' artifacts
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
    written, or (a sqlite file) is not an MLflow store this tool can open (``check_sqlite``)."""
    path = _sqlite_path(uri)
    if path is not None:
        check_sqlite(uri, path, writable)
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


def check_sqlite(uri: str, path: Path, writable: bool) -> None:
    """What the path is, checked before MLflow touches it (MLflow would create its tables in any file
    it is given, or end in a SQLAlchemy traceback): its folder exists; it is a file, not a folder;
    a writer may write it and its folder, a reader may read it; and what is there is an MLflow
    store (``check_schema``). A writer may start from nothing (no file, or an empty one)."""
    shown = redact(uri)
    if not path.parent.is_dir():
        raise TrackingError(f"tracking store {shown} is unreachable: folder {path.parent} does not exist")
    if path.is_dir():
        raise TrackingError(f"tracking store {shown} is a folder, not a sqlite file: name the database in it, "
                            f"e.g. sqlite:///{path / 'mlflow.db'}")
    if path.exists() and not path.is_file():
        raise TrackingError(f"tracking store {shown} is not a regular file")
    if writable and (not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK))):
        raise TrackingError(f"tracking store {shown} is not writable")
    artifacts = path.parent / ARTIFACT_FOLDER
    if writable and artifacts.exists() and not (artifacts.is_dir() and os.access(artifacts, os.W_OK)):
        raise TrackingError(f"tracking store {shown} cannot keep artifacts: {artifacts} is not a writable folder")
    if not writable and path.exists() and not os.access(path, os.R_OK):
        raise TrackingError(f"tracking store {shown} is not readable")
    check_schema(uri, new_store_ok=writable)


@functools.cache
def _mlflow_schema() -> tuple[str, frozenset[str], str]:
    """(the installed mlflow's version, every schema revision its migrations know, the newest)."""
    from importlib.metadata import version

    import mlflow.store
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(Path(mlflow.store.__file__).parent / "db_migrations"))
    return version("mlflow"), frozenset(r.revision for r in script.walk_revisions()), script.get_current_head()


SCHEMA_SETTLE_S = 3.0     # a schema that has not moved for this long is not being created
SQLITE_MAGIC = b"SQLite format 3\x00"
MLFLOW_TABLES = frozenset({"alembic_version", "experiments", "runs"})


def _header_problem(path: Path) -> str | None:
    """Why the file is no sqlite database, or a truncated one (its header's own page count says how
    long it must be), in a few words; None where the header is sound."""
    size = path.stat().st_size
    with path.open("rb") as f:
        header = f.read(100)
    if not header.startswith(SQLITE_MAGIC):
        return (f"is not a sqlite database (a file of {size} bytes that does not start with sqlite's header): "
                "name the mlflow.db a sweep wrote")
    if len(header) < 100:
        return f"is truncated ({size} bytes, shorter than sqlite's header): restore it from a copy"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages, counter, valid_for = (int.from_bytes(header[i:i + 4], "big") for i in (28, 24, 92))
    if pages and counter == valid_for and size < pages * page_size:
        return f"is truncated ({size} of the {pages * page_size} bytes its header promises): restore it from a copy"
    return None


def _schema_state(path: Path, integrity: bool = True) -> tuple[frozenset[str], tuple[str, ...]]:
    """(its tables, its alembic revisions) after sqlite's quick check (``integrity``), through a read-only
    connection (the file is never changed); ``TrackingError`` names what sqlite found damaged."""
    import sqlite3
    from contextlib import closing

    try:
        with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            check = db.execute("PRAGMA quick_check(1)").fetchone()[0] if integrity else "ok"
            tables = frozenset(row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'"))
            revisions = tuple(row[0] for row in db.execute("SELECT version_num FROM alembic_version")) \
                if "alembic_version" in tables else ()
    except sqlite3.Error as exc:
        if "locked" in str(exc):
            raise TrackingError(f"is locked by another process (sqlite: {exc}): try again") from None
        raise TrackingError(f"is damaged (sqlite: {exc}): restore it from a copy") from None
    if check != "ok":
        raise TrackingError(f"is damaged (sqlite's check: {check}): restore it from a copy")
    return tables, revisions


def _settled(state, newest: str) -> bool:
    """A store this mlflow opens as it is: nothing in it yet, or its schema at the newest revision."""
    tables, revisions = state
    return not tables or (MLFLOW_TABLES <= tables and revisions == (newest,))


def check_schema(uri: str, new_store_ok: bool = True) -> None:
    """``TrackingError`` (one line) where a sqlite file is not an MLflow store whose schema this mlflow
    writes: not sqlite at all, truncated or damaged; another program's database; migrated by a newer
    MLflow (this one cannot read it; its own advice, `mlflow db upgrade`, cannot help); or older than
    this mlflow (then upgrading helps). Without ``new_store_ok`` (a reader) an empty file or database
    is refused too: MLflow would create its tables in it. Read before MLflow opens the store, through
    a read-only connection: the file is never changed."""
    path = _sqlite_path(uri)
    if path is None or not path.is_file():
        return
    shown = redact(uri)
    if path.stat().st_size == 0 and new_store_ok:
        return
    problem = _header_problem(path) if path.stat().st_size else \
        "is an empty file, not an MLflow store: run a sweep into it first (python sweeps/full.py --tracking-uri ...)"
    try:
        state = None if problem else _schema_state(path)
    except TrackingError as exc:
        problem = str(exc)
    if problem:
        raise TrackingError(f"tracking store {shown} {problem}")
    mlflow_version, known, newest = _mlflow_schema()
    if not state[0] and not new_store_ok:
        raise TrackingError(f"tracking store {shown} holds no MLflow tables yet: run a sweep into it first "
                            "(python sweeps/full.py --tracking-uri ...)")
    unknown = [revision for revision in state[1] if revision not in known]
    if unknown:
        raise TrackingError(
            f"tracking store {shown} was migrated by a newer MLflow: its schema revision {unknown[0]} is not one "
            f"this tool's mlflow {mlflow_version} knows (its newest is {newest}), and this tool needs mlflow "
            f"{mlflow_version}; open that store with the newer mlflow that migrated it, or give --tracking-uri a "
            "copy made before it was migrated")
    state = _settle(path, state, newest)
    if _settled(state, newest):
        return
    if not state[1]:
        raise TrackingError(f"tracking store {shown} is a sqlite database that MLflow did not write (it has no "
                            "MLflow schema revision): name the mlflow.db a sweep wrote")
    raise TrackingError(
        f"tracking store {shown} has schema revision {state[1][0]}, older than the one this tool's mlflow "
        f"{mlflow_version} reads ({newest}): back it up, then run `mlflow db upgrade {shown}` with mlflow "
        f"{mlflow_version}")


def _settle(path: Path, state, newest: str):
    """The store's state once it stands still: another process may be creating it right now (MLflow
    creates its tables, then migrates a new store step by step: a second sweep or a dashboard started
    beside this one), so an unfinished schema is waited for while it moves, and judged only when it
    has not moved for ``SCHEMA_SETTLE_S`` (a file nobody wrote for that long is judged at once)."""
    if time.time() - path.stat().st_mtime > SCHEMA_SETTLE_S:
        return state
    still_since = time.monotonic()
    while not _settled(state, newest) and time.monotonic() - still_since < SCHEMA_SETTLE_S:
        time.sleep(0.25)
        try:
            now = _schema_state(path)
        except TrackingError:
            now = state
        if now != state:
            state, still_since = now, time.monotonic()
    return state


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _not_there(uri: str) -> bool:
    """A sqlite store with no file yet, an empty one, or one whose schema another process is creating
    right now (a sweep that has just started): it holds no runs yet, and opening it through MLflow would
    create its tables, which a reader must not (and two processes creating them at once fail, the sweep
    among them). A schema that is not being created and is not this mlflow's is ``check_schema``'s
    one-line ``TrackingError``. Reads through a read-only connection, without sqlite's integrity check."""
    path = _sqlite_path(uri)
    if path is None:
        return False
    if not path.is_file() or path.stat().st_size == 0:
        return True
    try:
        state = _schema_state(path, integrity=False)
    except TrackingError:                 # locked or unreadable: judged below, by whether it is being written
        state = None
    if state is not None and not state[0]:
        return True                       # a sqlite file with no tables yet
    if state is not None and _settled(state, _mlflow_schema()[2]):
        return False
    if time.time() - path.stat().st_mtime <= SCHEMA_SETTLE_S:
        return True                       # being created: nothing to read yet
    check_schema(uri, new_store_ok=False)
    return False


def artifact_root(uri: str) -> str | None:
    """Where experiments keep artifacts: beside a sqlite file; a server decides for itself."""
    path = _sqlite_path(uri)
    return (path.parent / ARTIFACT_FOLDER).as_uri() if path is not None else None


# MLflow 3's UI opens an experiment without this tag in its GenAI view ("Traces: 0, no data"); with it,
# the runs table (our trials) is what opens.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def prepare_store(uri: str) -> dict[str, str]:
    """Create the schema, every group's experiment and the ``sweeps`` one (idempotent); returns
    group -> experiment id."""
    check_reachable(uri)
    client = _client(uri)
    root = artifact_root(uri)
    ids = {}
    for group in (*groups.NAMES, SWEEPS_EXPERIMENT):
        experiment = client.get_experiment_by_name(group)
        if experiment is None:
            location = f"{root}/{group}" if root else None
            chart = {"chart_group": group} if group != SWEEPS_EXPERIMENT else {}
            ids[group] = client.create_experiment(group, artifact_location=location,
                                                  tags={**chart, **EXPERIMENT_KIND})
        else:
            ids[group] = experiment.experiment_id
            for key, value in EXPERIMENT_KIND.items():      # stores made before the tag existed
                if experiment.tags.get(key) != value:
                    client.set_experiment_tag(experiment.experiment_id, key, value)
    ids.pop(SWEEPS_EXPERIMENT)
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
    """Every FINISHED run ``group`` charts, oldest first, each with the tag prefix under which it keeps
    that group's hashes: its own experiment's runs (``""``), then runs of other experiments whose
    ``charted_by`` names it (``"<group>."``). None: no such experiment, or the store is not there yet."""
    if _not_there(uri):
        return
    client = _client(uri)
    experiment = client.get_experiment_by_name(group)
    if experiment is None:
        return
    yield from ((run, "") for run in _search_pages(client, [experiment.experiment_id], "attributes.status = 'FINISHED'"))
    others = [e.experiment_id for e in client.search_experiments() if e.experiment_id != experiment.experiment_id]
    if others:
        shared = f"attributes.status = 'FINISHED' and tags.{CHARTED_BY} LIKE '%{group}%'"
        yield from ((run, f"{group}.") for run in _search_pages(client, others, shared)
                    if group in run.data.tags[CHARTED_BY].split(",")[1:])


def _search_pages(client, experiment_ids: list[str], filter_string: str):
    token = None
    while True:
        page = client.search_runs(experiment_ids, filter_string, max_results=1000, page_token=token,
                                  order_by=["attributes.start_time ASC"])
        yield from page
        token = page.token
        if not token:
            return


def finished_hashes(uri: str, group: str) -> set[str]:
    """``config_hash`` of every FINISHED run ``group`` charts (its own, and those it shares with
    another group, by its own hash of them): those configs need not run again."""
    return {r.data.tags.get(f"{prefix}config_hash", "") for r, prefix in _finished_runs(uri, group)} - {""}


def finished_subjects(uri: str, group: str) -> dict[str, str]:
    """``subject_hash`` -> the size of the latest FINISHED run of it that ``group`` charts
    (``TrialConfig.describe_size``): what the store measured, at whatever workload (runs logged
    before the tag existed are not in it)."""
    return {r.data.tags[f"{prefix}subject_hash"]: size_text(*(r.data.params.get(k, "?") for k in
                                                              ("max_new_tokens", "prompts_per_type", "repeats")),
                                                            r.data.params.get("context_tokens", "0"))
            for r, prefix in _finished_runs(uri, group) if r.data.tags.get(f"{prefix}subject_hash")}


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


def shared_tags(config: TrialConfig) -> dict[str, str]:
    """What lets every group that charts a run find it (``sweeps.measure_once``): ``charted_by``
    (the run's own group first), and each other group's ``config_hash`` and ``subject_hash`` of the
    trial as it plans it, under ``<group>.`` (``tracking.table.as_charted_by``)."""
    if not config.also_charted_by:
        return {}
    tags = {CHARTED_BY: ",".join(config.charts)}
    for group in config.also_charted_by:
        own = config.charted_as(group)
        tags.update({f"{group}.config_hash": own.config_hash, f"{group}.subject_hash": own.subject_hash})
    return tags


def write_record(uri: str, record: dict) -> str:
    """Write one result (``log_trial``'s record: the result as a dict, sweep_id, and a trial_key new
    to the store, tagged on the run) as a run."""
    from mlflow.entities import Metric, Param

    data, key = record["result"], record["trial_key"]
    config = TrialConfig.from_dict(data["config"])
    client = _client(uri)
    experiment_id = _experiment_id(client, config.group)
    tags = {"group": config.group, "model": config.model, "config_hash": config.config_hash,
            "subject_hash": config.subject_hash, "stack": config.stack.label, "sweep_id": record["sweep_id"], "trial_key": key,
            **shared_tags(config), **data["tags"]}
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
    frame = pd.concat(frames, ignore_index=True).drop_duplicates("run_id") if frames else pd.DataFrame()
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
    as plain columns), read now; ``status`` None: every run, with its ``status`` column. Runs of
    other groups that this one charts too (tag ``charted_by``) are in it, as this group reads them
    (``tracking.table.as_charted_by``)."""
    from tracking.table import as_charted_by, search, to_frame, with_shared

    if _not_there(uri):
        return pd.DataFrame()
    client = _client(uri)
    experiment = client.get_experiment_by_name(group)
    if experiment is None:
        return pd.DataFrame()
    where = f"attributes.status = '{status}'" if status else ""
    own = to_frame(search(client, experiment.experiment_id, where))
    shared_filter = " and ".join(w for w in (where, f"tags.{CHARTED_BY} LIKE '%{group}%'") if w)
    others = [e.experiment_id for e in client.search_experiments() if e.experiment_id != experiment.experiment_id]
    shared = to_frame(search(client, others, shared_filter)) if others else pd.DataFrame()
    return with_shared(own, as_charted_by(shared, group))


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


def record_sweep(uri: str, record: dict) -> None:
    """Keep what sized a sweep (``record``: its ``sweep_id`` and ``purpose``, its budget, the step costs
    its workloads were fitted with) as a run of the ``sweeps`` experiment, so that the next sweep on
    this store can size the same trials the same way (``sweep_records``). Called again for the same
    sweep (its zoo's stage sized later), it rewrites that run's record. ``prepare_store`` first."""
    client = _client(uri)
    experiment_id = _experiment_id(client, SWEEPS_EXPERIMENT)
    sweep_id = record["sweep_id"]

    def write() -> None:
        found = client.search_runs([experiment_id], f"tags.sweep_id = '{sweep_id}'", max_results=1)
        if found:
            run_id = found[0].info.run_id
        else:
            run_id = client.create_run(experiment_id, run_name=f"sweep {sweep_id}",
                                       tags={"sweep_id": sweep_id, "purpose": str(record.get("purpose", ""))}).info.run_id
        client.log_text(run_id, json.dumps(record, indent=1), SWEEP_ARTIFACT)
        client.set_terminated(run_id, status="FINISHED")

    _with_retry(write)


def sweep_records(uri: str) -> list[dict]:
    """Every sweep's record in the store (``record_sweep``), newest first; none where the store or its
    ``sweeps`` experiment is not there yet (a store written before sweeps kept records). A record that
    cannot be read back is left out. Reads only: it never creates or changes a store."""
    import tempfile

    if _not_there(uri):
        return []
    client = _client(uri)
    experiment = client.get_experiment_by_name(SWEEPS_EXPERIMENT)
    if experiment is None:
        return []
    records = []
    runs = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'",
                              max_results=1000, order_by=["attributes.start_time DESC"])
    with tempfile.TemporaryDirectory() as folder:
        for run in runs:
            try:
                path = client.download_artifacts(run.info.run_id, SWEEP_ARTIFACT, folder)
                record = json.loads(Path(path).read_text())
            except Exception:     # MLflow's own errors, OSError, a record cut short: not this sweep's to fix
                continue
            if isinstance(record, dict) and record.get("sweep_id"):
                records.append(record)
    return records
