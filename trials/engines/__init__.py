"""Inference engines, one folder each. An engine loads a model under a stack and generates greedily a
fixed number of new tokens, stamping each; it turns a stack's factors into its own arguments and
says how a user turns the same stack on in their code, from one description (so the card shows
what ran). transformers is the first engine (``trials.engines.transformers``).
"""
