"""transformers serve as a second server engine, and the server lifecycle every server engine shares.

The lifecycle (``trials.engines.server_process``) is checked on a small Python HTTP server started
exactly as an engine's server is: healthy, never healthy (it exits, or answers 503), a port taken,
Ctrl-C inside the block, a helper process in its group, and its starter killed outright. The engine
itself runs once for real on the tiny zoo model through the serving runner (one server start, plus
one that fails on a folder that is not a model). After every test no server process is left.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import psutil
import pytest

from conftest import assert_none_left, children_running
from trials.config import Load, Runtime, Stack, TrialConfig, Workload
from trials.engines import server_process
from trials.engines.server_process import ServerError, serve_process
from trials.errors import ConfigError

MODEL = "tiny-gqa"
NAME = "transformers_serve"
LOAD = Load(rates=(0.5, 2.0), concurrency=(1, 4), requests=6, warmup=1, ttft_slo_s=2.0, tpot_slo_s=0.25)
WORKLOAD = Workload("mixed", 1, 16)
FAKE = textwrap.dedent('''
    import http.server, subprocess, sys
    port, mode, helper = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "helper"
    if helper:                                    # a process of its own, in the server's group
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print("fake server starting on", port, flush=True)
    if mode == "die":
        print("error: the model folder is broken", flush=True)
        sys.exit(3)
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if mode == "ok" else 503)
            self.end_headers()
            self.wfile.write(b'{"status": "ok"}')
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
''')


def fake(mode: str = "ok", helper: bool = False):
    """The fake server's command for a port."""
    return lambda port: [sys.executable, "-c", FAKE, str(port), mode, "helper" if helper else "alone"]


SERVER_MARKS = ("fake server", "http.server", "transformers serve", "time.sleep(300)")


def servers_left() -> list[psutil.Process]:
    """Server processes this test process started (any depth): transformers serve and the fake one."""
    return children_running(lambda line: any(mark in " ".join(line) for mark in SERVER_MARKS))


@pytest.fixture(autouse=True)
def no_server_left():
    yield
    assert_none_left(servers_left, "a server process")


def group_of(running) -> list[psutil.Process]:
    """The server and the processes it started."""
    server = psutil.Process(running.pid)
    return [server, *server.children(recursive=True)]


def gone(processes: list[psutil.Process]) -> bool:
    return all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in processes)


# --- the lifecycle every server engine shares -----------------------------------------------------

def test_a_healthy_server_is_stopped_with_its_whole_group():
    with serve_process("fake", fake(helper=True), threads=1) as running:
        assert running.url.startswith("http://127.0.0.1:") and running.started_s > 0
        assert server_process.http_get(f"{running.url}/health")[0] == 200
        deadline = time.monotonic() + 10
        while len(group_of(running)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        processes = group_of(running)
        assert len(processes) == 2                     # the server and its helper
    assert gone(processes)


def test_a_server_that_never_becomes_healthy_is_one_line_with_its_log_tail():
    with pytest.raises(ServerError, match="fake exited with code 3 before it was healthy") as died:
        with serve_process("fake", fake("die"), threads=1):
            pass
    assert "error: the model folder is broken" in str(died.value) and "\n" not in str(died.value)
    with pytest.raises(ServerError, match=r"fake was not healthy within 1 s: .*fake server starting") as slow:
        with serve_process("fake", fake("unhealthy"), threads=1, health_timeout_s=1):
            pass
    assert "\n" not in str(slow.value)


def test_a_port_taken_is_refused_and_ctrl_c_stops_the_server():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match=f"port {port} on 127.0.0.1 is taken: fake cannot bind it"):
            with serve_process("fake", fake(), threads=1, port=port):
                pass
    with pytest.raises(KeyboardInterrupt):
        with serve_process("fake", fake(helper=True), threads=1) as running:
            time.sleep(0.5)
            processes = group_of(running)
            raise KeyboardInterrupt
    assert gone(processes)


def test_a_server_dies_with_the_process_that_started_it():
    """SIGKILL to the process holding the server (no ``finally`` runs there): the server is told to stop
    by the kernel (its parent-death signal)."""
    holder = textwrap.dedent(f'''
        import sys, time
        from trials.engines.server_process import serve_process
        FAKE = {FAKE!r}
        with serve_process("fake", lambda port: [sys.executable, "-c", FAKE, str(port), "ok", "alone"], 1) as running:
            print(running.pid, flush=True)
            time.sleep(300)
    ''')
    starter = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        server = psutil.Process(int(starter.stdout.readline()))
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(10)
        server.wait(10)
        assert not server.is_running()
    finally:
        starter.kill()
        starter.wait()
        starter.stdout.close()


# --- transformers serve -----------------------------------------------------------------------------

def config(batch_size: int = 2, load: Load = LOAD) -> TrialConfig:
    return TrialConfig("serving", MODEL, Stack(engine=NAME, precision="fp32", batch_size=batch_size), WORKLOAD,
                       repeats=1, load=load)


@pytest.fixture(scope="module")
def served_trial(tiny_zoo):
    """One serving trial of the tiny zoo model behind transformers serve (2 sequences in flight), run by
    the serving runner as a sweep runs it."""
    from trials.run import run_trial

    began = time.perf_counter()
    result = run_trial(config(), Runtime(num_threads=1, price_per_hour_usd=0.5))
    assert result.status == "FINISHED", result.error
    logging.getLogger(__name__).info("served trial: %.1f s", time.perf_counter() - began)
    return result


def test_a_zoo_model_is_served_and_measured_as_every_server_is(served_trial):
    """The same metrics as llama-server's trials (each point's percentiles and goodput, the saturation
    point, the sustainable rate, parity, cost), every request exactly 16 tokens, the server's greedy
    text equal to the in-process transformers engine's, and the command line a user runs."""
    m, tags = served_trial.metrics, served_trial.tags
    for prefix in ("c1_", "c4_", "r1_", "r2_"):
        assert m[f"{prefix}requests"] == LOAD.requests and m[f"{prefix}errors"] == 0
        assert m[f"{prefix}ttft_s_p50"] <= m[f"{prefix}ttft_s_p95"] <= m[f"{prefix}e2e_s_p95"]
        assert m[f"{prefix}goodput_rps"] >= 0 and m[f"{prefix}achieved_rps"] > 0
    assert m["r1_rate_multiple"] == 0.5 and m["r2_rate_multiple"] == 2.0
    assert m["c1_achieved_rps"] == pytest.approx(m["single_stream_rps"])
    for name in ("saturation_rps", "sustainable_rps", "goodput_rps_max", "ttft_s_p50_lowest_rate",
                 "usd_per_million_output_tokens", "peak_memory_bytes", "weights_bytes", "kv_cache_allocated_bytes",
                 "server_start_s", "parallel_slots", "context_per_slot", "n_ctx"):
        assert m[name] >= 0, name
    assert m["parity_token_match"] == 1.0 and m["parity_prompts_identical"] == 1.0
    # the same weights one request at a time in-process, beside the served single stream
    assert m["in_process_ttft_s_p50"] > 0 and m["ttft_served_vs_in_process"] == m["c1_ttft_s_p50"] / m["in_process_ttft_s_p50"]
    assert m["parallel_slots"] == 2 and m["n_ctx"] == 2 * m["context_per_slot"]
    points = served_trial.raw["points"]
    assert [p["point"] for p in points] == ["c1", "c4", "r1", "r2"]
    assert all(r["output_tokens"] == WORKLOAD.max_new_tokens and r["finish_reason"] == "length"
               for p in points for r in p["requests"])
    command = tags["server_command"]
    assert command.startswith(f"OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 transformers serve '<{MODEL}>' --host 127.0.0.1")
    assert "--continuous-batching" in command and "--cb-num-blocks 2" in command and "--dtype float32" in command
    assert "--no-trust-remote-code" in command and tags["transformers_serve_version"].startswith("transformers serve of")
    assert tags["engine"] == NAME


def generating_at_once(requests: list[dict]) -> int:
    """The most requests streaming tokens at one time (first token to last token, client clock)."""
    events = sorted([(r["first_token_s"], 1) for r in requests] + [(r["token_s"][-1], -1) for r in requests],
                    key=lambda event: (event[0], event[1]))
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_batch_size_is_the_most_sequences_in_flight(served_trial):
    """The paged cache holds ``batch_size`` sequences: with 4 requests always waiting, 2 stream at once,
    never more (the scheduler admits a request only when a sequence's block is free)."""
    [c4] = [p for p in served_trial.raw["points"] if p["point"] == "c4"]
    assert generating_at_once(c4["requests"]) == 2


def test_a_folder_that_is_not_a_model_fails_with_the_servers_own_words(tiny_zoo, tmp_path):
    from trials.engines.transformers_serve import backend

    served = backend.load(config())
    for tokenizer_file in pathlib.Path(served.model).glob("tokenizer*"):
        shutil.copy(tokenizer_file, tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ServerError, match="transformers serve exited with code") as caught:
        with backend.serve(config(), replace(served, model=str(tmp_path)), threads=1):
            pass
    assert "\n" not in str(caught.value) and "no-such-architecture" in str(caught.value)


def test_each_request_is_the_in_process_engines_ids_and_greedy_config(tiny_zoo):
    """The text each request sends tokenizes (as the server does) to the in-process engine's ids; the
    generation config is greedy with end-of-sequence suppressed; the parity count reads text."""
    from trials.engines.transformers_serve import backend

    served = backend.load(config())
    tokenizer = served.loaded.tokenizer
    for prompt in served.prompts:
        assert tokenizer(served.request_prompts[prompt.id])["input_ids"] == tokenizer(prompt.text)["input_ids"]
    generation = json.loads(backend.request_body(served)["generation_config"])
    assert generation["do_sample"] is False and generation["suppress_tokens"] == backend.eos_ids(served.loaded)
    ids = tokenizer("def add(a, b):\n    return a + b\n", add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert backend.agreed_tokens(tokenizer, ids, text) == len(ids)
    assert backend.agreed_tokens(tokenizer, ids, tokenizer.decode(ids[:5]) + "\u2603") == 5
    assert backend.agreed_tokens(tokenizer, ids, "") == 0


@pytest.mark.parametrize("stack, reason", [
    (dict(precision="nf4"), "unknown precision 'nf4' for the transformers_serve engine; valid: fp32, bf16"),
    (dict(precision="fp32", kv_bits=4, kv_backend="hqq"), "keeps no 'hqq' KV cache; its quantized caches: none"),
    (dict(precision="fp32", speculation="prompt_lookup", num_draft_tokens=4), "speculates with nothing"),
    (dict(precision="fp32", compile=True), "compiled decoding is not served"),
    (dict(precision="fp32", batch_size=65), "at most 64 sequences in flight"),
])
def test_what_transformers_serve_cannot_run_is_refused_with_the_reason(stack, reason):
    with pytest.raises(ConfigError, match=reason):
        TrialConfig("serving", MODEL, Stack(engine=NAME, **stack), WORKLOAD, load=LOAD)


def test_the_full_profile_and_a_sweep_file_serve_it_and_the_quick_profile_does_not(monkeypatch, caplog):
    """The main job's quick profile stays llama-server only; the full profile and a sweep file's
    ``servers:`` add transformers serve; without its web stack it is left out in one line."""
    import importlib.util

    from sweeps.spaces import PROFILES
    from trials import groups

    serving = groups.get("serving")
    engines_of = lambda planned: {c.stack.engine for c in planned}                     # noqa: E731
    assert NAME not in engines_of(serving.plan(["smollm2-135m-instruct", "gemma-3-270m"], PROFILES["quick"], "cpu"))
    assert NAME in engines_of(serving.plan([MODEL], PROFILES["full"], "cpu"))
    mine = PROFILES["quick"].overridden({"serving": {"servers": [NAME], "real_models_only": False}}, "a test's")
    planned = serving.plan([MODEL], mine, "cpu")
    assert engines_of(planned) == {NAME} and sorted(c.stack.batch_size for c in planned) == [1, 4]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openai" else real(name, *a))
    with caplog.at_level(logging.INFO):
        assert serving.plan([MODEL], mine, "cpu") == []
    assert f"the {NAME} engine is left out: missing openai (install: pip install -e '.[serving]')" in caplog.text
