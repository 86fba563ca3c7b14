"""The KV cache on transformers: the quantized cache's backends, and the cache objects a stack needs.

transformers' ``QuantizedCache`` (KIVI-style, HQQ or optimum-quanto) is what ``cache_implementation=
"quantized"`` builds; it refuses models with sliding-window layers, for which ``make_cache`` builds a
hybrid by hand (quantized full-attention layers, sliding ones kept in full precision). The
arguments themselves are the stack's description (``arguments.generate_arguments``).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from pathlib import Path

import torch

from trials.config import Stack
from trials.engines.transformers.arguments import cache_config
from trials.errors import ConfigError

log = logging.getLogger(__name__)
BACKEND_PACKAGES = {"hqq": ("hqq", "hqq"), "quanto": ("optimum.quanto", "optimum-quanto")}


def require_backend(backend: str) -> None:
    """Raise ``ConfigError`` naming the pip package when the backend cannot be imported here."""
    module, package = BACKEND_PACKAGES[backend]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"KV backend {backend!r} needs the {package!r} package, which this worker "
                          f"cannot import ({type(exc).__name__}); pip install {package}") from None


# quanto compiles its C++ kernels on first use (~1 min on 2 cores) under torch's build lock, a plain
# file that a build interrupted by Ctrl-C or a killed worker leaves behind; every later build, and
# every later load (torch takes the lock to check the build), then waits on it forever, silently.
QUANTO_KERNELS = {"cpu": "quanto_cpp", "cuda": "quanto_cuda"}


def build_quanto_kernels(device: str) -> None:
    """Build (or load) quanto's kernels for ``device`` before a cache needs them, one process at a
    time under an ``flock``, which the kernel releases when its holder dies: whoever holds it knows
    that a torch lock left in the build folder is stale, and removes it."""
    import fcntl

    from optimum.quanto.library.extensions import get_extension, is_extension_available

    name = QUANTO_KERNELS.get(device.split(":")[0])
    if name is None or not is_extension_available(name):
        return
    extension = get_extension(name)
    build = Path(extension.build_directory)
    build.mkdir(parents=True, exist_ok=True)
    with open(build.parent / "build.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if clear_stale_build_lock(build):
            log.warning("removed the build lock an interrupted build of %s left in %s; building it again",
                        name, build)
        extension.lib


def clear_stale_build_lock(build_directory: Path) -> bool:
    """Remove torch's ``lock`` in ``build_directory``; call it only under ``build_quanto_kernels``'
    flock (no build of ours is running then). True if there was one."""
    lock = build_directory / "lock"
    if not lock.exists():
        return False
    lock.unlink(missing_ok=True)
    return True


def layer_types(model: torch.nn.Module) -> list[str]:
    text_config = model.config.get_text_config(decoder=True)
    return list(getattr(text_config, "layer_types", None) or ["full_attention"] * text_config.num_hidden_layers)


def has_sliding_layers(model: torch.nn.Module) -> bool:
    return any(t != "full_attention" for t in layer_types(model))


HYBRID_NOTE = ("sliding-window layers keep their window in full precision (DynamicSlidingWindowLayer: "
               "QuantizedCache takes full-attention layers only); only full-attention layers are quantized")


def make_cache(stack: Stack, model: torch.nn.Module):
    """A fresh cache object of the kind ``generate()`` builds for this stack; for a model with
    sliding-window layers, a hybrid: quantized full-attention layers, full-precision sliding ones."""
    from transformers import DynamicCache, QuantizedCache
    from transformers.cache_utils import Cache, DynamicSlidingWindowLayer, HQQQuantizedLayer, QuantoQuantizedLayer

    text_config = model.config.get_text_config(decoder=True)
    if stack.kv_bits == 16:
        return DynamicCache(config=text_config)
    settings = cache_config(stack)
    backend = settings.pop("backend")
    if not has_sliding_layers(model):
        return QuantizedCache(backend=backend, config=text_config, **settings)
    quantized = {"hqq": HQQQuantizedLayer, "quanto": QuantoQuantizedLayer}[backend]
    return Cache(layers=[quantized(**settings) if kind == "full_attention"
                         else DynamicSlidingWindowLayer(sliding_window=text_config.sliding_window)
                         for kind in layer_types(model)])


def cache_kwarg(model: torch.nn.Module) -> str:
    """The forward's name for the cache: ``cache`` (transformers >= 5.18), else ``past_key_values``
    (older versions ignore an unknown ``cache=`` silently, which would drop the prefix)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
