"""A user's own model, declared in a sweep file only: its runs carry its entry, so every reader
rebuilds their configs in any process, with nothing registered there.

The sweep file declares two: a local folder (a copy of the tiny zoo's tiny-gqa under another name)
and a hub id. There is no hub here, so only the download is replaced: the hub id's files are put in
a Hugging Face cache folder beforehand and its trials run with ``HF_HUB_OFFLINE=1`` (in fresh
processes, where that cache is read). Trials are planned from the file; the export then draws them in a fresh process, as a
teammate opening the store would, and each card's reproduce command is the run's exact config.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import tracking
from sweeps.sweepfile import load_sweep
from tracking.store import write_record
from trials import groups
from trials.config import TrialConfig
from trials.models import zoo
from trials.models.registry import Catalogue
from trials.run import run_trial

from conftest import ROOT

SWEEP = """models:
  - name: my-tiny
    path: my-tiny
    draft: tiny-draft
    trust_remote_code: false
  - name: my-hub
    hub: org/tiny-hub
    draft: none
    trust_remote_code: false
groups: [baseline, stacks]
profile: {base: quick, prompts_per_type: 1, max_new_tokens: 8, repeats: 2}
"""


def _hub_cache(folder, model_folder):
    """A Hugging Face hub cache holding ``org/tiny-hub`` (what a download would have left)."""
    revision = "0" * 40
    repo = folder / "models--org--tiny-hub"
    shutil.copytree(model_folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(folder)}


def _trial_cli(config: dict, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "trials.run", "--config", json.dumps(config), "--raw"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_sweep_files_own_models_are_rebuilt_by_every_reader_in_a_fresh_process(tiny_zoo, tmp_path):
    shutil.copytree(zoo.model_path("tiny-gqa"), tmp_path / "my-tiny")
    hub_env = _hub_cache(tmp_path / "hub", zoo.model_path("tiny-gqa"))
    (tmp_path / "mine.yaml").write_text(SWEEP)
    sweep = load_sweep(tmp_path / "mine.yaml")
    catalogue = Catalogue(tuple(sweep.entries))
    planned = {name: groups.get(name).plan(sweep.models, sweep.profile, "cpu", catalogue=catalogue)
               for name in sweep.groups}
    mine = planned["stacks"][[c.model for c in planned["stacks"]].index("my-tiny")]   # its base stack
    hub = planned["stacks"][[c.model for c in planned["stacks"]].index("my-hub")]   # its base stack
    local = [c for c in planned["baseline"] if c.model == "my-tiny"][:1] + [mine]
    assert mine.entry().location == str((tmp_path / "my-tiny").resolve())
    assert hub.entry().source == "hub" and all(c.declared for c in [*local, hub])

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.prepare_store(uri)
    for config in local:
        result = run_trial(config)
        assert result.status == "FINISHED", result.error
        tracking.log_trial(uri, result)
    from_hub = _trial_cli(hub.to_dict(), hub_env)
    assert from_hub["status"] == "FINISHED" and from_hub["tags"]["model_source"] == "hub"
    write_record(uri, {"result": from_hub, "sweep_id": "", "trial_key": uuid.uuid4().hex})

    # the store alone rebuilds each config, with the same hash ...
    for group in ("baseline", "stacks"):
        for _, row in tracking.runs_frame(uri, group).iterrows():
            rebuilt = TrialConfig.from_dict(tracking.read_trial_artifact(uri, row["run_id"])["config"])
            assert rebuilt.config_hash == row["tags.config_hash"] and rebuilt.entry().name == row["model"]

    # ... and in fresh processes: the export draws both models and their best-stack cards ...
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, str(ROOT / "dashboard" / "export.py"), "--tracking-uri", uri,
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    page = out.read_text()
    assert "my-tiny" in page and "my-hub" in page and "unknown model" not in page
    assert page.count("python -m trials.run --config") >= 2

    # ... whose reproduce command is the run's exact config (the trial CLI runs it: tests/test_trial.py)
    from dashboard.sections.stacks import reproduce

    for _, row in tracking.runs_frame(uri, "stacks").iterrows():
        command, _ = reproduce(row)
        config = TrialConfig.from_dict(json.loads(command.split("--config '", 1)[1].rstrip("'")))
        assert config.config_hash == row["tags.config_hash"] and config.declared, row["model"]
