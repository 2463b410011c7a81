"""The broker port's adapter: the runtime's every call to Kafka, made with aiokafka.

The only module of the runtime that imports aiokafka (a contract in ``.importlinter``); the rest
of the runtime sees the Protocols of :mod:`fleetloop.daemon.runtime.port`. The clients' settings
and why they differ from aiokafka's defaults are here, next to the calls they shape.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import CommitFailedError, KafkaConnectionError, KafkaError, KafkaTimeoutError
from aiokafka.structs import OffsetAndMetadata

from fleetloop.core import checkpoint
from fleetloop.daemon.act.publish import Publisher
from fleetloop.daemon.runtime.config import DaemonConfig
from fleetloop.daemon.runtime.follower import active_of
from fleetloop.daemon.runtime.port import Rebalance, Record, TopicPartition
from fleetloop.kafka_security import connect
from fleetloop.schemas.control import ActivePolicy
from fleetloop.schemas.topics import POLICY, topic_name

# Above any record the broker accepts (Kafka's default limit is 1 MiB): a record larger than the
# fetch size would stall the partition; fetched, the door refuses it.
MAX_FETCH_BYTES = 2 * 1024 * 1024


def _kafka(tp: TopicPartition) -> KafkaPartition:
    return KafkaPartition(tp.topic, tp.partition)


def _ours(tp: Any) -> TopicPartition:
    return TopicPartition(tp.topic, tp.partition)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, listener: Rebalance) -> None:
        self.listener = listener

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.listener.on_revoked(sorted(_ours(tp) for tp in revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.listener.on_assigned(sorted(_ours(tp) for tp in assigned))


class _GroupConsumer:
    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._c = consumer

    def subscribe(self, topics: Sequence[str], listener: Rebalance) -> None:
        self._c.subscribe(sorted(topics), listener=_Listener(listener))

    async def getmany(
        self, *, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, Sequence[Record]]:
        # Keyed by aiokafka's TopicPartition: a named tuple equal to (and hashed as) the port's.
        batch: Mapping[TopicPartition, Sequence[Record]] = await self._c.getmany(
            timeout_ms=timeout_ms, max_records=max_records
        )
        return batch

    def assignment(self) -> set[TopicPartition]:
        return {_ours(tp) for tp in self._c.assignment()}

    # aiokafka's per-partition accessors assert that the partition is assigned, and its coordinator
    # runs in a task of its own: a rebalance can take a partition during any await of the runtime,
    # between the runtime's look at the assignment and its call. A daemon died of that assertion
    # ("Partition is not assigned") when a second member joined. So here a partition not assigned
    # is not an error: seeking, pausing or resuming it does nothing (the next assignment seeks,
    # pauses and resumes what it is given), and its high watermark and last poll are unknown.

    def _mine(self, tp: TopicPartition) -> KafkaPartition | None:
        k = _kafka(tp)
        return k if k in self._c.assignment() else None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if (k := self._mine(tp)) is not None:
            self._c.seek(k, offset)

    def pause(self, *tps: TopicPartition) -> None:
        mine = self._c.assignment()
        self._c.pause(*[k for k in map(_kafka, tps) if k in mine])

    def resume(self, *tps: TopicPartition) -> None:
        mine = self._c.assignment()
        self._c.resume(*[k for k in map(_kafka, tps) if k in mine])

    def highwater(self, tp: TopicPartition) -> int | None:
        k = self._mine(tp)
        high: int | None = self._c.highwater(k) if k is not None else None
        return high

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        k = self._mine(tp)
        at: int | None = self._c.last_poll_timestamp(k) if k is not None else None
        return at

    async def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        got = await self._c.beginning_offsets([_kafka(tp) for tp in tps])
        return {_ours(tp): int(o) for tp, o in got.items()}

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        got = await self._c.end_offsets([_kafka(tp) for tp in tps])
        return {_ours(tp): int(o) for tp, o in got.items()}

    async def committed(self, tp: TopicPartition) -> int | None:
        offset: int | None = await self._c.committed(_kafka(tp))
        return offset

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        await self._c.commit({_kafka(tp): OffsetAndMetadata(o, "") for tp, o in offsets.items()})

    async def topics(self) -> set[str]:
        names: set[str] = await self._c.topics()
        return names


class _PolicyReader:
    def __init__(self, consumer: AIOKafkaConsumer, topic: str) -> None:
        self._c = consumer
        self._tp = KafkaPartition(topic, 0)

    async def start_at(self, offset: int | None) -> None:
        self._c.assign([self._tp])
        if offset is not None:
            self._c.seek(self._tp, offset)
        else:
            await self._c.seek_to_beginning()

    async def poll(self, timeout_ms: int) -> list[Record]:
        batch = await self._c.getmany(timeout_ms=timeout_ms)
        return sorted((r for rs in batch.values() for r in rs), key=lambda r: r.offset)


@dataclass(frozen=True, slots=True)
class KafkaSession:
    producer: AIOKafkaProducer
    consumer: _GroupConsumer
    policies: _PolicyReader
    publisher: Publisher


class KafkaBroker:
    """The runtime's broker: Kafka (or any broker speaking its protocol) through aiokafka."""

    error = KafkaError

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.policy_topic = topic_name(config.prefix, POLICY)

    def transient(self, exc: BaseException) -> bool:
        return isinstance(exc, (KafkaConnectionError, KafkaTimeoutError)) or (
            isinstance(exc, KafkaError) and exc.retriable
        )

    def commit_failed(self, exc: BaseException) -> bool:
        return isinstance(exc, CommitFailedError)

    def timeout_error(self) -> Exception:
        err: Exception = KafkaTimeoutError()
        return err

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[KafkaSession]:
        """The producer, the group consumer and the policy reader, started in that order and
        stopped in reverse; the publisher on the producer."""
        cfg = self.config
        producer = AIOKafkaProducer(
            **connect(cfg.bootstrap_servers),
            client_id=f"{cfg.client_id}-producer",
            acks="all",
            enable_idempotence=cfg.idempotence,
            linger_ms=5,
            # A tick's decisions (two records per node: control.decisions and control.state) go
            # out in a few batches instead of one per 16 KiB (the client's default), which took
            # ~200 ms of round trips per publish at 1,000 nodes and held the loop (and the next
            # records and ticks) while it waited.
            max_batch_size=checkpoint.CHUNK_BYTES,
            max_request_size=2 * checkpoint.CHUNK_BYTES,
        )
        consumer = AIOKafkaConsumer(
            **connect(cfg.bootstrap_servers),
            client_id=cfg.client_id,
            group_id=cfg.group_id,
            group_instance_id=cfg.group_instance_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            partition_assignment_strategy=(RangePartitionAssignor,),
            max_poll_records=cfg.max_batch,
            # A fetch answers within 20 ms even when the broker does not answer it as soon as
            # records arrive (the embedded broker holds an empty fetch for the whole wait: with the
            # client's default 500 ms, and still with 100 ms, the loop read its own ticks back ~45 ms
            # after they were acknowledged, on the breaker-latency path). Costs at most fifty empty
            # fetches a second on an idle partition set.
            fetch_max_wait_ms=20,
            # Short sessions: the embedded broker completes a join in about half the session timeout.
            session_timeout_ms=int(cfg.session_timeout_s * 1000),
            heartbeat_interval_ms=int(min(1.0, cfg.session_timeout_s / 6.0) * 1000),
            # Not the session timeout (the client's default): a revoke that checkpoints a large
            # shard outlasts it, and the member dropped for it rejoins into another rebalance.
            rebalance_timeout_ms=int(max(cfg.rebalance_timeout_s, cfg.session_timeout_s) * 1000),
            max_partition_fetch_bytes=MAX_FETCH_BYTES,
            # A fetch that the broker never answers (seen on the embedded broker under floods)
            # stalls every partition until it times out: 15 s, not the client's default 40 s.
            request_timeout_ms=15_000,
        )
        policy_consumer = AIOKafkaConsumer(
            **connect(cfg.bootstrap_servers),
            client_id=f"{cfg.client_id}-policy",
            enable_auto_commit=False,
            max_partition_fetch_bytes=MAX_FETCH_BYTES,
        )
        await producer.start()
        try:
            await consumer.start()
            try:
                await policy_consumer.start()
                yield KafkaSession(
                    producer,
                    _GroupConsumer(consumer),
                    _PolicyReader(policy_consumer, self.policy_topic),
                    Publisher(producer, cfg.prefix, int(cfg.state_refresh_s * 1000)),
                )
            finally:
                await policy_consumer.stop()
                await consumer.stop()
        finally:
            await producer.stop()

    async def read_log(self, topic: str, *, client: str, fetch_bytes: int | None = None) -> list[Record]:
        cfg = self.config
        sizes = {} if fetch_bytes is None else {"max_partition_fetch_bytes": fetch_bytes}
        consumer = AIOKafkaConsumer(
            **connect(cfg.bootstrap_servers),
            client_id=f"{cfg.client_id}-{client}",
            enable_auto_commit=False,
            **sizes,
        )
        await consumer.start()
        try:
            return await _read_to_end(consumer, topic)
        finally:
            await consumer.stop()

    async def read_tail(self, topic: str, since: int, *, client: str) -> tuple[list[Record], int, int]:
        cfg = self.config
        consumer = AIOKafkaConsumer(
            **connect(cfg.bootstrap_servers),
            client_id=f"{cfg.client_id}-{client}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_partition_fetch_bytes=MAX_FETCH_BYTES,
        )
        await consumer.start()
        records: list[Record] = []
        try:
            tp = KafkaPartition(topic, 0)
            consumer.assign([tp])
            first = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            start = max(since, first)
            if start >= end:
                return records, first, end
            consumer.seek(tp, start)
            while await consumer.position(tp) < end:
                batch = await consumer.getmany(tp, timeout_ms=500)
                records.extend(batch.get(tp, ()))
        finally:
            await consumer.stop()
        return records, first, end


async def _read_to_end(consumer: AIOKafkaConsumer, topic: str) -> list[Record]:
    """Every record of ``topic``'s partition 0 from its beginning to its end, as it grows while read
    (``consumer`` started, not subscribed)."""
    tp = KafkaPartition(topic, 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    end = (await consumer.end_offsets([tp]))[tp]
    records: list[Record] = []
    while await consumer.position(tp) < end:
        batch = await consumer.getmany(tp, timeout_ms=500)
        records.extend(batch.get(tp, ()))
        end = max(end, consumer.highwater(tp) or 0)
    return records


async def read_active(consumer: AIOKafkaConsumer, topic: str, group: str) -> ActivePolicy | None:
    """The newest ActivePolicy for ``group`` on ``topic`` (``consumer`` started, not subscribed)."""
    return active_of(await _read_to_end(consumer, topic), group)
