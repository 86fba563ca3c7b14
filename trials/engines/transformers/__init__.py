"""The transformers engine: ``generate()`` with a stack's arguments.

``arguments`` (torch-free): a stack as ``from_pretrained`` / ``generate()`` keywords, and as a user's
code; ``generation``: greedy generation with per-token stamps, under those arguments materialized
(``prepare``); ``kv_cache``, ``speculation``, ``compiled``: what the quantized cache, the draft
model and compiled decoding need from transformers. Loading itself is ``trials.models.loading``.
"""
