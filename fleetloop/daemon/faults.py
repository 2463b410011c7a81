"""Fault injection for the restart tests: ``FLEETLOOP_FAULT=crash:<point>:<n>`` makes the daemon
kill itself with SIGKILL the n-th time it reaches ``<point>`` (no clean-up, no flush: a kill -9 at
an exact place). Points: ``mid-batch`` (records read into the shards, nothing decided),
``after-publish`` (decisions acknowledged, no checkpoint or commit yet), ``after-checkpoint``
(checkpoint acknowledged, offsets not committed). Unset in production: then ``reach`` is a no-op.
"""

from __future__ import annotations

import os
import signal

_SPEC = os.environ.get("FLEETLOOP_FAULT", "")
_counts: dict[str, int] = {}


def _parse(spec: str) -> tuple[str, int] | None:
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] != "crash" or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


_FAULT = _parse(_SPEC)


def reach(point: str) -> None:
    """Count a pass through ``point``; SIGKILL this process when the configured one is due."""
    if _FAULT is None or _FAULT[0] != point:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] >= _FAULT[1]:
        os.kill(os.getpid(), signal.SIGKILL)
