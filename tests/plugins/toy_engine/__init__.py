"""The toy in-process engine (``spec.py``, ``backend.py``)."""
