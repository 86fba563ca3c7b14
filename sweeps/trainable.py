"""The Ray Tune trainable: run one trial in a worker and record it, whatever happens.

The worker converts Tune's dict back into a ``TrialConfig``, gives torch as many threads as Ray
granted CPUs (two trials sharing a machine must not fight over cores, or each slows the other's
numbers), runs the measurement loop, and logs the run to MLflow itself, so a result is stored the
moment it exists and survives a driver that dies. A trial that raises is recorded as a FAILED run
with its one-line reason and reported to Tune as an ordinary result: one bad trial never stops the
sweep. While the sweep trains the zoo beside the trials, each trial pins its worker to the cores the
training does not hold (``sweeps.cpus``; tag ``cpu_affinity``). A worker that dies mid-trial
(SIGKILL) reports nothing; Tune retries the trial (``--max-failures``), and the retry logs the dead attempt as a FAILED run that says so.
"""

from __future__ import annotations

import logging
import os
import time

import ray
from ray import tune

import tracking
from sweeps import cpus
from trials.config import Runtime, TrialConfig
from trials.loop import failed_result
from trials.run import run_trial


def granted_cpus() -> int | None:
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    return max(1, int(cpus)) if cpus else None


ATTEMPTS_FILE = "attempts.txt"


def record_attempt() -> int:
    """This trial's attempt number (1 the first time), counted in Tune's trial folder: a worker
    killed mid-trial (SIGKILL, the OOM killer, a lost node) reports nothing, and Tune starts the
    trial again (``FailureConfig``); the next attempt finds the count there."""
    from pathlib import Path

    folder = Path(tune.get_context().get_trial_dir())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ATTEMPTS_FILE
    attempt = (int(path.read_text() or 0) if path.exists() else 0) + 1
    path.write_text(str(attempt))
    return attempt


def time_left(ends_at: float | None) -> float | None:
    """What the sweep's budget leaves this trial as it starts (it may have waited for its resources
    since it was handed out); None without a budget."""
    return None if ends_at is None else max(0.0, ends_at - time.time())


def run_in_worker(params: dict) -> None:
    logging.basicConfig(level=logging.WARNING)
    config = TrialConfig.from_dict(params["trial"])
    affinity = cpus.pin_trial(params.get("reservation_path"), params.get("machine_cpus"))
    attempt = record_attempt()
    if attempt > 1:   # the attempts before this one died without a word: say so in the store
        died = failed_result(config, RuntimeError(
            f"worker died before reporting (attempt {attempt - 1}); Ray Tune retried the trial"))
        died.tags["attempt"] = str(attempt - 1)
        tracking.log_trial(params["tracking_uri"], died, sweep_id=params["sweep_id"])
    runtime = Runtime(num_threads=granted_cpus(), git_sha=params["git_sha"],
                      sweep_id=params["sweep_id"],
                      memory_budget_bytes=params.get("memory_budget_bytes"),
                      price_per_hour_usd=params.get("price_per_hour_usd"),
                      time_limit_s=time_left(params.get("budget_ends_at")),
                      sweep_pids=(os.getppid(),))     # the raylet: its workers run the sweep's other trials
    try:
        result = run_trial(config, runtime)
    except Exception as exc:  # recorded as a FAILED run; the sweep goes on
        result = failed_result(config, exc)
    if params.get("search"):          # a searched group's trial (sweeps.searches): which search, its place in it
        result.tags.update(search=params["search"], search_id=params.get("search_id", ""))
        result.metrics["search_index"] = float(params.get("search_index") or 0)
    context = ray.get_runtime_context()
    result.tags.update({"ray.node_id": context.get_node_id(), "ray.node_ip": ray.util.get_node_ip_address(),
                        "attempt": str(attempt), "profile": params.get("profile", ""),
                        "cpu_affinity": affinity})
    run_id = tracking.log_trial(params["tracking_uri"], result, sweep_id=params["sweep_id"])
    tune.report({
        "trial_status": result.status, "error": result.error, "run_id": run_id, "spooled": not run_id,
        "config_hash": config.config_hash, "model": config.model, "stack": config.stack.label,
        "group": config.group,
        **{k: result.metrics[k] for k in ("tok_per_s", "measured_s", "model_load_s", "ttft_s", "slo_margin",
                                          "capacity_rps", "ttft_ratio", "tpot_ratio") if k in result.metrics},
    })
