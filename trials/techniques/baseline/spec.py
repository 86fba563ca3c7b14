"""The baseline group's declaration: a model at a weight precision, nothing else switched on."""

from trials.config import Stack
from trials.techniques.spec import DeviceCheck, ProfileKey, Technique, built_in, only_weights_and_batch

NAME = "baseline"

def device_checks(setup) -> list[DeviceCheck]:
    """On a device: both 16/32-bit precisions on short prompts."""
    return [DeviceCheck(Stack(precision=setup.fast)), DeviceCheck(Stack(precision=setup.other))]


SPEC = Technique(
    NAME, "Baseline: each model at each weight precision", order=0,
    guard=only_weights_and_batch(NAME),
    **built_in(NAME, "run_baseline"),
    reference="none: the baseline is what the other groups compare against",
    profile_keys={"precisions": ProfileKey("precision", many=True)},
    device_checks=device_checks,
)
