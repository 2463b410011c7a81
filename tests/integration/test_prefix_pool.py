"""kafka_env's prefixes, made ahead by the session's pool, on both brokers: each fresh, with every
registry topic laid out as fleetloop makes it, empty and answering ListOffsets."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition
from fleetloop.daemon.brokers import ProcessBroker
from fleetloop.daemon.brokers.admin import missing_topics, registry_topics
from fleetloop.topic_layout import layout_problems, topic_partitions
from tests.support.prefixes import PrefixPool


async def test_pooled_prefixes_are_fresh_complete_empty_and_servable(
    broker: ProcessBroker, prefix_pool: PrefixPool
) -> None:
    taken = [await asyncio.to_thread(prefix_pool.take) for _ in range(4)]
    assert len(set(taken)) == 4
    counts = await topic_partitions(broker.bootstrap_servers)
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    try:
        for prefix in taken:
            assert await missing_topics(broker.bootstrap_servers, prefix) == []
            assert layout_problems(prefix, counts) == []
            parts = [
                TopicPartition(str(t.name), p)
                for t in registry_topics(prefix)
                for p in range(t.num_partitions)
            ]
            ends = await asyncio.wait_for(consumer.end_offsets(parts), 30)  # nothing in them
            assert set(ends.values()) == {0}, ends
    finally:
        await consumer.stop()
