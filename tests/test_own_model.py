"""A user's own model, declared in a sweep file only: its runs carry its entry, so every reader
rebuilds their configs in any process, with nothing registered there.

The sweep file's model is a local folder (a copy of the tiny zoo's tiny-gqa under another name). Its
trials are planned from the file and run here; the export, the best-stack card's reproduce command
and the trial CLI then run in fresh processes, as a teammate opening the store would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import tracking
from conftest import ROOT
from sweeps.sweepfile import load_sweep
from trials import groups, zoo
from trials.config import TrialConfig
from trials.registry import Catalogue
from trials.run import run_trial

SWEEP = """models:
  - name: my-tiny
    path: my-tiny
    draft: tiny-draft
    trust_remote_code: false
groups: [baseline, stacks]
profile: {base: quick, prompts_per_type: 1, max_new_tokens: 8, repeats: 2}
"""


def test_a_sweep_files_own_model_is_rebuilt_by_every_reader_in_a_fresh_process(tiny_zoo, tmp_path):
    shutil.copytree(zoo.model_path("tiny-gqa"), tmp_path / "my-tiny")
    (tmp_path / "mine.yaml").write_text(SWEEP)
    sweep = load_sweep(tmp_path / "mine.yaml")
    catalogue = Catalogue(tuple(sweep.entries))
    planned = {name: groups.get(name).plan(sweep.models, sweep.profile, "cpu", catalogue=catalogue)
               for name in sweep.groups}
    base = planned["baseline"][0]
    stacks = [c for c in planned["stacks"] if c.stack.batch_size == 1 and not c.stack.compile
              and c.stack.kv_bits == 16][:2]          # the base stack and one with speculation or NF4
    assert base.declared == catalogue.declared and all(c.declared for c in stacks)
    assert {c.entry().location for c in stacks} == {str((tmp_path / "my-tiny").resolve())}

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.prepare_store(uri)
    for config in [base, *stacks]:
        result = run_trial(config)
        assert result.status == "FINISHED", result.error
        tracking.log_trial(uri, result)

    # the store alone rebuilds each config, with the same hash, in this process ...
    for group in ("baseline", "stacks"):
        for _, row in tracking.runs_frame(uri, group).iterrows():
            rebuilt = TrialConfig.from_dict(tracking.read_trial_artifact(uri, row["run_id"])["config"])
            assert rebuilt.config_hash == row["tags.config_hash"] and rebuilt.entry().name == "my-tiny"

    # ... and in fresh ones: the export draws the model and its best-stack card ...
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, str(ROOT / "dashboard" / "export.py"), "--tracking-uri", uri,
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    page = out.read_text()
    assert "my-tiny" in page and "python -m trials.run --config" in page and "unknown model" not in page

    # ... whose reproduce command reruns the trial (same config hash), nothing registered
    from dashboard.sections.stacks import reproduce

    row = tracking.runs_frame(uri, "stacks").iloc[0]
    command, _ = reproduce(row)
    config = json.loads(command.split("--config '", 1)[1].rstrip("'"))
    rerun = subprocess.run([sys.executable, "-m", "trials.run", "--config", json.dumps(config)],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads(rerun.stdout.strip().splitlines()[-1])["config_hash"] == row["tags.config_hash"]
