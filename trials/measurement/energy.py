"""Energy the timed passes used, only where a hardware counter measures it; never an estimate.

* CPU: Intel RAPL's package counters (``/sys/class/powercap/intel-rapl:N/energy_uj``, microjoules,
  wrapping at ``max_energy_range_uj``), summed over packages. A package counter counts everything
  running on that package during the passes, not this trial alone: ``energy_method`` says so, and
  what else ran (other trials) counts too.
* CUDA: NVML's total-energy counter of the trial's GPU (``nvmlDeviceGetTotalEnergyConsumption``,
  millijoules, Volta and newer) through ``pynvml`` where it is installed.

Elsewhere (no readable counter: most VMs and containers, this project's CI machines) nothing is
logged but the tag ``energy_method`` saying why, so a chart cannot show a number nobody measured.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

POWERCAP = Path("/sys/class/powercap")


@dataclass
class Energy:
    joules: float | None = None     # None: not measured (``method`` says why)
    method: str = ""


def rapl_packages(root: Path = POWERCAP) -> list[Path]:
    """The package-level RAPL domains whose counter this process may read (``intel-rapl:N``; the
    sub-domains ``intel-rapl:N:M`` are parts of a package and would count twice)."""
    found = []
    for domain in sorted(root.glob("intel-rapl:*")):
        if domain.name.count(":") == 1 and _read_uj(domain / "energy_uj") is not None:
            found.append(domain)
    return found


def _read_uj(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _rapl_joules(domains: list[Path], before: list[int]) -> float:
    total = 0
    for domain, start in zip(domains, before):
        end = _read_uj(domain / "energy_uj") or 0
        if end < start:                       # the counter wrapped
            end += (_read_uj(domain / "max_energy_range_uj") or 0) + 1
        total += end - start
    return total / 1e6


def _nvml_handle():
    import pynvml
    import torch

    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


@contextmanager
def measure_energy(device: str, root: Path = POWERCAP) -> Iterator[Energy]:
    """Joules the body used, by the counter this device has (see the module docstring)."""
    energy = Energy()
    if device == "cuda":
        try:
            nvml, handle = _nvml_handle()
            start = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except Exception as exc:  # no pynvml, or a GPU without the counter
            energy.method = f"not measured: NVML energy counter unavailable ({type(exc).__name__})"
            yield energy
            return
        yield energy
        import torch

        torch.cuda.synchronize()
        energy.joules = (nvml.nvmlDeviceGetTotalEnergyConsumption(handle) - start) / 1e3
        energy.method = "nvml total energy of the GPU (whole device)"
        return
    domains = rapl_packages(root)
    if not domains:
        energy.method = f"not measured: no readable RAPL counter under {root}"
        yield energy
        return
    before = [_read_uj(d / "energy_uj") or 0 for d in domains]
    yield energy
    energy.joules = _rapl_joules(domains, before)
    energy.method = f"rapl package counters ({len(domains)} package(s), whole package: every process on it)"
