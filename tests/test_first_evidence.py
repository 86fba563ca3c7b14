"""First evidence early: on a machine whose zoo is not built, the sweep trains it in a Ray task on one
reserved core while the trials whose models need no build run on the others, then sizes and runs
the zoo's trials (real Ray, a real sqlite store, the real CLI).

The zoo folder is the tiny set with ``tiny-gqa`` removed, so the build trains that one model (seconds);
the model that needs no build is a user's folder (a copy of tiny-gqa under another name)."""

import json
import os
import shutil

import pytest

import tracking
from trials.models import zoo

from conftest import run_sweep, without_ray_shutdown_noise

SWEEP = """models:
  - name: my-tiny
    path: my-tiny
    draft: none
    trust_remote_code: false
  - tiny-gqa
groups: [baseline]
profile: {base: quick, prompts_per_type: 1, max_new_tokens: 8, repeats: 2, baseline: {precisions: [fp32]}}
"""


@pytest.mark.cold          # its own sweep: with the fault tests (make test-faults, .ci/run), not in make test
def test_the_zoo_trains_beside_the_trials_that_need_no_build(tiny_zoo, tmp_path, monkeypatch, capsys):
    shutil.copytree(zoo.model_path("tiny-gqa"), tmp_path / "my-tiny")
    fresh_zoo = tmp_path / "zoo"
    shutil.copytree(zoo.zoo_dir(), fresh_zoo)
    shutil.rmtree(fresh_zoo / "tiny-gqa")
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, zoo.ZOO_ENV_VAR: str(fresh_zoo),
           "LLM_SWEEPS_CALIBRATION": str(tmp_path / "calibration.json")}
    args = ["--sweep", str(tmp_path / "sweep.yaml"), "--budget", "20s", "--no-defer", "--tracking-uri", uri]
    done = run_sweep(*args, "--summary-json", str(tmp_path / "summary.json"), env=env)
    log = done.stdout[-4000:] + done.stderr[-3000:]
    assert done.returncode == 0, log
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] == 2 and summary["failed"] == 0, log
    assert summary["zoo_beside"].startswith("zoo training (tiny set) on CPU"), summary
    assert "trained beside the trials" in done.stdout and "the first finished run" in done.stdout

    # order: the folder model's trials start first; the zoo's only once it is built and calibrated
    starts = [line.split("start  baseline ")[1].split()[0] for line in done.stdout.splitlines()
              if "start  baseline " in line]
    assert starts[0] == "my-tiny", done.stdout
    built_at = done.stdout.index("The zoo is built")
    assert done.stdout.index("start  baseline tiny-gqa") > built_at
    monkeypatch.setenv(zoo.ZOO_ENV_VAR, str(fresh_zoo))
    assert zoo.is_built("tiny-gqa")

    # every run says its cores; one whose timed passes overlapped the training ran off its core and says so
    frame = tracking.runs_frame(uri, "baseline")
    start, end, _, what = summary["zoo_window"]
    zoo_cpu = str(summary["zoo_cpus"][0])
    assert frame["tags.cpu_affinity"].notna().all(), frame["tags.cpu_affinity"]
    for _, run in frame.iterrows():
        if run["timed_start_unix"] < end and run["timed_end_unix"] > start:
            assert zoo_cpu not in run["tags.cpu_affinity"].replace("-", ",").split(","), run["tags.cpu_affinity"]
            assert what in run["tags.shared_machine"], run["tags.shared_machine"]

    # the same command again plans the very same configs (stages sized the same, zoo built or not)
    from sweeps.full import main

    monkeypatch.setenv("LLM_SWEEPS_CALIBRATION", env["LLM_SWEEPS_CALIBRATION"])
    assert main([*args, "--dry-run"]) == 0
    assert "total: 2 trials, 2 already finished" in capsys.readouterr().out


@pytest.mark.cold          # its own sweep, like the test above
def test_a_zoo_build_that_fails_beside_the_trials_keeps_theirs_and_says_why_in_one_line(tiny_zoo, tmp_path):
    """A file where ``tiny-gqa``'s folder belongs: the build in the Ray task fails; the folder model's
    run is kept, the zoo's trial is said not run because of the build (not 'interrupted'), exit 1."""
    shutil.copytree(zoo.model_path("tiny-gqa"), tmp_path / "my-tiny")
    broken_zoo = tmp_path / "zoo"
    shutil.copytree(zoo.zoo_dir(), broken_zoo)
    shutil.rmtree(broken_zoo / "tiny-gqa")
    (broken_zoo / "tiny-gqa").write_text("not a model folder")
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, zoo.ZOO_ENV_VAR: str(broken_zoo),
           "LLM_SWEEPS_CALIBRATION": str(tmp_path / "calibration.json")}
    done = run_sweep("--sweep", str(tmp_path / "sweep.yaml"), "--budget", "20s", "--no-defer", "--tracking-uri", uri, env=env)
    log = done.stdout[-4000:] + done.stderr[-3000:]
    assert done.returncode == 1, log
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "the zoo's build failed, so its 1 trial(s) did not run" in errors[0], log
    assert "Traceback" not in without_ray_shutdown_noise(done.stderr), log
    assert "1 planned trial(s) never ran (the zoo's build failed" in done.stdout, log
    frame = tracking.runs_frame(uri, "baseline")
    assert list(frame["model"]) == ["my-tiny"] and list(frame["status"]) == ["FINISHED"], frame
