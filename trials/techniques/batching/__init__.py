"""The batching technique: see ``runner`` (and ``trials.groups`` for its declaration)."""
