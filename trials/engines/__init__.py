"""Inference engines, one folder each. An engine loads a model under a stack and generates greedily a
fixed number of new tokens, stamping each; it turns a stack's factors into its own arguments and
says how a user turns the same stack on in their code, from one description (so the card shows
what ran). ``transformers`` (``generate()``) is the default engine; ``llama_cpp`` runs GGUF files
through llama-cpp-python on CPU.

``ENGINES``: each folder's torch-free ``spec.SPEC`` (``trials.engines.spec.Engine``), by name.
"""

from trials.engines.llama_cpp.spec import SPEC as _LLAMA_CPP
from trials.engines.transformers.spec import SPEC as _TRANSFORMERS

ENGINES = {e.name: e for e in (_TRANSFORMERS, _LLAMA_CPP)}
DEFAULT = _TRANSFORMERS.name
