"""Runs as tables: the one place where MLflow runs become rows, and a cache that keeps every group's
table current while a sweep writes, reading only what changed.

A row is one run: ``run_id``, ``experiment_id``, ``status``, ``start_time``/``end_time`` (UTC
timestamps), the metrics and params under their own names (a metric wins over a param of the same
name; the param stays as ``params.<name>``), and the tags as ``tags.<name>``: the shape of
``mlflow.search_runs``' frames, so a chart reads the same columns either way.

``RunsCache`` reads each group once, then, on ``refresh()``, only the runs that ended since its
newest known end time (less a margin for workers whose clocks run behind): a run that finishes, or
is added already finished, is picked up; a rerun of a configuration is a new run and replaces
nothing (charts choose the latest). A running run has no end time and is not charted until it ends.
Deleting runs in the MLflow UI is not an end, so ``refresh(full=True)`` (the page's Reload button)
reads everything again. On a sqlite store (the default) the tables are read straight from its
file (``sqlite_frame``: an order of magnitude faster at 10,000 runs, benchmarks/dashboard_scale.py);
elsewhere through MLflow's search API.
"""

from __future__ import annotations

import threading
import time

import pandas as pd

from trials.stats.runs import latest as latest_runs

NUMERIC_PARAMS = ("batch_size", "kv_bits", "num_draft_tokens", "max_new_tokens", "repeats", "seed")
CLOCK_MARGIN_MS = 60 * 1000           # re-read runs that ended this long before the newest known end
PAGE = 5000                            # runs per search call


def _row(run) -> dict:
    info, data = run.info, run.data
    row = {"run_id": info.run_id, "experiment_id": info.experiment_id, "status": info.status,
           "start_time": info.start_time, "end_time": info.end_time}
    row.update({f"tags.{k}": v for k, v in data.tags.items()})
    for key, value in data.params.items():
        row[f"params.{key}" if key in data.metrics else key] = value
    row.update(data.metrics)
    return row


def to_frame(runs) -> pd.DataFrame:
    """MLflow ``Run`` entities as one table (see the module's docstring for its columns)."""
    frame = pd.DataFrame([_row(run) for run in runs])
    return frame if frame.empty else _typed(frame)


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """Times as UTC timestamps, the numeric params as numbers: one table whichever way it was read."""
    for column in ("start_time", "end_time"):
        frame[column] = pd.to_datetime(frame[column], unit="ms", utc=True)
    for column in NUMERIC_PARAMS:
        if column in frame:
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame


def search(client, experiment_id: str | list[str], filter_string: str = "") -> list:
    """Every run of an experiment (or of a list of them) that matches ``filter_string``, page by page."""
    runs, token = [], None
    ids = [experiment_id] if isinstance(experiment_id, str) else list(experiment_id)
    while True:
        page = client.search_runs(ids, filter_string, max_results=PAGE, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


CHARTED_BY = "tags.charted_by"         # every group that charts a shared run, its own first (tracking.store)


def as_charted_by(frame: pd.DataFrame, group: str) -> pd.DataFrame:
    """The runs of ``frame`` (other groups' runs) that ``group`` also charts (``charted_by`` names it:
    one measurement, run once, ``sweeps.measure_once``), as ``group`` reads them: its own numbers, kept
    under ``<group>.`` where they differ from the run's (its ``config_hash``, a quality scored its own
    way), over the run's."""
    if frame.empty or CHARTED_BY not in frame:
        return pd.DataFrame()
    names = frame[CHARTED_BY].fillna("").str.split(",")
    rows = frame[[group in n[1:] for n in names]].reset_index(drop=True)
    for column in [c for c in rows.columns if c.startswith((f"{group}.", f"tags.{group}."))]:
        plain = column.replace(f"{group}.", "", 1)
        rows[plain] = rows[column].where(rows[column].notna(), rows[plain]) if plain in rows else rows[column]
    return rows


def with_shared(own: pd.DataFrame, shared: pd.DataFrame) -> pd.DataFrame:
    """A group's own runs and the runs it shares with another group, in start-time order."""
    if shared.empty:
        return own
    if own.empty:
        return shared
    return pd.concat([own, shared], ignore_index=True).sort_values("start_time", kind="stable").reset_index(drop=True)


def sqlite_frame(path: str, experiment_id: str, since_ms: int | None = None,
                 known: dict[str, int] | None = None) -> pd.DataFrame:
    """``to_frame`` of an experiment's ended runs (``end_time >= since_ms``), read straight from a
    sqlite store's tables: the same table as the MLflow API gives (a test holds them equal), ~10x
    faster, because it skips building one entity per metric, param and tag. ``known``: run id ->
    end time (ms) of runs the caller holds already; those are left out unless their end time
    changed, and found from the runs table alone, so a refresh with nothing new costs one small
    query. The schema is that of the pinned mlflow (pyproject.toml)."""
    import sqlite3

    where = "r.experiment_id = ? AND r.lifecycle_stage = 'active' AND r.status != 'RUNNING'"
    args: list = [int(experiment_id)]
    if since_ms is not None:
        where += " AND r.end_time >= ?"
        args.append(int(since_ms))
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as db:
        runs = pd.read_sql_query("SELECT r.run_uuid AS run_id, r.experiment_id, r.status, r.start_time, "
                                 f"r.end_time FROM runs r WHERE {where}", db, params=args)
        if known:
            runs = runs[[known.get(i) != e for i, e in zip(runs["run_id"], runs["end_time"])]]
        if runs.empty:
            return pd.DataFrame()
        ids = list(runs["run_id"]) if known else None

        def wide(table: str, value: str) -> pd.DataFrame:
            select = f"SELECT t.run_uuid AS run_id, t.key, {value} AS value FROM {table} t "
            if ids is None:
                rows = pd.read_sql_query(select + f"JOIN runs r ON r.run_uuid = t.run_uuid WHERE {where}",
                                         db, params=args)
            else:            # only the new runs, by id, in chunks under sqlite's limit on parameters
                rows = pd.concat([pd.read_sql_query(select + f"WHERE t.run_uuid IN ({','.join('?' * len(chunk))})",
                                                    db, params=chunk)
                                  for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500))])
            return rows.pivot(index="run_id", columns="key", values="value")

        metrics = wide("latest_metrics", "CASE WHEN t.is_nan THEN NULL ELSE t.value END").astype(float)
        params = wide("params", "t.value")
        tags = wide("tags", "t.value")
    params.columns = [f"params.{k}" if k in metrics.columns else k for k in params.columns]
    tags.columns = [f"tags.{k}" for k in tags.columns]
    frame = runs.set_index("run_id").join([tags, params, metrics]).reset_index()
    frame.columns.name = None
    frame["experiment_id"] = frame["experiment_id"].astype(str)
    return _typed(frame)


class RunsCache:
    """Every group's ended runs (FINISHED, FAILED, KILLED), kept current by ``refresh``.

    Thread-safe: the dashboard's callbacks run in threads. ``frame(group, status)`` returns a table
    the caller may keep (never mutated afterwards: a refresh builds new tables); it holds the runs of
    the other groups read here that the group charts too (``as_charted_by``).
    """

    def __init__(self, uri: str, groups=None):
        from trials.groups import NAMES

        self.uri, self.groups = uri, tuple(groups or NAMES)
        self._lock = threading.Lock()
        self._frames: dict[str, pd.DataFrame] = {}
        self._experiments: dict[str, str] = {}
        self._mlflow = None
        self._views: dict[tuple, tuple[int, pd.DataFrame]] = {}
        self.version = 0                           # +1 whenever any group's table changed
        self.last_read_s = 0.0                     # how long the last refresh took

    def _client(self):
        if self._mlflow is None:
            from mlflow.tracking import MlflowClient

            self._mlflow = MlflowClient(tracking_uri=self.uri)
        return self._mlflow

    def experiment_id(self, group: str) -> str | None:
        with self._lock:
            return self._experiments.get(group)

    def refresh(self, full: bool = False) -> bool:
        """Read what changed since the last refresh (everything when ``full`` or the first time);
        True when some group's table changed."""
        started = time.perf_counter()
        client = self._client()
        changed = False
        with self._lock:
            for group in self.groups:
                changed |= self._refresh_group(client, group, full)
            if changed:
                self.version += 1
        self.last_read_s = time.perf_counter() - started
        return changed

    def _read(self, client, group: str, since_ms: int | None = None, known: pd.DataFrame | None = None):
        """The group's ended runs (that ended at or after ``since_ms``) as a table, less those in
        ``known`` with the same end time."""
        experiment = self._experiments[group]
        holds = ({} if known is None or known.empty else
                 dict(zip(known["run_id"], known["end_time"].dt.as_unit("ms").astype("int64"))))
        if self.uri.startswith("sqlite:///"):
            return sqlite_frame(self.uri[len("sqlite:///"):], experiment, since_ms, holds)
        query = "attributes.status != 'RUNNING'"
        if since_ms is not None:
            query += f" and attributes.end_time >= {int(since_ms)}"
        return to_frame([r for r in search(client, experiment, query)
                         if holds.get(r.info.run_id) != r.info.end_time])

    def _refresh_group(self, client, group: str, full: bool) -> bool:
        if group not in self._experiments or full:
            experiment = client.get_experiment_by_name(group)
            if experiment is None:
                return self._frames.pop(group, None) is not None
            self._experiments[group] = experiment.experiment_id
        old = self._frames.get(group)
        if full or old is None:
            frame = self._read(client, group)
        else:
            since = None if old.empty else old["end_time"].max().value // 1_000_000 - CLOCK_MARGIN_MS
            new = self._read(client, group, since, old)
            if new.empty:
                return False
            frame = new if old.empty else pd.concat([old[~old["run_id"].isin(set(new["run_id"]))], new],
                                                    ignore_index=True)
        if not frame.empty:
            frame = frame.sort_values("start_time", kind="stable").reset_index(drop=True)
        self._frames[group] = frame
        return True

    def frame(self, group: str, status: str | None = "FINISHED", latest: bool = False) -> pd.DataFrame:
        """The group's runs with ``status`` (None: every ended run, with its ``status`` column).
        ``latest``: only each configuration's most recent run per status (``tags.config_hash``),
        which is all a chart of "the most recent run per configuration" needs, however many times a
        sweep was repeated."""
        key = (group, status, latest)
        with self._lock:
            if key not in self._views or self._views[key][0] != self.version:
                others = [f for g, f in self._frames.items() if g != group and not f.empty]
                frame = with_shared(self._frames.get(group, pd.DataFrame()),
                                    as_charted_by(pd.concat(others, ignore_index=True), group) if others else pd.DataFrame())
                if not frame.empty and status is not None:
                    frame = frame[frame["status"] == status].reset_index(drop=True)
                if latest and not frame.empty and "tags.config_hash" in frame.columns:
                    frame = latest_runs(frame, ["tags.config_hash", "status"])
                self._views[key] = (self.version, frame)
            return self._views[key][1]

    def count(self) -> int:
        """Ended runs over every group (a run two groups chart counts once: it is in its own group's)."""
        with self._lock:
            return sum(len(frame) for frame in self._frames.values())

    def finished_hashes(self, group: str) -> set[str]:
        frame = self.frame(group)
        return set(frame["tags.config_hash"].dropna()) - {""} if "tags.config_hash" in frame else set()


def machine_sharing(frame: pd.DataFrame, beside=()) -> dict[str, tuple[float, int, str]]:
    """For each run with a timed window (metrics ``timed_start_unix``/``timed_end_unix``): the share
    of its timed passes during which other work ran on the same host (another run's timed passes, or
    one of ``beside``: ``(start, end, host, what)`` windows such as the sweep's zoo training), how many
    overlapped it, and their names (``group model stack``, or ``what``). Pure: reads its arguments only."""
    needed = {"run_id", "timed_start_unix", "timed_end_unix"}
    if frame.empty or not needed <= set(frame.columns):
        return {}
    timed = frame.dropna(subset=["timed_start_unix", "timed_end_unix"])
    host = timed["tags.env.host"] if "tags.env.host" in timed else pd.Series("", index=timed.index)
    out = {}
    for index, run in timed.iterrows():
        start, end = float(run["timed_start_unix"]), float(run["timed_end_unix"])
        others = timed[(timed["run_id"] != run["run_id"]) & (host == host[index])
                       & (timed["timed_start_unix"] < end) & (timed["timed_end_unix"] > start)]
        windows = [(float(a), float(b), " ".join(str(other.get(k, "")) for k in ("tags.group", "tags.model",
                                                                              "tags.stack")).strip())
                   for a, b, (_, other) in zip(others["timed_start_unix"], others["timed_end_unix"], others.iterrows())]
        windows += [(float(a), float(b), what) for a, b, where, what in beside
                    if where in ("", host[index]) and a < end and b > start]
        covered, reach = 0.0, start
        for a, b in sorted((max(start, a), min(end, b)) for a, b, _ in windows):   # the union of the overlaps
            if b > reach:
                covered += b - max(a, reach)
                reach = b
        out[run["run_id"]] = (covered / (end - start) if end > start else 0.0, len(windows),
                              "; ".join(name for _, _, name in windows))
    return out
