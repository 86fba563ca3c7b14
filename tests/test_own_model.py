"""A user's own model, declared in a sweep file only: its runs carry its entry, so every reader
rebuilds their configs in any process, with nothing registered there.

The sweep file declares two: a local folder (a copy of the tiny zoo's tiny-gqa under another name)
and a hub id; both run through every group. There is no hub here, so only the download is replaced: the hub id's files are put in
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
profile: {base: quick, prompts_per_type: 1, max_new_tokens: 8, repeats: 2}
"""
# What a hub model's trials run in a fresh process (where HF_HUB_OFFLINE and the cache are read).
RUN_ALL = """
import json, sys
from trials.config import TrialConfig
from trials.run import run_trial
for line in open(sys.argv[1]):
    print(json.dumps(run_trial(TrialConfig.from_dict(json.loads(line))).to_dict()), flush=True)
"""


def picked_stacks() -> dict[str, set[str]]:
    """From each group's plan of each model, the stacks that fill its charts and cards (the first
    context only): enough for every section to draw the model, at a test's cost. The kv_cache and
    stacks groups run this CPU's fast precision (bf16 where native, fp32 where emulated: AVX2)."""
    from trials.measurement.hardware import fast_precision

    fast = fast_precision("cpu")
    return {"baseline": {"fp32"}, "speculative": {"fp32+lookup(k=4)"}, "kv_cache": {fast, f"{fast}+kv4-hqq"},
            "batching": {"fp32+b2"}, "quantization": {"bf16"}, "stacks": {fast}, "engines": set(),
            "serving": set(), "capacity": set()}


def _hub_cache(folder, model_folder):
    """A Hugging Face hub cache holding ``org/tiny-hub`` (what a download would have left)."""
    revision = "0" * 40
    repo = folder / "models--org--tiny-hub"
    shutil.copytree(model_folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(folder)}


def _picked(planned: dict[str, list], model: str) -> list[TrialConfig]:
    pick, out = picked_stacks(), []
    for group, configs in planned.items():
        mine = [c for c in configs if c.model == model]
        if not mine:
            continue
        first = min(c.workload.context_tokens for c in mine)
        out += [c for c in mine if c.stack.label in pick[group] and c.workload.context_tokens == first]
    return out


def test_a_sweep_files_own_models_run_through_every_group_and_every_reader(tiny_zoo, tmp_path, monkeypatch):
    """Both declared models through every group: planned from the file, run (the hub id in a fresh
    process, reading only its cache), logged twice (two sweeps), then read back by every reader:
    configs rebuilt from the store, each section and deep dive drawn, the best-stack card filled under
    a budget the model passes, the two sweeps compared, the report's tables, and the export and the
    cards' reproduce commands in fresh processes."""
    shutil.copytree(zoo.model_path("tiny-gqa"), tmp_path / "my-tiny")
    hub_env = _hub_cache(tmp_path / "hub", zoo.model_path("tiny-gqa"))
    (tmp_path / "mine.yaml").write_text(SWEEP)
    sweep = load_sweep(tmp_path / "mine.yaml")
    catalogue = Catalogue(tuple(sweep.entries))
    import huggingface_hub.constants          # the planner reads a hub model's config from this cache

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", hub_env["HF_HUB_CACHE"])
    planned = {name: groups.get(name).plan(sweep.models, sweep.profile, "cpu", catalogue=catalogue,
                                           **({"runs": lambda group: None}
                                              if groups.get(name).space_reads_store else {}))
               for name in groups.implemented()}
    monkeypatch.undo()
    local, hub = _picked(planned, "my-tiny"), _picked(planned, "my-hub")
    assert all(c.stack.kv_group_size == 32 for c in [*local, *hub] if c.stack.kv_bits != 16), \
        "the planner fits the quantized cache's groups to the model's K/V row (32 elements)"
    # every group runs them; the engines group plans them on llama.cpp too (through llama.cpp's
    # converter, the route tests/test_engines.py runs on the same tiny-gqa weights), not run here
    # and the serving group serves them behind llama-server (tests/test_serving.py runs that path)
    # and the capacity group searches their served configurations (tests/test_capacity_trial.py runs one)
    assert {c.group for c in local} == {c.group for c in hub} == set(groups.implemented()) - {"engines", "serving", "capacity"}
    for model in ("my-tiny", "my-hub"):
        assert {"llama_cpp:f16", "llama_cpp:q8_0"} <= {c.stack.label for c in planned["engines"] if c.model == model}
        assert {"llama_server:f16", "llama_server:f16+b4"} <= {c.stack.label for c in planned["serving"] if c.model == model}
        assert {"llama_server:f16+b4+step64"} <= {c.stack.label for c in planned["capacity"] if c.model == model}
    assert local[0].entry().location == str((tmp_path / "my-tiny").resolve())
    assert hub[0].entry().source == "hub" and all(c.declared for c in [*local, *hub])

    results = []
    for config in local:
        result = run_trial(config)
        assert result.status == "FINISHED", (config.group, config.stack.label, result.error)
        results.append(result.to_dict())
    (tmp_path / "hub.jsonl").write_text("".join(json.dumps(c.to_dict()) + "\n" for c in hub))
    done = subprocess.run([sys.executable, "-c", RUN_ALL, str(tmp_path / "hub.jsonl")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=hub_env)
    assert done.returncode == 0, done.stderr[-3000:]
    from_hub = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["status"] for r in from_hub] == ["FINISHED"] * len(hub), [r.get("error") for r in from_hub]
    assert all(r["tags"]["model_source"] == "hub" for r in from_hub)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.prepare_store(uri)
    for sweep_id in ("first", "second"):              # the same trials twice: two sweeps to compare
        for result in [*results, *from_hub]:
            write_record(uri, {"result": result, "sweep_id": sweep_id, "trial_key": uuid.uuid4().hex})

    # the store alone rebuilds each config, with the same hash
    frames = {group: tracking.runs_frame(uri, group) for group in groups.implemented()
              if group not in ("engines", "serving", "capacity")}
    for group, frame in frames.items():
        assert set(frame["model"]) == {"my-tiny", "my-hub"}, group
        for _, row in frame.iterrows():
            rebuilt = TrialConfig.from_dict(tracking.read_trial_artifact(uri, row["run_id"])["config"])
            assert rebuilt.config_hash == row["tags.config_hash"] and rebuilt.entry().name == row["model"]

    # every section and its deep dive draw both models; the best-stack card fills under a budget they pass
    from dashboard import compare, report
    from dashboard.app import RenderedSections, open_store, render_section, section_frame
    from dashboard.sections import all_sections, deep_dive_defaults

    runs = open_store(uri)
    drawn = RenderedSections(runs)
    for section in all_sections():
        if section.GROUP in ("engines", "serving", "capacity"):
            continue
        rendered = str(render_section(section, runs))
        assert "unknown model" not in rendered and "No finished runs" not in rendered, section.GROUP
        if hasattr(section, "deep_dive"):
            models = section.deep_dive_models(section_frame(section, runs))
            assert {"my-tiny", "my-hub"} <= set(models), (section.GROUP, models)
            for model in ("my-tiny", "my-hub"):
                chosen = {**deep_dive_defaults(section), **({"max_kl": 1e9, "max_ppl_pct": 1e9}
                                                            if section.GROUP == "stacks" else {})}
                dive = str(drawn.deep_dive(section, model, chosen))
                assert model in dive, (section.GROUP, model)
                if section.GROUP == "stacks":
                    assert f"{model}: best stack within" in dive and "python -m trials.run" in dive

    # the two sweeps compare in every group, for both models
    for group, frame in frames.items():
        table = compare.compare(frame[frame["status"] == "FINISHED"], "sweep", "second", "first")
        labels = " ".join(table["label"])
        assert "my-tiny" in labels and "my-hub" in labels, (group, labels)

    # the report has a row of both in each table it draws
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as text:
        assert report.main(["--tracking-uri", uri]) == 0
    assert "my-tiny" in text.getvalue() and "my-hub" in text.getvalue()

    # in fresh processes: the export draws both models and their best-stack cards ...
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, str(ROOT / "dashboard" / "export.py"), "--tracking-uri", uri,
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    page = out.read_text()
    assert "my-tiny" in page and "my-hub" in page and "unknown model" not in page
    assert page.count("trials.run") >= 2                      # each card's reproduce command

    # ... whose reproduce command is the run's exact config (the trial CLI runs it: tests/test_trial.py)
    from dashboard.stack_facts import reproduce

    for _, row in frames["stacks"].iterrows():
        command, _ = reproduce(row)
        config = TrialConfig.from_dict(json.loads(command.split("--config '", 1)[1].rstrip("'")))
        assert config.config_hash == row["tags.config_hash"] and config.declared, row["model"]
