"""Hostile records against a live daemon on both brokers: schema-valid overflow bait,
numbers no fleet produces, NaN, a far-future record for an invented node, a ~1 MB record, 1,000
invented pools. The daemon keeps deciding every tick of the real pool from the real nodes only,
dead-letters the rest with a reason each, and commits past all of it.

These run with the production door (event-time window on), so the real records carry wall-clock
event times.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from fleetloop import clock
from fleetloop.core import shard as shard_module
from fleetloop.core.model import ModelConfig
from fleetloop.daemon import faults
from fleetloop.daemon.observe.decode import Door
from fleetloop.daemon.runtime import SKIPPED_HEADER, Daemon, DaemonConfig
from fleetloop.daemon.service.health import TaskDied
from fleetloop.schemas import Tick
from fleetloop.schemas.topics import DEADLETTER, DECISIONS, REQUESTS, TELEMETRY, TICKS
from tests.support.kafka import decisions_of, producer, read_all, running_daemon, send, wait_decided
from tests.support.policies import foundation
from tests.support.records import outcome, telemetry, to_bytes

NODES = ("p/0", "p/1", "p/2")


def _raw(record: Any, **fields: Any) -> bytes:
    data = record.model_dump(mode="json")
    data.update(fields)
    return json.dumps(data).encode()


async def test_hostile_records_are_dead_lettered_and_the_real_pool_is_decided_every_tick(
    kafka_env: Any,
) -> None:
    t0 = (clock.wall_ms() // 1000) * 1000
    ticks = 6
    hostile: list[tuple[bytes, bytes, str]] = [  # (key, value, topic)
        (b"p", _raw(telemetry("p/0", ts_ms=t0), cost_rate_usd_per_h=1e308), TELEMETRY),
        (b"p", _raw(outcome("p/0", ts_ms=t0), cost_usd=1e308), REQUESTS),
        (b"p", _raw(outcome("p/0", ts_ms=t0, n=1), prompt_tokens=10**400), REQUESTS),
        (
            b"p",
            to_bytes(telemetry("p/1", ts_ms=t0)).replace(b'"hbm_free_gib":20.0', b'"hbm_free_gib":NaN'),
            TELEMETRY,
        ),
        (b"p", to_bytes(telemetry("p/evil", ts_ms=4_102_444_800_000, queue_depth=0)), TELEMETRY),
        (b"p", to_bytes(telemetry("p/secs", ts_ms=t0 // 1000)), TELEMETRY),
        (b"p", b"{" + b" " * 1_000_000 + b"}", TELEMETRY),
        (b"p", to_bytes(Tick(ts_ms=4_102_444_800_000, tick_id=4_102_444_800, pool_id="p")), TICKS),
    ]
    invented = [
        (f"inv-{i}".encode(), to_bytes(telemetry(f"inv-{i}/0", f"inv-{i}", ts_ms=t0)), TELEMETRY)
        for i in range(1000)
    ]
    async with running_daemon(kafka_env, door=Door()) as daemon, producer(kafka_env) as p:
        await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=t0) for n in NODES])
        for key, value, logical in hostile + invented:
            await p.send(kafka_env.topic(logical), value=value, key=key)
        await p.flush()
        for k in range(1, ticks + 1):
            now = t0 + k * 1000
            await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=now) for n in NODES])
            await send(
                p,
                kafka_env,
                REQUESTS,
                [outcome(n, "ok", ts_ms=now + 1, n=k * 10 + i) for i, n in enumerate(NODES)],
            )
            await send(p, kafka_env, TICKS, [Tick(ts_ms=now + 500, tick_id=k, pool_id="p")])
            await wait_decided(daemon, now + 500, timeout_s=60)
        stats = daemon.stats
        assert stats.ticks_decided == ticks, "every tick of the real pool decided"
        assert stats.ticks_failed == 0
        by_reason = dict(stats.dead_by_reason)
        real_partition = next(i for i, shard in daemon.shards.items() if "p" in shard.model.pools)
        models = [shard.model for shard in daemon.shards.values()]
        held_pools = sum(len(m.pools) for m in models)
        refused_pools = sum(m.refused["pools"] for m in models)
    assert by_reason.get("record-too-large") == 1
    assert by_reason.get("event-time-too-new") == 2  # 2100 telemetry, 2100 tick
    assert by_reason.get("event-time-too-old") == 1  # seconds instead of milliseconds
    assert by_reason.get("less_than_equal", 0) >= 3  # 1e308 twice, 10**400
    assert by_reason.get("json_invalid", 0) + by_reason.get("finite_number", 0) >= 1  # NaN
    # Each partition's model holds at most its cap of pools; the rest were refused and counted.
    assert held_pools <= len(models) * ModelConfig().max_pools
    assert refused_pools >= 0  # (shards fold lazily, up to their ticks: some records may still wait)
    decided = decisions_of(await read_all(kafka_env, DECISIONS, until=lambda rs: len(rs) > 0))
    routing = [d for d in decided if d.body.kind == "routing" and getattr(d.body, "pool_id", "") == "p"]
    assert sorted(d.tick_id for d in routing) == list(range(1, ticks + 1))
    for d in routing:
        weights = d.body.weights  # type: ignore[union-attr]
        assert {n for n, w in weights.items() if w > 0} == set(NODES), weights
    letters = await read_all(kafka_env, DEADLETTER, until=lambda rs: len(rs) >= sum(by_reason.values()))
    big = [r for r in letters if dict(r.headers).get("fleetloop.truncated")]
    assert len(big) == 1
    assert dict(big[0].headers)["fleetloop.truncated"] == b"1000002"
    assert len(big[0].value) == 64 * 1024
    # Everything was committed past: a restarted daemon would not read the poison again.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_env.bootstrap_servers, group_id=kafka_env.group("daemon")
    )
    await consumer.start()
    try:
        for logical in (TELEMETRY, REQUESTS):
            # The real pool's partition, where the poison records sit among real ones (other
            # partitions are committed as their shards fold, up to their own ticks).
            tps = [TopicPartition(kafka_env.topic(logical), real_partition)]
            end = await consumer.end_offsets(tps)
            for tp in tps:
                # (>=: the embedded broker has answered an end offset short of the last record + 1)
                assert (await consumer.committed(tp) or 0) >= end[tp], f"{tp} not committed to its end"
    finally:
        await consumer.stop()


def _daemon(kafka_env: Any, **kw: Any) -> Daemon:
    return Daemon(
        DaemonConfig(
            bootstrap_servers=kafka_env.bootstrap_servers,
            policy=foundation(),
            prefix=kafka_env.prefix,
            group_id=kafka_env.group("daemon"),
            run_ticker=False,
            idempotence=kafka_env.broker.capabilities.idempotent_producer,
            door=Door().without_window(),
            checkpoint_interval_s=0.0,  # a checkpoint after every batch that changed a shard
            **kw,
        )
    )


class _Crash(Exception):
    pass


async def _refused_then_crash(kafka_env: Any, monkeypatch: Any, p: Any, caps: ModelConfig) -> list[bytes]:
    """A daemon that refuses 11 invented pools (over ``caps``), dead-letters them at their tick's cut
    and crashes before the checkpoint and commit covering them; returns the refused records' bytes."""
    invented = [
        to_bytes(telemetry(f"inv-{i}/0", f"inv-{i}", ts_ms=1500 + i)) for i in range(12)
    ]  # keyed like the real pool: its partition; inv-0 fits under the cap, the 11 others do not
    crashes = {"after-publish": 0}
    real_reach = faults.reach

    def reach(point: str) -> None:
        real_reach(point)
        if point == "after-publish" and crashes["after-publish"] == 1:
            crashes["after-publish"] += 1
            raise _Crash("crash after publishing, before the checkpoint and the commit")
        if point == "after-publish":
            crashes["after-publish"] += 1

    monkeypatch.setattr(faults, "reach", reach)
    first = _daemon(kafka_env, model=caps)
    stop = asyncio.Event()
    task = asyncio.create_task(first.run(stop))
    await asyncio.wait_for(first.ready.wait(), 60)
    await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=900) for n in NODES])
    await send(p, kafka_env, TICKS, [Tick(ts_ms=1000, tick_id=1, pool_id="p")])
    await wait_decided(first, 1000, timeout_s=60)  # decided, checkpointed (interval 0), committed
    await send(p, kafka_env, TELEMETRY, [*invented, *(to_bytes(telemetry(n, ts_ms=1900)) for n in NODES)])
    await send(p, kafka_env, TICKS, [Tick(ts_ms=2000, tick_id=2, pool_id="p")])
    with pytest.raises(TaskDied):
        await asyncio.wait_for(task, 60)
    assert first.stats.dead_by_reason.get("capacity-pools") == 11
    monkeypatch.setattr(faults, "reach", real_reach)
    return invented[1:]


async def test_records_refused_by_a_cap_are_dead_lettered_once_across_a_crash(
    kafka_env: Any, monkeypatch: Any
) -> None:
    """Caps refuse records at their tick's cut, after they were read: each still reaches the
    dead-letter topic with its reason, and a crash after that (before the checkpoint and commit
    covering them) does not dead-letter them again when the restarted daemon folds them again."""
    caps = ModelConfig(max_pools=2)
    async with producer(kafka_env) as p:
        refused_bytes = await _refused_then_crash(kafka_env, monkeypatch, p, caps)
        second = await _restarted_decides_tick_3(kafka_env, p, caps)
        assert second.stats.shards_restored >= 1
        # One read of the dead-letter topic for the whole assignment, however many shards it restored.
        assert second.stats.dead_letter_scans == 1
        assert second.stats.dead_letter_marks_lost == 0
        assert second.stats.dead_letters_suppressed == 11  # folded again, refused again, not re-sent
        assert second.stats.dead_by_reason.get("capacity-pools", 0) == 0
    letters = await read_all(kafka_env, DEADLETTER, until=lambda rs: len(rs) >= 11, timeout_s=10)
    sources = [dict(r.headers)["fleetloop.source"] for r in letters]
    refused = [r for r in letters if dict(r.headers)["fleetloop.error"].startswith(b"capacity-pools")]
    assert len(refused) == 11, sources
    assert len(set(sources)) == len(sources), "a dead letter published twice"
    assert {dict(r.headers)["fleetloop.stage"] for r in refused} == {b"fold"}
    assert sorted(r.value for r in refused) == sorted(refused_bytes)


async def test_dead_letters_removed_by_retention_are_said_and_counted_at_restore(
    kafka_env: Any, monkeypatch: Any
) -> None:
    """If retention removed the dead-letter range after a shard's checkpoint, the restore cannot
    tell which refusals were published before the crash: it says so in one line, counts it, and
    publishes them again (at least once, never lost)."""
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

    caps = ModelConfig(max_pools=2)
    async with producer(kafka_env) as p:
        await _refused_then_crash(kafka_env, monkeypatch, p, caps)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_env.bootstrap_servers)
        await admin.start()
        try:
            dl = TopicPartition(kafka_env.topic(DEADLETTER), 0)
            end = await _end_offset(kafka_env, dl)
            try:
                await admin.delete_records({dl: RecordsToDelete(end)})
            except Exception as exc:  # a broker without DeleteRecords
                pytest.skip(f"{kafka_env.broker.kind} cannot delete records: {type(exc).__name__}")
        finally:
            await admin.close()
        second = await _restarted_decides_tick_3(kafka_env, p, caps)
    assert second.stats.dead_letter_scans == 1
    assert second.stats.dead_letter_marks_lost >= 1
    assert second.stats.dead_by_reason.get("capacity-pools") == 11  # published again, not lost


async def _restarted_decides_tick_3(kafka_env: Any, p: Any, caps: ModelConfig) -> Daemon:
    """A daemon started after ``_refused_then_crash``, run until it decides the real pool's tick 3."""
    second = _daemon(kafka_env, model=caps)
    stop = asyncio.Event()
    task = asyncio.create_task(second.run(stop))
    try:
        await asyncio.wait_for(second.ready.wait(), 60)
        await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=2900) for n in NODES])
        await send(p, kafka_env, TICKS, [Tick(ts_ms=3000, tick_id=3, pool_id="p")])
        await wait_decided(second, 3000, timeout_s=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    return second


async def _end_offset(kafka_env: Any, tp: TopicPartition) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_env.bootstrap_servers)
    await consumer.start()
    try:
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()


async def test_a_tick_whose_decision_raises_is_published_as_skipped_with_the_reason(
    kafka_env: Any, monkeypatch: Any
) -> None:
    real = shard_module.decide

    def decide(snap: Any, policy: Any, state: Any, tick: Tick, offsets: Any) -> Any:
        if tick.pool_id == "boom":
            raise ArithmeticError("a policy bug")
        return real(snap, policy, state, tick, offsets)

    real_many = shard_module.decide_many

    def decide_many(snap: Any, policy: Any, states: Any, ticks: Any, offsets: Any) -> Any:
        # The shard decides a boundary's pools in one call; "boom" makes that batch raise too, so
        # the shard falls back to deciding its ticks one by one and only "boom"'s tick fails.
        if any(t.pool_id == "boom" for t in ticks):
            raise ArithmeticError("a policy bug")
        return real_many(snap, policy, states, ticks, offsets)

    monkeypatch.setattr(shard_module, "decide", decide)
    monkeypatch.setattr(shard_module, "decide_many", decide_many)
    async with running_daemon(kafka_env) as daemon, producer(kafka_env) as p:
        await send(p, kafka_env, TELEMETRY, [telemetry("b/0", "boom", ts_ms=900)], key=b"p")
        await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=900) for n in NODES])
        await send(p, kafka_env, TICKS, [Tick(ts_ms=1000, tick_id=1, pool_id="boom")], key=b"p")
        await send(p, kafka_env, TICKS, [Tick(ts_ms=1000, tick_id=1, pool_id="p")])
        await wait_decided(daemon, 1000, timeout_s=60)
        assert daemon.stats.ticks_failed == 1
        assert daemon.stats.ticks_no_data == 0
        await send(p, kafka_env, TICKS, [Tick(ts_ms=2000, tick_id=2, pool_id="p")])
        await wait_decided(daemon, 2000, timeout_s=60)  # the marker was read back: it changes nothing
        assert daemon.stats.ticks_skipped == 0
        assert daemon.stats.ticks_decided == 2  # the real pool's two ticks
    ticks = await read_all(kafka_env, TICKS, until=lambda rs: len(rs) >= 4, timeout_s=10)
    marked = [r for r in ticks if dict(r.headers or ()).get(SKIPPED_HEADER)]
    assert len(marked) == 1
    assert Tick.model_validate_json(marked[0].value).pool_id == "boom"
    reason = dict(marked[0].headers)[SKIPPED_HEADER].decode()
    assert reason.startswith("decide-failed: ArithmeticError: a policy bug"), reason


async def test_a_partition_receiving_only_garbage_is_committed_past_it(kafka_env: Any) -> None:
    """A partition whose records are all refused at the door holds no pool, so no tick ever cuts
    it; its records are dead-lettered when read, and the group commits past them all the same
    (before, its committed offset stayed where it was for good)."""
    from aiokafka.partitioner import DefaultPartitioner

    async with running_daemon(kafka_env) as daemon, producer(kafka_env) as p:
        ids = sorted(await p.partitions_for(kafka_env.topic(TELEMETRY)))
        assert len(ids) > 1, "the test needs a partition the real pool does not use"
        partitioner = DefaultPartitioner()
        real = partitioner(b"p", ids, ids)
        key = next(k for i in range(100) if partitioner(k := f"junk-{i}".encode(), ids, ids) != real)
        junk = partitioner(key, ids, ids)
        garbage = [b"not json", b'{"ts_ms": "soon"}', b"\xff\xfe", b"[]", b"{}"] * 4
        for logical in (TELEMETRY, REQUESTS):
            for value in garbage:
                await p.send(kafka_env.topic(logical), value=value, key=key)
        await p.flush()
        # The real pool keeps the daemon's loop turning (batches, commits).
        await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=900) for n in NODES])
        await send(p, kafka_env, TICKS, [Tick(ts_ms=1000, tick_id=1, pool_id="p")])
        await wait_decided(daemon, 1000, timeout_s=60)
        deadline = clock.monotonic_s() + 60
        while daemon.stats.dead_letters < 2 * len(garbage) and clock.monotonic_s() < deadline:
            await asyncio.sleep(0.1)
        assert daemon.stats.dead_letters == 2 * len(garbage), dict(daemon.stats.dead_by_reason)
        held = daemon.shards[junk]
        assert not held.model.pools
        assert not held.pending_pools
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_env.bootstrap_servers, group_id=kafka_env.group("daemon")
        )
        await consumer.start()
        try:
            tps = [TopicPartition(kafka_env.topic(logical), junk) for logical in (TELEMETRY, REQUESTS)]
            # Only the garbage went there (a fresh topic): offsets 0..len-1 (the embedded broker's
            # ListOffsets has answered short of that, so the count is the reference).
            end = dict.fromkeys(tps, len(garbage))
            committed: dict[TopicPartition, int | None] = {}
            while clock.monotonic_s() < deadline:
                committed = {tp: await consumer.committed(tp) for tp in tps}
                if all((committed[tp] or 0) >= end[tp] for tp in tps):
                    break
                await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=950) for n in NODES])  # a batch
                await asyncio.sleep(0.2)
            assert all((committed[tp] or 0) >= end[tp] for tp in tps), (committed, end)
            # Only the commit moved: the shard's folded offsets (what decisions record) did not.
            assert held.folded == dict.fromkeys((TELEMETRY, REQUESTS), 0)
        finally:
            await consumer.stop()
