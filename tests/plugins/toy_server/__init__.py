"""The toy server engine (``spec.py``, ``backend.py``, ``server.py``)."""
