"""Where a daemon's loop time goes (``runtime.LoopTimes``, the "loop" log line): per phase, the
wall time, and of it the time the loop's thread ran and was runnable but not run."""

from __future__ import annotations

import pytest
from fleetloop import clock
from fleetloop.daemon import runtime
from fleetloop.daemon.runtime import LoopTimes


def test_each_lap_goes_to_its_phase_split_into_run_queued_and_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    sched = [(5.0, 1.0)]  # (on cpu, runnable not run)
    monkeypatch.setattr(clock, "monotonic_s", lambda: now[0])
    monkeypatch.setattr(clock, "thread_sched_s", lambda: sched[0])
    times = LoopTimes()
    assert times.report() is None  # opens the window
    times.lap("loop")  # the first lap only marks
    now[0], sched[0] = 102.0, (5.5, 2.0)  # 2 s: 0.5 ran, 1.0 queued, 0.5 waited
    times.lap("fetch_held_back")
    now[0], sched[0] = 103.0, (6.5, 2.0)  # 1 s: all of it ran
    times.lap("decide")
    now[0], sched[0] = 104.0, (6.5, 2.0)  # 1 s waited on acks
    times.lap("acks")
    times.ticker_late_s = 1.25
    assert times.report() is None  # within LOOP_REPORT_S
    now[0] = 100.0 + runtime.LOOP_REPORT_S
    figures = times.report()
    assert figures is not None
    assert figures["fetch_held_back"] == "2.00/0.50/1.00"
    assert figures["decide"] == "1.00/1.00/0.00"
    assert figures["acks"] == "1.00/0.00/0.00"
    assert (figures["cpu_s"], figures["runq_s"], figures["waiting_s"]) == (1.5, 1.0, 1.5)
    assert figures["ticker_late_s"] == 1.25
    assert times.wall_s == {}
    assert times.ticker_late_s == 0.0  # a new window


def test_the_thread_sched_clock_moves_with_work() -> None:
    cpu0, runq0 = clock.thread_sched_s()
    sum(i * i for i in range(300_000))
    cpu1, runq1 = clock.thread_sched_s()
    assert cpu1 > cpu0
    assert runq1 >= runq0


def test_the_collectors_pauses_are_timed_per_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LoopTimes.on_gc`` (a ``gc.callbacks`` entry): each collection's pause, the longest one and
    the full ones in the window's line, then a new window; a stop without its start is ignored.
    And a real collection reaches it once installed."""
    import gc

    now = [100.0]
    monkeypatch.setattr(clock, "monotonic_s", lambda: now[0])
    monkeypatch.setattr(clock, "thread_sched_s", lambda: (0.0, 0.0))
    times = LoopTimes()
    assert times.report() is None
    times.on_gc("stop", {"generation": 2})  # no start seen: ignored
    for gen, took in ((0, 0.01), (2, 0.25), (1, 0.05)):
        times.on_gc("start", {"generation": gen})
        now[0] += took
        times.on_gc("stop", {"generation": gen})
    now[0] = 100.0 + runtime.LOOP_REPORT_S
    figures = times.report()
    assert figures is not None
    assert (figures["gc_s"], figures["gc_max_s"], figures["gc_full"]) == (0.31, 0.25, 1)
    assert (times.gc_s, times.gc_max_s, times.gc_full) == (0.0, 0.0, 0)
    monkeypatch.undo()
    real = LoopTimes()
    gc.callbacks.append(real.on_gc)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(real.on_gc)
    assert real.gc_full == 1
    assert real.gc_s > 0.0
