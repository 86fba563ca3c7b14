"""The speculative technique: see ``runner`` (and ``trials.groups`` for its declaration)."""
