"""A rebalance while the loop awaits the broker must not kill the consumer task.

aiokafka's per-partition accessors (``highwater``, ``last_poll_timestamp``) assert that the
partition is assigned. The group's rebalance callbacks run beside the daemon's loop, so a
partition listed before an await may be gone after it: a survivor in ``test_scale_out[kafka]``
died so once ("AssertionError: Partition is not assigned"). These tests take a
partition away during the await and check that the loop's helpers go on, and that a restore that
saw the assignment move restores again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from fleetloop.daemon.runtime.assignment import Assignment
from fleetloop.daemon.runtime.port import TopicPartition
from tests.support.runtime_harness import rig
from tests.support.virtual_time import FakeClock, run_virtual


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


Check = Callable[[Assignment], Awaitable[None]]


def _with(consumer: Any, check: Check) -> None:
    """Run ``check`` on an assignment part whose group consumer is ``consumer``."""

    async def run(clock: FakeClock) -> None:
        async with rig(clock) as r:
            r.link.session = dataclasses.replace(r.session, consumer=consumer)
            await check(r.assignment())

    run_virtual(run)


def test_end_offsets_of_a_partition_taken_during_the_await() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)

    async def check(assignment: Assignment) -> None:
        end = await assignment.end_offsets([a, b])
        assert end == {a: 7, b: 5}  # the high watermark where the client still knows it

    _with(_Consumer([a, b], take=b), check)


def test_look_again_skips_a_partition_taken_while_it_waits() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer = _Consumer([a, b], take=b)

    async def check(assignment: Assignment) -> None:
        async def rebalance() -> None:
            await asyncio.sleep(0.05)
            consumer.mine.discard(b)
            await asyncio.sleep(0.05)
            consumer.polls[a] = 2.0  # a's fetch answered

        task = asyncio.create_task(rebalance())
        await assignment.look_again([a, b])  # raised AssertionError before: b was read after it was taken
        await task

    _with(consumer, check)


def _restore(moves: bool) -> bool:
    """Run one ``Assignment.restore`` over one assigned partition; when ``moves``, the group's
    callbacks run during its await (as they do beside the loop). Returns whether the loop is to
    restore again."""
    consumer = _Consumer([], take=TopicPartition("none", 0))
    needed: list[bool] = []

    async def check(assignment: Assignment) -> None:
        consumer.mine = {TopicPartition(next(iter(assignment.parts.logical)), 0)}

        async def assign(assigned: Any) -> None:
            await asyncio.sleep(0)
            if moves:
                assignment.parts.generation += 1

        assignment.assign = assign  # type: ignore[method-assign]
        assignment.needed = True
        await assignment.restore()
        needed.append(assignment.needed)

    _with(consumer, check)
    return needed[0]


def test_restore_that_saw_the_assignment_move_restores_again() -> None:
    assert _restore(moves=False) is False
    assert _restore(moves=True) is True
