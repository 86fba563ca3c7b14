"""llama-server's step time against the tokens in a step, measured once per model and configuration.

Why: the p95 ITL a ``-b`` gives (``trials.stats.step_time``) follows from how long one scheduling
step takes with n tokens in it. llama.cpp's own benchmark measures exactly such steps: ``llama-bench``
with ``-b``/``-ub`` at least the prompt, so each ``pp<p>`` test is ONE step of p tokens, and ``tg16``
gives the step of one decoding token (its seconds per token). Same GGUF, KV cache type, flash
attention and threads as the server, built from the same llama.cpp (``trials.engines.llama_cpp.tools``).

Measured once and kept: one JSON file per (GGUF path, bytes and mtime, cache type, threads, tools
build) under ``~/.cache/llm-inference-sweeps/step-curves`` (or ``$LLM_SWEEPS_STEP_CURVES_DIR``). The
file keeps the samples, not only the line: the curve is fitted again from them on every read, and a
file that does not parse, names another key or holds unusable samples is measured again, not trusted.
One process measures a key at a time (a file lock): two measurements at once would slow each other.
A curve measured while something else took the cores (its fit or its repeats stray) is not kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import tempfile
import time

from trials.engines.llama_cpp import bench, tools
from trials.stats.step_time import StepCurve

log = logging.getLogger(__name__)

CACHE_ENV_VAR = "LLM_SWEEPS_STEP_CURVES_DIR"
DEFAULT_DIR = "~/.cache/llm-inference-sweeps/step-curves"
FORMAT_VERSION = 1
PROMPT_SIZES = (8, 32, 64, 128, 256)     # tokens in one prefill step (the server's prompts are ~50-200)
DECODE_TOKENS = 16                       # tg16: the one-token (decode) step
REPEATS = 3                              # the fastest counts: a 2-core machine shared with others
# A curve measured while something else ran is used once, said so, and not kept (the next trial
# measures again): its fit strays this far from its samples (root mean square, relative), or its
# tests' repeats spread this much (median relative standard deviation); a quiet run stays well below.
MAX_KEPT_RESIDUAL = 0.15
MAX_KEPT_SPREAD = 0.15


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_DIR).expanduser()


def curve_key(gguf_path: str | os.PathLike, cache_type: str, threads: int, build: str) -> dict:
    """What a measured curve stands for: the GGUF (its path, bytes and mtime: a rebuilt file is
    another), the KV cache type, the threads and the tools' build (``tools_dir().name``)."""
    path = pathlib.Path(gguf_path).resolve()
    stat = path.stat()
    return {"gguf": str(path), "gguf_bytes": stat.st_size, "gguf_mtime_ns": stat.st_mtime_ns,
            "cache_type": cache_type, "threads": threads, "llama_cpp_build": build}


def cache_file(key: dict) -> pathlib.Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{pathlib.Path(key['gguf']).stem}.{key['cache_type']}.t{key['threads']}.{digest}.json"


def samples_from_rows(rows: list[dict], prompt_sizes=PROMPT_SIZES, decode_tokens: int = DECODE_TOKENS) -> list[tuple[int, float]]:
    """(tokens, seconds) of one step from llama-bench's JSON rows: ``pp<p>`` is one step of p tokens,
    ``tg<n>`` n steps of one token. Each test's fastest repeat (``samples_ns``; ``avg_ns`` where
    absent): on a shared machine a moment's contention is not the step's cost."""
    samples = []
    for tokens, (n_prompt, n_gen) in [(p, (p, 0)) for p in prompt_sizes] + [(1, (0, decode_tokens))]:
        row = next((r for r in rows if (r.get("n_prompt"), r.get("n_gen")) == (n_prompt, n_gen)), None)
        times = (row or {}).get("samples_ns") or [(row or {}).get("avg_ns")]
        if not all(isinstance(t, (int, float)) and t > 0 for t in times):
            raise tools.ToolError(f"llama-bench printed no {'pp' if n_prompt else 'tg'}{n_prompt or n_gen} row")
        samples.append((tokens, min(times) / 1e9 / (n_gen or 1)))
    return samples


def measure(gguf_path: str | os.PathLike, cache_type: str = "f16", threads: int = 1,
            prompt_sizes: tuple[int, ...] | None = None, repeats: int | None = None,
            folder: pathlib.Path | None = None, timeout_s: float = 600) -> tuple[StepCurve, dict]:
    """Measure the curve now (no cache): one llama-bench run, ``-b``/``-ub`` = the largest prompt
    (``PROMPT_SIZES`` and ``REPEATS`` unless given). The curve, and a record: the command, each
    test's relative spread, when."""
    sizes = tuple(prompt_sizes or PROMPT_SIZES)
    repeats = repeats or REPEATS
    rows, command = bench.llama_bench_rows(gguf_path, threads, sizes, DECODE_TOKENS, repeats, cache_type,
                                           flash_attn=True, timeout_s=timeout_s, folder=folder,
                                           batch_tokens=max(sizes))
    samples = samples_from_rows(rows, sizes)
    spread = {f"{'pp' if r['n_prompt'] else 'tg'}{r['n_prompt'] or r['n_gen']}": r["stddev_ns"] / r["avg_ns"]
              for r in rows if r.get("avg_ns") and r.get("stddev_ns") is not None}
    record = {"command": command, "repeats": repeats, "relative_stddev": spread,
              "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
              "build_commit": rows[0].get("build_commit"), "cpu_info": rows[0].get("cpu_info")}
    return StepCurve.fit(samples), record


def _read(path: pathlib.Path, key: dict) -> tuple[StepCurve | None, dict | str | None]:
    """The curve a cache file holds and its record, or (None, why it is not usable; None if absent)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"unreadable ({type(exc).__name__})"
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        return None, "another format"
    if data.get("key") != key:
        return None, "it names another key"
    try:
        curve = StepCurve.fit([(int(n), float(s)) for n, s in data["samples"]])
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"unusable samples ({exc})"
    record = data.get("record")
    return curve, record if isinstance(record, dict) else {}


def noise(curve: StepCurve, record: dict) -> str | None:
    """Why a measured curve is too noisy to keep (one line), or None."""
    spreads = sorted(record.get("relative_stddev", {}).values())
    spread = spreads[len(spreads) // 2] if spreads else 0.0
    if curve.residual > MAX_KEPT_RESIDUAL:
        return (f"the fit strays {100 * curve.residual:.0f} % from its samples (more than "
                f"{100 * MAX_KEPT_RESIDUAL:.0f} %): not kept")
    if spread > MAX_KEPT_SPREAD:
        return (f"llama-bench's repeats spread {100 * spread:.0f} % (median; more than "
                f"{100 * MAX_KEPT_SPREAD:.0f} %): not kept")
    return None


def step_curve(gguf_path: str | os.PathLike, cache_type: str = "f16", threads: int = 1,
               folder: pathlib.Path | None = None, timeout_s: float = 600) -> tuple[StepCurve, dict]:
    """The step curve of ``gguf_path`` with a ``cache_type`` KV cache on ``threads`` threads: read
    from the cache, else measured (``measure``) and kept. The record says which (``cached``) and,
    where a damaged file was measured again, why (``remeasured``); ``noisy`` where the fit strayed too
    far from its samples to be kept."""
    folder = folder or tools.tools_dir()
    key = curve_key(gguf_path, cache_type, threads, folder.name)
    path = cache_file(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tools.locked(path.with_name(f".{path.name}.lock")):
        curve, found = _read(path, key)
        if curve is not None:
            return curve, {**found, "cached": True, "file": str(path)}
        problem = found
        if problem:
            log.warning("step curve %s: %s: measuring it again", path, problem)
        curve, record = measure(gguf_path, cache_type, threads, folder=folder, timeout_s=timeout_s)
        record = {**record, "cached": False, "file": str(path), **({"remeasured": problem} if problem else {})}
        noisy = noise(curve, record)
        if noisy:
            log.warning("step curve of %s: %s", gguf_path, noisy)
            return curve, {**record, "noisy": noisy}
        data = {"format_version": FORMAT_VERSION, "key": key, "samples": [list(p) for p in curve.samples],
                "fit": curve.as_dict(), "record": {k: v for k, v in record.items() if k not in ("cached", "file", "remeasured")}}
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
            json.dump(data, tmp, indent=2)
        os.replace(tmp.name, path)
    return curve, record
