"""llama.cpp's own OpenAI-compatible server (``llama-server``), as an engine the serving group drives."""
