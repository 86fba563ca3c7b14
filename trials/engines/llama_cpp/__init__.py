"""The llama.cpp engine: GGUF files through llama-cpp-python on CPU (``spec``: what it takes and
refuses; ``backend``: the engine in a worker; ``gguf``/``convert``: its weight files; ``tools``:
llama.cpp's own llama-bench and llama-server, built from the same source and flags)."""
