"""llama.cpp's own benchmark, ``llama-bench``, on one GGUF: the cross-check of the binding's numbers
and the server's step curve (``trials.engines.llama_server.step_curve``), from the tools' build."""

from __future__ import annotations

import json
import os
import pathlib
import shlex

from trials.engines.llama_cpp.tools import ToolError, run_killable, stderr_tail, tools_dir
from trials.errors import ConfigError


def llama_bench(gguf_path: str | os.PathLike, threads: int, prompt_tokens: int = 128, gen_tokens: int = 32,
                repeats: int = 3, cache_type: str = "f16", flash_attn: bool = True, timeout_s: float = 600,
                folder: pathlib.Path | None = None) -> dict:
    """``llama-bench`` on one GGUF: prompt processing (``pp<prompt_tokens>``) and generation
    (``tg<gen_tokens>``) tokens per second, mean and standard deviation over ``repeats``, with the
    build, CPU, backends and exact command as ``llama_bench_*`` tags. A cross-check of the binding's
    numbers by llama.cpp's own benchmark. ToolError if it fails or outlives ``timeout_s`` (then its
    whole process group is killed, as on any exception). ``folder``: the tools' folder where the caller
    already checked it (``tools_dir``), else found and checked here."""
    rows, command = llama_bench_rows(gguf_path, threads, (prompt_tokens,) if prompt_tokens else (), gen_tokens,
                                     repeats, cache_type, flash_attn, timeout_s, folder)
    result = {}
    for phase, tokens in (("pp", prompt_tokens), ("tg", gen_tokens)):
        row = next((r for r in rows if (r["n_prompt"], r["n_gen"]) == ((tokens, 0) if phase == "pp" else (0, tokens))),
                   None)
        if tokens and row is None:
            raise ToolError(f"`{shlex.join(command)}` printed no {phase}{tokens} row")
        result[f"llama_bench_{phase}_tok_per_s"] = row["avg_ts"] if row else None
        result[f"llama_bench_{phase}_tok_per_s_std"] = row["stddev_ts"] if row else None
    first = rows[0]
    for key in ("build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_type", "model_size",
                "model_n_params", "n_threads", "type_k", "type_v", "flash_attn", "n_batch", "n_ubatch"):
        result[f"llama_bench_{key}"] = first.get(key)
    result["llama_bench_command"] = shlex.join(command)
    return result


def llama_bench_rows(gguf_path: str | os.PathLike, threads: int, prompt_sizes: tuple[int, ...] = (128,),
                     gen_tokens: int = 32, repeats: int = 3, cache_type: str = "f16", flash_attn: bool = True,
                     timeout_s: float = 600, folder: pathlib.Path | None = None,
                     batch_tokens: int | None = None) -> tuple[list[dict], list[str]]:
    """``llama-bench``'s JSON rows (one per test: ``pp<p>`` for each of ``prompt_sizes``, ``tg<gen_tokens>``
    unless 0) and the command that printed them. ``batch_tokens``: its ``-b`` and ``-ub`` (a prompt of
    at most that many tokens is then one step); llama-bench's defaults otherwise."""
    for name, value, least in (("threads", threads, 1), ("gen_tokens", gen_tokens, 0), ("repeats", repeats, 1),
                               *(("prompt_tokens", p, 1) for p in prompt_sizes),
                               *((("batch_tokens", batch_tokens, 1),) if batch_tokens is not None else ())):
        if not isinstance(value, int) or value < least:
            raise ConfigError(f"llama_bench: {name} must be an integer >= {least}, not {value!r}")
    if not prompt_sizes and not gen_tokens:
        raise ConfigError("llama_bench: prompt_tokens and gen_tokens are both 0: nothing to measure")
    if not pathlib.Path(gguf_path).is_file():
        raise ConfigError(f"llama_bench: no GGUF file {gguf_path}")
    command = [str((folder or tools_dir()) / "llama-bench"), "-m", str(gguf_path), "-t", str(threads),
               "-p", ",".join(str(p) for p in prompt_sizes) or "0", "-n", str(gen_tokens), "-r", str(repeats),
               "-fa", "on" if flash_attn else "off", "-ctk", cache_type, "-ctv", cache_type, "-o", "json"]
    if batch_tokens is not None:
        command[-2:-2] = ["-b", str(batch_tokens), "-ub", str(batch_tokens)]
    done = run_killable(command, timeout_s)
    try:
        rows = json.loads(done.stdout)
    except ValueError:
        raise ToolError(f"`{shlex.join(command)}` printed no JSON: {stderr_tail(done.stderr)}") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ToolError(f"`{shlex.join(command)}` printed no rows: {stderr_tail(done.stderr)}")
    return rows, command
