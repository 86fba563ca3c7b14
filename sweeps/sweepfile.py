"""A sweep file: which models, which chart groups, how big a workload, which stacks -- as YAML.

    python sweeps/full.py --sweep my-sweep.yaml

Every key is optional; what is left out is the command line's default::

    models:                       # registry names, or your own models, each stated in full
      - zoo-gqa
      - name: my-llama            # the name runs and charts show
        path: ./models/my-llama   # a local folder (relative to this file), or  hub: org/model
        draft: none               # its draft model (a name from the registry or this list), or none
        trust_remote_code: false  # stated, never assumed
    groups: [baseline, speculative, stacks]
    profile:                      # a built-in profile by name (quick, full), or one with overrides:
      base: quick
      repeats: 5
      speculative: {draft_k: [2, 4, 8]}
    stacks: [base, nf4, spec, nf4+kv4+spec]   # the stacks group: only these of its design (base:
                                              # bf16 where it is native, else fp32)

The built-in profiles (``sweeps/profiles/*.yaml``) are sweep files too, with a complete profile, so
the main job reads its own sizes through this very loader. A file is checked before anything
starts: an unknown key, a wrong type or an out-of-range value is one line naming the file, line,
column and key (``sweeps.schema``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from sweeps import schema
from sweeps.sizing import PROFILE_DIR, Profile, builtin_profile_names, profile_fields
from trials import engines, groups
from trials.config import PRECISIONS
from trials.errors import ConfigError
from trials.redaction import shown
from trials.models.registry import Catalogue, ModelEntry, all_models, check_local_folder


class Draft(schema.Type):
    """A draft model's name, or ``none`` (YAML ``null`` too): stated, so it is never guessed."""

    def check(self, value, node, path, source):
        if value is None or value == "none":
            return None
        return schema.Text().check(value, node, path, source)

    def describe(self):
        return "a model name or none"


class Name(schema.Type):
    """A model's name as runs, charts and file names carry it: letters, digits and ``. _ - + @``."""

    PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+@-]{0,99}")

    def check(self, value, node, path, source):
        if not isinstance(value, str) or not self.PATTERN.fullmatch(value):
            schema.fail_at(source, node, path, f"{shown(value)} is not a usable name (expected {self.describe()})")
        return value

    def describe(self):
        return "letters, digits and . _ - + @, starting with a letter or digit (a hub id goes in hub:)"


MODEL_FIELDS = schema.Fields({
    "name": Name(),
    "path": schema.Text(),
    "hub": schema.Text(),
    "draft": Draft(),
    "trust_remote_code": schema.Bool(),
    "role": schema.Choice(("target", "draft")),
    "dtype": schema.Choice(tuple(p for p in PRECISIONS if p in ("fp32", "bf16", "fp16"))),
    "tokenizer": schema.Text(),
}, required=("name", "draft", "trust_remote_code"),
    doc="a model: name, path or hub, draft, trust_remote_code (role, dtype, tokenizer optional)")


def sweep_fields(builtin: bool) -> schema.Fields:
    profile = profile_fields(True) if builtin else \
        schema.AnyOf((schema.Choice(tuple(builtin_profile_names())), profile_fields(False)))
    return schema.Fields({
        "models": schema.ListOf(schema.AnyOf((schema.Text(), MODEL_FIELDS))),
        "groups": schema.ListOf(schema.Choice(tuple(groups.implemented()))),
        "profile": profile,
        "stacks": schema.ListOf(schema.Text()),
    }, required=("profile",) if builtin else (), doc="a sweep file (models, groups, profile, stacks)")


@dataclass
class Sweep:
    source: str
    profile: object | None = None           # sweeps.sizing.Profile; None: the command line's
    models: list[str] | None = None
    groups: list[str] | None = None
    stacks: list[str] | None = None
    entries: list[ModelEntry] = field(default_factory=list)   # the models this file declares


def load_sweep(path: str | Path, builtin: bool = False) -> Sweep:
    """Read and check a sweep file (its own models become ``entries``). One-line ``ConfigError`` on any
    problem, before anything starts."""
    data, root, source = schema.read(path)
    if data is None:
        data = {}
    data = sweep_fields(builtin).check(data, root, "", source)
    sweep = Sweep(source)
    if "profile" in data:
        profile = data["profile"]
        if builtin:
            sweep.profile = Profile(profile["name"], profile, source)
        elif isinstance(profile, str):
            sweep.profile = profiles()[profile]
        else:
            overrides = {k: v for k, v in profile.items() if k != "base"}
            if "base" not in profile:
                schema.fail_at(source, schema.node_at(root, "profile"), "profile",
                               f"missing key 'base' (the profile to start from: {', '.join(profiles())})")
            sweep.profile = profiles()[profile["base"]].overridden(overrides, source)
    if "models" in data:
        sweep.models, sweep.entries = _models(data["models"], root, source)
    sweep.groups = data.get("groups")
    sweep.stacks = data.get("stacks")
    _check_engines(sweep.stacks or [], root, source)
    return sweep


def _check_engines(stacks: list[str], root, source: str) -> None:
    """A stack on another engine is named ``engine:stack`` (``llama_cpp:q4_0+spec``): an engine that is
    not installed here is refused with the file's position, before anything is planned."""
    nodes = schema.node_at(root, "stacks")
    for i, name in enumerate(stacks):
        engine, colon, _ = name.partition(":")
        if colon and engine.strip() not in engines.ENGINES:
            node = nodes.value[i] if nodes is not None and i < len(nodes.value) else nodes
            schema.fail_at(source, node, f"stacks[{i}]", f"unknown engine {shown(engine.strip())} in "
                           f"{shown(name)}; engines: {', '.join(engines.ENGINES)}")


def _models(items: list, root, source: str) -> tuple[list[str], list[ModelEntry]]:
    nodes = schema.node_at(root, "models")
    nodes = nodes.value if nodes is not None else [None] * len(items)
    declared = {item["name"]: item for item in items if isinstance(item, dict)}
    known = set(all_models()) | set(declared)
    names, entries = [], []
    for i, (item, node) in enumerate(zip(items, nodes)):
        where = f"models[{i}]"
        if isinstance(item, str):
            if item not in all_models():
                schema.fail_at(source, node, where, f"unknown model {shown(item)}: not in the registry; declare "
                               "it here with name, path or hub, draft and trust_remote_code")
            names.append(item)
            continue
        if ("path" in item) == ("hub" in item):
            schema.fail_at(source, node, where, "give exactly one of path (a local folder) or hub (an id)")
        if item["name"] in all_models():
            schema.fail_at(source, schema.node_at(node, "name"), f"{where}.name",
                           f"{item['name']!r} is already a registry model; name yours differently")
        draft = item["draft"]
        if draft is not None and draft not in known:
            schema.fail_at(source, schema.node_at(node, "draft"), f"{where}.draft",
                           f"unknown draft {shown(draft)}: not in the registry nor declared in this file")
        if draft == item["name"]:
            schema.fail_at(source, schema.node_at(node, "draft"), f"{where}.draft", "a model cannot draft for itself")
        if "path" in item:
            folder = Path(item["path"]).expanduser()
            if not folder.is_absolute():
                folder = Path(source).resolve().parent / folder
            try:
                check_local_folder(folder)
            except ConfigError as exc:
                schema.fail_at(source, schema.node_at(node, "path"), f"{where}.path", str(exc))
            source_kind, location = "local", str(folder.resolve())
        else:
            source_kind, location = "hub", item["hub"]
        entry = ModelEntry(item["name"], source_kind, location, item.get("role", "target"),
                           default_draft=draft, dtype=item.get("dtype", "fp32"),
                           trust_remote_code=item["trust_remote_code"], tokenizer=item.get("tokenizer"))
        entries.append(entry)
        names.append(entry.name)
    Catalogue(tuple(entries))           # one name, one model: the file cannot declare a name twice
    return names, entries


def load_profile(name: str) -> Profile:
    """A built-in profile, from ``sweeps/profiles/<name>.yaml``."""
    path = PROFILE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown profile {name!r}; valid: {', '.join(builtin_profile_names())}")
    return load_sweep(path, builtin=True).profile


@functools.cache
def profiles() -> dict[str, Profile]:
    """The built-in profiles (``sweeps/profiles/*.yaml``), read on first use: their sections come
    from the techniques' specs, so a bad ``$LLM_SWEEPS_TECHNIQUES`` is a command's ``ConfigError``."""
    return {name: load_profile(name) for name in builtin_profile_names()}


def __getattr__(name: str):
    if name == "PROFILES":
        return profiles()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
