"""Building a zoo set: the tokenizer, then every model that is missing or stale, then the quality gate."""

from __future__ import annotations

import logging
import os
import time

from trials.models.zoo.cache import damage, is_built, load_card, model_path, tokenizer_is_current, zoo_dir
from trials.models.zoo.quality import ZooQualityError, quality_problems
from trials.models.zoo.recipes import RECIPES, ZOO_SETS, _check_model, _check_set, _with_teachers
from trials.models.zoo.tokenizer import build_tokenizer
from trials.models.zoo.training import train_precision
from trials.models.zoo.workers import _run_training

log = logging.getLogger("trials.models.zoo")


def build(set_name: str = "full", force: bool = False, *, only: list[str] | None = None,
          jobs: int | None = None) -> dict[str, dict]:
    """Build a zoo set (or `only` some of its models, plus their teachers); skip up-to-date models.

    Returns name -> model card for every model asked for. Raises ZooQualityError if the gate fails.
    """
    _check_set(set_name)
    names = list(ZOO_SETS[set_name])
    if only:
        for name in only:
            if _check_model(name).zoo_set != set_name:
                raise ValueError(f"zoo model {name!r} is in set {RECIPES[name].zoo_set!r}, not {set_name!r}")
        names = _with_teachers(list(only))
    start = time.time()
    zoo_dir().mkdir(parents=True, exist_ok=True)
    if force or not tokenizer_is_current(set_name):
        build_tokenizer(set_name)
    todo = [n for n in names if force or not is_built(n)]
    for name in names:
        if name not in todo:
            log.info("%s: up to date, skipped", name)
        elif problem := damage(name):
            log.warning("%s: %s is damaged (%s): building it again", name, model_path(name), problem)
    if todo:
        jobs = jobs or min(2, os.cpu_count() or 1)
        precision = train_precision()
        log.info("building %s with %d worker process(es) in %s: %s", set_name, jobs, precision, ", ".join(todo))
        _run_training(todo, jobs, precision)
    cards = {name: load_card(name) for name in names}
    if todo:
        log.info("%s set: built %d model(s) in %.1fs", set_name, len(todo), time.time() - start)
    problems = quality_problems(set_name, cards)
    if problems:
        raise ZooQualityError(f"zoo set {set_name!r} failed the quality gate:\n  " + "\n  ".join(problems))
    return cards
