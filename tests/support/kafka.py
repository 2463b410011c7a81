"""Kafka helpers for integration tests: run the daemon in process, produce, read a topic."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from fleetloop.daemon.observe.decode import Door
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.policies.registry import CompiledPolicy
from fleetloop.schemas import Decision
from tests.support.policies import foundation
from tests.support.records import to_bytes


@contextlib.asynccontextmanager
async def running_daemon(
    env: Any, group: str = "daemon", policy: CompiledPolicy | None = None, door: Door | None = None
) -> AsyncIterator[Daemon]:
    """A daemon in process. ``door`` defaults to the production bounds without the event-time
    window: the tests' records carry synthetic event times (seconds after epoch 0)."""
    daemon = Daemon(
        DaemonConfig(
            bootstrap_servers=env.bootstrap_servers,
            policy=policy or foundation(),
            prefix=env.prefix,
            group_id=env.group(group),
            run_ticker=False,
            idempotence=env.broker.capabilities.idempotent_producer,
            door=door or Door().without_window(),
        )
    )
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    try:
        await asyncio.wait_for(daemon.ready.wait(), 60)
        yield daemon
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


@contextlib.asynccontextmanager
async def producer(env: Any) -> AsyncIterator[AIOKafkaProducer]:
    p = AIOKafkaProducer(bootstrap_servers=env.bootstrap_servers, acks="all")
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def send(
    p: AIOKafkaProducer, env: Any, logical: str, records: Sequence[Any], key: bytes = b"p"
) -> None:
    for r in records:
        value = r if isinstance(r, bytes) else to_bytes(r)
        await p.send(env.topic(logical), value=value, key=key)
    await p.flush()


async def read_all(env: Any, logical: str, *, until: Any = None, timeout_s: float = 30.0) -> list[Any]:
    """Every record on a topic from the beginning; waits until ``until(records)`` holds."""
    consumer = AIOKafkaConsumer(
        env.topic(logical), bootstrap_servers=env.bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    records: list[Any] = []
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                batch = await consumer.getmany(timeout_ms=200)
                for rs in batch.values():
                    records.extend(rs)
                if until is None and not batch:
                    return records
                if until is not None and until(records):
                    return records
    except TimeoutError:
        return records
    finally:
        await consumer.stop()


def decisions_of(records: Sequence[Any]) -> list[Decision]:
    return [Decision.model_validate_json(r.value) for r in records]


async def wait_decided(daemon: Daemon, tick_ms: int, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while daemon.stats.last_decision_ts_ms < tick_ms:
            await asyncio.sleep(0.05)
