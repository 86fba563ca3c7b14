"""Sizing profiles: how big each chart group's workload is, as data read from YAML.

A profile states the workload every group gets (prompt set, prompts per type, new tokens, repeats),
each group's own settings (``group_fields()``, from each technique's ``profile_keys``: precisions,
batch sizes, contexts and caches, k values, the stacks design's parts), and the smaller workload real pretrained models get on a CPU
(``real_models_on_cpu``). The built-in ones are files, ``sweeps/profiles/<name>.yaml``, in the sweep
file's format (``sweeps.sweepfile`` reads them); a search space asks ``profile.settings(group, model,
device)``.
"""

from __future__ import annotations

from pathlib import Path

from sweeps import schema
from trials import groups
from trials import engines
from trials.config import PRECISIONS, Workload, parse_cache
from trials.models.registry import ModelEntry
from trials.prompts import PROMPT_SETS
from trials.redaction import shown
from trials.techniques.spec import ProfileKey

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
WORKLOAD_FIELDS = {
    "prompt_set": schema.Choice(tuple(PROMPT_SETS)),
    "prompts_per_type": schema.Int(1, 10_000),
    "max_new_tokens": schema.Int(2, 1_000_000),
    "repeats": schema.Int(1, 1_000),
}
class KvCache(schema.Type):
    """``full`` (the model's own precision) or ``<backend><bits>``, e.g. ``hqq4``, ``quanto2``."""

    def check(self, value, node, path, source):
        if value == "full" or (isinstance(value, str) and parse_cache(value)):
            return value
        backend = str(value).rstrip("0123456789")
        packs = engines.kv_caches()
        if backend in packs:
            schema.fail_at(source, node, path, f"{backend} cannot pack {str(value)[len(backend):] or 'an unstated number of'} "
                           f"bits; it packs {', '.join(map(str, packs[backend]))}")
        schema.fail_at(source, node, path, f"{shown(value)} is not a KV cache; expected {self.describe()}")

    def describe(self):
        return "full, " + ", ".join(f"{b}{n}" for b, bits in engines.kv_caches().items() for n in bits)




def _schema_type(key: ProfileKey) -> schema.Type:
    one = {"int": lambda: schema.Int(key.low, key.high), "bool": schema.Bool,
           "number": lambda: schema.Number(key.low, key.high),
           "precision": lambda: schema.Choice(PRECISIONS), "cache": KvCache,
           "weight": lambda: schema.Choice(engines.weight_types()),
           "engine": lambda: schema.Choice(tuple(engines.ENGINES))}[key.kind]()
    return schema.ListOf(one) if key.many else one


def group_fields() -> dict[str, dict[str, schema.Type]]:
    """Each group's own settings (beside the workload keys, which any section may override), from its
    technique's declaration (``Technique.profile_keys``); read on use, so a bad
    ``$LLM_SWEEPS_TECHNIQUES`` is a ``ConfigError`` of the command that reads a profile, not of an import."""
    return {g.name: {name: _schema_type(key) for name, key in g.profile_keys.items()}
            for g in groups.GROUPS if g.implemented}


def optional_keys() -> set[str]:
    return {name for g in groups.GROUPS for name, key in g.profile_keys.items() if key.optional}


def profile_fields(complete: bool) -> schema.Fields:
    """The ``profile:`` mapping. A built-in profile states every key (``complete``); a sweep file's
    names a ``base`` profile and overrides any of its keys."""
    fields, optional = group_fields(), optional_keys()

    def sections(with_required: bool) -> dict:
        return {group: schema.Fields({**WORKLOAD_FIELDS, **own},
                                     required=tuple(k for k in own if k not in optional) if with_required else (),
                                     doc=f"the {group} group's settings")
                for group, own in fields.items()}

    real = schema.Fields({**WORKLOAD_FIELDS, **sections(False)},
                         doc="the workload for real pretrained models on a CPU")
    head = {"name": schema.Text()} if complete else {"base": schema.Choice(tuple(builtin_profile_names()))}
    return schema.Fields({**head, **WORKLOAD_FIELDS, **sections(complete), "real_models_on_cpu": real},
                         required=("name", *WORKLOAD_FIELDS,
                                   *(g for g, own in fields.items() if set(own) - optional))
                         if complete else (),
                         doc="a profile mapping")


def builtin_profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


class Profile:
    """A workload size: every group's settings, and smaller ones for real models on a CPU where the
    profile has them. Read from a profile file (``load_profile``) or a sweep file's overrides."""

    def __init__(self, name: str, settings: dict, source: str = "", base: str | None = None):
        self.name = name
        self.base = base or name            # the built-in profile it derives from (default --budget)
        self.settings_ = settings
        self.source = source
        self.prompts_per_type = settings["prompts_per_type"]
        self.max_new_tokens = settings["max_new_tokens"]
        self.repeats = settings["repeats"]

    def workload(self, prompt_set: str | None = None) -> Workload:
        return Workload(prompt_set or self.settings_["prompt_set"], self.prompts_per_type, self.max_new_tokens)

    def reduced_for(self, model: ModelEntry, device: str) -> bool:
        """Whether ``model`` gets the smaller ``real_models_on_cpu`` workload here."""
        return device == "cpu" and "real_models_on_cpu" in self.settings_ and is_real(model)

    def settings(self, group: str, model: ModelEntry | None = None, device: str = "cpu") -> dict:
        """``group``'s settings for ``model``: the profile's workload, its group section, and for a real
        model on a CPU the ``real_models_on_cpu`` workload and section, each over the one before."""
        layers = [self.settings_, self.settings_.get(group, {})]
        if model is not None and self.reduced_for(model, device):
            real = self.settings_["real_models_on_cpu"]
            layers += [real, real.get(group, {})]
        out: dict = {}
        for layer in layers:
            out.update({k: v for k, v in layer.items() if not isinstance(v, dict)})
        return out

    def overridden(self, overrides: dict, source: str) -> "Profile":
        """This profile with a sweep file's ``profile:`` keys over it (sections merged key by key)."""
        return Profile(f"{self.name}+{Path(source).stem}", _merge(self.settings_, overrides), source, self.base)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(base.get(key, {}), value) if isinstance(value, dict) else value
    return out


def is_real(model: ModelEntry) -> bool:
    """A real pretrained model (not the project's own zoo)."""
    return model.source != "zoo"
