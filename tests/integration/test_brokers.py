"""Both real brokers do what fleetloop relies on, and their capability flags tell the truth."""

from __future__ import annotations

import asyncio
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from fleetloop.daemon.brokers import (
    KAFKA_CAPABILITIES,
    TANSU_CAPABILITIES,
    ApacheKafka,
    BrokerStartError,
    ProcessBroker,
    probe_capabilities,
)
from fleetloop.schemas.topics import DECISIONS, STATE, TELEMETRY, TOPICS

STEP_S = 30  # bound on any one broker round trip in these tests


async def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], **extra: Any) -> list[Any]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **extra)
    try:
        await producer.start()  # inside: a failed start (InitProducerId on Tansu) still needs stop()
        return [await producer.send_and_wait(topic, value, key=key) for key, value in records]
    finally:
        await producer.stop()


async def _read_all(bootstrap: str, topic: str, partitions: int, count: int) -> list[Any]:
    """``count`` records from every partition of ``topic``, from the beginning, without a group."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        await consumer.seek_to_beginning()
        got: list[Any] = []
        async with asyncio.timeout(STEP_S):
            while len(got) < count:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(batch)
        return got
    finally:
        await consumer.stop()


def test_broker_listens_on_loopback_only(broker: ProcessBroker) -> None:
    assert broker.bootstrap_servers.startswith("127.0.0.1:")
    assert broker.running
    assert broker.log_path.exists()


async def test_registry_topics_exist_with_their_partitions(kafka_env: Any) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_env.bootstrap_servers)
    await admin.start()
    try:
        names = {kafka_env.topic(logical): spec for logical, spec in TOPICS.items()}
        described = await admin.describe_topics(sorted(names))
    finally:
        await admin.close()
    partitions = {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}
    assert partitions == {name: spec.partitions for name, spec in names.items()}


async def test_produce_consume_round_trip_keeps_keys_and_per_key_order(kafka_env: Any) -> None:
    topic = kafka_env.topic(TELEMETRY)  # 4 partitions, keyed by pool
    records = [(f"pool-{i % 3}".encode(), f"v{i}".encode()) for i in range(12)]
    sent = await _produce(kafka_env.bootstrap_servers, topic, records)
    got = await _read_all(kafka_env.bootstrap_servers, topic, TOPICS[TELEMETRY].partitions, len(records))

    assert sorted((r.key, r.value) for r in got) == sorted(records)
    partition_of: dict[bytes, set[int]] = defaultdict(set)
    for (key, _), meta in zip(records, sent, strict=True):
        partition_of[key].add(meta.partition)
    assert all(len(p) == 1 for p in partition_of.values()), "one key must map to one partition"
    for key in partition_of:
        assert [r.value for r in got if r.key == key] == [v for k, v in records if k == key]


async def test_group_commit_then_new_consumer_resumes_after_it(kafka_env: Any) -> None:
    """At least once: a consumer of the same group starts right after the committed offset.

    Partitions are assigned by hand, as a restarted instance that owns them would: offsets are
    committed to and fetched from the group coordinator without a rebalance (which on Tansu takes
    seconds, see the next test).
    """
    topic = kafka_env.topic(DECISIONS)  # 1 partition: offsets are a total order
    await _produce(kafka_env.bootstrap_servers, topic, [(b"e", f"d{i}".encode()) for i in range(6)])
    partition = TopicPartition(topic, 0)

    async def read_then_commit(count: int) -> list[Any]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_env.bootstrap_servers,
            group_id=kafka_env.group("resume"),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            consumer.assign([partition])
            async with asyncio.timeout(STEP_S):
                read = [await consumer.getone() for _ in range(count)]
                await consumer.commit({partition: read[-1].offset + 1})
                assert await consumer.committed(partition) == read[-1].offset + 1
            return read
        finally:
            await consumer.stop()

    assert [(r.offset, r.value) for r in await read_then_commit(3)] == [(0, b"d0"), (1, b"d1"), (2, b"d2")]
    assert [(r.offset, r.value) for r in await read_then_commit(2)] == [(3, b"d3"), (4, b"d4")]


async def test_subscribed_group_member_gets_every_partition(kafka_env: Any) -> None:
    """JoinGroup / SyncGroup / Heartbeat: a lone member of a group is assigned every partition."""
    topic = kafka_env.topic(TELEMETRY)
    await _produce(kafka_env.bootstrap_servers, topic, [(b"pool-a", b"t0")])
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_env.bootstrap_servers,
        group_id=kafka_env.group("members"),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,  # Tansu's join takes about half of it (measured), Kafka's is immediate
        heartbeat_interval_ms=500,
    )
    await consumer.start()
    try:
        async with asyncio.timeout(STEP_S):
            record = await consumer.getone()
        assignment = consumer.assignment()
    finally:
        await consumer.stop()
    assert (record.key, record.value) == (b"pool-a", b"t0")
    assert assignment == {TopicPartition(topic, p) for p in range(TOPICS[TELEMETRY].partitions)}


async def test_registry_cleanup_policies_are_set(kafka_env: Any) -> None:
    """control.state and control.policy are compacted, the rest delete (DescribeConfigs on both)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_env.bootstrap_servers)
    await admin.start()
    try:
        resources = [ConfigResource(ConfigResourceType.TOPIC, kafka_env.topic(t)) for t in sorted(TOPICS)]
        responses = await admin.describe_configs(resources)
    finally:
        await admin.close()
    policies: dict[str, str] = {}
    for response in responses:
        for error_code, _msg, _type, name, entries in response.resources:
            assert error_code == 0, name
            policies[name] = {entry[0]: entry[1] for entry in entries}["cleanup.policy"]
    assert policies == {kafka_env.topic(t): spec.cleanup for t, spec in TOPICS.items()}
    assert policies[kafka_env.topic(STATE)] == "compact"


async def test_idempotent_producer_works_where_capabilities_say_so(kafka_env: Any) -> None:
    topic = kafka_env.topic(STATE)
    expected = {"kafka": KAFKA_CAPABILITIES, "tansu": TANSU_CAPABILITIES}[kafka_env.broker.kind]
    assert kafka_env.broker.capabilities == expected
    if kafka_env.broker.capabilities.idempotent_producer:
        sent = await _produce(
            kafka_env.bootstrap_servers, topic, [(b"node-1", b"w=0.5")], enable_idempotence=True
        )
        got = await _read_all(kafka_env.bootstrap_servers, topic, TOPICS[STATE].partitions, 1)
        assert [(r.key, r.value, r.offset) for r in got] == [(b"node-1", b"w=0.5", sent[0].offset)]
    else:  # the measured Tansu limit: InitProducerId answers UnknownError
        with pytest.raises(KafkaError):
            await asyncio.wait_for(
                _produce(kafka_env.bootstrap_servers, topic, [(b"k", b"v")], enable_idempotence=True),
                STEP_S,
            )


async def test_probe_capabilities_matches_the_broker_and_cleans_up(kafka_env: Any) -> None:
    scratch = f"{kafka_env.prefix}.probe"
    probed = await asyncio.wait_for(
        probe_capabilities(kafka_env.bootstrap_servers, scratch_topic=scratch), 2 * STEP_S
    )
    assert probed == kafka_env.broker.capabilities

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_env.bootstrap_servers)
    await admin.start()
    try:
        async with asyncio.timeout(STEP_S):  # deletion is asynchronous on Apache Kafka
            while scratch in await admin.list_topics():
                await asyncio.sleep(0.1)
    finally:
        await admin.close()


def test_kafka_that_dies_at_start_quotes_its_console(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JVM that cannot start: BrokerStartError says so, with the JVM's own words (needs the jars)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a failed start keeps its dir: keep it here
    broker = ApacheKafka(heap_mb=1, start_timeout_s=60)
    with pytest.raises(BrokerStartError) as caught:
        broker.start()
    text = str(caught.value)
    assert text.startswith("kafka broker failed to start: process exited with code 1")
    assert "heap" in text.lower()
    assert not broker.running
