"""A toy in-process engine, declared from outside the project: one folder (this package), registered
with ``LLM_SWEEPS_ENGINES=toy_engine.spec`` (the folder's parent on ``PYTHONPATH``), and run through
plan -> Ray worker -> store -> dashboard -> export -> report -> llm-recommend with no line of the
project changed. ``spec.py`` declares it (torch-free); ``backend.py`` runs it in a worker.
"""

from trials.engines.spec import Engine

NAME = "toy"


def guard(stack) -> str | None:
    return None if stack.batch_size == 1 else "the toy engine decodes one prompt at a time"


SPEC = Engine(NAME, "toy (a greedy loop over forward())", ("fp32",), {}, guard, "torch", "toy_engine.backend",
              sixteen_bit=("fp32",), proposers=(), color="#00CC96",
              caption="a hand-written greedy loop over the model's forward pass.", version_tag="toy_version")
