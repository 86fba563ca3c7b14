"""KV-cache footprint of any Hugging Face model config: bytes per token and at a context, batch and precision.

``kv_footprint(config)`` takes a ``config.json`` dict, a path to a ``config.json`` (or to a model folder holding
one), or a ``transformers`` config object (``AutoConfig``), and returns a frozen :class:`KVFootprint`. It models
the architectures that simple calculators get wrong:

* an explicit ``head_dim`` (used as is, not ``hidden_size / num_attention_heads``);
* grouped- and multi-query attention (``num_key_value_heads``);
* sliding-window layers: a layer keeps ``min(context, window)`` tokens (``sliding_window``; for Qwen2-style configs
  only when ``use_sliding_window`` is true and for layers ``>= max_window_layers``, as transformers does). That is
  what one decode step attends to; transformers' ``DynamicSlidingWindowLayer`` keeps views of the last
  ``window - 1`` tokens between steps, but into the storage of the step's concatenation, so once it has
  decoded past the window it holds ``window`` tokens of memory per layer, plus an 8-byte int64 window
  counter: ``held_bytes`` is exactly what that cache holds (measured by walking its storages);
* interleaved local/global layers (``layer_types``, Gemma-2's alternation, Gemma-3's ``sliding_window_pattern``);
* multi-head latent attention (DeepSeek-V2/V3): ``kv_lora_rank + qk_rope_head_dim`` elements per layer and token,
  one latent shared by all heads -- the compressed ("absorbed") cache that MLA serving engines (vLLM, SGLang)
  keep. transformers' eager DeepSeek implementation instead caches the decompressed per-head K
  (``qk_nope_head_dim + qk_rope_head_dim``) and V (``v_head_dim``); ask for that with ``mla="expanded"``.
  The default, and what the CLI reports unless ``--mla expanded``, is the latent cache;
* hybrid models whose linear-attention / Mamba layers hold no KV (Qwen3-Next, Jamba, any ``layer_types`` with
  ``linear_attention``). Those layers keep a fixed-size recurrent state that does not grow with context; it is
  not counted here (noted in ``notes``).

Anything it cannot model (an unknown ``model_type``, an unknown layer type, a missing field) raises
:class:`KVFootprintError` naming what it cannot model; it never guesses.

Precision: ``bits / 8`` bytes per cached element (16-bit default). For 8/4/2 bits this is the payload only;
quantization scales and zero points are extra and are measured elsewhere (``trials.measurement.instruments.kv_cache_bytes``).

``CATALOGUE`` holds well-known real architectures as *transcribed config facts*: the fields of each model's
published ``config.json`` that matter for the KV cache, written down from the hub configs (the hub id is the
key's ``hub_id``; nothing is downloaded). The zoo models (``trials.models.zoo``) resolve too.

Command line::

    python -m trials.measurement.kv_footprint CONFIG [--context N] [--batch B] [--bits 16|8|4|2] [--mla latent|expanded] [--json]

CONFIG is a path to a ``config.json`` (or a folder with one), a catalogue name or a zoo name. Bad input prints
one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
from typing import Any

from trials.models import zoo
from trials.redaction import one_line

__all__ = ["CATALOGUE", "KVFootprint", "KVFootprintError", "LayerGroup", "kv_footprint", "load_config", "main"]


class KVFootprintError(ValueError):
    """The config describes something this calculator cannot model (or it is not a usable config)."""


# --------------------------------------------------------------------------------------- catalogue
# Transcribed config facts (the KV-relevant fields of each published config.json). ``hub_id`` is the source.

CATALOGUE: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(
        hub_id="meta-llama/Llama-3.1-8B", model_type="llama", num_hidden_layers=32, hidden_size=4096,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    "llama-3.1-70b": dict(
        hub_id="meta-llama/Llama-3.1-70B", model_type="llama", num_hidden_layers=80, hidden_size=8192,
        num_attention_heads=64, num_key_value_heads=8, head_dim=128),
    "llama-3.2-1b": dict(
        hub_id="meta-llama/Llama-3.2-1B", model_type="llama", num_hidden_layers=16, hidden_size=2048,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    "llama-3.2-3b": dict(
        hub_id="meta-llama/Llama-3.2-3B", model_type="llama", num_hidden_layers=28, hidden_size=3072,
        num_attention_heads=24, num_key_value_heads=8, head_dim=128),
    "qwen2.5-0.5b": dict(
        hub_id="Qwen/Qwen2.5-0.5B", model_type="qwen2", num_hidden_layers=24, hidden_size=896,
        num_attention_heads=14, num_key_value_heads=2, sliding_window=32768, use_sliding_window=False,
        max_window_layers=24),
    "qwen2.5-7b": dict(
        hub_id="Qwen/Qwen2.5-7B", model_type="qwen2", num_hidden_layers=28, hidden_size=3584,
        num_attention_heads=28, num_key_value_heads=4, sliding_window=131072, use_sliding_window=False,
        max_window_layers=28),
    "qwen2.5-72b": dict(
        hub_id="Qwen/Qwen2.5-72B", model_type="qwen2", num_hidden_layers=80, hidden_size=8192,
        num_attention_heads=64, num_key_value_heads=8, sliding_window=131072, use_sliding_window=False,
        max_window_layers=80),
    "mistral-7b-v0.1": dict(
        hub_id="mistralai/Mistral-7B-v0.1", model_type="mistral", num_hidden_layers=32, hidden_size=4096,
        num_attention_heads=32, num_key_value_heads=8, sliding_window=4096),
    "gemma-2-9b": dict(
        hub_id="google/gemma-2-9b", model_type="gemma2", num_hidden_layers=42, hidden_size=3584,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, sliding_window=4096),
    "phi-3-mini-4k": dict(
        hub_id="microsoft/Phi-3-mini-4k-instruct", model_type="phi3", num_hidden_layers=32, hidden_size=3072,
        num_attention_heads=32, num_key_value_heads=32, sliding_window=2047),
    "deepseek-v3": dict(
        hub_id="deepseek-ai/DeepSeek-V3", model_type="deepseek_v3", num_hidden_layers=61, hidden_size=7168,
        num_attention_heads=128, num_key_value_heads=128, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128),
    "qwen3-next-80b-a3b": dict(
        hub_id="Qwen/Qwen3-Next-80B-A3B-Instruct", model_type="qwen3_next", num_hidden_layers=48,
        hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256, full_attention_interval=4),
    "jamba-v0.1": dict(
        hub_id="ai21labs/Jamba-v0.1", model_type="jamba", num_hidden_layers=32, hidden_size=4096,
        num_attention_heads=32, num_key_value_heads=8, attn_layer_period=8, attn_layer_offset=4),
}

# model_types whose attention is plain (GQA/MQA/MHA, optional sliding window / layer_types) -- modelled as such.
_STANDARD_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "gemma", "gemma2",
    "gemma3_text", "starcoder2", "olmo", "olmo2", "granite", "cohere", "ministral",
})
_MLA_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})
_HYBRID_TYPES = frozenset({"qwen3_next", "jamba"})
KNOWN_MODEL_TYPES = _STANDARD_TYPES | _MLA_TYPES | _HYBRID_TYPES

_FULL_TYPES = {"full_attention", "attention", "global", "global_attention"}
_SLIDING_TYPES = {"sliding_attention", "sliding_window", "local", "local_attention"}
_CHUNKED_TYPES = {"chunked_attention"}
_NO_KV_TYPES = {"linear_attention", "mamba", "mamba2", "conv", "moe", "mlp", "dense", "sparse"}


# ------------------------------------------------------------------------------------------ result

@dataclasses.dataclass(frozen=True)
class LayerGroup:
    """Layers of one kind. ``elements_per_token``: cached elements per layer and token (K and V together)."""

    kind: str                   # "full", "sliding", "mla", "none"
    layers: int
    elements_per_token: int
    window: int | None = None   # sliding/chunked layers keep min(context, window) tokens

    def tokens_cached(self, context: int) -> int:
        return context if self.window is None else min(context, self.window)

    def elements(self, context: int, batch: int = 1) -> int:
        return self.layers * self.elements_per_token * self.tokens_cached(context) * batch


SLIDING_COUNTER_BYTES = 8      # DynamicSlidingWindowLayer._sliding_window_tensor (one int64)


def _bytes(elements: int, bits: int) -> int:
    if bits not in (16, 8, 4, 2, 32):
        raise KVFootprintError(f"unsupported precision: {bits} bits (use 32, 16, 8, 4 or 2)")
    return math.ceil(elements * bits / 8)


@dataclasses.dataclass(frozen=True)
class KVFootprint:
    """KV-cache footprint of one architecture.

    ``bytes_per_token_uncapped(bits)``: bytes every new token adds while no window is full (all layers). With
    sliding windows, the cost per token falls once context passes a window; ``total_bytes(context, batch, bits)``
    is exact for a context and ``bytes_per_token(context, bits)`` is its average per token.
    """

    name: str
    model_type: str
    num_hidden_layers: int
    groups: tuple[LayerGroup, ...]
    notes: tuple[str, ...] = ()

    @property
    def elements_per_token_uncapped(self) -> int:
        return sum(g.layers * g.elements_per_token for g in self.groups)

    def bytes_per_token_uncapped(self, bits: int = 16) -> int:
        return _bytes(self.elements_per_token_uncapped, bits)

    def total_bytes(self, context: int, batch: int = 1, bits: int = 16) -> int:
        if context < 0 or batch < 0:
            raise KVFootprintError(f"context and batch must be >= 0 (got {context}, {batch})")
        return _bytes(sum(g.elements(context, batch) for g in self.groups), bits)

    def held_bytes(self, context: int, batch: int = 1, bits: int = 16) -> int:
        """Exactly what transformers' ``DynamicCache`` holds after decoding to ``context`` positions:
        ``total_bytes`` plus an 8-byte window counter per sliding layer (``DynamicSlidingWindowLayer``;
        its ``window - 1``-token views keep the storage of ``window`` tokens alive)."""
        counters = sum(g.layers for g in self.groups if g.kind == "sliding") * SLIDING_COUNTER_BYTES
        return self.total_bytes(context, batch, bits) + counters

    def bytes_per_token(self, context: int, bits: int = 16) -> float:
        """Average bytes per token of one sequence at ``context`` (equals the uncapped value without windows)."""
        return self.total_bytes(context, 1, bits) / context if context else float(self.bytes_per_token_uncapped(bits))

    def breakdown(self, context: int, batch: int = 1, bits: int = 16) -> dict[str, int]:
        """Total bytes per layer kind (``none`` layers included at 0)."""
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.kind] = out.get(g.kind, 0) + _bytes(g.elements(context, batch), bits)
        return out

    def report(self, context: int, batch: int = 1, bits: int = 16) -> dict[str, Any]:
        return {
            "name": self.name, "model_type": self.model_type, "num_hidden_layers": self.num_hidden_layers,
            "context": context, "batch": batch, "bits": bits,
            "bytes_per_token": self.bytes_per_token(context, bits),
            "bytes_per_token_uncapped": self.bytes_per_token_uncapped(bits),
            "total_bytes": self.total_bytes(context, batch, bits),
            "breakdown": self.breakdown(context, batch, bits),
            "layers": [dataclasses.asdict(g) for g in self.groups],
            "notes": list(self.notes),
        }


# ----------------------------------------------------------------------------------------- loading

def load_config(spec: Any) -> tuple[str, dict[str, Any]]:
    """(name, config dict) from a dict, a transformers config, a path, a catalogue name or a zoo name."""
    if isinstance(spec, dict):
        return str(spec.get("_name_or_path") or spec.get("hub_id") or spec.get("model_type", "config")), dict(spec)
    if hasattr(spec, "to_dict") and not isinstance(spec, (str, pathlib.Path)):
        d = spec.to_dict()
        return str(d.get("_name_or_path") or d.get("model_type", "config")), d
    if isinstance(spec, pathlib.Path) or (isinstance(spec, str) and spec not in CATALOGUE and not _is_zoo(spec)):
        path = pathlib.Path(spec)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise KVFootprintError(f"unknown config {str(spec)!r}: not a file, a catalogue name "
                                   f"({', '.join(CATALOGUE)}) or a zoo name")
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise KVFootprintError(f"cannot read {path}: {e}") from None
        except RecursionError:
            raise KVFootprintError(f"cannot read {path}: nested too deeply") from None
        if not isinstance(config, dict):
            raise KVFootprintError(f"{path} is not a model config (a JSON object), but a JSON {type(config).__name__}")
        return str(spec), config
    if spec in CATALOGUE:
        return spec, dict(CATALOGUE[spec])
    return spec, _zoo_config(spec)


def _is_zoo(name: str) -> bool:
    return name in zoo.RECIPES


def _zoo_config(name: str) -> dict[str, Any]:
    """The built model's config.json; if not built, the same fields from its recipe (a Llama config)."""
    path = zoo.model_path(name) / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    r = zoo.RECIPES[name]
    return dict(model_type="llama", num_hidden_layers=r.layers, hidden_size=r.hidden_size,
                num_attention_heads=r.attention_heads, num_key_value_heads=r.kv_heads, head_dim=r.head_dim)


# ---------------------------------------------------------------------------------------- modelling

def _req(cfg: dict, key: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise KVFootprintError(f"config ({cfg.get('model_type')}) lacks {key!r}; cannot model its KV cache")
    return value


def _attention_elements(cfg: dict) -> int:
    heads = int(_req(cfg, "num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = cfg.get("head_dim") or int(_req(cfg, "hidden_size")) // heads
    return 2 * kv_heads * int(head_dim)


def _layer_types(cfg: dict, model_type: str, n: int, notes: list[str]) -> list[str]:
    """Per-layer kind names (transformers' layer_types convention)."""
    lt = cfg.get("layer_types")
    if lt is not None:
        if len(lt) != n:
            raise KVFootprintError(f"layer_types has {len(lt)} entries but num_hidden_layers is {n}")
        return list(lt)
    window = cfg.get("sliding_window")
    if model_type == "qwen3_next":
        interval = int(cfg.get("full_attention_interval") or 4)
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    if model_type == "jamba":
        period, offset = int(_req(cfg, "attn_layer_period")), int(_req(cfg, "attn_layer_offset"))
        return ["full_attention" if i % period == offset else "mamba" for i in range(n)]
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if window is not None and cfg.get("use_sliding_window"):
            first = int(cfg.get("max_window_layers") or 0)
            return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
        if window is not None:
            notes.append(f"sliding_window={window} ignored: use_sliding_window is false")
        return ["full_attention"] * n
    if model_type == "gemma2":
        if window is None:
            raise KVFootprintError("gemma2 config lacks 'sliding_window'; cannot model its local layers")
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if model_type == "gemma3_text":
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if model_type == "gemma" or window is None:
        return ["full_attention"] * n
    # mistral, mixtral, phi3, starcoder2, ...: a non-null sliding_window applies to every layer (as transformers does)
    return ["sliding_attention"] * n


def kv_footprint(config: Any, *, mla: str = "latent") -> KVFootprint:
    """KV footprint of ``config`` (dict, path, ``AutoConfig``, catalogue name or zoo name).

    ``mla``: for multi-head latent attention, ``"latent"`` (the compressed cache: ``kv_lora_rank +
    qk_rope_head_dim`` per layer and token) or ``"expanded"`` (the per-head K/V transformers' eager code caches).
    """
    if mla not in ("latent", "expanded"):
        raise KVFootprintError(f"mla must be 'latent' or 'expanded', not {mla!r}")
    name, cfg = load_config(config)
    notes: list[str] = []
    if isinstance(cfg.get("text_config"), dict):
        cfg = dict(cfg["text_config"])
        notes.append("multimodal config: the text model's KV only")
    model_type = cfg.get("model_type")
    if model_type not in KNOWN_MODEL_TYPES:
        raise KVFootprintError(f"cannot model model_type {model_type!r}: known types are "
                               f"{', '.join(sorted(KNOWN_MODEL_TYPES))}")
    n = int(_req(cfg, "num_hidden_layers"))

    if model_type in _MLA_TYPES:
        if mla == "latent":
            per = int(_req(cfg, "kv_lora_rank")) + int(_req(cfg, "qk_rope_head_dim"))
            notes.append("MLA latent cache (kv_lora_rank + qk_rope_head_dim per layer, shared by all heads); "
                         "transformers' eager implementation caches expanded per-head K/V instead (mla='expanded')")
        else:
            heads = int(_req(cfg, "num_attention_heads"))
            per = heads * (int(_req(cfg, "qk_nope_head_dim")) + int(_req(cfg, "qk_rope_head_dim"))
                           + int(_req(cfg, "v_head_dim")))
            notes.append("MLA expanded cache: per-head K (qk_nope + qk_rope) and V (v_head_dim), "
                         "as transformers' eager implementation stores it")
        return KVFootprint(name, model_type, n, (LayerGroup("mla", n, per),), tuple(notes))

    if cfg.get("kv_lora_rank"):
        raise KVFootprintError(f"model_type {model_type!r} has kv_lora_rank (latent attention) the calculator "
                               "does not model for this type")
    types = _layer_types(cfg, model_type, n, notes)
    per = _attention_elements(cfg)
    window = cfg.get("sliding_window")
    counts: dict[tuple[str, int | None], int] = {}
    for t in types:
        if t in _FULL_TYPES:
            key = ("full", None)
        elif t in _SLIDING_TYPES:
            if not window:
                raise KVFootprintError(f"layer type {t!r} but no sliding_window in the config")
            key = ("sliding", int(window))
        elif t in _CHUNKED_TYPES:
            key = ("sliding", int(_req(cfg, "attention_chunk_size")))
        elif t in _NO_KV_TYPES:
            key = ("none", None)
        else:
            raise KVFootprintError(f"cannot model attention layer type {t!r} (model_type {model_type!r})")
        counts[key] = counts.get(key, 0) + 1
    groups = tuple(LayerGroup(kind, count, 0 if kind == "none" else per, w)
                   for (kind, w), count in counts.items())
    if counts.get(("none", None)):
        notes.append(f"{counts[('none', None)]} linear-attention/recurrent/MLP-only layers hold no KV "
                     "(their fixed-size recurrent state is not counted)")
    return KVFootprint(name, model_type, n, groups, tuple(notes))


# --------------------------------------------------------------------------------------------- CLI

def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return str(n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trials.measurement.kv_footprint",
                                description="KV-cache bytes per token and in total for a model config.")
    p.add_argument("config", help="path to a config.json (or a model folder), a catalogue name or a zoo name")
    p.add_argument("--context", type=int, default=32768, help="tokens per sequence (default 32768)")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    p.add_argument("--bits", type=int, choices=(16, 8, 4, 2), default=16,
                   help="bits per cached element (default 16; 8/4/2: payload only, scales/zeros extra)")
    p.add_argument("--mla", choices=("latent", "expanded"), default="latent",
                   help="MLA models: latent (compressed) cache or transformers' expanded per-head K/V")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        if args.context < 0 or args.batch < 0:
            raise KVFootprintError("--context and --batch must be >= 0")
        report = kv_footprint(args.config, mla=args.mla).report(args.context, args.batch, args.bits)
    except KVFootprintError as e:
        print(f"kv_footprint: error: {one_line(e)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['name']} ({report['model_type']}, {report['num_hidden_layers']} layers), "
          f"{args.bits}-bit, context {args.context}, batch {args.batch}")
    print(f"bytes per token: {report['bytes_per_token']:,.1f} (uncapped {report['bytes_per_token_uncapped']:,})")
    print(f"total bytes: {report['total_bytes']:,} ({_human(report['total_bytes'])})")
    for kind, b in report["breakdown"].items():
        print(f"  {kind}: {b:,}")
    for note in report["notes"]:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
