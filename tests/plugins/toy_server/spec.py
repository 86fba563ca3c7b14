"""A toy server engine, declared from outside the project: one folder (this package), registered with
``LLM_SWEEPS_ENGINES=toy_engine.spec,toy_server.spec`` (the folder's parent on ``PYTHONPATH``), and
measured by the serving group through plan -> Ray worker -> store -> dashboard -> export -> report ->
llm-recommend with no line of the project changed. It serves the toy engine's greedy loop
(``server.py``) over HTTP, one request at a time, and checks its tokens against that engine's.
"""

from trials.engines.spec import Engine

NAME = "toy_server"


def guard(stack) -> str | None:
    if stack.batch_size != 1:
        return "the toy server answers one request at a time: batch_size (slots) must be 1"
    if stack.step_tokens or stack.threads:
        return "the toy server takes no server options (step_tokens and threads must be 0)"
    return None


SPEC = Engine(NAME, "toy server (a greedy loop over HTTP)", ("fp32",), {}, guard, "torch", "toy_server.backend",
              sixteen_bit=("fp32",), proposers=(), devices=("cpu",), color="#FFA15A", serves=True,
              builds_on=("toy",), start_s=8.0, version_tag="toy_server_version",
              caption="the toy engine's greedy loop behind Python's http.server, one request at a time.")
