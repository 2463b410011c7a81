"""Publishing decisions and dead letters.

Every decision goes to ``control.decisions`` (the audit log replay compares against); enforced
ones also go to ``control.state`` (compacted: the newest desired state per key). The decisions of a
shadow policy (a document run beside the enforcing one) go to ``control.shadow`` only: routers never
read it, and replay's log stays the enforcing policy's alone. Values are
canonical JSON (sorted keys), so the same decision is the same bytes in a live run and a replay.
``publish`` (and ``flush`` after ``stage``) returns only when the broker acknowledged every record
(acks=all): the caller commits input offsets after that, never before (at-least-once; a duplicate
decision is harmless).

A dead letter carries the original key and bytes, except when they would not fit: a value larger
than ``MAX_DEAD_LETTER_COPY`` (or a key larger than ``MAX_DEAD_LETTER_KEY``) is cut to that size
and the headers say so, with the original length and its sha256, so no record can make the
dead-letter copy exceed the producer's request limit. A dead letter the broker still refuses is
counted and logged by the caller, never raised: the record it stood for is committed past anyway.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder

from fleetloop.daemon.observe.decode import DeadLetter, digest
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.topics import DEADLETTER, DECISIONS, SHADOW, STATE, topic_name


def decision_bytes(decision: Decision) -> bytes:
    return orjson.dumps(decision.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


def _raise_if_transient(exc: Exception) -> None:
    """A broker that is away is the caller's to wait out (it retries); anything else is counted."""
    if isinstance(exc, (KafkaConnectionError, KafkaTimeoutError)) or (
        isinstance(exc, KafkaError) and exc.retriable
    ):
        raise exc


_PARTITIONER = DefaultPartitioner()
MAX_DEAD_LETTER_COPY = 64 * 1024  # far below any broker's or producer's default 1 MiB limit
MAX_DEAD_LETTER_KEY = 1024


def dead_letter_headers(d: DeadLetter, stage: str) -> list[tuple[str, bytes]]:
    headers = [
        ("fleetloop.error", d.reason.encode()),
        ("fleetloop.source", f"{d.topic}:{d.partition}:{d.offset}".encode()),
        ("fleetloop.stage", stage.encode()),
    ]
    value = d.value or b""
    if len(value) > MAX_DEAD_LETTER_COPY:
        headers.append(("fleetloop.truncated", str(len(value)).encode()))
        headers.append(("fleetloop.sha256", digest(value).encode()))
    if d.key is not None and len(d.key) > MAX_DEAD_LETTER_KEY:
        headers.append(("fleetloop.key_truncated", str(len(d.key)).encode()))
        headers.append(("fleetloop.key_sha256", digest(d.key).encode()))
    return headers


def dead_letter_record(d: DeadLetter, stage: str) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) of the copy published for ``d``: bounded whatever ``d`` holds."""
    key = d.key[:MAX_DEAD_LETTER_KEY] if d.key is not None else None
    value = (d.value or b"")[:MAX_DEAD_LETTER_COPY]
    return key, value, dead_letter_headers(d, stage)


class Publisher:
    """Decisions go out as each pool is decided (:meth:`stage`), in record batches the client
    sends in the background; :meth:`flush` returns once the broker acknowledged every one. One
    ``send`` call per record cost ~9 us of the loop's time (~2,900 records a tick at 1,000 nodes,
    29,000 at 10,000): appending to a batch costs ~1 us, and the loop never waits on a round trip
    between pools (bench/results/latency-s6.md)."""

    def __init__(self, producer: AIOKafkaProducer, prefix: str) -> None:
        self._producer = producer
        self._decisions = topic_name(prefix, DECISIONS)
        self._state = topic_name(prefix, STATE)
        self._shadow = topic_name(prefix, SHADOW)
        self._deadletter = topic_name(prefix, DEADLETTER)
        self.decisions_published = 0
        self.state_published = 0
        self.shadow_published = 0
        self.dead_letters = 0
        self.end_offset = 0  # one past the highest dead letter the broker acknowledged to us
        self._partitions: dict[str, list[int]] = {}  # topic -> its partitions, as the client knows them
        self._open: dict[tuple[str, int], BatchBuilder] = {}  # staged records not yet handed over
        self._full: deque[tuple[str, int, BatchBuilder]] = deque()  # full batches, in fill order
        self._sent: list[asyncio.Future[object]] = []  # batches handed to the client, not awaited
        self._pump: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self.batches_sent = 0

    async def publish(self, decisions: Sequence[Decision], shadow: Sequence[Decision] = ()) -> None:
        """Send every decision (and enforced ones to the state topic), and a shadow policy's
        decisions to the shadow topic; wait for all acks."""
        await self.stage(decisions, shadow)
        await self.flush()

    async def stage(self, decisions: Sequence[Decision], shadow: Sequence[Decision] = ()) -> None:
        """Queue these decisions to go out now, without waiting for the broker: the records go
        into the current batch of their topic partition, handed to the client as soon as the one
        before it left (a background task; the caller yields to let it run)."""
        try:
            for d in shadow:
                await self._append(self._shadow, d.key.encode(), decision_bytes(d))
            self.shadow_published += len(shadow)
            for d in decisions:
                key = d.key.encode()
                value = decision_bytes(d)
                await self._append(self._decisions, key, value)
                if d.policy.mode == "enforce":
                    await self._append(self._state, key, value)
                    self.state_published += 1
            self.decisions_published += len(decisions)
        except Exception as exc:  # e.g. no metadata for a topic yet: flush() raises it to the caller
            self._failed = self._failed or exc
            return
        if (self._full or self._open) and (self._pump is None or self._pump.done()):
            self._pump = asyncio.create_task(self._hand_over())

    async def flush(self) -> None:
        """Return once every staged record is acknowledged (acks=all); raise the first failure."""
        while self._full or self._open or (self._pump is not None and not self._pump.done()):
            if self._pump is None or self._pump.done():
                self._pump = asyncio.create_task(self._hand_over())
            await asyncio.wait([self._pump])
        sent, self._sent = self._sent, []
        failed, self._failed = self._failed, None
        results = await asyncio.gather(*sent, return_exceptions=True) if sent else []
        for r in results:
            if isinstance(r, BaseException) and failed is None:
                failed = r
        if failed is not None:
            self._open.clear()
            self._full.clear()
            raise failed

    async def settle(self) -> bool:
        """Wait until everything staged so far is acknowledged or failed, without taking the
        outcome (``flush`` still raises a failure); True when none failed so far."""
        while self._full or self._open or (self._pump is not None and not self._pump.done()):
            if self._pump is None or self._pump.done():
                self._pump = asyncio.create_task(self._hand_over())
            await asyncio.wait([self._pump])
        sent = list(self._sent)
        if sent:
            await asyncio.wait(sent)
        return self._failed is None and not any(f.exception() is not None for f in sent if not f.cancelled())

    async def _append(self, topic: str, key: bytes, value: bytes) -> None:
        parts = self._partitions.get(topic)
        if parts is None:
            parts = self._partitions[topic] = sorted(await self._producer.partitions_for(topic))
        # The partition the client's own partitioner picks for this key (murmur2), as send() does.
        part = parts[0] if len(parts) == 1 else _PARTITIONER(key, parts, parts)
        builder = self._open.get((topic, part))
        if builder is None:
            builder = self._open[(topic, part)] = self._producer.create_batch()
        if builder.append(timestamp=None, key=key, value=value) is None:  # full: queue it, start another
            self._full.append((topic, part, self._open.pop((topic, part))))
            builder = self._open[(topic, part)] = self._producer.create_batch()
            builder.append(timestamp=None, key=key, value=value)

    async def _hand_over(self) -> None:
        """Hand the staged batches to the client, one at a time and in the order they were filled
        (so a partition's records keep their order); waits here, not in the caller, while a
        partition's previous batch has not left yet, so records staged meanwhile go in one batch."""
        try:
            while self._full or self._open:
                if self._full:
                    topic, part, builder = self._full.popleft()
                else:
                    (topic, part), builder = next(iter(self._open.items()))
                    del self._open[(topic, part)]
                builder.close()  # closed: sent at once, not after the client's linger
                self._sent.append(await self._producer.send_batch(builder, topic, partition=part))
                self.batches_sent += 1
        except Exception as exc:  # raised by flush(), to the caller that retries the publish
            self._failed = self._failed or exc

    async def dead_letter(self, letters: Sequence[DeadLetter], stage: str = "decode") -> list[str]:
        """Publish bounded copies of ``letters``; returns one line per copy the broker refused."""
        failures: list[str] = []
        futures = []
        for d in letters:
            key, value, headers = dead_letter_record(d, stage)
            try:
                futures.append(
                    await self._producer.send(self._deadletter, value=value, key=key, headers=headers)
                )
            except Exception as exc:  # e.g. MessageSizeTooLargeError: count it, never die of it
                _raise_if_transient(exc)
                failures.append(f"{type(exc).__name__}: {exc}")
        if futures:
            for result in await asyncio.gather(*futures, return_exceptions=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result
                    _raise_if_transient(result)
                    failures.append(f"{type(result).__name__}: {result}")
                else:
                    self.end_offset = max(self.end_offset, int(result.offset) + 1)
        self.dead_letters += len(letters) - len(failures)
        return failures
