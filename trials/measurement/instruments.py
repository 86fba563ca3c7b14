"""Measurement primitives: generation timing, peak memory, and the real bytes behind tensors.

Timing. Prefill (reading the prompt) is compute-bound and happens once; decode (one token per step)
is memory-bandwidth-bound and dominates long outputs, so they are timed apart. ``TokenTimer`` is a
transformers streamer: ``generate()`` hands it the prompt, then every new token (or every accepted
run of tokens under speculative decoding) as soon as it exists. Streamers receive tokens moved to
the CPU, which synchronizes CUDA, so wall-clock stamps taken there are honest on either device.
TTFT = first new token - start; decode time = last new token - first new token.

Memory. On CUDA, ``peak_memory_bytes`` is ``torch.cuda.max_memory_allocated`` after a reset: every
tensor the trial holds (weights, KV cache, activations). On CPU there is no allocator counter, so we
use the kernel's resident-set high-water mark of this process: free what the allocator holds
(``malloc_trim``), reset the mark (write ``5`` to ``/proc/self/clear_refs``), run, read ``VmHWM``.
The trial's peak is then ``weights_bytes + (VmHWM - RSS at reset)``: the weights plus whatever the
generation added on top, excluding the interpreter and libraries and whatever earlier trials in the
same worker left behind. Where the reset is not permitted the method falls back to a polling
sampler of RSS, and says so in ``memory_method``.

Bytes. ``tensor_bytes`` walks tensors to their storage, follows tensor subclasses (quantized weights
and caches keep their data in inner tensors, see ``__tensor_flatten__``) and counts each storage once.
"""

from __future__ import annotations

import ctypes
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch


class TokenTimer:
    """A transformers streamer that time-stamps each batch of new tokens."""

    def __init__(self) -> None:
        self.start = 0.0
        self.stamps: list[tuple[float, int]] = []   # (time, tokens per row in this put)
        self._prompt_seen = False

    def reset(self) -> None:
        self.stamps.clear()
        self._prompt_seen = False
        self.start = time.perf_counter()

    def put(self, value: torch.Tensor) -> None:
        now = time.perf_counter()
        if not self._prompt_seen:             # generate() first hands over the prompt itself
            self._prompt_seen = True
            return
        per_row = value.shape[-1] if value.dim() > 1 else 1
        self.stamps.append((now, per_row))

    def end(self) -> None:
        pass

    def stamp(self, tokens: int = 1) -> None:
        """An engine without streamers (llama.cpp) stamps each token itself as it arrives."""
        self.stamps.append((time.perf_counter(), tokens))

    @property
    def new_tokens(self) -> int:
        return sum(n for _, n in self.stamps)

    @property
    def ttft_s(self) -> float:
        return self.stamps[0][0] - self.start

    @property
    def decode_s(self) -> float:
        return self.stamps[-1][0] - self.stamps[0][0]

    @property
    def decode_tokens(self) -> int:
        """Tokens produced after the first one, per row: what decode time paid for."""
        return self.new_tokens - self.stamps[0][1]


# ---------------------------------------------------------------------------------------- memory

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _page_size()


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmHWM not found")


def _page_size() -> int:
    import resource

    return resource.getpagesize()


def _trim_malloc() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class PeakMemory:
    """Result of ``track_peak_memory``: bytes added on top of the starting point, and how measured."""

    added_bytes: int = 0
    method: str = ""
    _samples: list[int] = field(default_factory=list, repr=False)


@contextmanager
def track_peak_memory(device: str) -> Iterator[PeakMemory]:
    """Peak memory added by the body. See the module docstring for the method per device."""
    peak = PeakMemory()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        yield peak
        torch.cuda.synchronize()
        peak.added_bytes = torch.cuda.max_memory_allocated() - base
        peak.method = "cuda.max_memory_allocated"
        return
    _trim_malloc()
    base = _rss_bytes()
    if _reset_hwm():
        yield peak
        peak.added_bytes = max(0, _hwm_bytes() - base)
        peak.method = "rss_high_water_mark(clear_refs)"
        return
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak._samples.append(_rss_bytes())
            stop.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join()
    peak.added_bytes = max(0, max(peak._samples + [_rss_bytes()]) - base)
    peak.method = "rss_sampled_5ms"


# ----------------------------------------------------------------------------------------- bytes

def _leaf_tensors(t: torch.Tensor) -> Iterator[torch.Tensor]:
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None and type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        names, _ = flatten()
        for name in names:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):
                yield from _leaf_tensors(inner)
        return
    yield t


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Real bytes of the storages behind ``tensors``; shared storage is counted once."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        for leaf in _leaf_tensors(t):
            if leaf.numel() == 0:
                continue
            storage = leaf.untyped_storage()
            key = (str(leaf.device), storage.data_ptr())
            if key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
    return total


def model_weights_bytes(model: torch.nn.Module) -> int:
    """Real bytes of a model's weights: parameters, buffers, and quantizer state kept beside them.

    bitsandbytes keeps part of a quantized weight outside parameters and buffers: int8 row scales in
    ``weight.SCB`` (moved to ``module.state`` after the first forward) and 4-bit block scales and
    codebooks in ``weight.quant_state``. ``get_memory_footprint()`` misses them; this counts them.
    """
    side = [t for module in model.modules() for t in _side_tensors(module, ("state", "quant_state"))]
    side += [t for p in model.parameters() for t in _side_tensors(p, ("SCB", "CB", "quant_state"))]
    return tensor_bytes(list(model.parameters()) + list(model.buffers()) + side)


_TRANSIENT_STATE = ("idx",)


def _side_tensors(owner, names: tuple[str, ...]) -> Iterator[torch.Tensor]:
    for name in names:
        value = getattr(owner, name, None)
        if isinstance(value, torch.Tensor) or type(value).__module__.startswith("bitsandbytes"):
            yield from _quantizer_tensors(value)


def _quantizer_tensors(obj) -> Iterator[torch.Tensor]:
    """Tensors in a bitsandbytes state object (``QuantState``, ``MatmulLtState``), nested ones too."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _quantizer_tensors(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _quantizer_tensors(v)
    elif type(obj).__module__.startswith("bitsandbytes"):
        # ``idx`` (LLM.int8's outlier columns of the last forward pass) depends on the input, not
        # the weights: 0 or a few int64s, so it is left out of weight storage.
        yield from _quantizer_tensors({k: v for k, v in vars(obj).items() if k not in _TRANSIENT_STATE})


def cache_tensors(cache) -> Iterator[torch.Tensor]:
    """Every tensor a transformers cache object holds (any layer type, quantized or not)."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        yield from _tensors_in(vars(cache))
        return
    for layer in layers:
        yield from _tensors_in(vars(layer))


def _tensors_in(obj) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors_in(v)


def kv_cache_bytes(cache) -> int:
    return tensor_bytes(cache_tensors(cache))

