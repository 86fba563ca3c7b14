"""Engines declared outside the project: a toy in-process engine and a toy server engine, each one folder
under tests/plugins/, named only by ``$LLM_SWEEPS_ENGINES``, run from plan to ``llm-recommend`` with no
line of the project changed."""

import os
import re
import subprocess
import sys

import psutil

from conftest import ROOT, assert_none_left, run_sweep

PLUGINS = ROOT / "tests" / "plugins"
ENGINES = "toy_engine.spec,toy_server.spec"
SWEEP = """models: [tiny-gqa]
groups: [engines, serving]
profile:
  base: quick
  prompts_per_type: 1
  max_new_tokens: 8
  repeats: 2
  engines: {engines: [toy], eval_windows: 2}
  serving: {servers: [toy_server], parallel: [1], caches: [full], rates: [0.2], concurrency: [1],
            requests_per_point: 8, warmup_requests: 1, real_models_only: false, max_new_tokens: 8}
# 0.2 x the single-stream rate: at 1 x a one-slot server is exactly saturated, and whether a handful of
# Poisson arrivals "keeps up" is a coin flip (it failed CI once); at 0.2 x it keeps up unless it is broken.
"""

READ_BACK = """
import json, sys
import tracking
from dashboard import app, export, recommend, report

uri, out = sys.argv[1], sys.argv[2]
engines = tracking.runs_frame(uri, "engines")
serving = tracking.runs_frame(uri, "serving")
print("ENGINES", json.dumps(engines[["stack", "lossless", "kl_divergence"]].to_dict("records")))
print("SERVING", json.dumps(serving[["stack", "parity_token_match", "single_stream_rps"]].to_dict("records")))
page = app.create_app(uri).server.test_client().get("/_dash-layout").get_data(as_text=True)
print("PAGE", "toy (a greedy loop over forward())" in page, "toy_server.server --model" in page)
assert export.main(["--tracking-uri", uri, "--out", out]) == 0
assert report.main(["--tracking-uri", uri]) == 0
sys.exit(recommend.main(["--tracking-uri", uri, "--no-quality-limit", "--max-ttft", "60s", "--max-tpot", "10s",
                         "--rate", "0.1", "--price-per-hour", "0.1"]))
"""


def _toy_servers() -> list:
    return [p for p in psutil.process_iter(["cmdline"])
            if "toy_server.server" in " ".join(p.info["cmdline"] or [])]


def test_a_toy_engine_and_a_toy_server_run_from_plan_through_ray_to_recommend(tiny_zoo, tmp_path):
    """The sweep plans the engines group on the toy engine and the serving group on the toy server,
    runs both on a Ray worker (the plug-in variable and PYTHONPATH reach it), logs them to a real
    store; the live page, the export, the report and llm-recommend read them back. The toy engine's
    fp32 greedy tokens equal the reference's; the toy server's equal the toy engine's (parity); no
    toy server is left running."""
    env = {**os.environ, "LLM_SWEEPS_ENGINES": ENGINES,
           "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    sweep_file = tmp_path / "toy.yaml"
    sweep_file.write_text(SWEEP)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = run_sweep("--sweep", str(sweep_file), "--workers", "1", "--budget", "none", "--tracking-uri", uri,
                     env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_none_left(_toy_servers, "a toy server")

    out = tmp_path / "report.html"
    read = subprocess.run([sys.executable, "-c", READ_BACK, uri, str(out)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)
    assert read.returncode == 0, read.stdout[-3000:] + read.stderr[-3000:]
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in read.stdout.splitlines()
             if line.split(" ", 1)[0] in ("ENGINES", "SERVING", "PAGE")}
    assert '"stack": "toy:fp32"' in lines["ENGINES"] and '"lossless": 1.0' in lines["ENGINES"], lines
    assert '"parity_token_match": 1.0' in lines["SERVING"], lines
    assert lines["PAGE"] == "True True", "the live page draws both engines' runs"
    page = out.read_text()
    assert "a greedy loop over forward()" in page and "toy_server:fp32" in page      # both runs drawn
    assert "| tiny-gqa | toy | toy:fp32 |" in read.stdout              # the report's engines table
    assert "| tiny-gqa | toy_server:fp32 |" in read.stdout             # its serving table
    assert re.search(r"served \([\d.]+ req/s\)\s+toy_server:fp32\s+toy_server\s", read.stdout), read.stdout[-2000:]
