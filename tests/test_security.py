"""Security checks, each fast and offline: servers bind loopback unless told otherwise (and say so),
no model runs hub code unless its registry entry asks, nothing read from a store is evaluated or
unpickled, and no secret from the environment reaches a run's tags, params or artifact."""

import ast
import json
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT_DIRS = ("dashboard", "tracking", "sweeps", "trials", "benchmarks")
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def project_files() -> list[Path]:
    return sorted(p for d in PROJECT_DIRS for p in (ROOT / d).rglob("*.py"))


# --- servers bind 127.0.0.1 -------------------------------------------------------------------------

def test_dashboard_warns_when_it_binds_beyond_loopback():
    from dashboard.app import bind_warning

    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert bind_warning(host) is None, host
    for host in ("0.0.0.0", "::", "10.0.0.5", "my-laptop.local"):
        warning = bind_warning(host)
        assert warning and "\n" not in warning and "other machines" in warning, host
        assert host in warning


def test_dashboard_main_binds_loopback_by_default_and_prints_the_warning(tmp_path, capsys):
    """Through main's own argument parsing; an unreachable store stops it before any server starts."""
    from dashboard.app import main

    missing = f"sqlite:///{tmp_path}/missing/mlflow.db"
    assert main(["--tracking-uri", missing]) == 2
    assert "warning" not in capsys.readouterr().err, "the default host must be loopback"
    assert main(["--host", "0.0.0.0", "--tracking-uri", missing]) == 2
    first_line = capsys.readouterr().err.splitlines()[0]
    assert first_line.startswith("warning: --host 0.0.0.0") and "other machines" in first_line


def _hosts_in(text: str) -> list[str]:
    return re.findall(r"--(?:host|bind)[ =][\"']?([\w.:\[\]-]+?)(?::\d+)?(?=[\s\"'\\]|$)", text, flags=re.M)


def test_make_targets_and_scripts_bind_loopback():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\nmlflow-ui:"):]
    assert "--host 127.0.0.1" in recipe.split("\n\n")[0], "make mlflow-ui must bind 127.0.0.1"
    for path in [ROOT / "Makefile", *sorted((ROOT / "benchmarks").glob("*.sh"))]:
        for host in _hosts_in(path.read_text()):
            assert host in LOOPBACK, f"{path.name}: binds {host}"
    assert "dashboard/app.py $(ARGS)" in makefile, "make dashboard relies on app.py's loopback default"


def test_the_commands_the_sweep_prints_bind_loopback(capsys):
    from sweeps.summary import print_summary

    print_summary([], [], Counter(), "sqlite:////tmp/mlflow.db", 1.0, 0.0)
    out = capsys.readouterr().out
    assert "--host 127.0.0.1" in out and "http://127.0.0.1:8050" in out
    assert "0.0.0.0" not in out


def test_local_ray_starts_without_its_dashboard():
    """Ray's own dashboard would be one more server; the local sweep never starts it."""
    source = "\n".join(path.read_text() for path in (ROOT / "sweeps").glob("*.py"))
    local_inits = [line for line in source.splitlines() if "ray.init(" in line and "address" not in line]
    assert local_inits and all("include_dashboard=False" in line for line in local_inits)


# --- trust_remote_code ------------------------------------------------------------------------------

def test_trust_remote_code_only_comes_from_the_registry_entry():
    """Every ``trust_remote_code=`` in the project passes a registry entry's field (or False), or, where
    a sweep file declares a model, the file's own required ``trust_remote_code`` key."""
    assert not [p for p in project_files() if "trust_remote_code=True" in p.read_text()]
    passed = 0
    for path in project_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "trust_remote_code":
                value = node.value
                from_entry = isinstance(value, ast.Attribute) and value.attr == "trust_remote_code"
                is_false = isinstance(value, ast.Constant) and value.value is False
                from_file = (path.name == "sweepfile.py" and isinstance(value, ast.Subscript)
                             and isinstance(value.slice, ast.Constant) and value.slice.value == "trust_remote_code")
                assert from_entry or is_false or from_file, f"{path.relative_to(ROOT)}:{node.value.lineno}"
                passed += 1
    assert passed >= 3, "model and tokenizer loading pass it explicitly (trials/models/loading.py, quantized_weights.py)"


def test_registry_entries_never_trust_remote_code(tmp_path):
    from trials.models.registry import ModelEntry, all_models, get_model

    assert ModelEntry("x", "hub", "org/x", "target").trust_remote_code is False
    assert not [name for name, entry in all_models().items() if entry.trust_remote_code]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert get_model(str(tmp_path)).trust_remote_code is False, "a local folder is not trusted either"


def test_a_sweep_file_trusts_remote_code_only_where_it_says_so(tmp_path):
    from sweeps.sweepfile import load_sweep
    from trials.errors import ConfigError
    from trials.models.registry import get_model

    path = tmp_path / "mine.yaml"
    path.write_text("models:\n  - {name: trusted-x, hub: org/x, draft: none, trust_remote_code: true}\n"
                    "  - {name: untrusted-y, hub: org/y, draft: none, trust_remote_code: false}\n")
    declared = load_sweep(path).entries
    assert get_model("trusted-x", declared).trust_remote_code is True
    assert get_model("untrusted-y", declared).trust_remote_code is False
    with pytest.raises(ConfigError, match="unknown model 'trusted-x'"):
        get_model("trusted-x")           # a file's models live in its sweep, not in the process
    path.write_text("models:\n  - {name: unstated-z, hub: org/z, draft: none}\n")
    with pytest.raises(ConfigError, match="missing key 'trust_remote_code'"):
        load_sweep(path)


# --- nothing evaluated or unpickled -----------------------------------------------------------------

PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal", "joblib"}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader"}
# (file relative to the repo, finding) -> why it is safe. Empty: nothing needed one so far.
ALLOWED: dict[tuple[str, str], str] = {}


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _dotted(node) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def unsafe_calls(source: str) -> list[str]:
    """What in ``source`` would run code that data brings: eval/exec, unpickling, torch.load without
    weights_only=True, yaml.load without a safe loader, numpy's allow_pickle."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"import {m}" for m in modules if m.split(".")[0] in PICKLE_MODULES]
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name in ("eval", "exec"):
            found.append(f"{name}()")
        elif name.split(".")[0] in PICKLE_MODULES or name.endswith("read_pickle"):
            found.append(f"{name}()")
        elif name == "torch.load":
            weights_only = _keyword(node, "weights_only")
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                found.append("torch.load() without weights_only=True")
        elif name in ("yaml.load", "yaml.load_all"):
            loader = _keyword(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
            if loader is None or _dotted(loader).split(".")[-1] not in SAFE_YAML_LOADERS:
                found.append(f"{name}() without a safe loader")
        elif name in ("yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all", "yaml.full_load_all"):
            found.append(f"{name}()")
        elif name.split(".")[-1] == "load" and name.split(".")[0] in ("np", "numpy"):
            allow = _keyword(node, "allow_pickle")
            if isinstance(allow, ast.Constant) and allow.value is True:
                found.append(f"{name}(allow_pickle=True)")
    return found


def test_the_scanner_finds_what_it_looks_for():
    bad = ("import pickle\npickle.loads(b)\neval(s)\nexec(s)\ntorch.load(p)\nyaml.load(f)\n"
           "yaml.load(f, Loader=yaml.Loader)\npd.read_pickle(p)\nnp.load(p, allow_pickle=True)\n")
    assert len(unsafe_calls(bad)) == 9, unsafe_calls(bad)
    good = ("model.eval()\ntorch.load(p, weights_only=True)\nyaml.load(f, Loader=yaml.SafeLoader)\n"
            "yaml.safe_load(f)\njson.loads(s)\nnp.load(p)\nast.literal_eval(s)\n")
    assert unsafe_calls(good) == []


def test_nothing_from_the_store_is_evaluated_or_unpickled():
    findings = {(str(p.relative_to(ROOT)), f) for p in project_files() for f in unsafe_calls(p.read_text())}
    assert not findings - ALLOWED.keys(), sorted(findings - ALLOWED.keys())


# --- no secrets in runs -----------------------------------------------------------------------------

SECRETS = {"HF_TOKEN": "hf_secret_test_value", "MLFLOW_TRACKING_PASSWORD": "mlflow-password-test-value",
           "MLFLOW_TRACKING_TOKEN": "mlflow-token-test-value", "AWS_SECRET_ACCESS_KEY": "aws-secret-test-value"}
SECRET_TAG_NAME = re.compile(r"token|password|passwd|secret|api_?key|credential", re.I)


@pytest.fixture
def secret_env(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


def _assert_no_secret(tags: dict, params: dict, artifact: str) -> None:
    """No value holds a secret, and no tag is named like one (params may count tokens: max_new_tokens)."""
    assert not [name for name in tags if SECRET_TAG_NAME.search(name)]
    for name, value in [*tags.items(), *params.items()]:
        assert not any(s in str(value) for s in SECRETS.values()), f"{name!r} holds a secret"
    assert not any(s in artifact for s in SECRETS.values()), "trial.json holds a secret"


def test_environment_tags_hold_no_secret(secret_env):
    from trials.measurement.environment import environment_tags

    for device in ("cpu", "cuda"):
        _assert_no_secret(environment_tags(device), {}, "")


def test_a_logged_trial_holds_no_secret(secret_env):
    """What ``tracking.log_trial`` writes is the config's params, the result's tags and error, and
    ``result.to_dict()`` as trial.json; a trial that failed (tags built as a real trial builds them,
    from the environment) is checked here without an MLflow store (a fresh one takes ~7 s)."""
    from trials.config import Stack, TrialConfig, Workload
    from trials.loop import failed_result

    config = TrialConfig(group="baseline", model="qwen2.5-1.5b-instruct", device="cuda",
                         stack=Stack(precision="bf16"), workload=Workload("mixed", 1, 8), repeats=1)
    result = failed_result(config, RuntimeError("401 Client Error: gated repo"))
    assert result.tags["env.device"] == "cuda" and "env.git_sha" in result.tags
    _assert_no_secret(result.tags | {"error": result.error}, config.flat_params(),
                      json.dumps(result.to_dict()))


# --- secrets in every part of a URI, and values echoed back short ------------------------------------

HIDDEN = [
    ("http://alice:pw-1@host:5000/", "http://alice:***@host:5000/"),
    ("https://tok-2@host/", "https://***@host/"),                                  # a token alone
    ("https://alice:p@ss-3@host/x@y", "https://alice:***@host/x@y"),               # an '@' in the password
    ("http://host/?token=tok-4&x=1", "http://host/?token=***&x=1"),
    ("http://host/p?X-Amz-Credential=AKIA-5&X-Amz-Signature=sig-6",
     "http://host/p?X-Amz-Credential=***&X-Amz-Signature=***"),
    ("http://host/?API-Key=key-7;session_id=s-8", "http://host/?API-Key=***;session_id=***"),
    ("http://host/#access_token=tok-9", "http://host/#access_token=***"),
    ("s3://AKIA:secret-10@bucket/path", "s3://AKIA:***@bucket/path"),
]


@pytest.mark.parametrize("uri, shown", HIDDEN, ids=[h[1] for h in HIDDEN])
def test_secrets_in_every_part_of_a_uri_are_hidden(uri, shown):
    from trials.redaction import one_line, redact

    assert redact(uri) == shown
    assert redact(f"tracking store {uri} is unreachable") == f"tracking store {shown} is unreachable"
    assert one_line(RuntimeError(f"cannot reach {uri}")) == f"cannot reach {shown}"


def test_what_is_not_a_secret_is_left_as_it_is():
    from trials.redaction import redact

    for text in ("sqlite:////tmp/a@b/mlflow.db", "http://127.0.0.1:5000", "max_new_tokens=8", "tiny-gqa fp32"):
        assert redact(text) == text


def test_an_echoed_value_is_short_and_never_expanded():
    """A 10 MB value, a YAML alias expansion (9**9 strings) and a value nested thousands deep are
    echoed back within a line with no secret (redacted before they are cut); the expansion's whole
    repr would be gigabytes, so this test only ends when it is never built."""
    from trials.redaction import MAX_LINE, MAX_VALUE, one_line, shown

    expansion = ["x"] * 9
    for _ in range(8):
        expansion = [expansion] * 9
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    for value in ("x" * 10_000_000, expansion, deep):
        assert len(shown(value)) <= MAX_VALUE + 1
    line = one_line(f"unknown model {'x' * 10_000_000!r}\nsecond line http://u:{'s' * 500}@host/ " + "y " * 5000)
    assert "\n" not in line and len(line) <= MAX_LINE + 1 and "s" * 20 not in line and "u:***@host" in line
