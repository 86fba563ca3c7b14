"""The stacks technique: see ``runner`` (and ``trials.groups`` for its declaration)."""
