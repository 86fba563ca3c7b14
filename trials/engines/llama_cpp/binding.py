"""llama-cpp-python, imported on use: the install line where it is missing, its C log quieted, and
the threads a trial may run it on."""

from __future__ import annotations

import logging

from trials.errors import ConfigError

INSTALL = "pip install llama-cpp-python==0.3.36 (make setup installs it; it compiles llama.cpp once, for minutes)"


def require_llama_cpp():
    """The binding, its C log quieted to errors (else llama.cpp prints every tensor it loads or
    quantizes into the sweep's output)."""
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError(f"the llama_cpp engine needs llama-cpp-python: {INSTALL}") from None
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    return llama_cpp


def threads() -> int:
    """The threads this trial was granted (``Runtime.num_threads``, which the trial sets as torch's):
    llama.cpp's OpenMP threads spin, so more threads than granted cores would slow every trial beside it."""
    import torch

    return max(1, torch.get_num_threads())
