"""The Kafka adapter's per-partition calls on a partition a rebalance has taken.

aiokafka asserts that a partition is assigned in ``seek``, ``pause``, ``resume``, ``highwater`` and
``last_poll_timestamp``, and its coordinator changes the assignment in a task of its own, so any
await of the runtime can end with a partition gone. The adapter (``_GroupConsumer``) makes such a
call a no-op or an unknown figure, for every call site at once: a daemon in
``test_scale_out[kafka]`` died of the assertion in its consumer task when a second member joined.
"""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition as KafkaPartition
from fleetloop.daemon.runtime.kafka import _GroupConsumer
from fleetloop.daemon.runtime.port import TopicPartition

MINE = TopicPartition("fleet.telemetry", 0)
GONE = TopicPartition("fleet.telemetry", 1)


class _AioConsumer:
    """What the adapter calls of ``AIOKafkaConsumer``, asserting as aiokafka does."""

    def __init__(self) -> None:
        self.mine = {KafkaPartition(MINE.topic, MINE.partition)}
        self.calls: list[tuple[str, Any]] = []

    def assignment(self) -> set[KafkaPartition]:
        return set(self.mine)

    def _assert(self, tp: KafkaPartition) -> None:
        assert tp in self.mine, "Partition is not assigned"

    def seek(self, tp: KafkaPartition, offset: int) -> None:
        self._assert(tp)
        self.calls.append(("seek", (tp.partition, offset)))

    def pause(self, *tps: KafkaPartition) -> None:
        for tp in tps:
            self._assert(tp)
        self.calls.append(("pause", tuple(tp.partition for tp in tps)))

    def resume(self, *tps: KafkaPartition) -> None:
        for tp in tps:
            self._assert(tp)
        self.calls.append(("resume", tuple(tp.partition for tp in tps)))

    def highwater(self, tp: KafkaPartition) -> int:
        self._assert(tp)
        return 42

    def last_poll_timestamp(self, tp: KafkaPartition) -> int:
        self._assert(tp)
        return 1_000


def test_a_partition_not_assigned_is_no_error_and_an_assigned_one_is_served() -> None:
    aio = _AioConsumer()
    consumer = _GroupConsumer(aio)  # type: ignore[arg-type]
    consumer.seek(GONE, 5)
    consumer.seek(MINE, 7)
    consumer.pause(MINE, GONE)
    consumer.resume(GONE, MINE)
    assert aio.calls == [("seek", (0, 7)), ("pause", (0,)), ("resume", (0,))]
    assert (consumer.highwater(MINE), consumer.highwater(GONE)) == (42, None)
    assert (consumer.last_poll_timestamp(MINE), consumer.last_poll_timestamp(GONE)) == (1_000, None)
