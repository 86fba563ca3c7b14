"""transformers' own OpenAI-compatible server (``transformers serve``), as an engine the serving group drives."""
