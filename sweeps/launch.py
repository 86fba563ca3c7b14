"""Ray and Ray Tune for the sweep: join a cluster or start local Ray, how many trials run at once, one Tune run.

``connect`` joins a cluster (``--address``; the worker environment variables travel in Ray's
runtime_env, and ``--wait-for-gpus`` waits for the GPU workers), ``start_local_ray`` starts Ray here
without its dashboard, ``planned_workers`` says how many trials run at once (before Ray starts too),
``run_tune`` runs the trials, one GPU per trial where the cluster has GPUs, else ``--cpus-per-trial``
CPUs, and ``collect_outcomes`` records a trial whose worker died as a FAILED run. Ray is imported
where it is used, so planning and ``--help`` never pay for it.
"""

from __future__ import annotations

import functools
import logging
import os
import time

import tracking
from sweeps.plan import chosen_profile
from trials import engines, groups
from trials.config import TrialConfig
from trials.errors import ConfigError
from trials.redaction import redact

log = logging.getLogger("sweeps")

# Environment variables the trials need on every node: Ray's runtime_env hands them to the workers,
# so that a secret never has to be written into cluster.yaml or onto a node's disk: the token of gated
# Hugging Face models (Llama), and the plug-ins the plan was made with (the engines and techniques a
# worker must discover to run it; their modules must be importable on the nodes).
FORWARDED_ENV = ("HF_TOKEN", engines.PLUGINS_ENV, groups.PLUGINS_ENV)


def worker_env_vars() -> dict[str, str]:
    return {name: os.environ[name] for name in FORWARDED_ENV if os.environ.get(name)}


def connect(address: str, gpus: int | None, gpu_wait_s: float | None) -> None:
    """Join the Ray cluster at ``address``; with ``gpus``, wait until it has them (``ConfigError`` after
    ``gpu_wait_s``, with Ray shut down again)."""
    import ray

    env_vars = worker_env_vars()
    ray.init(address=address, logging_level=logging.WARNING,
             runtime_env={"env_vars": env_vars} if env_vars else None)
    if gpus:
        try:
            wait_for_gpus(gpus, gpu_wait_s)
        except ConfigError:
            ray.shutdown()
            raise


def wait_for_gpus(count: int, timeout_s: float | None, poll_s: float = 15.0) -> None:
    """Until the cluster has ``count`` GPUs; ``ConfigError`` after ``timeout_s`` (None: no limit)."""
    import ray

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while (present := ray.cluster_resources().get("GPU", 0)) < count:
        if deadline is not None and time.monotonic() >= deadline:
            raise ConfigError(f"waited {timeout_s:.0f} s for {count} GPU(s) and the cluster has {present:g}: "
                              "does cluster.yaml have a GPU worker type that can start (`ray status` on the "
                              "head shows pending nodes; the autoscaler log says why one failed)?")
        log.info("waiting for GPUs: %g of %d have joined the cluster", present, count)
        time.sleep(min(poll_s, max(0.1, deadline - time.monotonic())) if deadline else poll_s)


def detect_device(address: str | None) -> str:
    """'cuda' when the cluster (or this machine, for local Ray) has GPUs, else 'cpu'."""
    if address is None:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    import ray

    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


def alive_nodes() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def start_local_ray(phases) -> None:
    """Local Ray, once (its start-up time goes to ``phases.ray_start_s``)."""
    import ray

    if not ray.is_initialized():
        began = time.perf_counter()
        ray.init(logging_level=logging.WARNING, include_dashboard=False)
        phases.ray_start_s = time.perf_counter() - began


def planned_workers(args, device: str) -> int:
    """Trials at once, as run_tune will choose them (before Ray starts: from this machine)."""
    import ray

    if ray.is_initialized():
        slots = ray.cluster_resources().get("GPU" if device == "cuda" else "CPU", 1)
    else:
        import torch

        slots = torch.cuda.device_count() if device == "cuda" else (os.cpu_count() or 1)
    slots = int(slots // (1 if device == "cuda" else args.cpus_per_trial))
    return max(1, min(args.workers or slots, slots))


def trial_threads(args, device: str) -> int:
    """The threads one trial gets (what its step costs are calibrated on)."""
    return 1 if device == "cuda" else args.cpus_per_trial


def trial_resources(args, device: str) -> dict[str, float]:
    """What an ordinary trial holds: a GPU (and a CPU to drive it), or ``--cpus-per-trial`` cores."""
    return {"cpu": 1, "gpu": 1} if device == "cuda" else {"cpu": args.cpus_per_trial}


def node_cpus() -> float:
    """The CPUs of the largest node (a trial that holds a node asks for all of them)."""
    import ray

    return max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=1) or 1


def resources_of(plain: dict[str, float], configs, later):
    """Per trial: ``plain``, or every CPU of a node for a group whose trials hold one
    (``Technique.holds_node``: a server and its load generator must not share cores with another trial).
    Only where the sweep has such a trial does Tune get a function (else the dict, as always)."""
    from trials import groups

    holding = {g.name for g in groups.GROUPS if g.holds_node}
    if not any(c.group in holding for c in [*configs, *(later.planned if later is not None else [])]):
        return plain
    whole = {**plain, "cpu": max(plain["cpu"], node_cpus())}

    def resources(spec: dict) -> dict[str, float]:
        return whole if (spec.get("trial") or {}).get("group") in holding else plain
    return resources


def first_run_hint(uri: str) -> str:
    """What to run, once the store has a run, to watch the sweep fill the charts."""
    default = uri == tracking.resolve_uri(None)
    command = "make dashboard" if default else f"python dashboard/app.py --tracking-uri {redact(uri)}"
    return (f"the store has its first run: in another terminal, `{command}` opens the dashboard on "
            "http://127.0.0.1:8050; it follows this sweep, drawing each run as it finishes and saying what runs now")


def run_tune(configs: list[TrialConfig], later, args, uri: str, sweep_id: str, device: str,
             deadline=None, reservation_path: str | None = None, job=None, setup=None,
             standby: list[TrialConfig] = ()):
    """One Tune run: ``configs`` in priority order, then what ``later`` (a ``ZooStage``) hands out once
    it can, then the plan's deferred trials (``standby``) while time is left, each started only while
    ``deadline`` (a ``sweeps.deferral.Deadline``) admits it. The zoo's
    training (``job``) and a build beside the trials (``setup``, a ``SetupBeside``) are said among what
    runs until they end. Returns (Tune's results, the progress printer)."""
    from ray import tune

    from sweeps import cpus
    from sweeps.deferral import Deadline, priority_keys
    from sweeps.progress import ProgressPrinter
    from sweeps.staged import StagedSearcher
    from sweeps.trainable import run_in_worker
    from trials.measurement.environment import git_sha

    deadline = deadline or Deadline(None, {})
    resources = trial_resources(args, device)
    workers = planned_workers(args, device)
    waiting = len(later.planned) if later is not None else 0
    log.info("running %d trials%s, %d at a time, each with %s", len(configs),
             f" (then the zoo's {waiting})" if later is not None else "", workers, resources)
    watches = [later.poll] if later is not None else []      # polled about once a second

    def watch() -> None:
        for each in watches:
            each()
    keys = priority_keys(configs + (later.planned if later is not None else []))
    from sweeps.searches import Searches

    searches = Searches(getattr(args, "search", "grid"), uri, sweep_id, chosen_profile(args, device), device,
                        getattr(args, "catalogue", None))
    printer = None

    def standby_started(config: TrialConfig) -> None:
        printer.total += 1
        printer.say(f"time left in the budget: a deferred trial starts ({config.group} {config.model} "
                    f"{config.stack.label})")
    searcher = StagedSearcher(configs, later, lambda queued: sorted(queued, key=lambda c: keys[c.config_hash]),
                              deadline, searches, standby, standby_started)
    printer = ProgressPrinter(len(configs) + waiting, deadline, searcher, first_run_hint(uri),
                              functools.partial(tracking.write_live, uri, sweep_id), watch=watch)
    if job is not None:
        printer.running[job.what] = job.started      # said in the heartbeat and on the dashboard
    if setup is not None and not setup.done():
        watches.append(setup.said_by(printer))
    if later is not None:
        def zoo_trials_known(count: int) -> None:
            if job is not None:
                printer.running.pop(job.what, None)
            printer.total = len(configs) + count
            printer.say(f"the zoo's {count} trial(s) queued, in priority order")
        later.on_ready = zoo_trials_known
    param_space = {"tracking_uri": uri, "sweep_id": sweep_id, "git_sha": git_sha(),
                   "profile": chosen_profile(args, device).name,
                   "memory_budget_bytes": args.memory_budget, "price_per_hour_usd": args.price_per_hour,
                   "reservation_path": reservation_path, "machine_cpus": sorted(cpus.current())}
    tuner = tune.Tuner(
        tune.with_resources(run_in_worker, resources_of(resources, configs, later)),
        param_space=param_space,
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=workers, num_samples=-1,
                                    search_alg=searcher),
        run_config=tune.RunConfig(name=sweep_id, storage_path=args.storage_path, verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=args.max_failures),
                                  callbacks=[printer]),
    )
    deadline.start()                             # the budget counts from the first trial
    return tuner.fit(), printer


def collect_outcomes(results, uri: str, sweep_id: str) -> list[dict]:
    """One dict per trial; a trial whose worker died is recorded here as a FAILED run."""
    from trials.loop import failed_result

    outcomes = []
    for result in results:
        if result.error is None and result.metrics and "trial_status" in result.metrics:
            outcomes.append(result.metrics)
            continue
        if not result.config or "trial" not in result.config:
            continue                          # a trial Tune created but never started (Ctrl-C)
        config = TrialConfig.from_dict(result.config["trial"])
        reason = (str(result.error).strip().splitlines()[-1] if result.error
                  else "interrupted before it reported a result")
        failure = failed_result(config, RuntimeError(f"worker failed: {reason}"))
        tracking.log_trial(uri, failure, sweep_id=sweep_id)
        outcomes.append({"trial_status": "FAILED", "error": failure.error, "group": config.group,
                         "model": config.model, "stack": config.stack.label})
    return outcomes
