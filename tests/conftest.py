"""Shared pytest fixtures."""

import pytest


@pytest.fixture(scope="session")
def tiny_zoo():
    """The tiny model zoo (tiny-mha, tiny-gqa, tiny-draft), built once and cached on disk.

    Builds into ``trials.zoo.zoo_dir()`` (``$LLM_SWEEPS_ZOO_DIR`` or the default cache), so repeated
    runs reuse it; returns that folder. Load models with ``trials.zoo.model_path(name)``.
    """
    from trials import zoo

    zoo.build("tiny")
    return zoo.zoo_dir()
