"""The batching group's declaration: B rows per decode step, up to the memory boundary."""

from trials.config import Stack
from trials.techniques.spec import DeviceCheck, ProfileKey, Technique, built_in, only_weights_and_batch

NAME = "batching"


def cost(config, estimate) -> float:
    """Each prompt decoded alone once (the batch-1 reference), then the batched passes."""
    w = config.workload
    reference = estimate.generate_s(estimate.cost, w.max_new_tokens, repeats=1, batch=1)
    return estimate.once((NAME, config.model, w), reference) + estimate.plain


def device_checks(setup) -> list[DeviceCheck]:
    """On a device: each of the check's batch sizes."""
    return [DeviceCheck(Stack(precision=setup.fast, batch_size=n)) for n in setup.batches]


SPEC = Technique(
    NAME, "Static batching: B rows per decode step, up to the memory boundary", order=3,
    guard=only_weights_and_batch(NAME),
    **built_in(NAME, "run_batching"),
    reference="each prompt decoded alone (batch 1), once per worker, model and workload (tag "
              "batch1_reference); the memory bandwidth once per worker (tag bandwidth_source)",
    profile_keys={"batch_sizes": ProfileKey("int", many=True, low=1, high=65_536)},
    cost=cost,
    device_checks=device_checks,
)
