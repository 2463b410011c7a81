"""Dead letters: records the runtime cannot use go to ``fleet.deadletter`` with the reason, once.

A record the door refuses (malformed, too large, its event time outside the window around the
broker's timestamp) is dead-lettered as it is read; a record the shard refuses to fold (a cap, a
fold that raised) as it is folded; a policy document the follower refuses as it is considered.
Each is published as a bounded copy with its reason (:mod:`fleetloop.daemon.act.publish`) before
the checkpoint and the commit that cover it, counted by reason kind, and logged once per kind per
window (the logger's rate limit), never once per record. One the broker refuses to take is counted
and logged; the record it stands for is committed past anyway.

A restore reads records a previous run read, and may fold them again: their dead letters went out
then and are not published twice. Each checkpoint carries the offsets below which the shard's door
dead letters were published and the dead-letter topic's end (its mark); a restored shard suppresses
dead letters below its offsets and those found on the dead-letter topic from its mark on (published
between the checkpoint and a crash: one read of the topic for every shard restored at once,
:meth:`DeadLetters.scan`). A group's first start re-reads warm-up history a previous run handled
(up to its commit): the refusals among it are not news either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fleetloop.core.shard import Refusal, Shard
from fleetloop.daemon.observability import logger
from fleetloop.daemon.observe.decode import DeadLetter
from fleetloop.daemon.runtime.link import Link
from fleetloop.daemon.runtime.partition import OwnedPartition, Partitions
from fleetloop.daemon.runtime.port import TopicPartition, header
from fleetloop.daemon.runtime.telemetry import DaemonStats
from fleetloop.daemon.service import metrics
from fleetloop.schemas.topics import DEADLETTER, topic_name

log = logger("fleetloop.daemon")


class DeadLetters:
    def __init__(self, prefix: str, parts: Partitions, link: Link, *, stats: DaemonStats) -> None:
        self.parts = parts
        self.link = link
        self.stats = stats
        self.topic = topic_name(prefix, DEADLETTER)
        self.end = 0  # the dead-letter topic's end as this instance last knew it

    def fresh(self, owned: OwnedPartition, logical: str, offset: int, at_door: bool) -> bool:
        """Whether a dead letter for ``offset`` of ``logical`` in ``owned`` is still to publish:
        not below what was dead-lettered at the door before the shard's checkpoint, and not found
        on the dead-letter topic after it (a restore re-reads and re-folds those records)."""
        marks = owned.lettered if at_door else owned.fold_lettered
        if offset < marks.get(logical, 0):
            self.stats.dead_letters_suppressed += 1
            return False
        already = owned.already
        if already and (logical, offset) in already:
            already.discard((logical, offset))
            self.stats.dead_letters_suppressed += 1
            return False
        return True

    def take_refusals(self) -> list[DeadLetter]:
        """The records the shards refused to fold since the last call, as dead letters still to publish."""
        out: list[DeadLetter] = []
        physical = self.parts.physical
        for owned in self.parts:
            shard = owned.shard
            taken: list[Refusal] | None = shard.refusals
            if not taken:
                continue
            shard.refusals = []
            owned.dirty = True
            out.extend(
                DeadLetter(
                    physical[r.logical], owned.index, r.offset, r.key, r.value, r.timestamp_ms, r.reason
                )
                for r in taken
                if self.fresh(owned, r.logical, r.offset, False)
            )
        return out

    async def publish(self, dead: Sequence[DeadLetter], stage: str = "decode") -> None:
        """Publish dead letters (bounded copies) and count them by reason; one log line per reason
        kind per window (the logger's rate limit), never one per record."""
        publisher = self.link.publisher
        failures: list[str] = await self.link.retrying(
            "dead-letter", lambda: publisher.dead_letter(dead, stage)
        )
        self.end = max(self.end, publisher.end_offset)
        stats = self.stats
        stats.dead_letters += len(dead)
        for d in dead:
            kind = metrics.reason_kind(d.reason)
            stats.dead_by_reason[kind] = stats.dead_by_reason.get(kind, 0) + 1
            metrics.dead_letters.add(1, {"reason": kind})
            log.warning(
                "dead letter",
                source=f"{d.topic}:{d.partition}:{d.offset}",
                reason=d.reason,
                ratelimit_key=kind,
            )
        if failures:
            stats.dead_letters_lost += len(failures)
            log.error(
                "dead letters not published (the records are committed past anyway)",
                count=len(failures),
                first=failures[0],
                ratelimit_key="dead-letter-lost",
            )

    async def note_end(self) -> None:
        """Learn the dead-letter topic's end: what this instance publishes from now on lies at or
        after it (a new shard's checkpoint written later marks it)."""
        tp = TopicPartition(self.topic, 0)
        self.end = max(self.end, (await self.link.consumer.end_offsets([tp]))[tp])

    async def scan(self, shards: Mapping[int, Shard | None]) -> dict[int, set[tuple[str, int]]]:
        """For each restored shard, the sources dead-lettered from its checkpoint's mark on: one
        read of the dead-letter topic from the lowest mark, however many shards were restored."""
        marks = {p: s.dl_mark for p, s in shards.items() if s is not None and 0 <= s.dl_mark < self.end}
        if not marks:
            return {}
        self.stats.dead_letter_scans += 1
        found, first = await self._read(set(marks), min(marks.values()))
        lost = sorted(p for p, mark in marks.items() if mark < first)
        if lost:
            self.stats.dead_letter_marks_lost += len(lost)
            log.warning(
                "dead letters after these shards' checkpoints are gone from the dead-letter topic "
                "(retention): those published between the checkpoint and the crash may be published again",
                partitions=lost,
                earliest_offset=first,
                marks={str(p): marks[p] for p in lost},
            )
        return {p: {(lg, off) for at, lg, off in found.get(p, ()) if at >= marks[p]} for p in marks}

    async def _read(self, indexes: set[int], since: int) -> tuple[dict[int, list[tuple[int, str, int]]], int]:
        """Sources of shards ``indexes`` dead-lettered at or after offset ``since`` of the dead-letter
        topic (published after a shard's checkpoint, before a crash): not to publish again. Per
        partition (dead-letter offset, logical topic, source offset); and the topic's first offset
        (above ``since``: retention removed part of the range)."""
        records, first, end = await self.link.broker.read_tail(self.topic, since, client="lettered")
        self.end = max(self.end, end)
        found: dict[int, list[tuple[int, str, int]]] = {}
        logical_of = self.parts.logical
        for r in records:
            source = header(r, "fleetloop.source")
            if source is None:
                continue
            topic, _, rest = source.decode(errors="replace").rpartition(":")
            topic, _, part = topic.rpartition(":")
            logical = logical_of.get(topic)
            if logical is not None and part.isdigit() and int(part) in indexes and rest.isdigit():
                found.setdefault(int(part), []).append((r.offset, logical, int(rest)))
        return found, first
