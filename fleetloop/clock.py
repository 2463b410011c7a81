"""The one module that reads the clock (time is an input; ruff bans it elsewhere)."""

from __future__ import annotations

import os
import time

_SCHED: list[int] = []  # the open /proc/thread-self/schedstat of the thread that first asked


def monotonic_s() -> float:
    """Seconds on the monotonic clock: for deadlines and durations, never for event time."""
    return time.monotonic()


def wall_ms() -> int:
    """Wall-clock time in epoch milliseconds: the producer's event time (``ts_ms``)."""
    return time.time_ns() // 1_000_000


def cpu_s() -> float:
    """CPU seconds this process has used: what benchmarks report beside wall time on a shared machine."""
    return time.process_time()


def thread_sched_s() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of the thread that first called this
    (the daemon's loop thread), from Linux ``/proc/thread-self/schedstat``: a loop that is slow
    because the machine does not run it (waiting) tells apart from one that waits on I/O (neither).
    Off Linux (or unreadable): (process CPU seconds, 0.0)."""
    try:
        if not _SCHED:
            _SCHED.append(os.open("/proc/thread-self/schedstat", os.O_RDONLY))
        fields = os.pread(_SCHED[0], 128, 0).split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return time.process_time(), 0.0
