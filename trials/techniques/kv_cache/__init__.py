"""The kv_cache technique: see ``runner`` (and ``trials.groups`` for its declaration)."""
