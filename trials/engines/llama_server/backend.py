"""llama-server in a worker (``trials.engines.spec.ServerBackend``): the stack's GGUF served on
127.0.0.1, healthy before the first request, stopped with its whole process group afterwards (on
success, failure and Ctrl-C alike) and checked gone.

The requests carry the transformers tokenizer's ids of the project's prompts (the ids the in-process
engines decode), greedy, with the model's end-of-sequence ids suppressed (exactly ``max_new_tokens``
each, as every other group) and the prompt cache off (a repeated prompt is prefilled again, as a new
user's would be). ``parity`` asks the server for the same prompts one at a time and compares its
tokens with the in-process llama.cpp engine's on the same GGUF and cache type.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace

from trials.config import TrialConfig
from trials.engines.llama_cpp import generation, gguf, tools
from trials.engines.llama_cpp.spec import KV_TYPES, model_refusal
from trials.engines.llama_server.spec import NAME
from trials.errors import ConfigError
from trials.loop import trial_prompts
from trials.measurement.instruments import TokenTimer
from trials.models import loading
from trials.models.registry import model_config, reference_precision

HOST = "127.0.0.1"
HEALTH_TIMEOUT_S = 180            # loading a GGUF and warming up; a server slower than this is broken
STOP_TIMEOUT_S = 10               # SIGTERM, then SIGKILL of the process group
LOG_LINES = 4                     # the server's last log lines in an error


class ServerError(RuntimeError):
    """The server did not start, died or would not stop: one line, with its last log lines."""


@dataclass
class Served:
    """What a serving trial runs: the GGUF, the prompts and their ids, the context the server gets."""

    path: pathlib.Path
    card: dict
    prompts: list                 # trials.prompts.Prompt, in the workload's order
    prompt_ids: dict[str, list[int]]
    eos_ids: tuple[int, ...]
    per_slot: int                 # context tokens each slot holds
    n_ctx: int                    # the server's whole context: per_slot x slots
    tokenizer: object


@dataclass
class Running:
    url: str
    command: list[str]
    process: subprocess.Popen
    log_path: pathlib.Path
    started_s: float              # from launch to healthy
    threads: int
    notes: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid


def load(config: TrialConfig) -> Served:
    """The stack's GGUF (built once, as the in-process engine's) and the workload's prompt ids."""
    entry, stack, workload = config.entry(), config.stack, config.workload
    refused = model_refusal(entry.name, model_config(entry), stack)
    if refused:
        raise ConfigError(refused)
    source = loading.load(entry, reference_precision(entry, config.device), config.device)
    prompts = trial_prompts(config, source)
    ids = {p.id: generation.prompt_ids(source, p) for p in prompts}
    longest = max(len(v) for v in ids.values())
    per_slot = -(-(longest + workload.max_new_tokens + stack.num_draft_tokens + 16) // 256) * 256
    path, card = gguf.gguf_file(entry, stack.precision)
    return Served(path, card, prompts, ids, generation.eos_ids(pathlib.Path(entry.path()), source.tokenizer),
                  per_slot, per_slot * stack.batch_size, source.tokenizer)


def server_arguments(config: TrialConfig, served: Served, threads: int) -> list[str]:
    """llama-server's options for the stack (beside the binary, the model, host and port): the one
    description the trial runs and the user's command line shows."""
    stack = config.stack
    kv = KV_TYPES[stack.kv_bits]
    arguments = ["--ctx-size", str(served.n_ctx), "--parallel", str(stack.batch_size), "--cont-batching",
                 "--threads", str(threads), "--threads-batch", str(threads), "--flash-attn", "on",
                 "--cache-type-k", kv, "--cache-type-v", kv, "--seed", str(config.seed), "--metrics", "--no-webui"]
    if stack.speculation == "prompt_lookup":
        arguments += ["--spec-type", "ngram-simple", "--spec-draft-n-max", str(stack.num_draft_tokens)]
    return arguments


def user_command(config: TrialConfig, served: Served, threads: int) -> str:
    """The stack as a user starts it (the model file named as the project built it)."""
    model = f"<{config.model}>.{config.stack.precision}.gguf"
    return shlex.join(["llama-server", "--model", model, "--host", HOST, "--port", "8080",
                       *server_arguments(config, served, threads)])


def request_body(served: Served) -> dict:
    """What every request adds to an OpenAI completion: greedy, end-of-sequence suppressed, no
    prompt cache (llama-server's own fields; a server that lacks them ignores them)."""
    return {"temperature": 0.0, "top_k": 1, "ignore_eos": True, "cache_prompt": False,
            "logit_bias": [[i, False] for i in served.eos_ids]}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def port_taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return True
    return False


def _tail(log_path: pathlib.Path) -> str:
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return " | ".join(lines[-LOG_LINES:])[-600:] or "no output"


def _get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def wait_healthy(process: subprocess.Popen, url: str, log_path: pathlib.Path,
                 timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """Until ``/health`` answers 200, or raise ``ServerError`` with the server's last log lines: it
    exited, or it never became healthy within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(f"llama-server exited with code {process.returncode} before it was healthy: {_tail(log_path)}")
        with contextlib.suppress(OSError):
            if _get(f"{url}/health", timeout_s=2)[0] == 200:
                return
        time.sleep(0.1)
    raise ServerError(f"llama-server was not healthy within {timeout_s:g} s: {_tail(log_path)}")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after ``STOP_TIMEOUT_S``, then check that no
    process of the group is left (``ServerError`` if one is)."""
    for sent in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sent)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_TIMEOUT_S)
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_TIMEOUT_S)
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return
    raise ServerError(f"llama-server (process group {process.pid}) is still running after SIGKILL")


@contextlib.contextmanager
def serve(config: TrialConfig, served: Served, threads: int, port: int | None = None,
          health_timeout_s: float = HEALTH_TIMEOUT_S):
    """The server for ``config`` on 127.0.0.1 (a free port unless ``port`` is given), healthy; stopped
    and checked gone on the way out, whatever happened inside (Ctrl-C included)."""
    if port is not None and port_taken(port):
        raise ServerError(f"port {port} on {HOST} is taken: llama-server cannot bind it")
    port = port or free_port()
    url = f"http://{HOST}:{port}"
    command = [str(tools.server_binary()), "--model", str(served.path), "--host", HOST, "--port", str(port),
               *server_arguments(config, served, threads)]
    handle, log_name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
    log_path = pathlib.Path(log_name)
    began = time.perf_counter()
    with os.fdopen(handle, "w") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_healthy(process, url, log_path, health_timeout_s)
        yield Running(url, command, process, log_path, time.perf_counter() - began, threads)
    finally:
        try:
            stop(process)
        finally:
            log_path.unlink(missing_ok=True)


def completion_tokens(running: Running, ids: list[int], new_tokens: int, served: Served) -> list[int]:
    """The server's greedy tokens for one prompt (its native ``/completion``, which returns token ids)."""
    body = {"prompt": ids, "n_predict": new_tokens, "return_tokens": True, **request_body(served)}
    request = urllib.request.Request(f"{running.url}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return [int(t) for t in json.loads(response.read())["tokens"]]


def parity(config: TrialConfig, served: Served, running: Running) -> dict[str, float]:
    """The server's greedy tokens against the in-process llama.cpp engine's (the same GGUF, cache type
    and proposer, batch 1), prompt by prompt: ``parity_token_match`` is the share of positions that
    agree up to the first divergence of each prompt, ``parity_prompts_identical`` the share of prompts
    whose tokens are all equal. 1.0: the in-process engines group's quality numbers carry over."""
    new = config.workload.max_new_tokens
    loaded = generation.load(replace(config, stack=replace(config.stack, batch_size=1)), served.tokenizer,
                             served.per_slot)
    agreed, identical = 0, 0
    for prompt in served.prompts:
        served_ids = completion_tokens(running, served.prompt_ids[prompt.id], new, served)
        local = generation.generate_batch(loaded, [prompt], new, TokenTimer(), {"kv_bits": config.stack.kv_bits})
        mine = local.output_ids[0]
        same = next((i for i, (a, b) in enumerate(zip(served_ids, mine)) if a != b), min(len(served_ids), len(mine)))
        agreed += same
        identical += int(served_ids == mine)
    running.notes["kv_bytes_per_token"] = generation.kv_bytes_per_token(loaded, config.stack.kv_bits)
    running.notes["weights_bytes"] = generation.facts(loaded, local)[0]["weights_bytes"]
    return {"parity_token_match": agreed / (new * len(served.prompts)),
            "parity_prompts_identical": identical / len(served.prompts)}


def server_metrics(running: Running) -> dict[str, float]:
    """llama-server's Prometheus counters (``/metrics``), as ``server_<name>``."""
    status, text = _get(f"{running.url}/metrics")
    if status != 200:
        return {}
    values = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line[len("llamacpp:"):].partition(" ")
            with contextlib.suppress(ValueError):
                values[f"server_{name}"] = float(value)
    return values


def trial_facts(config: TrialConfig, served: Served, running: Running) -> tuple[dict[str, float], dict[str, str]]:
    """The GGUF and its bytes, the KV cache the server allocated (its context x the cache type's bytes
    per token, computed from ggml block sizes), how long it took to become healthy, its build and the
    command line to reproduce it."""
    stack = config.stack
    metrics = {"gguf_file_bytes": float(served.path.stat().st_size), "n_ctx": float(served.n_ctx),
               "context_per_slot": float(served.per_slot), "server_start_s": running.started_s,
               "server_threads": float(running.threads), "parallel_slots": float(stack.batch_size)}
    if "kv_bytes_per_token" in running.notes:
        metrics["kv_cache_allocated_bytes"] = float(served.n_ctx * running.notes["kv_bytes_per_token"])
        metrics["weights_bytes"] = float(running.notes["weights_bytes"])
    card = tools.read_card(tools.tools_dir(build=False)) or {}
    tags = {"engine": NAME, "gguf_type": stack.precision, "gguf_file": served.card.get("file", served.path.name),
            "gguf_origin": served.card.get("origin", ""), "weights_as_shipped": str(served.card.get("origin") == "shipped"),
            "kv_cache_type": KV_TYPES[stack.kv_bits], "flash_attn": "True",
            "llama_server_build": f"llama-server of llama-cpp-python {card.get('llama_cpp_python') or tools.binding_version()} "
                                  f"({tools.tools_dir(build=False).name})",
            "llama_cpp_build_flags": " ".join(tools.cmake_flags()),
            "server_command": user_command(config, served, running.threads),
            "user_code": user_command(config, served, running.threads)}
    return metrics, tags
