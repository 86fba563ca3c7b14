"""The objects a stack's described arguments stand for (``trials.engines.transformers.arguments``)."""

from __future__ import annotations

from trials.engines.transformers.arguments import Call, Dtype, Literal, Supplied
from trials.measurement.hardware import DTYPES


def materialize(value, supplied: dict | None = None):
    """The object ``value`` describes; ``supplied`` makes the engine's own (``Supplied``) by name."""
    if isinstance(value, Literal):
        return value.value
    if isinstance(value, Dtype):
        return DTYPES[value.precision]
    if isinstance(value, Call):
        made = _constructor(value.name)(**{k: materialize(v, supplied) for k, v in value.kwargs})
        for name, attribute in value.attributes:
            setattr(made, name, materialize(attribute, supplied))
        return made
    if isinstance(value, Supplied):
        return (supplied or {})[value.name]()
    return value


def materialize_all(arguments: dict, supplied: dict | None = None) -> dict:
    return {name: materialize(value, supplied) for name, value in arguments.items()}


def _constructor(name: str):
    from transformers import BitsAndBytesConfig
    from transformers.generation import CompileConfig

    return {"BitsAndBytesConfig": BitsAndBytesConfig, "CompileConfig": CompileConfig}[name]
