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
import pathlib
import shlex
import urllib.request
from dataclasses import dataclass, replace

from trials.config import TrialConfig
from trials.engines.llama_cpp import build_flags, generation, gguf, tools
from trials.engines.llama_cpp.spec import KV_TYPES, model_refusal
from trials.engines.llama_server.spec import NAME
from trials.engines import server_process
from trials.engines.spec import ServerFacts
from trials.engines.server_process import (HEALTH_TIMEOUT_S, HOST, Running, ServerError,  # noqa: F401  (the interface)
                                           http_get, serve_process)
from trials.errors import ConfigError
from trials.loop import trial_prompts
from trials.measurement.instruments import TokenTimer
from trials.models import loading
from trials.models.registry import model_config, reference_precision

STREAM_ENDS_WITH_DONE = True     # its streams end with ``data: [DONE]``


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
    draft_path: pathlib.Path | None = None     # the draft model's GGUF (speculation "draft")

    @property
    def request_prompts(self) -> dict[str, list[int]]:
        """What each request sends as its ``prompt``: the token ids."""
        return self.prompt_ids


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
    draft = gguf.gguf_file(config.entry(stack.draft_model), stack.draft_precision)[0] if stack.speculation == "draft" else None
    return Served(path, card, prompts, ids, generation.eos_ids(pathlib.Path(entry.path()), source.tokenizer),
                  per_slot, per_slot * stack.batch_size, source.tokenizer, draft)


def server_arguments(config: TrialConfig, served: Served, threads: int, draft: str | None = None) -> list[str]:
    """llama-server's options for the stack (beside the binary, the model, host and port): the one
    description the trial runs and the user's command line shows. ``draft``: how the draft's GGUF is
    named (default: its path). A draft keeps the target's cache type and threads, and at least one
    drafted token a round."""
    stack = config.stack
    kv = KV_TYPES[stack.kv_bits]
    arguments = ["--ctx-size", str(served.n_ctx), "--parallel", str(stack.batch_size), "--cont-batching",
                 *(["--batch-size", str(stack.step_tokens)] if stack.step_tokens else []),
                 "--threads", str(threads), "--threads-batch", str(threads), "--flash-attn", "on",
                 "--cache-type-k", kv, "--cache-type-v", kv, "--seed", str(config.seed), "--metrics", "--no-webui"]
    if stack.speculation == "prompt_lookup":
        arguments += ["--spec-type", "ngram-simple", "--spec-draft-n-max", str(stack.num_draft_tokens)]
    elif stack.speculation == "draft":
        arguments += ["--spec-type", "draft-simple", "--spec-draft-model", draft or str(served.draft_path),
                      "--spec-draft-n-max", str(stack.num_draft_tokens), "--spec-draft-n-min", "1",
                      "--spec-draft-threads", str(threads), "--cache-type-k-draft", kv, "--cache-type-v-draft", kv]
    return arguments


def user_command(config: TrialConfig, served: Served, threads: int) -> str:
    """The stack as a user starts it (the model files named as the project built them)."""
    stack = config.stack
    model = f"<{config.model}>.{stack.precision}.gguf"
    draft = f"<{stack.draft_model}>.{stack.draft_precision}.gguf" if stack.speculation == "draft" else None
    return shlex.join(["llama-server", "--model", model, "--host", HOST, "--port", "8080",
                       *server_arguments(config, served, threads, draft)])


def request_body(served: Served) -> dict:
    """What every request adds to an OpenAI completion: greedy, end-of-sequence suppressed, no
    prompt cache (llama-server's own fields; a server that lacks them ignores them)."""
    return {"temperature": 0.0, "top_k": 1, "ignore_eos": True, "cache_prompt": False,
            "logit_bias": [[i, False] for i in served.eos_ids]}


def serve(config: TrialConfig, served: Served, threads: int, port: int | None = None,
          health_timeout_s: float = HEALTH_TIMEOUT_S):
    """The server for ``config`` on 127.0.0.1 (a free port unless ``port`` is given), healthy; stopped
    and checked gone on the way out, whatever happened inside (Ctrl-C included)."""
    def command(port_: int) -> list[str]:
        return [str(tools.server_binary()), "--model", str(served.path), "--host", HOST, "--port", str(port_),
                *server_arguments(config, served, threads)]

    return serve_process("llama-server", command, threads, port, health_timeout_s)


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
    whose tokens are all equal. 1.0: the in-process engines group's quality numbers carry over.
    A draft model's stack is compared with the target alone (the binding has no draft models; greedy
    speculation must not change a token). ``in_process_ttft_s_p50``: the in-process engine's time to first token on the same prompts, one at
    a time after a warm-up (the engines group's path), to set beside the served one."""
    new = config.workload.max_new_tokens
    alone = replace(config.stack, batch_size=1)
    if alone.speculation == "draft":       # greedy speculation is lossless: the target's own tokens
        alone = replace(alone, speculation="none", draft_model=None, draft_precision=None, num_draft_tokens=0)
    loaded = generation.load(replace(config, stack=alone), served.tokenizer, served.per_slot)
    kwargs = {"kv_bits": config.stack.kv_bits}
    records = []

    def local(prompt, tokens):
        records.append(generation.generate_batch(loaded, [prompt], tokens, TokenTimer(), kwargs))
        return records[-1]

    def agreed(served_ids, record):
        mine = record.output_ids[0]
        same = next((i for i, (a, b) in enumerate(zip(served_ids, mine)) if a != b), min(len(served_ids), len(mine)))
        return same, served_ids == mine

    measured = server_process.parity(served.prompts, new, lambda prompt: completion_tokens(
        running, served.prompt_ids[prompt.id], new, served), local, agreed)
    running.notes["kv_bytes_per_token"] = generation.kv_bytes_per_token(loaded, config.stack.kv_bits)
    running.notes["weights_bytes"] = generation.facts(loaded, records[-1]).weights_bytes
    return measured


def step_curve(config: TrialConfig, served: Served, threads: int):
    """Seconds per scheduling step against the tokens in it, for the stack's GGUF, cache type and
    threads (``step_curve.step_curve``: llama-bench, measured once and kept): what predicts the ITL
    a ``-b`` gives under load (``trials.stats.step_time``)."""
    from trials.engines.llama_server.step_curve import step_curve as measured

    return measured(served.path, KV_TYPES[config.stack.kv_bits], threads)[0]


def server_metrics(running: Running) -> dict[str, float]:
    """llama-server's Prometheus counters (``/metrics``), as ``server_<name>``."""
    status, text = http_get(f"{running.url}/metrics")
    if status != 200:
        return {}
    values = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line[len("llamacpp:"):].partition(" ")
            with contextlib.suppress(ValueError):
                values[f"server_{name}"] = float(value)
    return values


def trial_facts(config: TrialConfig, served: Served, running: Running) -> ServerFacts:
    """The GGUF and its bytes, the KV cache the server allocated (its context x the cache type's bytes
    per token, computed from ggml block sizes), how long it took to become healthy, its build and the
    command line to reproduce it."""
    stack = config.stack
    per_token = running.notes.get("kv_bytes_per_token")            # known once parity ran the same GGUF
    card = tools.read_card(tools.tools_dir(build=False)) or {}
    tags = {"engine": NAME, "gguf_type": stack.precision, "gguf_file": served.card.get("file", served.path.name),
            "gguf_origin": served.card.get("origin", ""), "weights_as_shipped": str(served.card.get("origin") == "shipped"),
            "kv_cache_type": KV_TYPES[stack.kv_bits], "flash_attn": "True",
            "llama_server_build": f"llama-server of llama-cpp-python {card.get('llama_cpp_python') or tools.binding_version()} "
                                  f"({tools.tools_dir(build=False).name})",
            "llama_cpp_build_flags": " ".join(build_flags.cmake_flags()),
            "server_command": user_command(config, served, running.threads),
            "user_code": user_command(config, served, running.threads)}
    return ServerFacts(served.n_ctx, served.per_slot, running.notes.get("weights_bytes"),
                       None if per_token is None else served.n_ctx * per_token,
                       {"gguf_file_bytes": float(served.path.stat().st_size)}, tags)
