"""The one module that reads the clock (STYLE.md rule 2: time is an input; ruff bans it elsewhere)."""

from __future__ import annotations

import time


def monotonic_s() -> float:
    """Seconds on the monotonic clock: for deadlines and durations, never for event time."""
    return time.monotonic()


def wall_ms() -> int:
    """Wall-clock time in epoch milliseconds: the producer's event time (``ts_ms``)."""
    return time.time_ns() // 1_000_000


def cpu_s() -> float:
    """CPU seconds this process has used: what benchmarks report beside wall time on a shared machine."""
    return time.process_time()
