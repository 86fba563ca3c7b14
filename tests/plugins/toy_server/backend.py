"""The toy server in a worker (``trials.engines.spec.ServerBackend``): the model's HF folder served by
``python -m toy_server.server`` on 127.0.0.1, healthy before the first request, stopped with its
process group afterwards and checked gone (``trials.engines.server_process``, the project's one
process control). Requests send token ids; parity compares the server's tokens with the toy engine's
in-process greedy loop on the same folder.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from dataclasses import dataclass

from toy_engine import backend as in_process
from toy_server.spec import NAME
from trials.engines import server_process
from trials.engines.server_process import HEALTH_TIMEOUT_S, HOST, Running, serve_process
from trials.engines.spec import ServerFacts
from trials.measurement.instruments import TokenTimer, model_weights_bytes

STREAM_ENDS_WITH_DONE = True
CONTEXT = 2048


@dataclass
class Served:
    folder: str
    prompts: list
    request_prompts: dict
    loaded: object


def load(config) -> Served:
    loaded, prompts = in_process.load(config)
    ids = {p.id: loaded.tokenizer(p.text)["input_ids"] for p in prompts}
    return Served(str(config.entry().path()), prompts, ids, loaded)


def request_body(served: Served) -> dict:
    return {}


def command(served: Served, threads: int, port: int) -> list[str]:
    return [sys.executable, "-m", "toy_server.server", "--model", served.folder, "--port", str(port),
            "--threads", str(threads)]


def serve(config, served: Served, threads: int, port: int | None = None, health_timeout_s: float = HEALTH_TIMEOUT_S):
    return serve_process(NAME, lambda port_: command(served, threads, port_), threads, port, health_timeout_s)


def _get(running: Running, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{running.url}{path}", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def parity(config, served: Served, running: Running) -> dict[str, float]:
    new = config.workload.max_new_tokens

    def ask(prompt):
        answer = _get(running, "/v1/completions", {"prompt": served.request_prompts[prompt.id], "max_tokens": new})
        return answer["choices"][0]["tokens"]

    def agreed(tokens, record):
        mine = record.output_ids[0]
        same = next((i for i, (a, b) in enumerate(zip(tokens, mine)) if a != b), min(len(tokens), len(mine)))
        return same, tokens == mine

    return server_process.parity(served.prompts, new, ask,
                                 lambda prompt, n: in_process.generate_batch(served.loaded, [prompt], n, TokenTimer(), {}),
                                 agreed)


def server_metrics(running: Running) -> dict[str, float]:
    return {f"toy_server_{k}": float(v) for k, v in _get(running, "/metrics.json").items()}


def trial_facts(config, served: Served, running: Running) -> ServerFacts:
    command_line = " ".join(command(served, running.threads, 8000))
    return ServerFacts(CONTEXT, CONTEXT, float(model_weights_bytes(served.loaded.model)),
                       tags={"engine": NAME, "toy_server_version": "1", "server_command": command_line,
                             "user_code": command_line})
