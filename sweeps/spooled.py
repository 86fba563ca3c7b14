"""Results spooled on this machine while their tracking store was unreachable (``tracking.spool``).

A sweep delivers them before it plans (``deliver_before_planning``: delivered results count as done,
so their configs are skipped), and ``python sweeps/full.py --flush`` only delivers them
(``flush_spool``), each to its own store, once.
"""

from __future__ import annotations

import tracking
from tracking import spool
from trials.redaction import redact


def deliver_before_planning(uri: str) -> None:
    """Deliver what waits for ``uri`` and say so, when there was anything."""
    delivered, left = tracking.deliver_spooled(uri)
    if delivered or left:
        print(f"Spooled results from an earlier outage: {delivered} delivered to {redact(uri)}, {left} still waiting")


def flush_spool() -> int:
    """``--flush``: deliver every spooled result; exit 0 when none is left."""
    waiting = len(spool.pending())
    delivered, left = tracking.deliver_spooled(None)
    print(f"Spool {spool.spool_dir()}: {waiting} result(s) waiting, {delivered} delivered, {left} left"
          + (" (their store is still unreachable; run --flush again later)" if left else ""))
    return 0 if not left else 1
