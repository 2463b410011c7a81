"""A rebalance while the loop awaits the broker must not kill the consumer task.

aiokafka's per-partition calls (``seek``, ``pause``, ``resume``, ``highwater``,
``last_poll_timestamp``) assert that the partition is assigned, and the group's rebalance callbacks
run beside the daemon's loop, so a partition listed before an await may be gone after it: a
survivor in ``test_scale_out[kafka]`` died so ("AssertionError: Partition is not assigned"). The
broker adapter makes such a call a no-op or an unknown figure (the port's contract), and the
assignment's helpers rely on that.

So these tests run the helpers on the adapter (``_GroupConsumer``) over aiokafka's own consumer,
never started: the assignment, pause state, positions and assertions are aiokafka's, and only what
a broker would answer (offsets, a fetch's figures) is given here. A partition is taken (or given)
during an await; each test fails if the adapter stops shielding the helpers from the assertion, or
if a helper stops doing what it means to with such a partition. A restore that saw the assignment
move restores again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaPartition
from fleetloop.core.shard import INPUTS
from fleetloop.daemon.runtime.assignment import LOOK_AGAIN_S, Assignment
from fleetloop.daemon.runtime.kafka import _GroupConsumer
from fleetloop.daemon.runtime.port import (
    DecisionPublisher,
    GroupConsumer,
    PolicyReader,
    Producer,
    TopicPartition,
)
from fleetloop.schemas.topics import TICKS
from tests.support.runtime_harness import rig
from tests.support.virtual_time import FakeClock, run_virtual

A, B, C = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)


def _k(tp: TopicPartition) -> KafkaPartition:
    return KafkaPartition(tp.topic, tp.partition)


class _Aio(AIOKafkaConsumer):  # type: ignore[misc]
    """aiokafka's consumer, never started (no broker). ``give`` is a rebalance (aiokafka's
    ``assign``, which like the group's starts every partition afresh), ``fetched`` what its fetcher
    records of a fetch answer; ``end_offsets`` answers 5 for each partition, running ``during``
    (what the group and the fetcher do meanwhile) within its next round trip."""

    def __init__(self) -> None:
        super().__init__(bootstrap_servers="localhost:1")
        self.during: Callable[[], None] = lambda: None

    def give(self, *tps: TopicPartition) -> None:
        self.assign([_k(tp) for tp in tps])

    def fetched(self, tp: TopicPartition, *, highwater: int, at_ms: int) -> None:
        state = self._subscription.subscription.assignment.state_value(_k(tp))
        state.highwater, state.timestamp = highwater, at_ms

    def seek(self, partition: KafkaPartition, offset: int) -> None:
        self._subscription.seek(partition, offset)  # what its fetcher does of a seek (raises if not assigned)

    def sought(self) -> dict[TopicPartition, int]:
        """The positions of the partitions assigned that were sought."""
        states = self._subscription.subscription.assignment
        return {
            TopicPartition(k.topic, k.partition): states.state_value(k).position
            for k in self.assignment()
            if states.state_value(k).has_valid_position
        }

    async def beginning_offsets(self, partitions: Sequence[KafkaPartition]) -> dict[KafkaPartition, int]:
        return dict.fromkeys(partitions, 0)

    async def end_offsets(self, partitions: Sequence[KafkaPartition]) -> dict[KafkaPartition, int]:
        await asyncio.sleep(0)
        during, self.during = self.during, lambda: None
        during()
        return dict.fromkeys(partitions, 5)

    async def committed(self, partition: KafkaPartition) -> int | None:
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class _Session:
    """The rig's session (the port's) with another group consumer."""

    producer: Producer
    consumer: GroupConsumer
    policies: PolicyReader
    publisher: DecisionPublisher


Check = Callable[[Assignment, _Aio], Awaitable[None]]


def _on_adapter(check: Check) -> None:
    """Run ``check`` on an assignment part whose group consumer is the adapter over ``_Aio``."""

    async def run(clock: FakeClock) -> None:
        async with rig(clock) as r:
            aio = _Aio()
            try:
                s = r.session
                r.link.session = _Session(s.producer, _GroupConsumer(aio), s.policies, s.publisher)
                await check(r.assignment(), aio)
            finally:
                await aio.stop()

    run_virtual(run)


def test_end_offsets_of_a_partition_taken_during_the_await() -> None:
    async def check(assignment: Assignment, aio: _Aio) -> None:
        aio.give(A, B)
        aio.fetched(A, highwater=3, at_ms=1_000)
        aio.fetched(B, highwater=9, at_ms=1_000)

        def during() -> None:
            aio.give(A)  # a rebalance took B
            aio.fetched(A, highwater=7, at_ms=2_000)  # and A's first fetch after it answered

        aio.during = during
        end = await assignment.end_offsets([A, B])
        assert end == {A: 7, B: 5}  # the high watermark where the client still knows it

    _on_adapter(check)


def test_an_assignment_goes_on_with_what_a_rebalance_left_it() -> None:
    """A rebalance takes the ticks partition while the assignment awaits the broker's end offsets:
    the assignment pauses, seeks and resumes the partitions it still has (the consumer skips the
    one taken), and none is left paused."""

    async def check(assignment: Assignment, aio: _Aio) -> None:
        inputs = [assignment.parts.tp(k, 0) for k in INPUTS]
        aio.give(*inputs, assignment.parts.tp(TICKS, 0))
        aio.during = lambda: aio.give(*inputs)
        await assignment.assign(sorted(aio.assignment()))
        assert assignment.ready.is_set()
        assert set(aio.paused()) == set()
        assert aio.sought() == dict.fromkeys(inputs, 0)  # the warm-up's start: nothing committed

    _on_adapter(check)


async def _look(
    assignment: Assignment,
    aio: _Aio,
    listed: list[TopicPartition],
    moves: Callable[[], Coroutine[Any, Any, None]],
) -> None:
    """``look_again(listed)`` with the listed partitions assigned paused (as the assignment holds
    them) and ``moves`` beside it; the look still lasts its second."""
    aio.pause(*[_k(tp) for tp in listed if _k(tp) in aio.assignment()])
    clock = assignment.clock
    t0 = clock.monotonic_s()
    task = asyncio.create_task(moves())
    await assignment.look_again(listed)
    await task
    assert clock.monotonic_s() - t0 >= LOOK_AGAIN_S


def test_look_again_stops_waiting_for_a_partition_taken_while_it_waits() -> None:
    """B, listed before any fetch of it, is taken: it reads None then as before, and no fetch of it
    is coming. The look pauses A again as soon as A's fetch answers, not at the end of its second."""
    seen: list[set[KafkaPartition]] = []

    async def check(assignment: Assignment, aio: _Aio) -> None:
        aio.give(A, B)

        async def moves() -> None:
            await asyncio.sleep(0.05)
            aio.give(A)  # a rebalance took B
            await asyncio.sleep(0.03)
            seen.append(set(aio.paused()))  # A not fetched yet: still waited for
            aio.fetched(A, highwater=7, at_ms=2_000)
            await asyncio.sleep(0.05)
            seen.append(set(aio.paused()))

        await _look(assignment, aio, [A, B], moves)

    _on_adapter(check)
    assert seen == [set(), {_k(A)}]


def test_look_again_leaves_a_partition_assigned_while_it_waits_to_its_assignment() -> None:
    """C, listed but not assigned as the look starts, is given during the wait: that assignment
    pauses and resumes it; the look neither waits for it nor pauses it at its end."""
    paused: list[set[KafkaPartition]] = []

    async def check(assignment: Assignment, aio: _Aio) -> None:
        aio.give(A)
        aio.fetched(A, highwater=3, at_ms=1_000)

        async def moves() -> None:
            await asyncio.sleep(0.05)
            aio.give(A, C)  # a rebalance gave C (its assignment resumed what it holds)
            aio.fetched(A, highwater=7, at_ms=2_000)

        await _look(assignment, aio, [A, C], moves)
        paused.append(set(aio.paused()))

    _on_adapter(check)
    assert paused == [{_k(A)}]


def _restore(moves: bool) -> bool:
    """Run one ``Assignment.restore`` over one assigned partition; when ``moves``, the group's
    callbacks run during its await (as they do beside the loop). Returns whether the loop is to
    restore again."""
    needed: list[bool] = []

    async def check(assignment: Assignment, aio: _Aio) -> None:
        aio.give(TopicPartition(next(iter(assignment.parts.logical)), 0))

        async def assign(assigned: Any) -> None:
            await asyncio.sleep(0)
            if moves:
                assignment.parts.generation += 1

        assignment.assign = assign  # type: ignore[method-assign]
        assignment.needed = True
        await assignment.restore()
        needed.append(assignment.needed)

    _on_adapter(check)
    return needed[0]


def test_restore_that_saw_the_assignment_move_restores_again() -> None:
    assert _restore(moves=False) is False
    assert _restore(moves=True) is True
