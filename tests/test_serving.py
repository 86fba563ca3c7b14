"""Serving under load: a real llama-server on SmolLM2's shipped Q4_1, driven by the real load generator.

One module-scoped store holds two served stacks (1 and 2 parallel slots, the second with a q8_0
cache), each measured point by point, logged to a real MLflow store; the section, the report and
``llm-recommend`` read it back. The server's lifecycle is checked against real failures: a file that
is not a GGUF, a health check that times out, a port already taken, Ctrl-C inside the block, and the
server killed mid-load. After every test no llama-server process is left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import psutil
import pytest
import requests

import tracking
from conftest import assert_none_left, children_running
from trials.config import Load, Runtime, Stack, TrialConfig, Workload
from trials.run import run_trial
from trials.stats.serving import Slo

SMOL = "smollm2-135m-instruct"
LOAD = Load(rates=(0.5, 2.0), concurrency=(1, 2), requests=6, warmup=1, ttft_slo_s=2.0, tpot_slo_s=0.25)
WORKLOAD = Workload("mixed", 1, 16)
STACKS = {"p1": Stack(engine="llama_server", precision="q4_1", batch_size=1),
          # a q8_0 cache and a draft model (-md): the shipped file drafts for itself, so nearly every
          # proposal is accepted (the suite checks the path; the profiles draft with a lower-bit file)
          "p2-kv8-draft": Stack(engine="llama_server", precision="q4_1", batch_size=2, kv_bits=8, kv_backend="ggml",
                                speculation="draft", draft_model=SMOL, draft_precision="q4_1", num_draft_tokens=3)}


def servers_left() -> list[psutil.Process]:
    """llama-server processes started by this test process (any depth)."""
    return children_running(lambda line: "llama-server" in " ".join(line[:1]))


@pytest.fixture(autouse=True)
def no_server_left():
    yield
    assert_none_left(servers_left, "a llama-server process")


def config(name: str, load: Load = LOAD) -> TrialConfig:
    return TrialConfig("serving", SMOL, STACKS[name], WORKLOAD, repeats=1, load=load)


def build_serving_store(folder) -> tuple[str, dict]:
    """Each stack above served and measured (one server thread: the suite checks the path, not the
    numbers), logged to a fresh store: (uri, results by stack name)."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    tracking.prepare_store(uri)
    results = {}
    for name in STACKS:
        result = run_trial(config(name), Runtime(num_threads=1, price_per_hour_usd=0.5))
        assert result.status == "FINISHED", (name, result.error)
        tracking.log_trial(uri, result)
        results[name] = result
    return uri, results


def test_a_served_stack_is_measured_point_by_point(serving_store):
    """Each point of the ladder is logged with its percentiles and intervals; the rate ladder is sized
    from the stack's own single-stream rate; every request of every point is in the artifact; the
    server's tokens equal the in-process engine's on the same GGUF; the command line is the one run."""
    _, results = serving_store
    for name, result in results.items():
        m, slots = result.metrics, result.config.stack.batch_size
        for prefix in ("c1_", "c2_", "r1_", "r2_"):
            assert m[f"{prefix}requests"] == LOAD.requests and m[f"{prefix}errors"] == 0
            assert m[f"{prefix}ttft_s_p50"] <= m[f"{prefix}ttft_s_p95"] <= m[f"{prefix}e2e_s_p95"]
            assert m[f"{prefix}ttft_s_p95_exact"] == 0        # 6 requests: the largest value, said so
        assert m["r1_rate_multiple"] == 0.5 and m["r2_rate_multiple"] == 2.0
        assert m["c1_achieved_rps"] == pytest.approx(m["single_stream_rps"])
        assert m["parity_token_match"] == 1.0 and m["parity_prompts_identical"] == 1.0
        # the same weights one request at a time in-process, beside the served single stream
        assert m["in_process_ttft_s_p50"] > 0 and m["ttft_served_vs_in_process"] == m["c1_ttft_s_p50"] / m["in_process_ttft_s_p50"]
        assert m["server_tokens_predicted_total"] >= 4 * LOAD.requests * WORKLOAD.max_new_tokens
        assert m["usd_per_million_output_tokens"] > 0
        # the bandwidth bound with every slot decoding, beside the most output tok/s served
        assert m["roofline_tok_per_s"] > 0 and m["roofline_ratio"] == m["output_tok_per_s_max"] / m["roofline_tok_per_s"]
        assert m["decode_bytes_per_step"] > m["weights_bytes"] and result.tags["bandwidth_source"]
        assert f"--parallel {slots}" in result.tags["server_command"]
        assert result.tags["server_command"].startswith("llama-server --model '<smollm2-135m-instruct>.q4_1.gguf'")
        points = result.raw["points"]
        assert [p["point"] for p in points] == ["c1", "c2", "r1", "r2"]
        assert all(len(p["requests"]) == LOAD.requests for p in points)
        assert all(r["output_tokens"] == WORKLOAD.max_new_tokens for p in points for r in p["requests"])
    drafted = results["p2-kv8-draft"]
    assert "--cache-type-k q8_0" in drafted.tags["server_command"]
    assert ("--spec-type draft-simple --spec-draft-model '<smollm2-135m-instruct>.q4_1.gguf' --spec-draft-n-max 3"
            in drafted.tags["server_command"])
    # its own weights propose: nearly all accepted, close to k + 1 tokens per verifying pass
    assert drafted.metrics["server_draft_acceptance"] > 0.9, drafted.metrics
    assert 2.5 < drafted.metrics["server_tokens_per_target_pass"] <= 4.0
    assert "server_draft_acceptance" not in results["p1"].metrics


def test_a_server_that_never_becomes_healthy_is_one_line_and_gone(real_models, tmp_path):
    from trials.engines.llama_server import backend

    served = backend.load(config("p1"))
    broken = tmp_path / "not-a-model.gguf"
    broken.write_text("this is not a GGUF file\n")
    with pytest.raises(backend.ServerError, match="exited with code") as caught:
        with backend.serve(config("p1"), _with_path(served, broken), threads=1):
            pass
    assert "\n" not in str(caught.value)
    with pytest.raises(backend.ServerError, match="not healthy within"):
        with backend.serve(config("p1"), served, threads=1, health_timeout_s=0.01):
            pass


def _with_path(served, path):
    from dataclasses import replace

    return replace(served, path=path)


def test_a_port_taken_is_refused_and_ctrl_c_stops_the_server(real_models):
    from trials.engines.llama_server import backend

    served = backend.load(config("p1"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(backend.ServerError, match=f"port {port} on 127.0.0.1 is taken"):
            with backend.serve(config("p1"), served, threads=1, port=port):
                pass
    with pytest.raises(KeyboardInterrupt):
        with backend.serve(config("p1"), served, threads=1) as running:
            pid = running.process.pid
            raise KeyboardInterrupt
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_server_killed_mid_load_fails_the_trial_with_what_was_measured(real_models):
    """SIGKILL to the server inside the first point: the run is FAILED, its reason is one line, and
    the requests it measured before the kill are kept in the artifact."""
    from trials.techniques.serving.runner import run_serving_trial

    killed = threading.Event()

    def predicted(process) -> float:
        """The server's own count of generated tokens (its /metrics), 0 until it answers."""
        port = process.cmdline()[process.cmdline().index("--port") + 1]
        try:
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except requests.RequestException:
            return 0.0
        return next((float(line.split()[1]) for line in text.splitlines()
                     if line.startswith("llamacpp:tokens_predicted_total")), 0.0)

    def kill_inside_the_first_point() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed.is_set():
            for process in servers_left():       # warm-up (1 request) and 2 of the first point's done
                if predicted(process) >= 3 * WORKLOAD.max_new_tokens:
                    os.kill(process.pid, signal.SIGKILL)
                    killed.set()
                    return
            time.sleep(0.1)

    slow = Load(rates=(0.5,), concurrency=(1,), requests=12, warmup=1)
    watcher = threading.Thread(target=kill_inside_the_first_point, daemon=True)
    watcher.start()
    result = run_serving_trial(config("p1", slow), Runtime(num_threads=1))
    watcher.join(timeout=5)
    assert killed.is_set()
    assert result.status == "FAILED" and "\n" not in result.error
    assert "requests failed" in result.error
    kept = result.raw["points"]
    assert kept and sum(1 for p in kept for r in p["requests"] if not r["error"]) >= 1


def test_the_section_the_report_and_the_decision_read_the_served_runs(serving_store, capsys):
    """The page the app builds draws the four serving charts; the report tables each stack; the
    decision names a served stack with its command line (quality limits off: this store holds no
    in-process scores of the GGUF, so with them nothing qualifies, and it says why)."""
    from dashboard import recommend
    from dashboard.app import open_store, render_section, section_frame
    from dashboard.sections import serving

    uri, results = serving_store
    runs = open_store(uri)
    page = str(render_section(serving, runs))
    for chart in (serving.TTFT_ID, serving.ITL_ID, serving.GOODPUT_ID, serving.SLOTS_ID):
        assert chart in page
    frame = section_frame(serving, runs)
    figures = dict(serving.figures(frame))
    names = {trace.name for trace in figures[serving.TTFT_ID].data}
    assert {"llama_server:q4_1", "llama_server:q4_1+kv8-ggml+draft(q4_1,k=3)+b2"} <= names
    assert "--parallel" in json.dumps(figures[serving.TTFT_ID].data[0].customdata[0])
    # each stack's bandwidth bound is drawn dashed beside what it served: with its slots full (the most
    # requests in flight) at the value its run logged, and lower where fewer sequences decode
    drawn = [t for t in figures[serving.SLOTS_ID].data if t.name.endswith(" roofline")]
    bounds = {t.name: t.y[list(t.x).index(max(t.x))] for t in drawn}
    assert all(list(t.y) == sorted(t.y) for t in drawn)
    predicted = {f"{r.config.stack.label} roofline": r.metrics["roofline_tok_per_s"] for r in results.values()
                 if r.metrics.get("roofline_tok_per_s")}
    assert predicted and bounds == pytest.approx(predicted)
    assert figures[serving.SLOTS_ID].layout.yaxis.type == "log"
    assert "Poisson" in serving.caption(frame)
    table = "\n".join(serving.report(frame))
    assert f"| {SMOL} | llama_server:q4_1 |" in table

    slo = ["--max-ttft", "60s", "--max-tpot", "5s"]         # generous: the pick is the stack that kept up best
    expected = _expected_pick(results, Slo(60.0, 5.0))
    assert recommend.main(["--tracking-uri", uri, *slo, "--no-quality-limit", "--details"]) == 0
    out = capsys.readouterr().out
    if expected is None:
        assert "none within the SLO" in out
    else:
        assert f"most requests/s within the SLO: {expected}" in out and "serve it: llama-server --model" in out
    assert recommend.main(["--tracking-uri", uri, *slo, "--no-quality-limit"]) == 0
    table = capsys.readouterr().out                  # by default the served pick is a line of the table
    served_line = next(line for line in table.splitlines() if line.strip().startswith("served"))
    assert (expected in served_line and "req/s)" in served_line) if expected else \
        any(word in served_line for word in ("closest", "none within"))
    # nothing within an SLO of 1 ms: the line is the closest stack, and why-not names the others only
    assert recommend.main(["--tracking-uri", uri, "--max-ttft", "1ms", "--max-tpot", "1ms", "--no-quality-limit"]) == 0
    table = capsys.readouterr().out
    closest = next(line for line in table.splitlines() if "served: closest" in line)
    why = next(line for line in table.splitlines() if "served (none within" in line)
    shown = max((name for name in names if name in closest), key=len)     # one label starts the other
    assert "the others: " in why and f" {shown}: " not in why, why
    assert all(f" {name}: " in why for name in names - {shown}), why
    assert recommend.main(["--tracking-uri", uri, *slo]) == 0
    assert "quality not measured" in capsys.readouterr().out      # no in-process scores of the GGUF here
    assert recommend.main(["--tracking-uri", uri, "--json", "--no-quality-limit", *slo]) == 0
    [decision] = json.loads(capsys.readouterr().out)
    pick = decision["served"]["pick"]
    assert (pick and pick["stack"]) == expected
    if pick:
        assert pick["server_command"].startswith("llama-server")


def _expected_pick(results: dict, slo) -> str | None:
    """The stack with the highest achieved rate among points that kept up within ``slo``, computed
    here from each trial's own point summaries (the decision reads them back from the store)."""
    from trials.stats.serving import sustainable

    best = {r.config.stack.label: sustainable([s["summary"] for s in r.raw["points"] if s["point"].startswith("r")], slo)
            for r in results.values()}
    best = {k: v for k, v in best.items() if v is not None}
    return max(best, key=lambda k: best[k]["achieved_rps"]) if best else None


def test_the_plan_serves_both_real_models_with_the_ladder_the_issue_asks():
    """The main job's profile: >= 3 stacks per real model incl. a KV-type stack, 2 slot counts,
    >= 4 offered rates, >= 32 new tokens; zoo models are left to the in-process groups."""
    from sweeps.spaces import PROFILES
    from trials import groups

    planned = groups.get("serving").plan(["zoo-gqa", SMOL, "gemma-3-270m"], PROFILES["quick"], "cpu")
    by_model = {}
    for c in planned:
        by_model.setdefault(c.model, []).append(c)
    assert set(by_model) == {SMOL, "gemma-3-270m"}
    for model, configs in by_model.items():
        assert len(configs) >= 3 and any(c.stack.kv_bits < 16 for c in configs)
        assert len({c.stack.batch_size for c in configs}) >= 2
        assert all(len(c.load.rates) >= 4 and c.workload.max_new_tokens >= 32 for c in configs)
    # the full profile adds a draft model on llama-server: each model's f16 base, drafted by its own q4_0
    full = groups.get("serving").plan([SMOL, "gemma-3-270m"], PROFILES["full"], "cpu")
    drafts = {(c.model, c.stack.precision, c.stack.draft_model, c.stack.draft_precision, c.stack.num_draft_tokens)
              for c in full if c.stack.speculation == "draft"}
    assert drafts == {(m, "f16", m, "q4_0", 3) for m in (SMOL, "gemma-3-270m")}
    # a served draft names its weights: one line, not a server that fails to start
    with pytest.raises(ValueError, match="llama-server drafts with a GGUF of the target's own vocabulary"):
        Stack(engine="llama_server", precision="f16", speculation="draft", draft_model=SMOL, num_draft_tokens=3).validate()
