"""Topic setup from the registry, and capability probing of a broker of unknown kind.

Nothing here names a topic in a Metadata request before knowing it exists (why:
:mod:`fleetloop.topic_layout`, which also holds the layout rules and the creating-nothing checks
that the daemon, the edges and the router library share).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewTopic

from fleetloop.clock import wall_ms
from fleetloop.daemon.brokers.base import BrokerCapabilities
from fleetloop.kafka_security import Bootstrap, connect
from fleetloop.schemas.topics import POOL_KEYED_INPUTS, TOPICS, topic_name
from fleetloop.topic_layout import (
    TopicLayoutError,
    admin_client,
    cleanup_policies,
    layout_problems,
    partition_counts,
)

TOPIC_ALREADY_EXISTS: Final = 36
REPLICATION_FACTOR: Final = 1


class TopicSetupError(RuntimeError):
    """The broker refused to create a topic (for a reason other than "it already exists")."""

    def __init__(self, topic: str, error_code: int, message: str | None) -> None:
        self.topic = topic
        self.error_code = error_code
        super().__init__(f"cannot create topic {topic!r}: error {error_code} ({message or 'no message'})")


def registry_topics(prefix: str, partitions_override: Mapping[str, int] | None = None) -> list[NewTopic]:
    """One ``NewTopic`` per registry entry: its partitions (or the override), cleanup policy, RF 1."""
    overrides = dict(partitions_override or {})
    if unknown := sorted(set(overrides) - set(TOPICS)):
        raise KeyError(f"partitions_override names unknown topics {unknown}; known: {sorted(TOPICS)}")
    return [
        NewTopic(
            topic_name(prefix, logical),
            overrides.get(logical, spec.partitions),
            REPLICATION_FACTOR,
            topic_configs={"cleanup.policy": spec.cleanup},
        )
        for logical, spec in sorted(TOPICS.items())
    ]


async def create_topics(admin: Any, topics: list[NewTopic], *, timeout_s: float = 30.0) -> None:
    """Create ``topics`` (existing ones are fine) and wait until every partition has a leader."""
    response = await admin.create_topics(topics, timeout_ms=int(timeout_s * 1000))
    for topic, error_code, *rest in response.topic_errors:
        if error_code not in (0, TOPIC_ALREADY_EXISTS):
            raise TopicSetupError(topic, error_code, rest[0] if rest else None)
    expected = {str(t.name): int(t.num_partitions) for t in topics}
    async with asyncio.timeout(timeout_s):
        while True:
            ready = {
                str(t["topic"]): len(t["partitions"])
                for t in await admin.describe_topics(sorted(expected))
                if t["error_code"] == 0 and t["partitions"] and all(p["leader"] >= 0 for p in t["partitions"])
            }
            # The callers check partition counts (ensure_topics before creating anything).
            if set(ready) >= set(expected):
                return
            await asyncio.sleep(0.05)


async def ensure_topics(
    bootstrap_servers: Bootstrap, prefix: str, *, partitions_override: dict[str, int] | None = None
) -> None:
    """Create every missing topic of the registry under ``prefix`` with its partitions and
    ``cleanup.policy`` (replication factor 1), after checking the existing ones.

    An existing topic laid out otherwise than fleetloop relies on (:func:`layout_problems`) raises
    :class:`TopicLayoutError` before anything is created. A missing pool-keyed input gets the
    partition count of the existing ones, so the three stay co-partitioned.
    """
    registry_topics(prefix, partitions_override)  # unknown names: KeyError before connecting
    async with admin_client(bootstrap_servers, timeout_ms=30_000) as admin:
        counts = await partition_counts(admin)
        existing = {lg: counts[n] for lg in TOPICS if (n := topic_name(prefix, lg)) in counts}
        policies = await cleanup_policies(admin, sorted(topic_name(prefix, lg) for lg in existing))
        if problems := layout_problems(prefix, counts, policies):
            raise TopicLayoutError(
                f"{'; '.join(problems)} (delete or fix it, or use another --topic-prefix;"
                " see docs/operations.md, Topics)"
            )
        # Existing topics keep their counts; a missing pool-keyed input takes the existing ones'.
        pooled = [existing[lg] for lg in POOL_KEYED_INPUTS if lg in existing]
        follow = dict.fromkeys(POOL_KEYED_INPUTS, pooled[0]) if pooled else {}
        planned = registry_topics(prefix, {**(partitions_override or {}), **follow, **existing})
        missing = [t for t in planned if str(t.name) not in counts]
        if problems := layout_problems(prefix, {str(t.name): int(t.num_partitions) for t in missing}):
            raise TopicLayoutError(f"partitions_override: {'; '.join(problems)}")
        if missing:
            await create_topics(admin, missing)
    await wait_servable(bootstrap_servers, planned)


async def wait_servable(
    bootstrap_servers: Bootstrap, topics: list[NewTopic], *, timeout_s: float = 30.0
) -> None:
    """Wait until every partition answers ListOffsets.

    Apache Kafka lists a new partition's leader in metadata a moment before that leader serves it
    (NotLeaderOrFollower in between); aiokafka retries ListOffsets through that window.
    """
    partitions = [TopicPartition(str(t.name), p) for t in topics for p in range(int(t.num_partitions))]
    consumer = AIOKafkaConsumer(**connect(bootstrap_servers), enable_auto_commit=False)
    try:
        async with asyncio.timeout(timeout_s):
            await consumer.start()
            await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()


async def missing_topics(bootstrap_servers: Bootstrap, prefix: str) -> list[str]:
    """The registry topics under ``prefix`` the broker does not have (sorted physical names)."""
    async with admin_client(bootstrap_servers) as admin:
        existing = set(await admin.list_topics())
    return sorted({topic_name(prefix, logical) for logical in TOPICS} - existing)


async def delete_topics(bootstrap_servers: Bootstrap, prefix: str) -> None:
    """Delete every registry topic under ``prefix`` (missing ones are fine): tests clean up with it."""
    async with admin_client(bootstrap_servers, timeout_ms=30_000) as admin:
        existing = set(await admin.list_topics())
        doomed = sorted(existing & {topic_name(prefix, logical) for logical in TOPICS})
        if doomed:
            await admin.delete_topics(doomed)


async def _supports_idempotence(bootstrap_servers: Bootstrap, topic: str) -> bool:
    producer = AIOKafkaProducer(**connect(bootstrap_servers), enable_idempotence=True, acks="all")
    # The client logs the broker's refusal as an error; here a refusal is an answer, not a fault.
    sender_log = logging.getLogger("aiokafka.producer.sender")
    level = sender_log.level
    sender_log.setLevel(logging.CRITICAL)
    try:
        async with asyncio.timeout(15):
            await producer.start()  # InitProducerId happens here
            await producer.send_and_wait(topic, b"idempotent", key=b"probe")
    except Exception:  # UnknownError on Tansu; any failure means "do not turn it on"
        return False
    finally:
        with contextlib.suppress(Exception):
            await producer.stop()
        sender_log.setLevel(level)
    return True


async def _supports_offsets_for_times(bootstrap_servers: Bootstrap, topic: str) -> bool:
    """Two records at known times; ListOffsets must find the second by time, and nothing past it.

    Fails on Tansu (it searches append time) and on a broker that overwrites record timestamps
    (``LogAppendTime``): either way a replay cannot seek by event time there.
    """
    first_ms = wall_ms() - 60_000  # recent: inside any message.timestamp.{before,after}.max.ms
    partition = TopicPartition(topic, 0)
    producer = AIOKafkaProducer(**connect(bootstrap_servers), acks="all")
    consumer = AIOKafkaConsumer(**connect(bootstrap_servers), enable_auto_commit=False)
    try:
        async with asyncio.timeout(15):
            await producer.start()
            sent = [
                await producer.send_and_wait(topic, b"at", key=b"probe", partition=0, timestamp_ms=ts)
                for ts in (first_ms, first_ms + 1000)
            ]
            await consumer.start()
            found = await consumer.offsets_for_times({partition: first_ms + 1})
            beyond = await consumer.offsets_for_times({partition: first_ms + 10_000_000})
    finally:
        with contextlib.suppress(Exception):
            await producer.stop()
        with contextlib.suppress(Exception):
            await consumer.stop()
    hit = found.get(partition)
    return (
        hit is not None
        and hit.offset == sent[1].offset
        and hit.timestamp == first_ms + 1000
        and beyond.get(partition) is None
    )


async def probe_capabilities(
    bootstrap_servers: Bootstrap, *, scratch_topic: str | None = None
) -> BrokerCapabilities:
    """What a user-supplied broker of unknown kind can do, found by trying it on a scratch topic.

    Creates ``scratch_topic`` (default ``fleetloop-probe-<random>``, one partition), writes three small
    records, and deletes it again.
    """
    topic = scratch_topic or f"fleetloop-probe-{uuid.uuid4().hex[:12]}"
    async with admin_client(bootstrap_servers) as admin:
        try:
            await create_topics(admin, [NewTopic(topic, 1, REPLICATION_FACTOR)], timeout_s=15)
            offsets_for_times = await _supports_offsets_for_times(bootstrap_servers, topic)
            idempotent = await _supports_idempotence(bootstrap_servers, topic)
            return BrokerCapabilities(idempotent_producer=idempotent, offsets_for_times=offsets_for_times)
        finally:
            with contextlib.suppress(Exception):
                await admin.delete_topics([topic])
