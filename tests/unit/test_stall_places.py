"""Where the loop's stalls come from: the daemon keeps its longest stalls of its own time with what
its loop thread ran meanwhile (a sampler thread looks at the loop thread's frame while the loop is
late) and the collector's share, for the "daemon stopped" line and ``bench sizing``."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

from fleetloop import clock as wall_clock
from fleetloop.daemon.runtime.telemetry import (
    STALLS_KEPT,
    DaemonStats,
    LoopTimes,
    Stall,
    StallSampler,
    StallWatch,
    where_of,
)


def test_the_longest_stalls_are_kept_longest_first_and_short_ones_not_at_all() -> None:
    stats = DaemonStats()
    for k, own in enumerate([10.0, 70.0, 300.0, 55.0, 120.0, 90.0, 65.0, 49.9, 500.0]):
        stats.note_stall(Stall(own, own * 2, f"f{k}"))
    assert [x.own_ms for x in stats.stalls_top] == [500.0, 300.0, 120.0, 90.0, 70.0]
    assert len(stats.stalls_top) == STALLS_KEPT
    assert stats.stalls_shown().split(";")[0] == "500/1000ms@f8"
    assert " " not in stats.stalls_shown()
    assert DaemonStats().stalls_shown() == "none"


def test_a_stall_carries_the_collectors_share_and_the_window_names_its_longest() -> None:
    stats = DaemonStats()
    times = LoopTimes(clock=wall_clock, stats=stats)
    times.gc_total_s = 0.04  # a 40 ms collection since the last stall
    times.on_stall(0.2, 0.15, "core.shard._fold_to<daemon.runtime.decider._decide_batch")
    times.on_stall(0.06, 0.06, "")  # no collection since: no share
    assert [x.where for x in stats.stalls_top] == [
        "core.shard._fold_to<daemon.runtime.decider._decide_batch+gc40",
        "",
    ]
    assert times.stall_where == "core.shard._fold_to<daemon.runtime.decider._decide_batch+gc40"
    times.since_s = wall_clock.monotonic_s() - 60.0
    report = times.report()
    assert report is not None
    assert report["stall_where"] == "core.shard._fold_to<daemon.runtime.decider._decide_batch+gc40"
    assert times.stall_where == ""  # a new window


def test_where_of_names_fleetloops_frames_innermost_first_and_the_runtimes_caller() -> None:
    seen: list[str] = []

    def inner() -> None:
        seen.append(where_of(sys._getframe()))

    inner()  # from a test: no fleetloop frame, so the innermost frame's file and function
    assert seen == ["test_stall_places.py:inner"]
    assert where_of(None) == ""

    # From fleetloop's code: a pure function called by the runtime (the decider's fold, here the
    # shard's step_toward, stopped at its first line by a tracer).
    from fleetloop.core.shard import Shard

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_name == "pools":
            seen.append(where_of(frame))
        return None

    sys.setprofile(tracer)
    try:
        Shard(0).pools()
    finally:
        sys.setprofile(None)
    assert seen[-1] == "core.shard.pools"


def test_a_blocked_loop_is_reported_with_the_function_that_blocked_it() -> None:
    """A callback that holds the loop (here it waits, in a function of its own, until the sampler
    has looked at the loop thread at least once: counted, not timed) shows as a stall whose place
    names that function: what a user of bench sizing reads to see where the time went."""
    stats = DaemonStats()
    times = LoopTimes(clock=wall_clock, stats=stats)

    def hold_the_loop_for_the_sampler(sampler: StallSampler) -> None:
        deadline = wall_clock.monotonic_s() + 30.0  # a bound for a machine that never runs the sampler
        while not sampler._seen and wall_clock.monotonic_s() < deadline:
            time.sleep(0.005)  # blocks the loop (as a long decide would), lets the sampler run
        time.sleep(0.06)  # at least STALL_NOTE_MS of the loop's own time in all

    async def main() -> None:
        stop = asyncio.Event()
        sampler = StallSampler(wall_clock)
        watch = asyncio.create_task(StallWatch(wall_clock, times.on_stall, sampler).run(stop))
        await asyncio.sleep(0.05)
        hold_the_loop_for_the_sampler(sampler)
        await asyncio.sleep(0.05)
        stop.set()
        await watch

    asyncio.run(main())
    assert stats.stalls_top, "no stall kept"
    assert "hold_the_loop_for_the_sampler" in stats.stalls_top[0].where
    assert stats.stalls_top[0].own_ms >= 50.0
    # The watch stops its sampler: the thread ends (within one STALL_SAMPLE_S).
    threads = [t for t in threading.enumerate() if t.name == "fleetloop-stall-sampler"]
    for t in threads:
        t.join(timeout=10.0)
    assert not any(t.is_alive() for t in threads)
