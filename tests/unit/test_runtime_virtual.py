"""The runtime on the in-memory broker in virtual time: the whole daemon (ticker, loop, restore,
checkpoints, commits) against a broker double, so its timing rules (overload, an outage's catch-up,
restores, rebalances) run in milliseconds and the same way every time. What a test checks is what
the topics hold and what ``fleetloop replay`` makes of them. Integration tests run the same daemon
on the real brokers."""

from __future__ import annotations

import asyncio
import zlib

import pytest
from fleetloop.daemon.runtime import Daemon
from fleetloop.schemas.topics import CHECKPOINT, DEADLETTER, TELEMETRY, topic_name
from tests.support.memory_broker import MemoryBroker
from tests.support.runtime_harness import (
    TICK_MS,
    crash,
    daemon,
    decided_ticks,
    fleet,
    replay,
    running,
    skipped,
    ticks,
)
from tests.support.virtual_time import FakeClock, run_virtual

T0 = 1_800_000_000_000
FIRST = T0 // TICK_MS + 1  # the first boundary after the start


def pools_by_partition(partitions: int = 2) -> list[str]:
    """One pool name per partition of the pool-keyed topics (the memory broker's partitioner)."""
    found: dict[int, str] = {}
    for i in range(100):
        name = f"pool-{i}"
        found.setdefault(zlib.crc32(name.encode()) % partitions, name)
    return [found[p] for p in range(partitions)]


def covered(pool_ticks: list[tuple[int, tuple[str, int] | None]]) -> list[int]:
    """Every boundary a pool's tick records stand for, in order: a tick its own, a skipped record
    each boundary from its first skipped tick id to its own."""
    out: list[int] = []
    for tick_id, skip in pool_ticks:
        out.extend(range(skip[1], tick_id + 1) if skip else [tick_id])
    return out


def records_of(broker: MemoryBroker, pool: str) -> list[tuple[int, tuple[str, int] | None]]:
    return [(t.tick_id, skipped(h)) for t, h in ticks(broker, pool)]


def test_a_daemon_ticks_and_decides_every_boundary_and_replay_reproduces_it() -> None:
    async def main(clock: FakeClock) -> tuple[list[int], list[int], bool, int]:
        broker = MemoryBroker(clock)
        d = daemon(broker, clock)
        async with running(d):
            await fleet(broker, clock, ["a", "b"], T0 + 10 * TICK_MS)
        report = replay(broker, d)
        published = [t for t, skip in records_of(broker, "a") if skip is None]
        return published, decided_ticks(broker, "a"), report.exact, report.ticks_compared

    published, decided, exact, compared = run_virtual(main, wall_ms=T0)
    assert published == list(range(FIRST, FIRST + len(published)))
    assert len(published) >= 9
    assert decided == published
    assert exact
    assert compared == 2 * len(published)


def _overloaded(limit: int) -> tuple[list[float], list[tuple[int, tuple[str, int] | None]], Daemon]:
    """A daemon whose loop takes 0.7 s per tick it decides (two pools: 1.4 s per boundary of 1 s),
    for 60 s: how far behind its newest decision is, sampled every second; pool a's tick records."""

    async def main(clock: FakeClock) -> tuple[list[float], list[tuple[int, tuple[str, int] | None]], Daemon]:
        broker = MemoryBroker(clock, stage_delay_s=0.7)
        d = daemon(broker, clock, overload_max_ticks=limit)
        behind: list[float] = []

        async def sample() -> None:
            while True:
                await asyncio.sleep(1.0)
                if d.stats.last_decision_ts_ms:
                    behind.append((clock.wall_ms() - d.stats.last_decision_ts_ms) / 1000.0)

        async with running(d):
            sampler = asyncio.create_task(sample())
            await fleet(broker, clock, ["a", "b"], T0 + 60 * TICK_MS)
            sampler.cancel()
        return behind, records_of(broker, "a"), d

    return run_virtual(main, wall_ms=T0)


def test_overload_holds_ticks_back_and_publishes_the_boundaries_between_as_skipped() -> None:
    """The shard decides more slowly than the boundaries come: the ticker holds a pool's next tick
    back while ``overload_max_ticks`` of its boundaries wait, then publishes those it held back as
    one skipped record ("overload: ...") and the newest boundary. The decisions stay a few seconds
    behind instead of falling further behind at every boundary (the rule off: without bound)."""
    behind, records, d = _overloaded(2)
    assert max(behind[10:]) < 8.0, behind
    skips = [skip for _, skip in records if skip]
    assert skips
    assert all(reason.startswith("overload: ") for reason, _ in skips)
    boundaries = covered(records)
    assert boundaries == list(range(boundaries[0], boundaries[0] + len(boundaries)))  # each once
    assert d.stats.ticks_overload == sum(t - skip[1] + 1 for t, skip in records if skip) * 2
    assert d.stats.overload_episodes >= 1

    unbounded, records, d = _overloaded(0)
    assert unbounded[-1] > 15.0, unbounded
    assert not any(skip for _, skip in records)
    assert d.stats.ticks_overload == 0


@pytest.mark.parametrize("catchup", [5, 600])
def test_an_outage_beyond_the_catch_up_is_one_skipped_record_and_the_newest_boundaries_decided(
    catchup: int,
) -> None:
    """A daemon stops; 30 s later the next starts (its group resumes from the checkpoint). It
    publishes the boundaries missed meanwhile late and decides them from the recorded inputs; more
    than ``catchup_max_ticks`` of them go out as one skipped record ("outage: ...") per pool and
    only the newest ``catchup_max_ticks`` are decided."""

    async def main(clock: FakeClock) -> tuple[list[tuple[int, tuple[str, int] | None]], list[int], bool]:
        broker = MemoryBroker(clock)
        feed = asyncio.create_task(fleet(broker, clock, ["a", "b"], T0 + 45 * TICK_MS))
        async with running(daemon(broker, clock)):
            await asyncio.sleep(5.0)
        await asyncio.sleep(30.0)  # no daemon: nobody ticks
        second = daemon(broker, clock, catchup_max_ticks=catchup)
        async with running(second):
            await feed
        return records_of(broker, "a"), decided_ticks(broker, "a"), replay(broker, second).exact

    records, decided, exact = run_virtual(main, wall_ms=T0)
    boundaries = covered(records)
    assert boundaries == list(range(FIRST, FIRST + len(boundaries)))  # every boundary, once
    skips = [(t, skip) for t, skip in records if skip]
    if catchup == 600:
        assert skips == []
        assert decided == boundaries
    else:
        ((through, (reason, first)),) = skips
        assert reason == f"outage: {through - first + 1} ticks missed, beyond the catch-up of {catchup}"
        assert through - first + 1 > 20  # about 30 s missed
        after = [t for t, skip in records if not skip and t > through]
        assert after[:catchup] == list(range(through + 1, through + 1 + catchup))
        assert decided == [t for t in boundaries if not first <= t <= through]
    assert exact


def _restart_after_a_crash(lose_checkpoint: bool) -> tuple[Daemon, bool, int]:
    async def main(clock: FakeClock) -> tuple[Daemon, bool, int]:
        broker = MemoryBroker(clock)
        feed = asyncio.create_task(fleet(broker, clock, pools_by_partition(), T0 + 14 * TICK_MS))
        first = daemon(broker, clock, checkpoint_interval_s=2.0)
        task = asyncio.create_task(first.run(asyncio.Event()))
        await asyncio.sleep(7.5)
        await crash(first, task)  # no last checkpoint, no last commit
        if lose_checkpoint:
            broker.logs.pop((topic_name(broker.prefix, CHECKPOINT), 0))
        second = daemon(broker, clock, checkpoint_interval_s=2.0, warmup_records=0)
        async with running(second):
            await feed
        report = replay(broker, second)
        return second, report.exact, report.ticks_compared

    return run_virtual(main, wall_ms=T0)


def test_a_restart_restores_each_shard_from_its_checkpoint_and_decides_exactly() -> None:
    """A daemon dies between checkpoints; the next restores each shard from its newest checkpoint,
    folds the records after it again and decides again (without publishing) the ticks its
    predecessor had committed: every decision on control.decisions, before and after the crash, is
    the one replay makes from the topics. Without the checkpoint (and no warm-up) it is not."""
    second, exact, compared = _restart_after_a_crash(lose_checkpoint=False)
    assert second.stats.shards_restored == 2
    assert second.stats.ticks_restored > 0  # decided again to rebuild the state, not republished
    assert exact
    assert compared > 2 * 10
    second, exact, _ = _restart_after_a_crash(lose_checkpoint=True)
    assert second.stats.shards_restored == 0
    assert not exact


def test_a_partition_the_group_hands_to_another_instance_is_forgotten_and_decided_there() -> None:
    """A second instance joins: the first is left with partition 0 and forgets partition 1 (its
    shard and everything kept about it), which the second restores from the checkpoint the first
    wrote at the revoke. Every boundary of both pools is decided once, as replay decides it."""
    pools = pools_by_partition()

    async def main(clock: FakeClock) -> tuple[list[list[int]], Daemon, dict[str, list[int]], bool]:
        broker = MemoryBroker(clock)
        feed = asyncio.create_task(fleet(broker, clock, pools, T0 + 12 * TICK_MS))
        first, second = daemon(broker, clock), daemon(broker, clock)
        async with running(first):
            await asyncio.sleep(5.0)
            owned = [sorted(first.shards)]
            async with running(second):
                await feed
                await asyncio.sleep(1.5)
                owned += [sorted(first.shards), sorted(second.shards)]
        return owned, second, {p: decided_ticks(broker, p) for p in pools}, replay(broker, second).exact

    owned, second, decided, exact = run_virtual(main, wall_ms=T0)
    assert owned == [[0, 1], [0], [1]]
    assert second.stats.shards_restored == 1
    for pool, ids in decided.items():
        assert ids == list(range(FIRST, FIRST + len(ids))), pool
        assert len(ids) >= 12
    assert exact


def test_an_emptied_broker_is_detected_and_the_shards_start_clean() -> None:
    """The broker comes back empty (an in-memory broker restarted): the daemon finds its read
    positions beyond the partitions' ends, says so, starts its shards clean on what the broker has
    and goes on deciding."""

    async def main(clock: FakeClock) -> tuple[Daemon, list[int]]:
        broker = MemoryBroker(clock)
        feed = asyncio.create_task(fleet(broker, clock, ["a"], T0 + 12 * TICK_MS))
        d = daemon(broker, clock)
        async with running(d):
            await asyncio.sleep(5.5)
            broker.wipe()
            await feed
        return d, decided_ticks(broker, "a")

    d, decided = run_virtual(main, wall_ms=T0)
    assert d.stats.shards_started_clean >= 1
    assert decided  # decided again after the broker came back empty
    assert decided[-1] >= FIRST + 10


def test_a_record_refused_at_the_door_is_dead_lettered_once_across_a_crash() -> None:
    """A malformed record: the daemon that read it dead-letters it and dies before a checkpoint
    covers it; the next restores the older checkpoint, reads the record again, finds its dead letter
    on the dead-letter topic after the checkpoint's mark and does not publish it twice."""
    pool = pools_by_partition()[0]

    async def main(clock: FakeClock) -> tuple[list[bytes], Daemon]:
        broker = MemoryBroker(clock)
        feed = asyncio.create_task(fleet(broker, clock, [pool], T0 + 9 * TICK_MS))
        first = daemon(broker, clock, checkpoint_interval_s=2.0)
        task = asyncio.create_task(first.run(asyncio.Event()))
        await asyncio.sleep(4.2)  # a checkpoint at about 2 s and 4 s after the start
        broker.append(topic_name(broker.prefix, TELEMETRY), b"{not json", pool.encode())
        await asyncio.sleep(1.5)
        assert first.stats.dead_letters == 1
        await crash(first, task)  # before the next checkpoint
        second = daemon(broker, clock, checkpoint_interval_s=2.0)
        async with running(second):
            await feed
        sources = [dict(r.headers)["fleetloop.source"] for r in broker.records(DEADLETTER)]
        return sources, second

    sources, second = run_virtual(main, wall_ms=T0)
    assert len(sources) == 1, sources
    assert second.stats.shards_restored >= 1
    assert second.stats.dead_letter_scans == 1
    assert second.stats.dead_letters_suppressed == 1
