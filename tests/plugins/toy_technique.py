"""A toy technique, declared from outside the project: a test registers it with
``LLM_SWEEPS_TECHNIQUES=toy_technique`` and runs it through plan -> trial -> store -> section -> export.

One module holds all of it: the spec (``SPEC``), the search space (``plan``), the runner
(``run_toy``: the measurement loop, with the greedy outputs' distinct tokens added on top) and the
dashboard section (``GROUP``, ``TITLE``, ``BLURB``, ``figures``, ``report``).
"""

from __future__ import annotations

import plotly.graph_objects as go

from trials.config import Stack
from trials.models.registry import BUILT_IN
from trials.techniques import planning
from trials.techniques.spec import Technique, only_weights_and_batch

GROUP = "toy"
TITLE = "Toy: a technique declared outside the project"
BLURB = "How many distinct tokens does greedy decoding produce?"

SPEC = Technique(GROUP, TITLE, order=99, guard=only_weights_and_batch(GROUP),
                 runner="toy_technique:run_toy", space="toy_technique:plan", section="toy_technique",
                 reference="none")


def plan(models, profile, device, catalogue=BUILT_IN):
    return [planning.config(catalogue, GROUP, entry, Stack(precision="fp32"), device=device,
                            workload=planning.workload(profile.settings(GROUP, entry, device)), repeats=2)
            for entry in planning.targets(models, catalogue)]


def run_toy(config, runtime):
    from trials.engines.transformers.generation import prepare
    from trials.loop import finish, measure, trial_prompts
    from trials.models import loading

    loaded = loading.load(config.entry(), config.stack.precision, config.device)
    prompts = trial_prompts(config, loaded)
    prepared = prepare(config, loaded, prompts)
    measured = measure(config, loaded, prompts, generate_kwargs=prepared.kwargs)
    distinct = len({t for ids in measured.outputs().values() for t in ids})
    return finish(config, runtime, loaded, measured, metrics={"distinct_tokens": float(distinct)},
                  tags={"user_code": prepared.code})


def figures(frame):
    if frame.empty:
        return []
    return [("toy-distinct", go.Figure(go.Bar(x=list(frame["model"]), y=list(frame["distinct_tokens"]),
                                              name="distinct tokens")))]


def report(frame):
    return [f"| {row['model']} | {row['distinct_tokens']:.0f} distinct tokens |" for _, row in frame.iterrows()]
