"""The breaker path's stages after a tick boundary (``runtime.TripTrace``, the "trip path" line)
and what the runtime does with a tripping pool's decisions."""

from __future__ import annotations

from typing import Any

import pytest
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


def test_a_tripping_pools_decisions_are_acknowledged_before_any_routine_pool_is_decided() -> None:
    """``Decider.decide_ready``: the troubled pools of each shard's head boundary are decided,
    staged and acknowledged (``Publisher.settle``) before the first routine pool is decided; the
    trace has each of their stages and one "trip path" line. Without the settle (the mutation),
    the trip's decisions wait for the client's turns between the routine batches."""

    from fleetloop.core.shard import Row
    from fleetloop.daemon.runtime.partition import HeldTick
    from fleetloop.schemas import Tick
    from fleetloop.schemas.topics import REQUESTS, TELEMETRY
    from tests.support.records import outcome, telemetry
    from tests.support.runtime_harness import Rig, on_rig

    t0 = 1_700_000_000_000
    events: list[tuple[str, ...]] = []

    class Publisher:
        async def stage(self, decisions: Any, shadow: Any = ()) -> None:
            events.append(("stage", *sorted({d.body.entity.split("/")[1] for d in decisions})))

        async def settle(self) -> bool:
            events.append(("settle",))
            return True

    class Consumer:
        def highwater(self, tp: Any) -> None:
            return None

    boundary = t0 + 1000

    async def check(r: Rig) -> None:
        for p, pools in ((0, ("a", "b")), (1, ("c", "d"))):
            owned = r.own(p)
            shard = owned.shard
            shard.add(
                TELEMETRY, [Row(i, t0 + i, telemetry(f"{q}/0", q, ts_ms=t0 + i)) for i, q in enumerate(pools)]
            )
            kinds = ("ok", "error") if p == 1 else ("ok", "ok")  # pool d of shard 1 has a failed call
            shard.add(
                REQUESTS,
                [
                    Row(i, t0 + 5 + i, outcome(f"{q}/0", k, q, ts_ms=t0 + 5 + i))
                    for i, (q, k) in enumerate(zip(pools, kinds, strict=True))
                ],
            )
            cut = {TELEMETRY: 2, REQUESTS: 2}
            owned.held = [
                HeldTick(
                    k, Tick(ts_ms=boundary, tick_id=boundary // 1000, pool_id=q), boundary, cut, None, 0.0
                )
                for k, q in enumerate(pools)
            ]
        decided = await r.decider().decide_ready()
        assert {d.body.entity.split("/")[1] for d in decided} == {"a", "b", "c", "d"}
        assert events[:2] == [("stage", "d"), ("settle",)]
        assert sorted(events[2:]) == [("stage", "a"), ("stage", "b"), ("stage", "c")]
        stages = r.trace.after(boundary)
        assert list(stages) == ["ticks_read", "cut_ready", "folded", "decided", "staged", "acked"]
        assert r.trace.trips == set()  # logged once, at the settle

    on_rig(check, consumer=Consumer(), publisher=Publisher(), wall_ms=t0)


def test_the_read_up_wait_ends_once_every_partition_holds_a_record_past_the_boundary() -> None:
    """``Ticker.read_to_now``: a partition that holds a read record stamped after the boundary
    needs no more reading (the boundary's cut ends before that record); when all do, the wait ends
    without asking the broker, and the cut is the one a full wait gives. A partition without one
    still waits for the broker's end (here one that never answers: the wait's limit)."""
    import asyncio
    import dataclasses

    from fleetloop.core.shard import Row
    from fleetloop.schemas.topics import REQUESTS, TELEMETRY
    from tests.support.records import outcome, telemetry
    from tests.support.runtime_harness import rig
    from tests.support.virtual_time import FakeClock, run_virtual

    t0 = 1_700_000_000_000
    boundary = t0 + 1000
    asked: list[int] = []

    class Consumer:  # a broker that never answers ListOffsets
        def highwater(self, tp: Any) -> None:
            return None

        async def end_offsets(self, tps: Any) -> dict[Any, int]:
            asked.append(len(tps))
            await asyncio.sleep(3600)
            return {}

    async def run(clock: FakeClock) -> list[float]:
        took: list[float] = []
        async with rig(clock) as r:
            r.link.session = dataclasses.replace(r.session, consumer=Consumer())  # type: ignore[arg-type]
            ticker = r.ticker()
            shard = r.own(0).shard
            # Telemetry: one record before the boundary, one after; requests: one before only.
            shard.add(
                TELEMETRY,
                [
                    Row(0, t0 + 10, telemetry("a/0", "a", ts_ms=t0 + 10)),
                    Row(1, boundary + 5, telemetry("a/0", "a", ts_ms=boundary + 5)),
                ],
            )
            shard.add(REQUESTS, [Row(0, t0 + 20, outcome("a/0", "ok", "a", ts_ms=t0 + 20))])
            cut = shard.cut_by_time(boundary)

            started = clock.monotonic_s()
            await ticker.read_to_now(0.3, boundary)
            took.append(clock.monotonic_s() - started)  # requests has nothing past the boundary: it waits
            assert asked == [2]

            shard.add(REQUESTS, [Row(1, boundary + 7, outcome("a/0", "ok", "a", ts_ms=boundary + 7))])
            started = clock.monotonic_s()
            await ticker.read_to_now(0.3, boundary)
            took.append(clock.monotonic_s() - started)
            assert asked == [2]  # not asked again
            assert shard.cut_by_time(boundary) == cut  # the records past the boundary are not in its cut

            # A record past the boundary arriving while the broker is asked ends the wait too.
            shard2 = r.own(1).shard
            shard2.add(TELEMETRY, [Row(0, boundary + 1, telemetry("b/0", "b", ts_ms=boundary + 1))])

            async def arrive() -> None:
                await asyncio.sleep(0.05)
                shard2.add(REQUESTS, [Row(0, boundary + 2, outcome("b/0", "ok", "b", ts_ms=boundary + 2))])

            task = asyncio.create_task(arrive())
            started = clock.monotonic_s()
            await ticker.read_to_now(0.3, boundary)
            took.append(clock.monotonic_s() - started)
            await task
            assert asked == [2, 4]
        return took

    waited, at_once, arrived = run_virtual(run, wall_ms=t0)
    assert waited == pytest.approx(0.3, abs=0.006)
    assert at_once == 0.0
    assert arrived == pytest.approx(0.05, abs=0.006)  # the record came at 0.05 s; polled every 5 ms


def test_a_batch_that_moved_no_offset_commits_nothing() -> None:
    """``Checkpoints.commit``: the offsets of the last commit under the same assignment are not
    sent again (a round trip the loop waited on after every batch of input records); a moved
    offset, or a new assignment (a rebalance callback), commits again."""
    from fleetloop.core.shard import Row
    from fleetloop.schemas.topics import TELEMETRY, TICKS
    from tests.support.records import telemetry
    from tests.support.runtime_harness import rig
    from tests.support.virtual_time import FakeClock, run_virtual

    async def run(clock: FakeClock) -> None:
        async with rig(clock) as r:
            checkpoints = r.checkpoints()
            shard = r.own(0).shard
            commits: list[dict[str, int]] = []
            commit = r.session.consumer.commit

            async def counted(offsets: Any) -> None:
                commits.append({tp.topic: o for tp, o in offsets.items()})
                await commit(offsets)

            r.session.consumer.commit = counted  # type: ignore[method-assign]
            shard.add(TELEMETRY, [Row(0, 5, telemetry("a/0", "a", ts_ms=5))])
            await checkpoints.commit()
            await checkpoints.commit()  # nothing moved
            assert len(commits) == 1
            assert r.stats.commits_skipped == 1
            shard.ticks_at = 3  # a tick decided
            await checkpoints.commit()
            assert len(commits) == 2
            assert commits[-1][TICKS] == 3
            assert r.broker.committed["fleetloop"][r.parts.tp(TICKS, 0)] == 3
            r.parts.generation += 1  # the group moved partitions: commit again, even the same offsets
            await checkpoints.commit()
            await checkpoints.commit()
            assert len(commits) == 3
            assert (r.stats.commits, r.stats.commits_skipped) == (3, 2)

    run_virtual(run)


def test_a_shard_that_came_back_during_the_settle_decides_its_whole_queue() -> None:
    """A rebalance while the loop awaits the trip's acknowledgement takes the partition away and
    gives it back, restored (a new record: a new shard and queue): the new queue's ticks are all
    decided by the new shard, the tripping pool's included, not passed as "decided above" (they
    were, by the old one). Mutation: the offsets decided early applied to whatever queue the
    partition has -> the new shard never decides the trip pool's tick."""

    from fleetloop.core.shard import Row, Shard
    from fleetloop.daemon.runtime.partition import HeldTick, OwnedPartition
    from fleetloop.schemas import Tick
    from fleetloop.schemas.topics import REQUESTS, TELEMETRY
    from tests.support.records import outcome, telemetry
    from tests.support.runtime_harness import Rig, on_rig

    t0 = 1_700_000_000_000
    boundary = t0 + 1000
    pools = ("a", "b")
    cut = {TELEMETRY: 2, REQUESTS: 2}

    def fresh(r: Rig) -> OwnedPartition:
        owned = r.own(0)
        shard = owned.shard
        shard.add(
            TELEMETRY, [Row(i, t0 + i, telemetry(f"{q}/0", q, ts_ms=t0 + i)) for i, q in enumerate(pools)]
        )
        shard.add(
            REQUESTS,
            [
                Row(0, t0 + 5, outcome("a/0", "ok", "a", ts_ms=t0 + 5)),
                Row(1, t0 + 6, outcome("b/0", "error", "b", ts_ms=t0 + 6)),
            ],
        )
        owned.held = [
            HeldTick(
                k, Tick(ts_ms=boundary, tick_id=boundary // 1000, pool_id=q), boundary, dict(cut), None, 0.0
            )
            for k, q in enumerate(pools)
        ]
        return owned

    restored: list[Shard] = []
    rigs: list[Rig] = []

    class Publisher:
        async def stage(self, decisions: Any, shadow: Any = ()) -> None:
            pass

        async def settle(self) -> bool:  # the group takes partition 0 away and gives it back
            restored.append(fresh(rigs[0]).shard)
            return True

    class Consumer:
        def highwater(self, tp: Any) -> None:
            return None

    async def check(r: Rig) -> None:
        rigs.append(r)
        fresh(r)
        await r.decider().decide_ready()
        assert restored
        assert r.parts[0].shard is restored[0]
        assert r.parts[0].held == []
        assert set(restored[0].last_tick) == {"a", "b"}  # the trip pool b decided by the new shard too

    on_rig(check, consumer=Consumer(), publisher=Publisher(), wall_ms=t0)
