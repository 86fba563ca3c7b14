"""Measurement primitives every technique shares: ``instruments`` (token timing, peak memory, the real
bytes behind tensors), ``kv_footprint`` (exact KV-cache bytes from a config, torch-free),
``perplexity`` (held-out NLL over fixed windows), ``hardware`` and ``environment`` (what a number
depends on: CPU capability, native 16-bit matmuls, versions). The loop (``trials.loop``) composes them.
"""
