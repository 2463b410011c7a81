"""Stable at scale: the daemon measures how long its event loop stalls and how long the collector
pauses it, counts the group's assignments, restores with the collector held and the restored
shards frozen out of its sight, and joins a group as a static member when given a name."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import pytest
from fleetloop import clock as wall_clock
from fleetloop.core import checkpoint
from fleetloop.daemon.runtime import DaemonConfig, kafka
from fleetloop.daemon.runtime.telemetry import DaemonStats, LoopTimes, StallWatch, freeze_survivors, gc_held
from fleetloop.policies.registry import builtin_policy
from tests.support.memory_broker import MemoryBroker
from tests.support.runtime_harness import TICK_MS, daemon, fleet, rig, running
from tests.support.virtual_time import FakeClock, run_virtual
from tests.unit.test_assignment import _assigned, checkpointed

T0 = 1_800_000_000_000


def test_a_blocked_loop_is_measured_as_a_stall_in_the_stats_and_the_loop_line() -> None:
    """A synchronous step of 150 ms (what a long decide, a GC pause or a thread holding the GIL
    does to the loop) shows as a stall of about that long: in the window's "loop" figures and in
    the stats since the start. Real time: a stall is what the real loop does."""
    stats = DaemonStats()
    times = LoopTimes(clock=wall_clock, stats=stats)

    async def main() -> None:
        stop = asyncio.Event()
        watch = asyncio.create_task(StallWatch(wall_clock, times.on_stall).run(stop))
        await asyncio.sleep(0.1)
        time.sleep(0.15)  # the loop is blocked
        await asyncio.sleep(0.1)
        stop.set()
        await watch

    asyncio.run(main())
    assert stats.loop_stall_max_ms >= 120.0
    assert times.stall_max_s >= 0.12
    assert times.stall_own_max_s >= 0.1
    # The loop's own work (time.sleep blocks it without a core's wait): not the machine's.
    assert 100.0 <= stats.loop_stall_own_max_ms <= stats.loop_stall_max_ms
    assert stats.summary()["loop_stall_max_ms"] >= 120
    assert stats.stability()["loop_stall_max_ms"] >= 120.0


def test_gc_pauses_go_to_the_stats_since_the_start() -> None:
    stats = DaemonStats()
    times = LoopTimes(clock=wall_clock, stats=stats)
    gc.callbacks.append(times.on_gc)
    try:
        junk = [[i] for i in range(200_000)]
        gc.collect()
        del junk
    finally:
        gc.callbacks.remove(times.on_gc)
    assert stats.gc_pause_max_ms > 0.0
    assert stats.summary()["gc_pause_max_ms"] == round(stats.gc_pause_max_ms)


def test_gc_held_collects_nothing_meanwhile_and_freezes_what_was_built() -> None:
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with gc_held(True):
            assert not gc.isenabled()
            built = [{"row": [i, float(i)]} for i in range(10_000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(built)
        with gc_held(False):
            assert gc.isenabled()  # the daemon leaves the collector alone when it does not tune it
    finally:
        gc.unfreeze()


def test_a_restore_is_counted_and_freezes_the_restored_shard_when_the_daemon_tunes_gc() -> None:
    async def run(clock: FakeClock) -> tuple[int, int, bool]:
        broker = MemoryBroker(clock, partitions=1)
        written, _ = await checkpointed(clock, broker)
        async with rig(clock, broker, gc_gen0_threshold=100_000) as second:
            assignment = second.assignment()
            before = gc.get_freeze_count()
            await assignment.on_assigned(_assigned(second))
            same = checkpoint.encode(second.parts[0].shard.checkpoint_value()) == written
            return gc.get_freeze_count() - before, second.stats.assignments, same

    try:
        frozen, assignments, same = run_virtual(run, wall_ms=T0)
    finally:
        gc.unfreeze()
    assert same
    assert assignments == 1
    assert frozen > 0
    assert gc.isenabled()


def test_an_assignment_while_stopping_is_the_stops_not_a_rebalance() -> None:
    """A member that is stopping is handed partitions as the others leave: not counted."""

    async def run(clock: FakeClock) -> tuple[int, int]:
        async with rig(clock, MemoryBroker(clock, partitions=1)) as r:
            assignment = r.assignment()
            await assignment.on_assigned(_assigned(r))
            counted = r.stats.assignments
            r.link.stop = asyncio.Event()
            r.link.stop.set()
            await assignment.on_assigned(_assigned(r))
            return counted, r.stats.assignments

    assert run_virtual(run, wall_ms=T0) == (1, 1)


def test_the_daemon_reports_stall_gc_and_assignments_at_its_stop() -> None:
    async def main(clock: FakeClock) -> dict[str, Any]:
        broker = MemoryBroker(clock)
        d = daemon(broker, clock)
        async with running(d):
            await fleet(broker, clock, ["a"], T0 + 5 * TICK_MS)
        return {"summary": d.summary(), "stability": d.stability()}

    got = run_virtual(main, wall_ms=T0)
    for figures in (got["summary"], got["stability"]):
        assert figures["assignments"] == 1  # one member, no rebalance
        assert figures["loop_stall_max_ms"] == 0  # virtual time: the loop never runs late
        assert "gc_pause_max_ms" in figures


class _Captured(Exception):
    pass


@pytest.mark.parametrize("name", [None, "fleetloop-a"])
def test_the_group_consumer_is_a_static_member_when_given_a_name(
    name: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    class Producer:
        def __init__(self, **kw: Any) -> None:
            pass

        async def start(self) -> None:
            pass

        async def stop(self) -> None:
            pass

    def consumer(**kw: Any) -> Any:
        if kw.get("group_id"):
            seen.update(kw)
            raise _Captured
        return Producer()

    monkeypatch.setattr(kafka, "AIOKafkaProducer", Producer)
    monkeypatch.setattr(kafka, "AIOKafkaConsumer", consumer)
    cfg = DaemonConfig(
        bootstrap_servers="127.0.0.1:1", policy=builtin_policy("default"), group_instance_id=name
    )

    async def main() -> None:
        async with kafka.KafkaBroker(cfg).session():
            pass

    with pytest.raises(_Captured):
        asyncio.run(main())
    assert seen["group_instance_id"] == name
    assert seen["session_timeout_ms"] == 6000
    assert seen["rebalance_timeout_ms"] == 60_000  # not the session's: a revoke checkpoints first


def test_what_survives_a_collection_is_frozen_where_the_daemon_tunes_gc() -> None:
    """After a collection the loop freezes the survivors: the older generations stay empty, so no
    collection walks more than the young objects since the last one; a daemon that does not tune
    the collector never freezes."""
    times = LoopTimes(clock=wall_clock, stats=DaemonStats())
    try:
        frozen = gc.get_freeze_count()
        freeze_survivors(times, True)
        assert gc.get_freeze_count() == frozen  # no collection since: nothing to do
        times.on_gc("start", {"generation": 0})
        times.on_gc("stop", {"generation": 0})
        freeze_survivors(times, False)
        assert gc.get_freeze_count() == frozen  # not tuned: left alone
        assert not times.freeze_due
        gc.callbacks.append(times.on_gc)
        try:
            kept = [[i] for i in range(50_000)]
            gc.collect(0)
        finally:
            gc.callbacks.remove(times.on_gc)
        freeze_survivors(times, True)
        assert gc.get_freeze_count() >= frozen + len(kept)
        first = kept[0]
        assert all(o is not first for o in gc.get_objects(1))  # frozen: not left for a middle collection
        assert all(o is not first for o in gc.get_objects(2))
    finally:
        gc.unfreeze()
