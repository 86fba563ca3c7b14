"""Shared pytest fixtures."""

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests


@pytest.fixture(scope="session")
def tiny_zoo():
    """The tiny model zoo (tiny-mha, tiny-gqa, tiny-draft), built once and cached on disk.

    Builds into ``trials.zoo.zoo_dir()`` (``$LLM_SWEEPS_ZOO_DIR`` or the default cache), so repeated
    runs reuse it; returns that folder. Load models with ``trials.zoo.model_path(name)``.
    """
    from trials import zoo

    zoo.build("tiny")
    return zoo.zoo_dir()


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifacts: Path):
    """A real `mlflow server` on a free loopback port; yields its URL, stops it afterwards."""
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
