"""The cyclic collector is held while the daemon folds and decides a boundary, and its young
collection runs after the decisions are staged, a step of its own that the daemon's GC telemetry
times as every other collection; while held, a young generation past the threshold is collected at
the decider's next turn of the loop, never inside a batch's decide. The decisions are the same."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fleetloop.bench.fleetgen import BASE_TS_MS
from fleetloop.core.shard import INPUTS, Shard
from fleetloop.daemon.runtime.decider import Decider
from fleetloop.daemon.runtime.telemetry import CollectorHold, LoopTimes
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import Tick
from tests.support.memory_broker import MemoryBroker
from tests.support.runtime_harness import TICK_MS, daemon, fleet, running
from tests.support.virtual_time import FakeClock, run_virtual
from tests.unit.test_fold_steps import _Consumer, _publisher
from tests.unit.test_shard_many import cut_at, records

T0 = 1_800_000_000_000


@pytest.fixture
def collector_restored() -> Iterator[None]:
    """The process's collector as it was (the daemon's start tunes it process-wide)."""
    threshold = gc.get_threshold()
    yield
    gc.enable()
    gc.unfreeze()
    gc.set_threshold(*threshold)


@contextlib.contextmanager
def collections(into: list[Any], entry: Callable[[int], Any] = lambda gen: ("gc", gen)) -> Iterator[None]:
    """Each collection that starts while inside appended to ``into`` as ``entry(generation)``; what
    was pending collected first, so that only what the block allocates comes due."""
    gc.collect()

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            into.append(entry(info["generation"]))

    gc.callbacks.append(on_gc)
    try:
        yield
    finally:
        gc.callbacks.remove(on_gc)


@pytest.fixture
def seen(collector_restored: None) -> Iterator[list[tuple[str, int]]]:
    """The collections of the test, ``("gc", generation)`` each; the process's own threshold out of
    reach, so that none runs in between but the hold's."""
    got: list[tuple[str, int]] = []
    gc.set_threshold(1_000_000)
    with collections(got):
        yield got


def test_a_hold_collects_what_came_due_when_released_and_freezes_what_survived(
    seen: list[tuple[str, int]],
) -> None:
    untuned = CollectorHold(0)
    untuned.hold()
    assert gc.isenabled()  # the daemon leaves the collector alone when it does not tune it
    untuned.release()
    assert seen == []

    hold = CollectorHold(50_000)
    hold.hold()
    assert not gc.isenabled()
    few = [[i] for i in range(1_000)]
    hold.release()  # below the threshold: not due, nothing collected
    assert gc.isenabled()
    assert seen == []

    hold.hold()
    kept = [[i] for i in range(60_000)]
    assert seen == []  # held: past the threshold, and nothing collected meanwhile
    frozen = gc.get_freeze_count()
    hold.release()
    assert gc.isenabled()
    assert seen == [("gc", 0)]
    assert gc.get_freeze_count() >= frozen + len(kept)
    assert hold.collections == 1
    del few, kept


def test_a_held_young_generation_past_the_threshold_is_collected_at_a_turn(
    seen: list[tuple[str, int]],
) -> None:
    hold = CollectorHold(2_000)
    hold.hold()
    kept = [[i] for i in range(5_000)]
    assert seen == []  # held: the allocations past the threshold collected nothing
    assert hold.relieve()
    assert seen == [("gc", 0)]
    assert not gc.isenabled()  # still held
    assert gc.get_count()[0] < 2_000
    hold.release()
    assert gc.isenabled()
    assert seen == [("gc", 0)]  # the rest was below the threshold: not due
    del kept


def test_the_daemon_decides_with_the_collector_held_and_collects_between_the_batches(
    monkeypatch: pytest.MonkeyPatch, collector_restored: None
) -> None:
    """Every decide runs with the collector held, and none collects inside one; the collections
    that came due meanwhile run between batches, once a batch's decisions are staged, and the
    daemon's own GC telemetry receives each (``LoopTimes.on_gc``: the pause is timed, and a stall
    as any other). A threshold low enough for a small fleet's batches to pass it. Without the hold
    the decides run with the collector on and no collection is the hold's."""
    events: list[tuple[str, Any]] = []
    decide_many = Shard.decide_many

    def watched(self: Shard, *args: Any, **kw: Any) -> Any:
        events.append(("decide", gc.isenabled()))
        try:
            return decide_many(self, *args, **kw)
        finally:
            events.append(("decided", None))

    decide_ready = Decider.decide_ready

    async def ready(self: Decider) -> Any:
        events.append(("ready", None))
        out = await decide_ready(self)
        events.append(("ready_end", len(out)))
        return out

    on_gc = LoopTimes.on_gc

    def timed(self: LoopTimes, phase: str, info: Any) -> None:
        if phase == "start":
            events.append(("gc", info["generation"]))
        on_gc(self, phase, info)

    collect = CollectorHold._collect

    def collecting(self: CollectorHold) -> None:
        events.append(("collect", "held" if self.holding else "released"))
        collect(self)

    monkeypatch.setattr(Shard, "decide_many", watched)
    monkeypatch.setattr(Decider, "decide_ready", ready)
    monkeypatch.setattr(LoopTimes, "on_gc", timed)
    monkeypatch.setattr(CollectorHold, "_collect", collecting)

    async def main(clock: FakeClock) -> None:
        broker = MemoryBroker(clock)
        d = daemon(broker, clock, gc_gen0_threshold=100)
        async with running(d):
            await fleet(broker, clock, ["a", "b"], T0 + 6 * TICK_MS)

    run_virtual(main, wall_ms=T0)
    decides = [e for e in events if e[0] == "decide"]
    assert len(decides) >= 4
    assert all(enabled is False for _, enabled in decides), decides
    inside = False
    for what, _ in events:
        if what == "decide":
            inside = True
        elif what == "decided":
            inside = False
        elif what == "gc":
            assert not inside
    for k, e in enumerate(events):
        if e[0] == "collect":
            assert events[k + 1] == ("gc", 0)  # timed by the daemon's own telemetry
            last = [x[0] for x in reversed(events[:k]) if x[0] in ("decide", "decided")]
            assert last[:1] in ([], ["decided"])  # after a batch, never inside one
    # The collections that came due while the ticks were decided ran between the batches: the
    # hold's own at a turn, or the collector's while the decider awaited (CollectorHold.unheld).
    between, deciding = 0, False
    for what, _ in events:
        if what == "ready":
            deciding = True
        elif what == "ready_end":
            deciding = False
        elif what == "gc" and deciding:
            between += 1
    assert between >= 2, [e for e in events if e[0] in ("collect", "gc", "ready_end")][:40]


def test_the_decider_collects_a_held_young_generation_between_steps_never_inside_a_decide(
    collector_restored: None,
) -> None:
    """A far cut (20 s of a 200-node fleet's records) folded and decided with the collector held
    and a low threshold: the young generation passes it many times, and each time it is collected
    at a turn of the loop between the fold's steps or the batches, not inside a decide; the
    decisions are those decided with the collector left alone."""
    from fleetloop.daemon.runtime.partition import HeldTick
    from tests.support.runtime_harness import Rig, on_rig

    rows, pools = records(200, 20)
    policy = builtin_policy("default")
    ts = BASE_TS_MS + 20 * 1000
    cut = cut_at(rows, ts)
    ticks = [Tick(ts_ms=ts, tick_id=ts // 1000, pool_id=p) for p in pools]
    staged: list[bytes] = []

    def run(threshold: int) -> tuple[list[str], int]:
        events: list[str] = []

        async def check(r: Rig) -> tuple[list[str], int]:
            decider = r.decider()
            decider.fold_step_rows = 500
            decider.collector = CollectorHold(threshold)
            owned = r.own(0)
            shard = owned.shard
            for logical in INPUTS:
                shard.add(logical, rows[logical])
            owned.held = [HeldTick(k, t, ts, dict(cut), None, 0.0) for k, t in enumerate(ticks)]
            real = shard.decide_many

            def watched(*args: Any, **kw: Any) -> Any:
                events.append("decide")
                try:
                    return real(*args, **kw)
                finally:
                    events.append("decided")

            shard.decide_many = watched  # type: ignore[method-assign]
            staged.clear()
            with collections(events, lambda _: "gc"):
                decider.collector.hold()
                await decider.decide_ready()
                decider.collector.release()
                await asyncio.sleep(0)
            return events, decider.collector.collections

        got = on_rig(check, consumer=_Consumer(), publisher=_publisher(staged)(), policy=policy)
        return got[0], hash(tuple(staged))

    held, held_hash = run(300)
    _, alone_hash = run(0)  # the collector left alone runs where it will
    assert held_hash == alone_hash
    assert held.count("gc") >= 3, held
    inside = False
    for e in held:
        if e == "decide":
            inside = True
        elif e == "decided":
            inside = False
        else:
            assert not inside, held


def test_the_collector_runs_as_usual_while_the_decider_awaits(collector_restored: None) -> None:
    """Held over a decide, let go over its awaits: the other tasks' survivors are collected at the
    threshold as they come, not piled up for one long collection at the next turn."""
    seen: list[bool] = []

    async def other_task_step() -> int:
        seen.append(gc.isenabled())
        return 7

    async def main() -> None:
        hold = CollectorHold(2_000)
        hold.hold()
        assert await hold.unheld(other_task_step()) == 7
        assert not gc.isenabled()  # held again for the next step
        hold.release()
        assert gc.isenabled()
        assert await hold.unheld(other_task_step()) == 7  # not held: nothing to let go
        assert gc.isenabled()

    gc.enable()
    asyncio.run(main())
    assert seen == [True, True]
