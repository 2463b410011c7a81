"""Publishing decisions and dead letters.

Every decision goes to ``control.decisions`` (the audit log replay compares against); enforced
ones also go to ``control.state`` (compacted: the newest desired state per key). Values are
canonical JSON (sorted keys), so the same decision is the same bytes in a live run and a replay.
``publish`` returns only when the broker acknowledged every record (acks=all): the caller commits
input offsets after that, never before (at-least-once; a duplicate decision is harmless).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson
from aiokafka import AIOKafkaProducer

from fleetloop.daemon.observe.decode import DeadLetter
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.topics import DEADLETTER, DECISIONS, STATE, topic_name


def decision_bytes(decision: Decision) -> bytes:
    return orjson.dumps(decision.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


def dead_letter_headers(d: DeadLetter, stage: str) -> list[tuple[str, bytes]]:
    return [
        ("fleetloop.error", d.reason.encode()),
        ("fleetloop.source", f"{d.topic}:{d.partition}:{d.offset}".encode()),
        ("fleetloop.stage", stage.encode()),
    ]


class Publisher:
    def __init__(self, producer: AIOKafkaProducer, prefix: str) -> None:
        self._producer = producer
        self._decisions = topic_name(prefix, DECISIONS)
        self._state = topic_name(prefix, STATE)
        self._deadletter = topic_name(prefix, DEADLETTER)
        self.decisions_published = 0
        self.state_published = 0
        self.dead_letters = 0

    async def publish(self, decisions: Sequence[Decision]) -> None:
        """Send every decision (and enforced ones to the state topic); wait for all acks."""
        futures = []
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

    async def dead_letter(self, letters: Sequence[DeadLetter], stage: str = "decode") -> None:
        futures = [
            await self._producer.send(
                self._deadletter, value=d.value or b"", key=d.key, headers=dead_letter_headers(d, stage)
            )
            for d in letters
        ]
        if futures:
            await asyncio.gather(*futures)
        self.dead_letters += len(letters)
