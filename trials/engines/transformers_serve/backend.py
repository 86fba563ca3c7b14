"""transformers serve in a worker (``trials.engines.spec.ServerBackend``): the model's HF folder served
with continuous batching on 127.0.0.1, healthy before the first request, stopped with its whole
process group afterwards (on success, failure and Ctrl-C alike) and checked gone
(``trials.engines.server_process``).

Its completions API takes text only, so each request sends the prompt's text, checked here to
tokenize (as the server does: special tokens added) to exactly the ids the in-process transformers
engine decodes. Every request carries one generation config: the model's own, greedy, with its
end-of-sequence ids suppressed (``suppress_tokens``: continuous batching drops ``min_new_tokens``),
so each returns exactly ``max_tokens`` tokens as in every other group; the paged cache's pages are
longer than any sequence, so no prompt's blocks are shared with another's (each request is prefilled
again, as a new user's would be). ``parity`` asks the server for each prompt once, without streaming,
and compares its text with the in-process transformers engine's greedy output on the same folder
and precision (its API returns text, not token ids).
"""

from __future__ import annotations

import json
import pathlib
import shlex
import shutil
import sys
import urllib.request
from dataclasses import dataclass

from trials.config import TrialConfig
from trials.engines import server_process
from trials.engines.spec import ServerFacts
from trials.engines.server_process import HEALTH_TIMEOUT_S, HOST, Running, ServerError, serve_process  # noqa: F401
from trials.engines.transformers import backend as in_process
from trials.engines.transformers_serve.spec import NAME, model_refusal
from trials.errors import ConfigError
from trials.measurement.hardware import DTYPES
from trials.measurement.instruments import TokenTimer, model_weights_bytes
from trials.measurement.kv_footprint import KVFootprintError, kv_footprint
from trials.models.registry import model_config

STREAM_ENDS_WITH_DONE = False    # its streams end with a chunk carrying finish_reason and usage, no [DONE]
PAGE_ROUND = 256                  # a sequence's block: its longest prompt + new tokens + margin, rounded up to this
SERVER_NAME = "transformers serve"


@dataclass
class Served:
    """What a serving trial runs: the folder (named in every request as the server was started with),
    the prompts and the text each request sends, the generation config, the cache's geometry."""

    model: str                    # the folder or hub id the server serves (its requests must name it)
    prompts: list                 # trials.prompts.Prompt, in the workload's order
    request_prompts: dict[str, str]
    generation_config: str        # JSON: the model's own, greedy, end-of-sequence suppressed
    per_slot: int                 # tokens one sequence's block holds (the page size)
    loaded: object                # the in-process model (trials.models.loading.LoadedModel): parity's reference


def prompt_text(tokenizer, text: str, prompt_id: str) -> str:
    """The text whose server-side tokenization (special tokens added) is the in-process engine's ids
    (which add none after a chat template's own BOS): the text itself, or without that BOS."""
    templated = bool(tokenizer.bos_token) and text.startswith(tokenizer.bos_token)
    ids = tokenizer(text, add_special_tokens=not templated)["input_ids"]
    for candidate in (text, text.removeprefix(tokenizer.bos_token or "")):
        if tokenizer(candidate)["input_ids"] == ids:
            return candidate
    raise ConfigError(f"prompt {prompt_id}: no text tokenizes on the server to the in-process engine's ids")


def eos_ids(loaded) -> list[int]:
    """The end-of-sequence ids the in-process ``min_new_tokens`` suppresses (generation config, else tokenizer)."""
    value = loaded.model.generation_config.eos_token_id
    if value is None:
        value = loaded.tokenizer.eos_token_id
    return [int(i) for i in (value if isinstance(value, list) else [value]) if i is not None]


def load(config: TrialConfig) -> Served:
    """The model in-process (parity's reference; its tokenizer checks the prompts) and what the
    server is sent."""
    entry, stack, workload = config.entry(), config.stack, config.workload
    refused = model_refusal(entry.name, model_config(entry), stack)
    if refused:
        raise ConfigError(refused)
    if entry.trust_remote_code:
        raise ConfigError(f"{entry.name} needs remote code: transformers serve runs here with --no-trust-remote-code")
    loaded, prompts = in_process.load(config)      # the stack's precision on this device, the workload's prompts
    tokenizer = loaded.tokenizer
    texts = {p.id: prompt_text(tokenizer, p.text, p.id) for p in prompts}
    longest = max(len(tokenizer(t)["input_ids"]) for t in texts.values())
    per_slot = -(-(longest + workload.max_new_tokens + 16) // PAGE_ROUND) * PAGE_ROUND
    generation = {**loaded.model.generation_config.to_diff_dict(), "do_sample": False, "suppress_tokens": eos_ids(loaded)}
    return Served(entry.path(), prompts, texts, json.dumps(generation), per_slot, loaded)


def server_arguments(config: TrialConfig, served: Served) -> list[str]:
    """transformers serve's options for the stack (beside the model, host and port): the one
    description the trial runs and the user's command line shows. The cache holds ``batch_size``
    sequences: as many blocks, each of ``per_slot`` tokens; a forward pass takes at most what they hold."""
    stack = config.stack
    return ["--continuous-batching", "--device", config.device, "--dtype", dtype_name(stack.precision),
            "--cb-block-size", str(served.per_slot), "--cb-num-blocks", str(stack.batch_size),
            "--cb-max-batch-tokens", str(served.per_slot * stack.batch_size),
            "--no-trust-remote-code", "--default-seed", str(config.seed)]


def dtype_name(precision: str) -> str:
    """``--dtype``'s name of a precision (``fp32`` -> ``float32``)."""
    return str(DTYPES[precision]).removeprefix("torch.")


def thread_env(threads: int) -> dict[str, str]:
    """torch's threads in the server (it has no option of its own)."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def executable() -> list[str]:
    """The ``transformers`` command of this Python environment."""
    beside = pathlib.Path(sys.executable).with_name("transformers")
    found = str(beside) if beside.exists() else shutil.which("transformers")
    return [found] if found else [sys.executable, "-m", "transformers.cli.transformers"]


def user_command(config: TrialConfig, served: Served, threads: int) -> str:
    """The stack as a user starts it (a built model's folder named by the model)."""
    entry = config.entry()
    model = entry.location if entry.source == "hub" else f"<{config.model}>"
    env = [f"{k}={v}" for k, v in thread_env(threads).items()]
    return shlex.join([*env, "transformers", "serve", model, "--host", HOST, "--port", "8000",
                       *server_arguments(config, served)])


def request_body(served: Served) -> dict:
    """What every request adds to an OpenAI completion: the model it was started with (any other is
    refused) and the greedy, end-of-sequence-suppressed generation config."""
    return {"model": served.model, "generation_config": served.generation_config}


def serve(config: TrialConfig, served: Served, threads: int, port: int | None = None,
          health_timeout_s: float = HEALTH_TIMEOUT_S):
    """The server for ``config`` on 127.0.0.1 (a free port unless ``port`` is given), healthy; stopped
    and checked gone on the way out, whatever happened inside (Ctrl-C included)."""
    def command(port_: int) -> list[str]:
        return [*executable(), "serve", served.model, "--host", HOST, "--port", str(port_),
                *server_arguments(config, served)]

    return serve_process(SERVER_NAME, command, threads, port, health_timeout_s, env=thread_env(threads))


def completion(running: Running, served: Served, text: str, new_tokens: int) -> tuple[str, int]:
    """The server's greedy text for one prompt and how many tokens it generated (no streaming)."""
    body = {"prompt": text, "max_tokens": new_tokens, "temperature": 0, **request_body(served)}
    request = urllib.request.Request(f"{running.url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        answer = json.loads(response.read())
    return answer["choices"][0]["text"], int(answer["usage"]["completion_tokens"])


def agreed_tokens(tokenizer, mine: list[int], text: str) -> int:
    """How many of the in-process tokens the server's text reproduces: the longest prefix of them whose
    decoded text starts the server's (a prefix ending inside a multi-byte character does not count,
    a later one that completes it does)."""
    return max((k for k in range(1, len(mine) + 1)
                if text.startswith(tokenizer.decode(mine[:k], skip_special_tokens=True))), default=0)


def parity(config: TrialConfig, served: Served, running: Running) -> dict[str, float]:
    """The server's greedy output against the in-process transformers engine's (the same folder and
    precision, batch 1), prompt by prompt: ``parity_token_match`` is the share of in-process tokens the
    server's text reproduces up to the first divergence, ``parity_prompts_identical`` the share of
    prompts whose text and token count are equal. 1.0: the in-process groups' quality numbers carry over.
    ``in_process_ttft_s_p50``: the in-process engine's time to first token on the same prompts, one at
    a time after a warm-up, to set beside the served one."""
    new = config.workload.max_new_tokens
    loaded = served.loaded
    prepared = in_process.prepare(config, loaded, served.prompts)        # the stack's generate() keywords

    def agreed(answer, record):
        text, count = answer
        return agreed_tokens(loaded.tokenizer, record.output_ids[0], text), text == record.texts[0] and count == new

    return server_process.parity(
        served.prompts, new, lambda prompt: completion(running, served, served.request_prompts[prompt.id], new),
        lambda prompt, tokens: in_process.generate_batch(loaded, [prompt], tokens, TokenTimer(), prepared.kwargs),
        agreed)


def server_metrics(running: Running) -> dict[str, float]:
    """transformers serve exposes no counters (``/health`` and ``/v1/models`` only): none."""
    return {}


def trial_facts(config: TrialConfig, served: Served, running: Running) -> ServerFacts:
    """The weights' bytes, the KV cache the server was sized to hold (``batch_size`` sequences of
    ``per_slot`` tokens at the weights' dtype, every layer as full attention: transformers' own
    capacity target, which it rounds up to whole sectors), how long it took to become healthy, its
    version and the command line to reproduce it."""
    import transformers

    stack, model = config.stack, served.loaded.model
    facts = ServerFacts(served.per_slot * stack.batch_size, served.per_slot, float(model_weights_bytes(model)))
    facts.tags = tags = {"engine": NAME, "served_dtype": dtype_name(stack.precision),
            "transformers_serve_version": f"transformers serve of transformers {transformers.__version__}",
            "server_command": user_command(config, served, running.threads),
            "user_code": user_command(config, served, running.threads)}
    try:
        bits = DTYPES[stack.precision].itemsize * 8
        per_token = kv_footprint(model.config, mla="expanded").bytes_per_token_uncapped(bits)
        facts.kv_cache_allocated_bytes = float(served.per_slot * stack.batch_size * per_token)
    except KVFootprintError as exc:
        tags["kv_cache_bytes_exact_missing"] = str(exc)
    return facts
