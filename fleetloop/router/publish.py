"""OutcomePublisher: each call's RequestOutcome to ``fleet.requests``, never blocking the caller.

``publish()`` is synchronous and O(1): it puts the outcome on a bounded in-memory queue and returns
(False, counted in ``stats.dropped``, when the queue is full: a router must not stall its request
path because Kafka is slow; fleetloop reads a missing outcome as missing, never as "no demand").
A background task serializes and sends them, keyed by pool id (docs/operations.md, "Topics"), and waits for
acknowledgements in batches. ``stop()`` flushes what is queued. A call the router moved to another
model's pool (``routed_from`` set) also goes out as its copy keyed by the pool it was moved from
(:func:`fleetloop.schemas.requests.diverted_copy`), so the shard that sizes that pool counts it
wherever the two pools' partitions fall; ``stats.sent`` counts both records. ``start()`` refuses a
missing or misfit ``fleet.requests`` rather than let the first send auto-create it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from fleetloop.kafka_security import Bootstrap, connect
from fleetloop.schemas.requests import RequestOutcome, diverted_copy
from fleetloop.schemas.topics import REQUESTS, topic_name
from fleetloop.topic_layout import require_topics


@dataclass(slots=True)
class PublisherStats:
    queued: int = 0
    sent: int = 0
    dropped: int = 0
    failed: int = 0
    last_error: str = ""


class OutcomePublisher:
    """``await start()``, then ``publish(outcome)`` per call, ``await stop()`` to flush."""

    def __init__(
        self,
        bootstrap_servers: Bootstrap,
        *,
        topic_prefix: str = "",
        max_pending: int = 10_000,
        producer_options: Mapping[str, Any] | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        self.topic = topic_name(topic_prefix, REQUESTS)
        self._bootstrap = bootstrap_servers
        self._prefix = topic_prefix
        self.stats = PublisherStats()
        opts: dict[str, Any] = {"acks": "all", "linger_ms": 5}
        opts.update(producer_options or {})
        self._producer = AIOKafkaProducer(**connect(bootstrap_servers), **opts)
        self._queue: asyncio.Queue[RequestOutcome | None] = asyncio.Queue(max_pending)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Check ``fleet.requests`` (raises :class:`~fleetloop.topic_layout.TopicLayoutError` naming
        it when it is missing or laid out otherwise than fleetloop reads it), then connect.

        Checked once, here: the first send names the topic, and a broker that auto-creates topics
        would create a missing one with its own partition count, which ``fleetloop run`` refuses.
        """
        await require_topics(self._bootstrap, self._prefix, [REQUESTS], cleanup=True)
        await self._producer.start()
        self._task = asyncio.create_task(self._run(), name="fleetloop-router-publish")

    def publish(self, outcome: RequestOutcome) -> bool:
        try:
            self._queue.put_nowait(outcome)
        except asyncio.QueueFull:
            self.stats.dropped += 1
            return False
        self.stats.queued += 1
        return True

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(None)  # flush what is queued, then end
            try:
                await asyncio.wait_for(task, 10.0)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
        await self._producer.stop()

    async def _run(self) -> None:
        q = self._queue
        while True:
            first = await q.get()
            batch = [first]
            while not q.empty() and len(batch) < 1000:
                batch.append(q.get_nowait())
            futures = []
            end = False
            for o in batch:
                if o is None:
                    end = True
                    continue
                copy = diverted_copy(o)
                for rec in (o,) if copy is None else (o, copy):
                    value = orjson.dumps(rec.model_dump(mode="json"))
                    try:
                        futures.append(
                            await self._producer.send(self.topic, value=value, key=rec.pool_id.encode())
                        )
                    except KafkaError as exc:
                        self.stats.failed += 1
                        self.stats.last_error = str(exc)
            for f in asyncio.as_completed(futures):
                try:
                    await f
                    self.stats.sent += 1
                except KafkaError as exc:
                    self.stats.failed += 1
                    self.stats.last_error = str(exc)
            if end:
                return
