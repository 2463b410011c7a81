"""The router library's one clock (it ships without the daemon, so it cannot borrow the daemon's).

Only the I/O shell reads it (:mod:`fleetloop.router.follow`, :mod:`fleetloop.router.publish`);
``pick()`` and the desired state take ``now_s`` as an argument. An embedder passes
:func:`monotonic_s` to ``pick()``, the same clock the follower stamps arrivals with.
"""

from __future__ import annotations

import time


def monotonic_s() -> float:
    """Seconds on the monotonic clock: arrivals of desired state and the fail-static TTL."""
    return time.monotonic()


def wall_ms() -> int:
    """Epoch milliseconds: the age of a decision (its ``ts_ms``) and a RequestOutcome's ``ts_ms``."""
    return time.time_ns() // 1_000_000
