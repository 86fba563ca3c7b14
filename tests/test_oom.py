"""Out of memory is a FAILED run whose reason starts with ``oom``, in every chart group: a real
allocator failure (the CPU allocator's, untyped by torch; CUDA's ``torch.OutOfMemoryError``), and a
measured peak over ``--memory-budget`` (a smaller device, emulated on this CPU). The batching group's
predicted-peak refusal and ladder end are in tests/test_batching.py."""

from __future__ import annotations

import pytest
import torch

from trials import groups
from trials.config import Load, Runtime, Stack, TrialConfig, Workload
from trials.loop import failed_result, is_out_of_memory
from trials.run import run_trial
from trials.techniques.spec import Technique

TINY = Workload("mixed", 1, 8)


def _allocation_failure() -> RuntimeError:
    """A real one: the CPU allocator asked for a petabyte."""
    try:
        torch.empty(2 ** 50, dtype=torch.uint8)
    except RuntimeError as exc:
        return exc
    raise AssertionError("this machine allocated a petabyte")


def test_out_of_memory_errors_are_named_oom():
    config = TrialConfig(group="baseline", model="tiny-gqa", workload=TINY, repeats=1)
    cpu = _allocation_failure()
    assert is_out_of_memory(cpu)
    assert failed_result(config, cpu).error.startswith("oom: RuntimeError: [enforce fail")
    # CUDA's own error type, constructed here (no GPU on this machine): what a full device raises
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    assert failed_result(config, cuda).error == "oom: OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"
    assert failed_result(config, MemoryError()).error.startswith("oom: MemoryError")
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert failed_result(config, RuntimeError("shape mismatch")).error == "RuntimeError: shape mismatch"


def test_a_trial_that_runs_out_of_memory_is_a_failed_run_not_an_exception(tiny_zoo, monkeypatch):
    """The group's runner is replaced by one that asks the allocator for a petabyte (a real allocation
    failure inside run_trial); any other exception still propagates."""
    def greedy(self, config, runtime):
        torch.empty(2 ** 50, dtype=torch.uint8)

    monkeypatch.setattr(Technique, "run", greedy)
    result = run_trial(TrialConfig(group="baseline", model="tiny-gqa", workload=TINY, repeats=1))
    assert result.status == "FAILED" and result.error.startswith("oom: RuntimeError")
    monkeypatch.setattr(Technique, "run", lambda self, config, runtime: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_trial(TrialConfig(group="baseline", model="tiny-gqa", workload=TINY, repeats=1))


# One small trial per group (batching refuses by its prediction before it runs).
PER_GROUP = {
    "baseline": dict(stack=Stack(precision="fp32")),
    "quantization": dict(stack=Stack(precision="int8"), workload=Workload("mixed", 1, 8, eval_windows=2)),
    "kv_cache": dict(stack=Stack(precision="fp32", kv_bits=4, kv_backend="quanto", kv_group_size=16),
                     workload=Workload("prose", 1, 8, context_tokens=64)),
    "speculative": dict(stack=Stack(precision="fp32", speculation="prompt_lookup", num_draft_tokens=2)),
    "stacks": dict(stack=Stack(precision="fp32")),
    "batching": dict(stack=Stack(precision="fp32", batch_size=2)),
    "engines": dict(stack=Stack(precision="fp32")),        # its transformers side (llama.cpp: tests/test_engines.py)
    "serving": dict(stack=Stack(engine="llama_server", precision="f16"),      # the server's resident set
                    load=Load(rates=(1.0,), concurrency=(1,), requests=2, warmup=0)),
    "capacity": dict(stack=Stack(engine="llama_server", precision="f16", step_tokens=64),
                     load=Load(requests=2, warmup=0, ttft_slo_s=0.001)),    # infeasible: the single stream only
}


def test_every_group_is_covered():
    assert set(PER_GROUP) == set(groups.implemented())


@pytest.mark.parametrize("group", sorted(PER_GROUP))
def test_a_peak_over_the_memory_budget_is_an_oom_run_in_every_group(group, tiny_zoo):
    spec = {"workload": TINY, **PER_GROUP[group]}
    config = TrialConfig(group=group, model="tiny-gqa", repeats=1, **spec)
    budget = 64 << 10     # 64 KiB: below the weights alone (a CPU's resident-set rise is noise at this size)
    result = run_trial(config, Runtime(memory_budget_bytes=budget))
    assert result.status == "FAILED", (group, result.error, result.metrics.get("peak_memory_bytes"))
    assert result.error.startswith(("oom: measured peak", "oom: predicted peak")), result.error
    assert result.metrics["memory_budget_bytes"] == budget
    if result.error.startswith("oom: measured peak"):  # the measurements are kept beside the reason
        assert result.metrics["peak_memory_bytes"] > budget and result.metrics["tok_per_s"] > 0
