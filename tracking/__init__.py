"""Tracking: every trial as an MLflow run, read back as tables. The only package importing mlflow."""

from tracking.store import (TrackingError, check_reachable, deliver_spooled, experiment_id, finished_hashes, finished_subjects, log_trial, record_machine_sharing,
                            prepare_store, reachable_uri, read_trial_artifact, resolve_uri, runs_frame)
from tracking.table import RunsCache

__all__ = ["RunsCache", "TrackingError", "check_reachable", "deliver_spooled", "experiment_id", "finished_hashes", "finished_subjects", "log_trial", "prepare_store", "record_machine_sharing",
           "reachable_uri", "read_trial_artifact", "resolve_uri", "runs_frame"]
