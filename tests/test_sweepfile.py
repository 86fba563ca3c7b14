"""A user's own sweep file (``python sweeps/full.py --sweep FILE``): the built-in profiles are such
files, overrides change what they name and nothing else, the README's example plans. A model
declared only in a file runs on a real 2-node Ray cluster in tests/test_cluster_sweep.py (its
workers learn it from the driver); the session's sweep (conftest.py) reads a sweep file too.

The file's bad inputs (unknown key, wrong type, out-of-range k, a cache the backend cannot pack,
malformed YAML...) are in tests/test_bad_input.py, each with its file:line:column.
"""

from __future__ import annotations

import re

from sweeps.sizing import WORKLOAD_FIELDS, group_fields, optional_keys
from sweeps.spaces import PROFILES
from sweeps.sweepfile import load_sweep
from trials import groups
from trials.models import zoo
from trials.models.registry import Catalogue, get_model

from conftest import ROOT

EXAMPLE = ROOT / "sweeps" / "examples" / "my-sweep.yaml"


def _plan(profile, models=("tiny-gqa", "tiny-mha", "tiny-draft")) -> dict:
    return {name: groups.get(name).plan(list(models), profile, "cpu") for name in groups.implemented()}


def test_builtin_profiles_are_sweep_files_stating_every_setting():
    assert set(PROFILES) == {"quick", "full"}
    for name, profile in PROFILES.items():
        assert profile.source.endswith(f"sweeps/profiles/{name}.yaml")
        for group, own in group_fields().items():
            settings = profile.settings(group)
            missing = (set(WORKLOAD_FIELDS) | set(own)) - set(settings) - optional_keys()
            assert not missing, (name, group, missing)


def test_overrides_change_what_they_name_and_nothing_else(tiny_zoo, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("profile:\n  base: quick\n  speculative:\n    draft_k: [2, 8]\n    repeats: 4\n"
                    "  batching: {batch_sizes: [4, 1]}\n")
    sweep = load_sweep(path)
    assert sweep.models is None and sweep.groups is None          # left to the command line
    mine, quick = _plan(sweep.profile), _plan(PROFILES["quick"])
    draft = [c for c in mine["speculative"] if c.stack.speculation == "draft"]
    assert sorted({c.stack.num_draft_tokens for c in draft}) == [2, 8]
    assert {c.repeats for c in mine["speculative"]} == {4}
    assert [c.stack.batch_size for c in mine["batching"] if c.model == "tiny-gqa"] == [1, 4]   # smallest first
    for group in set(quick) - {"speculative", "batching"}:
        assert [c.config_hash for c in mine[group]] == [c.config_hash for c in quick[group]], group
    assert sweep.profile.base == "quick" and sweep.profile.name == "quick+mine"


def test_a_relative_model_path_is_relative_to_the_file(tiny_zoo, tmp_path):
    folder = tmp_path / "models" / "my-tiny"
    folder.parent.mkdir()
    folder.symlink_to(zoo.model_path("tiny-mha"))
    path = tmp_path / "mine.yaml"
    path.write_text("models:\n  - name: my-tiny-rel\n    path: models/my-tiny\n    draft: tiny-draft\n"
                    "    trust_remote_code: false\n")
    sweep = load_sweep(path)
    entry = get_model("my-tiny-rel", sweep.entries)
    assert sweep.models == ["my-tiny-rel"] and entry.source == "local"
    assert entry.location == str(folder.resolve()) and entry.default_draft == "tiny-draft"
    assert entry.trust_remote_code is False


def test_the_readme_example_is_the_file_and_plans_offline(tiny_zoo):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(# A sweep of your own.*?)```", readme, re.S)
    assert block and block.group(1) == EXAMPLE.read_text(), "README and sweeps/examples/my-sweep.yaml differ"
    sweep = load_sweep(EXAMPLE)
    catalogue = Catalogue(tuple(sweep.entries))
    assert catalogue.get("tinyllama-1.1b-chat").source == "hub"
    planned = {name: groups.get(name).plan(sweep.models, sweep.profile, "cpu", catalogue=catalogue)
               for name in sweep.groups}
    assert {c.model for cs in planned.values() for c in cs} == set(sweep.models)
    stacks = groups.get("stacks").select(planned["stacks"], sweep.stacks, sweep.source)
    assert {c.model for c in stacks} == set(sweep.models) and len(stacks) == len(sweep.stacks) * len(sweep.models)
    # "base" is the design's base stack on any CPU: bf16 where it is native, fp32 where it is emulated
    from trials.measurement.hardware import fast_precision

    assert "base" in sweep.stacks and fast_precision("cpu") in {c.stack.design_name for c in stacks}
