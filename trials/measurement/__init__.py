"""Measurement primitives every technique shares: ``instruments`` (token timing, peak memory, the real
bytes behind tensors), ``kv_footprint`` (exact KV-cache bytes from a config, torch-free),
``perplexity`` (held-out NLL over fixed windows), ``latency`` (per-request TTFT and time per output
token, p50/p95), ``energy`` (hardware counters only), ``cost`` ($/1M tokens at a given price), ``hardware`` and ``environment`` (what a number
depends on: CPU capability, native 16-bit matmuls, versions), ``neighbours`` (the CPU that processes outside
the trial took while it ran). The loop (``trials.loop``) composes them.
"""
