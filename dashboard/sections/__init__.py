"""One module per chart group, in page order.

Each section module exposes ``GROUP`` (its MLflow experiment), ``TITLE``, ``BLURB`` (one sentence:
the question it answers) and ``figures(frame) -> [(component id, plotly figure)]``, and may expose
``caption(frame) -> str`` (what the numbers are). ``frame`` is ``tracking.runs_frame`` of the group;
an empty list of figures means "nothing to show yet" and the app lays out the empty state. Adding a
chart group = one module here plus its line in ``SECTIONS``. The app marks, in every section, the
points of runs whose precision their CPU only emulated (``common.mark_emulated``, for any trace whose
hover uses ``common.PROVENANCE_HOVER``) and adds the section's one-line ``common.emulation_note``.
"""

from dashboard.sections import baseline, batching, kv_cache, quantization, speculative, stacks

SECTIONS = (baseline, speculative, kv_cache, batching, quantization, stacks)

__all__ = ["SECTIONS"]
