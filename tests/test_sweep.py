"""The main job end to end: real Ray Tune (local), a real sqlite MLflow store, the real CLI.

The session's quick sweep (tests/conftest.py: ``quick_sweep``) is the run under test; error cases
go through ``main(argv)`` in this process, and one through a real subprocess."""

import hashlib
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import requests

import tracking
from trials.measurement.hardware import cpu_profile

from conftest import QUICK_SWEEP_GROUPS, mlflow_server, run_sweep


def _main(argv: list[str], capsys) -> tuple[int, str, str]:
    """``sweeps/full.py``'s main in this process: (exit code, stdout, stderr)."""
    from sweeps.full import main

    try:
        code = main(argv)
    except SystemExit as exc:          # argparse's errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sweep_writes_finished_runs(quick_sweep):
    uri, out = quick_sweep.uri, quick_sweep.done.stdout
    frame = tracking.runs_frame(uri, "baseline")
    assert len(frame) == 4, quick_sweep.log()
    assert quick_sweep.counts("baseline") == (4, 0, 0)
    assert set(frame["model"]) == {"tiny-mha", "tiny-gqa"}
    assert set(frame["precision"]) == {"fp32", "bf16"}
    assert (frame["status"] == "FINISHED").all() and (frame["tok_per_s"] > 0).all()
    assert frame["tags.config_hash"].is_unique
    assert (frame["kv_cache_bytes"] == frame["kv_cache_bytes_exact"]).all()
    assert (frame["num_threads"] == 1).all(), "torch threads must follow the CPUs Ray granted"
    for column in ("tags.env.device_name", "tags.env.torch", "tags.env.transformers", "tags.env.ray",
                   "tags.env.mlflow", "tags.env.git_sha", "tags.env.host", "tags.env.cpu_model",
                   "tags.env.cpu_capability", "tags.env.bf16_native", "tags.env.bf16_matmul_ratio"):
        assert frame[column].notna().all() and (frame[column] != "").all(), column
    native = frame.set_index("precision")["tags.precision_native"]
    assert set(native["fp32"]) == {"True"}
    assert set(native["bf16"]) == {str(cpu_profile().bf16_native)}
    for needle in ("Calibration (what one step costs here", "tiny-gqa", "Estimated: ~", "Phases: zoo",
                   "This run, with --no-defer: every trial, past --budget 10 s",             # 10 s, --no-defer
                   "Estimated against measured (trial minutes"):
        assert needle in out, (needle, quick_sweep.log())
    raw = tracking.read_trial_artifact(uri, frame["run_id"].iloc[0])
    assert raw["raw"]["outputs"] and raw["raw"]["repeats"]
    assert "mlflow ui --backend-store-uri" in out and "dashboard/app.py" in out
    assert "the store has its first run: in another terminal" in out
    # what the dashboard showed while the sweep ran (tracking.live): its last state, every trial done
    live = json.loads((quick_sweep.folder / "sweep-live.json").read_text())
    assert live["done"] == live["total"] > 0 and live["running"] == {}


def test_a_second_sweep_plans_the_same_and_skips_what_finished(quick_sweep, capsys, monkeypatch):
    """The same command again (as a dry run, in this process): the cached calibration plans the very
    same configs and every FINISHED one is skipped (a FAILED one would run again: tests/test_faults.py)."""
    for name, value in quick_sweep.env.items():
        monkeypatch.setenv(name, value)
    code, out, err = _main([*quick_sweep.args, "--dry-run"], capsys)
    assert code == 0, err
    counts = [quick_sweep.counts(g) for g in QUICK_SWEEP_GROUPS]
    planned, finished = sum(map(sum, counts)), sum(c[0] for c in counts)
    assert 0 < finished <= planned
    assert f"total: {planned} trials, {finished} already finished" in out, out
    assert "tiny-gqa" in out


def test_a_narrower_sweep_at_another_workload_says_so_and_reuse_keeps_the_runs(quick_sweep, capsys, monkeypatch):
    """After the session sweep (10 s budget: the smallest workloads), its baseline group without a
    budget plans the profile's larger workload: every config hash differs. The sweep says it will
    measure them again, and --reuse keeps the runs (dry runs: nothing starts)."""
    for name, value in quick_sweep.env.items():
        monkeypatch.setenv(name, value)
    narrow = ["--models", "tiny-gqa,tiny-mha", "--groups", "baseline", "--budget", "none",
              "--tracking-uri", quick_sweep.uri, "--dry-run"]
    code, out, err = _main(narrow, capsys)
    assert code == 0, err
    assert "4 config(s) finished before at another workload (e.g. baseline tiny-" in out, out
    assert "measuring them again at this sweep's workload; --reuse keeps those runs instead" in out
    assert "total: 4 trials, 0 already finished" in out
    code, out, err = _main([*narrow, "--reuse"], capsys)
    assert code == 0 and "--reuse: keeping those runs, not measuring them again" in out, out + err
    assert "total: 4 trials, 4 already finished" in out
    code, out, err = _main([*narrow, "--reuse", "--rerun"], capsys)
    assert code == 2 and "not allowed with argument" in err


def test_each_run_says_what_shared_the_machine_during_its_timed_passes(quick_sweep):
    """The session sweep ran 2 trials at a time: every run's timed window is logged, and the end of
    the sweep tagged each with the other trials whose timed passes overlapped its own."""
    from tracking.table import machine_sharing

    frame = tracking.runs_frame(quick_sweep.uri, "baseline")
    assert (frame["timed_end_unix"] > frame["timed_start_unix"]).all()
    assert frame["tags.shared_machine"].notna().all() and frame["shared_machine_fraction"].between(0, 1).all()
    for _, run in frame[frame["shared_machine_fraction"] > 0].iterrows():
        assert "other job(s) ran during" in run["tags.shared_machine"]
    assert "Machine sharing: " in quick_sweep.done.stdout and "--workers 1 measures each trial alone" in quick_sweep.done.stdout
    # the overlap arithmetic on windows chosen by hand: a ran 0-10, b 5-15 (same host), c 2-4 on another host
    windows = pd.DataFrame({"run_id": ["a", "b", "c"], "timed_start_unix": [0.0, 5.0, 2.0],
                            "timed_end_unix": [10.0, 15.0, 4.0], "tags.env.host": ["h", "h", "other"],
                            "tags.group": ["g"] * 3, "tags.model": ["m"] * 3, "tags.stack": ["a", "b", "c"]})
    shared = machine_sharing(windows)
    assert shared["a"] == (0.5, 1, "g m b") and shared["b"] == (0.5, 1, "g m a") and shared["c"] == (0.0, 0, "")


@pytest.mark.parametrize("args,needle", [
    (["--models", "nosuchmodel"], "nosuchmodel"),
    (["--groups", "nosuchgroup"], "valid: baseline"),
    (["--workers", "abc"], "'abc' is not an integer"),
    (["--tracking-uri", "sqlite:////nonexistent/dir/mlflow.db"], "does not exist"),
    (["--tracking-uri", "http://127.0.0.1:9/"], "unreachable"),
    (["--profile", "huge"], "invalid choice"),
    (["--budget", "soon"], "not a duration"),
    (["--memory-budget", "2XB"], "memory budget"),
])
def test_bad_input_is_one_line_and_touches_nothing(quick_sweep, capsys, args, needle):
    db = Path(quick_sweep.uri[len("sqlite:///"):])
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    full_args = args if "--tracking-uri" in args else [*args, "--tracking-uri", quick_sweep.uri]
    code, out, err = _main(full_args, capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_bad_input_from_the_command_line_is_one_line_and_exit_2(tmp_path):
    """The one subprocess of the error cases: what a shell sees (exit code, one stderr line)."""
    done = run_sweep("--groups", "batching", "--memory-budget", "lots",
                     "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "memory budget" in lines[0], done.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_mlflow_server_shows_the_same_runs(quick_sweep, tmp_path):
    """What the MLflow UI shows comes from `mlflow server` on the same store: the same runs."""
    uri = quick_sweep.uri
    with mlflow_server(uri, tmp_path / "artifacts") as base:
        experiment = requests.get(f"{base}/api/2.0/mlflow/experiments/get-by-name",
                                  params={"experiment_name": "baseline"}, timeout=10).json()
        runs = requests.post(f"{base}/api/2.0/mlflow/runs/search", timeout=10,
                             json={"experiment_ids": [experiment["experiment"]["experiment_id"]]}).json()
        served = {r["info"]["run_id"] for r in runs["runs"]}
        assert served == set(tracking.runs_frame(uri, "baseline", status=None)["run_id"])
        assert set(tracking.runs_frame(base, "baseline")["run_id"]) == served


def test_the_report_of_measured_sizes_is_written_from_the_store(quick_sweep, capsys, tmp_path):
    """dashboard/report.py: the figures the sizing rests on, recomputed from the runs; with --out, the
    results page, which says when, by which command and from which code's runs it was made."""
    from dashboard import report

    page = tmp_path / "docs" / "results.md"
    assert report.main(["--tracking-uri", quick_sweep.uri, "--out", str(page)]) == 0
    text = page.read_text()
    sha = tracking.runs_frame(quick_sweep.uri, "baseline")["tags.env.git_sha"].iloc[0][:12]
    assert text.startswith("# Results") and f"`llm-report --tracking-uri {quick_sweep.uri} --out {page}`" in text
    assert sha in text and "| baseline | 4 |" in text
    capsys.readouterr()
    assert report.main(["--tracking-uri", quick_sweep.uri]) == 0
    out = capsys.readouterr().out
    times = out.split("**")[0]
    assert "| baseline | 4 |" in times and "nan" not in times          # every trial has its trial_s
    frame = tracking.runs_frame(quick_sweep.uri, "batching")
    for model, part in frame.groupby("model"):
        tok_per_s = part.set_index("batch_size")["tok_per_s"]
        row = next(line for line in out.splitlines() if line.startswith(f"| {model} | 1: "))
        assert ", ".join(f"{b}: {v:.0f}" for b, v in tok_per_s.sort_index().items()) in row
    assert report.main(["--tracking-uri", "sqlite:////nonexistent/dir/x.db"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_main_job_runs_breadth_first(tiny_zoo):
    """Every group's smallest model before any group's next one: each section has data early."""
    from sweeps.spaces import PROFILES, run_order
    from trials.techniques.baseline.space import plan as baseline
    from trials.techniques.batching.space import plan as batching
    from trials.techniques.speculative.space import plan as speculative

    profile = PROFILES["quick"]
    configs = [c for space in (baseline, speculative, batching)
               for c in space(["tiny-gqa", "tiny-mha"], profile, "cpu")]
    ordered = run_order(configs)
    first = {c.model for c in ordered[:sum(c.model == ordered[0].model for c in configs)]}
    assert first == {ordered[0].model}                       # round 0: one model ...
    seen_groups = [c.group for c in ordered if c.model == ordered[0].model]
    assert set(seen_groups) == {"baseline", "speculative", "batching"}   # ... in every group
    assert sorted(ordered, key=lambda c: c.config_hash) == sorted(configs, key=lambda c: c.config_hash)


def test_the_summary_says_each_reason_not_planned_once_with_its_models(capsys):
    """What planning leaves out, per model, is one line per reason in the summary, naming the models."""
    from sweeps.plan import PlanNotes
    from sweeps.spaces import PROFILES
    from sweeps.summary import print_summary
    from trials import groups

    models = ["tiny-gqa", "tiny-mha", "zoo-gqa"]
    with PlanNotes() as notes:
        groups.get("stacks").plan(models, PROFILES["quick"], "cpu")
    capsys.readouterr()
    refused = [n for n in notes.notes if "refused at plan time" in n]
    assert len(refused) % len(models) == 0 and refused
    print_summary([], [], {}, "sqlite:///nowhere.db", 1.0, 0.0, notes.notes)
    lines = [line for line in capsys.readouterr().out.splitlines() if "not planned: stacks: refused" in line]
    assert len(lines) == len(refused) // len(models), lines
    assert all(line.endswith(f"— for {', '.join(models)}") for line in lines)


def test_the_heartbeat_says_what_runs_and_how_long_is_left_by_the_plans_estimates(capsys):
    """Time left is the queued trials' estimates on the workers, corrected by what finished trials took
    against theirs, and when the budget ends; not the finished-trials rate."""
    import types

    from sweeps.deferral import Deadline
    from sweeps.progress import HEARTBEAT_S, ProgressPrinter
    from trials.config import Stack, TrialConfig, Workload

    queued = [TrialConfig(group="baseline", model="zoo-gqa", stack=Stack(p), workload=Workload("prose", 1, 8))
              for p in ("fp32", "bf16")]
    deadline = Deadline(3600.0, {c.config_hash: 600.0 for c in queued}, workers=2)
    deadline.start()
    printer = ProgressPrinter(total=10, deadline=deadline, searcher=types.SimpleNamespace(queue=queued, later=None))
    printer.running["kv_cache zoo-gqa bf16 ctx2048"] = printer.started
    printer.on_step_end(0, [])
    assert capsys.readouterr().out == ""                      # nothing yet: a line was just printed
    printer.last_line -= HEARTBEAT_S
    printer.on_step_end(0, [])
    line = capsys.readouterr().out
    assert "0/10 done" in line and "kv_cache zoo-gqa bf16 ctx2048" in line, line
    assert "~10 min of queued trials by the plan's estimates (x1.00" in line and "the budget ends in 60 min" in line
    deadline.finished(queued[0], 1200.0)                       # took twice its estimate
    printer.last_line -= HEARTBEAT_S
    printer.on_step_end(0, [])
    assert "~20 min of queued trials by the plan's estimates (x2.00" in capsys.readouterr().out


@pytest.mark.parametrize("config_json, message", [
    (None, "has no config.json"),
    ('{"model_type": "llama", ', "is not valid JSON (line 1"),
    ('{"hidden_size": 64}', "names no model_type"),
])
def test_a_broken_model_folder_is_one_line_before_anything_starts(tmp_path, capsys, config_json, message):
    """Found by a new user: a folder whose config.json was broken passed planning and hung in Ray."""
    folder = tmp_path / "my-model"
    folder.mkdir()
    if config_json is not None:
        (folder / "config.json").write_text(config_json)
    code, out, err = _main(["--groups", "baseline", "--models", str(folder),
                            "--tracking-uri", f"sqlite:///{tmp_path}/m.db"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "m.db").exists()                  # nothing started, no store written


def test_each_groups_estimate_is_printed_beside_what_its_trials_took(quick_sweep):
    """The summary's estimate per group against the session sweep's own trials. On the tiny zoo's
    trials, at the floors, fixed costs dominate and the cost models are loose (batching read 0.17x):
    an estimate off by more than 10x fails here; how close the estimates are on the main job is what
    its summary prints (README)."""
    rows = dict(re.findall(r"^  (\w+) +\d+ trials  estimated +[\d.]+  measured +[\d.]+ +([\d.]+)x$",
                           quick_sweep.done.stdout, re.M))
    assert set(rows) == set(QUICK_SWEEP_GROUPS), quick_sweep.log()
    assert all(0.1 <= float(ratio) <= 10 for ratio in rows.values()), rows
