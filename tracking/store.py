"""Writing the MLflow store (``tracking`` is the only package that imports mlflow).

One experiment per chart group (``trials.groups``), one run per trial: params are the flat
config, metrics are the trial's measurements, tags say group, model, ``config_hash`` and the
environment, and ``trial.json`` keeps the raw per-repeat numbers and generated texts. A trial that
failed is a FAILED run whose ``error`` tag is its one-line reason.

The driver calls ``prepare_store`` before any trial starts: it creates the schema and every
experiment, with an artifact location beside the database, so that workers never race to create them
and artifacts never land in Ray's temporary folders. Where the store is and whether it can be used:
``tracking.access``; reading it back: ``tracking.reading``. This module writes.

Beside the groups, the ``sweeps`` experiment keeps one run per sweep: what sized its trials (its
budget and the calibration its workloads were fitted with, ``sweep.json``), so that the next sweep
on the store can size the same trials the same way (``record_sweep``, ``sweep_records``).
"""

from __future__ import annotations

import json
import math
import time

import pandas as pd

from tracking import spool
from tracking.access import TrackingError, artifact_root, check_reachable, client as _client
from tracking.reading import CHARTED_BY, SWEEP_ARTIFACT, SWEEPS_EXPERIMENT, TRIAL_ARTIFACT, runs_frame
from trials.config import TrialConfig
from trials.redaction import redact
from trials import groups

_RETRIES = 5


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


def _experiment_id(client, group: str) -> str:
    experiment = client.get_experiment_by_name(group)
    if experiment is None:
        raise TrackingError(f"experiment {group!r} does not exist; the sweep driver creates it "
                            "(tracking.prepare_store)")
    return experiment.experiment_id


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
