"""Reading the MLflow store back: a group's runs as a table, the configurations it finished, a run's
raw ``trial.json``, the sweeps' records. A reader never creates or changes a store
(``tracking.access.not_there``: a store not there yet holds no runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tracking.access import TrackingError, client as _client, not_there as _not_there
from trials.config import size_text

TRIAL_ARTIFACT = "trial.json"
CHARTED_BY = "charted_by"                # tag: every group that charts a shared run (sweeps.measure_once)
SWEEPS_EXPERIMENT = "sweeps"             # one run per sweep: what sized it (not a chart group)
SWEEP_ARTIFACT = "sweep.json"


def experiment_id(uri: str, group: str) -> str | None:
    """The group's experiment id in the store (None when the store has no such experiment yet)."""
    experiment = _client(uri).get_experiment_by_name(group)
    return experiment.experiment_id if experiment is not None else None


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
