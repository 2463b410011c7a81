"""Publishing decisions and dead letters.

Every decision goes to ``control.decisions`` (the audit log replay compares against); enforced
ones also go to ``control.state`` (compacted: the newest desired state per key). The decisions of a
shadow policy (a document run beside the enforcing one) go to ``control.shadow`` only: routers never
read it, and replay's log stays the enforcing policy's alone. Values are
canonical JSON (sorted keys), so the same decision is the same bytes in a live run and a replay.
``publish`` returns only when the broker acknowledged every record (acks=all): the caller commits
input offsets after that, never before (at-least-once; a duplicate decision is harmless).

A dead letter carries the original key and bytes, except when they would not fit: a value larger
than ``MAX_DEAD_LETTER_COPY`` (or a key larger than ``MAX_DEAD_LETTER_KEY``) is cut to that size
and the headers say so, with the original length and its sha256, so no record can make the
dead-letter copy exceed the producer's request limit. A dead letter the broker still refuses is
counted and logged by the caller, never raised: the record it stood for is committed past anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

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

    async def publish(self, decisions: Sequence[Decision], shadow: Sequence[Decision] = ()) -> None:
        """Send every decision (and enforced ones to the state topic), and a shadow policy's
        decisions to the shadow topic; wait for all acks."""
        futures = [
            await self._producer.send(self._shadow, value=decision_bytes(d), key=d.key.encode())
            for d in shadow
        ]
        self.shadow_published += len(shadow)
        for d in decisions:
            key = d.key.encode()
            value = decision_bytes(d)
            futures.append(await self._producer.send(self._decisions, value=value, key=key))
            if d.policy.mode == "enforce":
                futures.append(await self._producer.send(self._state, value=value, key=key))
                self.state_published += 1
        if futures:
            await asyncio.gather(*futures)
        self.decisions_published += len(decisions)

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
