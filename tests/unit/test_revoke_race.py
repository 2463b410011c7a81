"""A rebalance while the loop awaits the broker must not kill the consumer task.

aiokafka's per-partition accessors (``highwater``, ``last_poll_timestamp``) assert that the
partition is assigned. The group's rebalance callbacks run beside the daemon's loop, so a
partition listed before an await may be gone after it: a survivor in ``test_scale_out[kafka]``
died so once ("AssertionError: Partition is not assigned", session 10). These tests take a
partition away during the await and check that the loop's helpers go on, and that a restore that
saw the assignment move restores again.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.policies.registry import builtin_policy


class _Consumer:
    """The accessors the runtime uses, asserting as aiokafka's do; ``take`` is removed from the
    assignment at the first await."""

    def __init__(self, tps: list[TopicPartition], take: TopicPartition) -> None:
        self.mine = set(tps)
        self.take = take
        self.polls = dict.fromkeys(tps, 1.0)

    def assignment(self) -> set[TopicPartition]:
        return set(self.mine)

    def _assert(self, tp: TopicPartition) -> None:
        assert tp in self.mine, "Partition is not assigned"

    def highwater(self, tp: TopicPartition) -> int:
        self._assert(tp)
        return 7

    def last_poll_timestamp(self, tp: TopicPartition) -> float:
        self._assert(tp)
        return self.polls[tp]

    def resume(self, *tps: TopicPartition) -> None:
        for tp in tps:
            self._assert(tp)

    def pause(self, *tps: TopicPartition) -> None:
        for tp in tps:
            self._assert(tp)

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        await asyncio.sleep(0)
        self.mine.discard(self.take)  # a rebalance ran during the await
        return dict.fromkeys(tps, 5)


def _daemon(consumer: Any) -> Daemon:
    daemon = Daemon(DaemonConfig(bootstrap_servers="127.0.0.1:9", policy=builtin_policy("default")))
    daemon._link.session = SimpleNamespace(consumer=consumer)  # type: ignore[assignment]
    return daemon


def test_end_offsets_of_a_partition_taken_during_the_await() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    daemon = _daemon(_Consumer([a, b], take=b))
    end = asyncio.run(daemon._end_offsets([a, b]))
    assert end == {a: 7, b: 5}  # the high watermark where the client still knows it


def test_look_again_skips_a_partition_taken_while_it_waits() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer = _Consumer([a, b], take=b)

    async def run() -> None:
        async def rebalance() -> None:
            await asyncio.sleep(0.05)
            consumer.mine.discard(b)
            await asyncio.sleep(0.05)
            consumer.polls[a] = 2.0  # a's fetch answered

        task = asyncio.create_task(rebalance())
        await _daemon(consumer)._look_again([a, b])
        await task

    asyncio.run(run())  # raised AssertionError before: b was read after it was taken


def _restore(moves: bool) -> bool:
    """Run one ``_restore_assignment`` over one assigned partition; when ``moves``, the group's
    callbacks run during its await (as they do beside the loop). Returns ``_restore_needed``."""
    consumer = _Consumer([], take=TopicPartition("none", 0))
    daemon = _daemon(consumer)
    consumer.mine = {TopicPartition(next(iter(daemon._topics)), 0)}

    async def on_assigned(assigned: Any) -> None:
        await asyncio.sleep(0)
        if moves:
            daemon._assign_gen += 1

    daemon._on_assigned = on_assigned  # type: ignore[method-assign]
    daemon._restore_needed = True
    asyncio.run(daemon._restore_assignment())
    return daemon._restore_needed


def test_restore_that_saw_the_assignment_move_restores_again() -> None:
    assert _restore(moves=False) is False
    assert _restore(moves=True) is True
