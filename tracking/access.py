"""Where the MLflow store is and whether it can be used, before MLflow opens it.

The default store is ``sqlite:///<cwd>/mlflow.db``; ``MLFLOW_TRACKING_URI`` or an explicit URI
(an ``mlflow server`` on clusters) override it. SQLite paths are made absolute, because Ray workers
run in other directories than the driver. A sqlite path is checked before MLflow opens it
(``check_sqlite``, ``check_schema``), because MLflow creates its tables in whatever file it is given
and ends in a SQLAlchemy traceback on anything else: a folder, a file that is not sqlite or is
truncated or damaged, another program's database, a schema that is not the pinned mlflow's (a newer
MLflow migrated it, which this one cannot read) are each one line. A reader never creates or changes
a store: a sqlite file that is not there yet, or whose schema is being created, holds no runs
(``not_there``).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

from trials.redaction import redact

ARTIFACT_FOLDER = "mlartifacts"          # beside a sqlite store: its experiments' artifacts
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


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def not_there(uri: str) -> bool:
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
