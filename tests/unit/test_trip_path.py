"""The breaker path's stages after a tick boundary (``runtime.TripTrace``, the "trip path" line)
and what the runtime does with a tripping pool's decisions."""

from __future__ import annotations

from fleetloop.daemon.runtime import TRACE_BOUNDARIES, TripTrace


def test_a_trace_keeps_each_stages_first_time_for_the_newest_boundaries() -> None:
    trace = TripTrace()
    trace.stamp(1000, "woke", 1001)
    trace.stamp(1000, "woke", 1050)  # the first time stands
    trace.stamp(1000, "staged", 1080)
    trace.trips.add(1000)
    assert trace.after(1000) == {"woke": 1, "staged": 80}
    assert trace.after(5000) == {}
    for k in range(1, TRACE_BOUNDARIES + 1):  # newer boundaries push the oldest out, with its trip
        trace.stamp(1000 + k * 1000, "woke", 1000 + k * 1000)
    assert len(trace.marks) == TRACE_BOUNDARIES
    assert 1000 not in trace.marks
    assert trace.trips == set()
