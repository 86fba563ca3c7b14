"""Training several zoo models at once: one spawned process per model, teachers before their drafts.

Each model trains in its own spawned process with ``torch.set_num_threads(1)``, so two run at once
on a 2-core machine. With one job (as beside a sweep's first trials) they train in the calling
process, one after another.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os

from trials.models.zoo.cache import ZOO_ENV_VAR, zoo_dir
from trials.models.zoo.recipes import _sources
from trials.models.zoo.training import train_model

log = logging.getLogger("trials.models.zoo")


def _train_in_worker(name: str, root: str, log_level: int, precision: str) -> dict:
    """Entry point of a spawned worker process: one thread, same zoo folder as the parent."""
    import torch
    import transformers

    os.environ[ZOO_ENV_VAR] = root
    if not logging.getLogger().handlers:
        logging.basicConfig(level=log_level, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    log.setLevel(log_level)
    transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bars in the build log
    torch.set_num_threads(1)
    return train_model(name, precision)


def _run_training(names: list[str], jobs: int, precision: str) -> None:
    """Train `names` in spawned processes, at most `jobs` at once, teachers before their drafts."""
    if not names:
        return
    pending = list(names)
    workers = max(1, min(jobs, len(pending)))
    root, level = str(zoo_dir()), log.getEffectiveLevel()
    if jobs == 1:                 # one at a time (beside a sweep's trials): here, in recipe order
        for name in pending:
            _train_in_worker(name, root, level, precision)
        return
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers,
                                                mp_context=multiprocessing.get_context("spawn")) as pool:
        running: dict[concurrent.futures.Future, str] = {}
        while pending or running:
            for name in list(pending):
                if len(running) >= workers:
                    break
                if any(s in pending or s in running.values() for s in _sources(name)):
                    continue
                pending.remove(name)
                running[pool.submit(_train_in_worker, name, root, level, precision)] = name
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                running.pop(future)
                future.result()  # re-raises a worker's error
