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


async def test_a_tripping_pools_decisions_are_acknowledged_before_any_routine_pool_is_decided() -> None:
    """``Daemon._decide_ready``: the troubled pools of each shard's head boundary are decided,
    staged and acknowledged (``Publisher.settle``) before the first routine pool is decided; the
    trace has each of their stages and one "trip path" line. Without the settle (the mutation),
    the trip's decisions wait for the client's turns between the routine batches."""
    from typing import Any

    from fleetloop.core.shard import Row, Shard
    from fleetloop.daemon.runtime import Daemon, DaemonConfig, _HeldTick
    from fleetloop.policies.registry import builtin_policy
    from fleetloop.schemas import Tick
    from fleetloop.schemas.topics import REQUESTS, TELEMETRY
    from tests.support.records import outcome, telemetry

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

    daemon = Daemon(DaemonConfig(bootstrap_servers="127.0.0.1:9", policy=builtin_policy("default")))
    daemon._consumer = Consumer()  # type: ignore[assignment]
    daemon._publisher = Publisher()  # type: ignore[assignment]
    boundary = t0 + 1000
    for p, pools in ((0, ("a", "b")), (1, ("c", "d"))):
        shard = daemon.shards[p] = Shard(p)
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
        daemon._publish_from[p] = 0
        daemon._held[p] = [
            _HeldTick(k, Tick(ts_ms=boundary, tick_id=boundary // 1000, pool_id=q), boundary, cut, None, 0.0)
            for k, q in enumerate(pools)
        ]
    decided = await daemon._decide_ready()
    assert {d.body.entity.split("/")[1] for d in decided} == {"a", "b", "c", "d"}
    assert events[:2] == [("stage", "d"), ("settle",)]
    assert sorted(events[2:]) == [("stage", "a"), ("stage", "b"), ("stage", "c")]
    stages = daemon.trace.after(boundary)
    assert list(stages) == ["ticks_read", "cut_ready", "folded", "decided", "staged", "acked"]
    assert daemon.trace.trips == set()  # logged once, at the settle


async def test_the_read_up_wait_ends_once_every_partition_holds_a_record_past_the_boundary() -> None:
    """``Daemon._read_to_now``: a partition that holds a read record stamped after the boundary
    needs no more reading (the boundary's cut ends before that record); when all do, the wait ends
    without asking the broker, and the cut is the one a full wait gives. A partition without one
    still waits for the broker's end (here one that never answers: the wait's limit)."""
    import asyncio
    from typing import Any

    from aiokafka import TopicPartition
    from fleetloop import clock
    from fleetloop.core.shard import INPUTS, Row, Shard
    from fleetloop.daemon.runtime import Daemon, DaemonConfig
    from fleetloop.policies.registry import builtin_policy
    from fleetloop.schemas.topics import REQUESTS, TELEMETRY, topic_name
    from tests.support.records import outcome, telemetry

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

    daemon = Daemon(DaemonConfig(bootstrap_servers="127.0.0.1:9", policy=builtin_policy("default")))
    daemon._consumer = Consumer()  # type: ignore[assignment]
    shard = daemon.shards[0] = Shard(0)
    for logical in INPUTS:
        daemon._owned.add(TopicPartition(topic_name("", logical), 0))
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
    await daemon._read_to_now(0.3, boundary)
    assert clock.monotonic_s() - started >= 0.29  # requests has nothing past the boundary: it waits
    assert asked == [2]

    shard.add(REQUESTS, [Row(1, boundary + 7, outcome("a/0", "ok", "a", ts_ms=boundary + 7))])
    started = clock.monotonic_s()
    await daemon._read_to_now(0.3, boundary)
    assert clock.monotonic_s() - started < 0.05
    assert asked == [2]  # not asked again
    assert shard.cut_by_time(boundary) == cut  # the records past the boundary are not in its cut

    # A record past the boundary arriving while the broker is asked ends the wait too.
    shard2 = daemon.shards[1] = Shard(1)
    for logical in INPUTS:
        daemon._owned.add(TopicPartition(topic_name("", logical), 1))
    shard2.add(TELEMETRY, [Row(0, boundary + 1, telemetry("b/0", "b", ts_ms=boundary + 1))])

    async def arrive() -> None:
        await asyncio.sleep(0.05)
        shard2.add(REQUESTS, [Row(0, boundary + 2, outcome("b/0", "ok", "b", ts_ms=boundary + 2))])

    task = asyncio.create_task(arrive())
    started = clock.monotonic_s()
    await daemon._read_to_now(0.3, boundary)
    took = clock.monotonic_s() - started
    await task
    assert 0.04 <= took < 0.2
    assert asked == [2, 4]


async def test_a_batch_that_moved_no_offset_commits_nothing() -> None:
    """``Daemon._commit``: the offsets of the last commit under the same assignment are not sent
    again (a round trip the loop waited on after every batch of input records); a moved offset, or
    a new assignment (a rebalance callback), commits again."""
    from typing import Any

    from aiokafka import TopicPartition
    from fleetloop.core.shard import INPUTS, Row, Shard
    from fleetloop.daemon.runtime import Daemon, DaemonConfig
    from fleetloop.policies.registry import builtin_policy
    from fleetloop.schemas.topics import TELEMETRY, TICKS, topic_name
    from tests.support.records import telemetry

    sent: list[dict[Any, int]] = []

    class Consumer:
        async def commit(self, offsets: Any) -> None:
            sent.append({tp.topic.split(".")[-1]: o.offset for tp, o in offsets.items()})

    daemon = Daemon(DaemonConfig(bootstrap_servers="127.0.0.1:9", policy=builtin_policy("default")))
    daemon._consumer = Consumer()  # type: ignore[assignment]
    shard = daemon.shards[0] = Shard(0)
    daemon._publish_from[0] = 0
    for logical in (*INPUTS, TICKS):
        daemon._owned.add(TopicPartition(topic_name("", logical), 0))
    shard.add(TELEMETRY, [Row(0, 5, telemetry("a/0", "a", ts_ms=5))])
    await daemon._commit()
    await daemon._commit()  # nothing moved
    assert len(sent) == 1
    assert daemon.stats.commits_skipped == 1
    shard.ticks_at = 3  # a tick decided
    await daemon._commit()
    assert len(sent) == 2
    assert sent[-1][TICKS.split(".")[-1]] == 3
    daemon._assign_gen += 1  # the group moved partitions: commit again, even the same offsets
    await daemon._commit()
    await daemon._commit()
    assert len(sent) == 3
    assert (daemon.stats.commits, daemon.stats.commits_skipped) == (3, 2)


async def test_a_shard_that_came_back_during_the_settle_decides_its_whole_queue() -> None:
    """A rebalance while the loop awaits the trip's acknowledgement takes the shard away and gives
    it back, restored (a new shard and queue): the new queue's ticks are all decided by the new
    shard, the tripping pool's included, not passed as "decided above" (they were, by the old one).
    Mutation: the offsets decided early applied to whatever queue the shard has -> the new shard
    never decides the trip pool's tick."""
    from typing import Any

    from fleetloop.core.shard import Row, Shard
    from fleetloop.daemon.runtime import Daemon, DaemonConfig, _HeldTick
    from fleetloop.policies.registry import builtin_policy
    from fleetloop.schemas import Tick
    from fleetloop.schemas.topics import REQUESTS, TELEMETRY
    from tests.support.records import outcome, telemetry

    t0 = 1_700_000_000_000
    boundary = t0 + 1000
    pools = ("a", "b")
    cut = {TELEMETRY: 2, REQUESTS: 2}

    def fresh() -> tuple[Shard, list[_HeldTick]]:
        shard = Shard(0)
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
        held = [
            _HeldTick(
                k, Tick(ts_ms=boundary, tick_id=boundary // 1000, pool_id=q), boundary, dict(cut), None, 0.0
            )
            for k, q in enumerate(pools)
        ]
        return shard, held

    daemon = Daemon(DaemonConfig(bootstrap_servers="127.0.0.1:9", policy=builtin_policy("default")))
    restored: list[Shard] = []

    class Publisher:
        async def stage(self, decisions: Any, shadow: Any = ()) -> None:
            pass

        async def settle(self) -> bool:  # the group takes partition 0 away and gives it back
            shard, held = fresh()
            daemon.shards[0], daemon._held[0] = shard, held
            restored.append(shard)
            return True

    class Consumer:
        def highwater(self, tp: Any) -> None:
            return None

    daemon._consumer = Consumer()  # type: ignore[assignment]
    daemon._publisher = Publisher()  # type: ignore[assignment]
    daemon.shards[0], daemon._held[0] = fresh()
    daemon._publish_from[0] = 0
    await daemon._decide_ready()
    assert restored
    assert daemon.shards[0] is restored[0]
    assert daemon._held[0] == []
    assert set(restored[0].last_tick) == {"a", "b"}  # the trip pool b decided by the new shard too
