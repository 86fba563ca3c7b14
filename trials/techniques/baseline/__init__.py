"""The baseline technique: see ``runner`` (and ``trials.groups`` for its declaration)."""
