"""Tracking: every trial as an MLflow run, read back as tables. The only package importing mlflow."""

from tracking.access import TrackingError, check_reachable, reachable_uri, resolve_uri
from tracking.reading import experiment_id, finished_hashes, finished_subjects, read_trial_artifact, runs_frame, sweep_records
from tracking.store import deliver_spooled, log_trial, prepare_store, record_machine_sharing, record_sweep
from tracking.live import describe_live, read_live, write_live
from tracking.table import RunsCache

__all__ = ["describe_live", "read_live", "write_live", "RunsCache", "TrackingError", "check_reachable", "deliver_spooled", "experiment_id", "finished_hashes", "finished_subjects", "log_trial", "prepare_store", "record_machine_sharing",
           "reachable_uri", "read_trial_artifact", "record_sweep", "resolve_uri", "runs_frame", "sweep_records"]
