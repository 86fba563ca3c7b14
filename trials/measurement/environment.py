"""Where a number came from: device, CPU (and whether its 16-bit matmuls are native), library
versions, project git sha, host.

Captured on every run as tags, so a throughput can always be traced to the machine and code that
produced it. Versions are read from package metadata, so this module imports neither ray nor mlflow.
"""

from __future__ import annotations

import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from trials.measurement.hardware import cpu_profile, hardware_tags

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def device_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return cpu_profile().model


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_sha(root: Path = PROJECT_ROOT) -> str:
    """HEAD of the project checkout, with ``-dirty`` when tracked files have uncommitted changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment_tags(device: str, sha: str | None = None) -> dict[str, str]:
    return {
        "env.device": device,
        "env.device_name": device_name(device),
        "env.host": socket.gethostname(),
        "env.python": platform.python_version(),
        "env.torch": torch.__version__,
        "env.transformers": _version("transformers"),
        "env.ray": _version("ray"),
        "env.mlflow": _version("mlflow"),
        "env.git_sha": sha or git_sha(),
        **hardware_tags(device),
    }
