"""Bad input, a catalogue: each kind gives one clear line (exit code 2), no traceback, and leaves the
store byte-for-byte unchanged.

Every command is called in-process through its own ``main(argv)`` (the function its script runs), so
the catalogue is fast; ``python sweeps/full.py`` as a subprocess is covered by test_sweep. A store
with one logged run is hashed before and after each case. argparse's own errors (a wrong type, a
choice that does not exist) are its usage line plus one error line, and exit 2 likewise.
"""

from __future__ import annotations

import hashlib
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


# Kinds that need the built zoo (a model's own config on disk): run with the ``tiny_zoo`` fixture.
NEEDS_ZOO = {"trial: context longer than the model's positions", "trial: generation longer than the model's positions",
             "sweep file: new tokens beyond the model's positions"}


@pytest.mark.parametrize("kind, make, needle", [c for c in CASES if c[0] not in NEEDS_ZOO],
                         ids=[c[0] for c in CASES if c[0] not in NEEDS_ZOO])
def test_bad_input_is_one_line_and_changes_nothing(kind, make, needle, store, tmp_path, capsys):
    _one_line_and_nothing_changed(kind, make, needle, store, tmp_path, capsys)


@pytest.mark.parametrize("kind, make, needle", [c for c in CASES if c[0] in NEEDS_ZOO],
                         ids=[c[0] for c in CASES if c[0] in NEEDS_ZOO])
def test_bad_input_about_a_built_model_is_one_line(kind, make, needle, store, tiny_zoo, tmp_path, capsys):
    _one_line_and_nothing_changed(kind, make, needle, store, tmp_path, capsys)


def _one_line_and_nothing_changed(kind, make, needle, store, tmp_path, capsys) -> None:
    before = _digest(store)
    main, argv = make(store, tmp_path)
    try:
        code = main(argv)
    except SystemExit as exit_:              # argparse: usage line + one error line
        code = exit_.code
    captured = capsys.readouterr()
    err = captured.err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    lines = [line for line in lines if "INFO" not in line and "WARNING" not in line]
    assert code == 2, (kind, code, err)
    assert "Traceback" not in err, (kind, err)
    assert len(lines) == 1, (kind, err)
    assert needle in lines[0], (kind, lines[0])
    assert SECRET not in err + captured.out, f"{kind}: a secret was printed back"
    assert _digest(store) == before, f"{kind}: the store changed"


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
