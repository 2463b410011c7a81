"""An in-memory broker for the runtime's unit tests: :class:`MemoryBroker` is the broker port
(:class:`fleetloop.daemon.runtime.port.Broker`) over append-only logs kept in this process, with a
consumer group that hands partitions out and calls its members' rebalance callbacks, committed
offsets, and a publisher that writes the same bytes as the real one.

Run it on virtual time (``tests/support/virtual_time.py``) with :class:`Inline` as the offload:
every wait then ends in virtual time and a test decides the same things every time. Unit tests
only: integration tests run the real brokers.

What it models, and how:
- a topic's partitions: the pool-keyed topics (telemetry, requests, ticks) have ``partitions``,
  every other topic one; a keyed record goes to ``crc32(key) % partitions`` (the same partition
  for a pool on every pool-keyed topic, as the real partitioner keeps it);
- a record's timestamp is the wall clock at its append (unless the producer gives one);
- the group: eager rebalances. A member joins at ``subscribe`` and leaves when its session closes;
  each member's callbacks run at its next fetch: revoked (its whole assignment), then, once every
  member has revoked, assigned (range assignment over the members in join order);
- a fetch returns records of the assigned, unpaused partitions from their positions; with none, it
  waits (virtual time) for a record or the timeout. A position beyond the log (an emptied broker)
  resets to the log's start, as ``auto_offset_reset="earliest"`` does;
- ``down``: the broker is away. Sends, commits and offset requests raise :class:`BrokerAway` (a
  transient error); fetches return nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleetloop.daemon.act.publish import dead_letter_record, decision_bytes
from fleetloop.daemon.act.state_changes import StateChanges
from fleetloop.daemon.observe.decode import DeadLetter
from fleetloop.daemon.runtime.config import STATE_REFRESH_S
from fleetloop.daemon.runtime.port import Rebalance, Record, TopicPartition
from fleetloop.schemas.decisions import Decision, state_headers
from fleetloop.schemas.topics import (
    DEADLETTER,
    DECISIONS,
    POLICY,
    REQUESTS,
    SHADOW,
    STATE,
    TELEMETRY,
    TICKS,
    topic_name,
)
from tests.support.virtual_time import FakeClock

A = TypeVar("A")
T = TypeVar("T")


class MemoryBrokerError(Exception):
    pass


class BrokerAway(MemoryBrokerError):
    """The broker does not answer (transient: it passes once the broker is back)."""


class CommitRefused(MemoryBrokerError):
    pass


@dataclass(frozen=True, slots=True)
class Stored:
    """A record on a log (the port's :class:`Record`)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(slots=True)
class _Log:
    first: int = 0
    records: list[Stored] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.first + len(self.records)

    def since(self, offset: int) -> list[Stored]:
        return self.records[max(0, offset - self.first) :]


class Inline:
    """The offload port done in the loop (no fork, no thread): virtual time stays whole."""

    async def encode_timed(self, encode: Callable[[Any], bytes], value: Any) -> tuple[bytes, float]:
        return encode(value), 0.0

    async def in_thread(self, fn: Callable[[A], T], arg: A) -> T:
        return fn(arg)


class MemoryBroker:
    error = MemoryBrokerError

    def __init__(
        self,
        clock: FakeClock,
        *,
        prefix: str = "",
        partitions: int = 2,
        group: str = "fleetloop",
        stage_delay_s: float = 0.0,
        state_refresh_ms: int = int(STATE_REFRESH_S * 1000),
    ) -> None:
        self.clock = clock
        # control.state's change-only rule, as the daemon's publisher applies it (0: every decision).
        self.state_refresh_ms = state_refresh_ms
        # How long handing one tick's decisions to the publisher takes: a daemon slower than its
        # boundaries (its loop busy that long per tick decided) in virtual time.
        self.stage_delay_s = stage_delay_s
        self.prefix = prefix
        self.keyed = {topic_name(prefix, t) for t in (TELEMETRY, REQUESTS, TICKS)}
        self.partitions = partitions
        self.logs: dict[TopicPartition, _Log] = {}
        self.committed: dict[str, dict[TopicPartition, int]] = {}
        self.groups: dict[str, _Group] = {}
        self.default_group = group
        self.down = False
        self._changed = asyncio.Event()

    # -- the port ---------------------------------------------------------------------------------

    def transient(self, exc: BaseException) -> bool:
        return isinstance(exc, BrokerAway)

    def commit_failed(self, exc: BaseException) -> bool:
        return isinstance(exc, CommitRefused)

    def timeout_error(self) -> Exception:
        return BrokerAway("request timed out")

    def session(self, group: str | None = None) -> contextlib.AbstractAsyncContextManager[MemorySession]:
        return self._session(group or self.default_group)

    @contextlib.asynccontextmanager
    async def _session(self, group: str) -> AsyncIterator[MemorySession]:
        consumer = MemoryConsumer(self, self.groups.setdefault(group, _Group(self, group)))
        session = MemorySession(
            MemoryProducer(self), consumer, MemoryPolicyReader(self), MemoryPublisher(self)
        )
        try:
            yield session
        finally:
            consumer.group.leave(consumer)

    async def read_log(self, topic: str, *, client: str, fetch_bytes: int | None = None) -> list[Record]:
        self.check()
        return list(self.log(TopicPartition(topic, 0)).records)

    async def read_tail(self, topic: str, since: int, *, client: str) -> tuple[list[Record], int, int]:
        self.check()
        log = self.log(TopicPartition(topic, 0))
        if max(since, log.first) >= log.end:
            return [], log.first, log.end
        return list(log.since(since)), log.first, log.end

    # -- the logs ---------------------------------------------------------------------------------

    def check(self) -> None:
        if self.down:
            raise BrokerAway("the broker is away")

    def log(self, tp: TopicPartition) -> _Log:
        return self.logs.setdefault(tp, _Log())

    def partitions_of(self, topic: str) -> int:
        return self.partitions if topic in self.keyed else 1

    def partition_for(self, topic: str, key: bytes | None) -> int:
        return zlib.crc32(key or b"") % self.partitions_of(topic)

    def append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        timestamp_ms: int | None = None,
    ) -> Stored:
        self.check()
        p = self.partition_for(topic, key) if partition is None else partition
        log = self.log(TopicPartition(topic, p))
        stored = Stored(
            topic,
            p,
            log.end,
            self.clock.wall_ms() if timestamp_ms is None else timestamp_ms,
            key,
            value,
            tuple((k, bytes(v)) for k, v in headers or ()),
        )
        log.records.append(stored)
        self.changed()
        return stored

    def records(self, logical: str, partition: int | None = None) -> list[Stored]:
        """What a logical topic holds (every partition, in partition then offset order)."""
        topic = topic_name(self.prefix, logical)
        return [
            r
            for tp in sorted(self.logs)
            if tp.topic == topic and (partition is None or tp.partition == partition)
            for r in self.logs[tp].records
        ]

    def wipe(self) -> None:
        """An emptied broker (a restarted in-memory one): every log and committed offset gone."""
        self.logs.clear()
        self.committed.clear()
        self.changed()

    def changed(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)


@dataclass(frozen=True, slots=True)
class MemorySession:
    producer: MemoryProducer
    consumer: MemoryConsumer
    policies: MemoryPolicyReader
    publisher: MemoryPublisher


class _Group:
    """A consumer group: its members in join order and its rebalances (eager, range assignment)."""

    def __init__(self, broker: MemoryBroker, name: str) -> None:
        self.broker = broker
        self.name = name
        self.members: list[MemoryConsumer] = []
        self.generation = 0
        self.revoked: set[int] = set()  # ids of members that revoked in this generation
        self.all_revoked = asyncio.Event()

    def join(self, member: MemoryConsumer) -> None:
        self.members.append(member)
        self.rebalance()

    def leave(self, member: MemoryConsumer) -> None:
        if member in self.members:
            self.members.remove(member)
            self.rebalance()

    def rebalance(self) -> None:
        self.generation += 1
        self.revoked = set()
        self.all_revoked = asyncio.Event()
        targets: dict[int, set[TopicPartition]] = {id(m): set() for m in self.members}
        topics = sorted({t for m in self.members for t in m.subscribed})
        for topic in topics:
            members = [m for m in self.members if topic in m.subscribed]
            n = self.broker.partitions_of(topic)
            for i, m in enumerate(members):  # range: consecutive partitions, the first members one more
                share, extra = divmod(n, len(members))
                start = i * share + min(i, extra)
                targets[id(m)] |= {
                    TopicPartition(topic, p) for p in range(start, start + share + (i < extra))
                }
        for m in self.members:
            m.target = targets[id(m)]
            m.pending = True
        if not self.members:
            self.all_revoked.set()
        self.broker.changed()

    def note_revoked(self, member: MemoryConsumer) -> None:
        self.revoked.add(id(member))
        if {id(m) for m in self.members} <= self.revoked:
            self.all_revoked.set()


class MemoryConsumer:
    """The group consumer (:class:`fleetloop.daemon.runtime.port.GroupConsumer`)."""

    def __init__(self, broker: MemoryBroker, group: _Group) -> None:
        self.broker = broker
        self.group = group
        self.subscribed: set[str] = set()
        self.listener: Rebalance | None = None
        self.assigned: set[TopicPartition] = set()
        self.target: set[TopicPartition] = set()
        self.pending = False
        self.positions: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()
        self.highwaters: dict[TopicPartition, int] = {}
        self.polled: dict[TopicPartition, int] = {}

    def subscribe(self, topics: Sequence[str], listener: Rebalance) -> None:
        self.subscribed = set(topics)
        self.listener = listener
        self.group.join(self)

    async def _rebalance_if_due(self) -> None:
        group = self.group
        while self.pending:
            self.pending = False
            generation = group.generation
            if self.listener is not None:
                await self.listener.on_revoked(sorted(self.assigned))
            self.assigned = set()
            group.note_revoked(self)
            await group.all_revoked.wait()
            if group.generation != generation or self.pending:
                continue  # the group moved again meanwhile: revoke (nothing) and join the new one
            self.assigned = set(self.target)
            self.paused &= self.assigned
            for tp in self.assigned:
                self.positions[tp] = self._committed_or_first(tp)
            if self.listener is not None:
                await self.listener.on_assigned(sorted(self.assigned))

    def _committed_or_first(self, tp: TopicPartition) -> int:
        committed = self.broker.committed.get(self.group.name, {}).get(tp)
        return committed if committed is not None else self.broker.log(tp).first

    def _fetch(self, max_records: int) -> dict[TopicPartition, list[Stored]]:
        out: dict[TopicPartition, list[Stored]] = {}
        now = self.broker.clock.wall_ms()
        left = max_records
        for tp in sorted(self.assigned - self.paused):
            log = self.broker.log(tp)
            position = self.positions.get(tp, log.first)
            if position > log.end or position < log.first:
                position = log.first  # out of range: auto_offset_reset="earliest"
            self.highwaters[tp] = log.end
            self.polled[tp] = now
            got = log.since(position)[:left] if left > 0 else []
            if got:
                out[tp] = got
                left -= len(got)
                position = got[-1].offset + 1
            self.positions[tp] = position
        return out

    async def getmany(
        self, *, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, Sequence[Record]]:
        await self._rebalance_if_due()
        got = {} if self.broker.down else self._fetch(max_records)
        if not got:
            await self.broker.wait_change(timeout_ms / 1000.0)
            await self._rebalance_if_due()
            got = {} if self.broker.down else self._fetch(max_records)
        return got

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    # As the port says (and its Kafka adapter does): a partition not assigned, which a rebalance can
    # take during any await, is no error: seek, pause and resume do nothing, the figures are unknown.

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if tp in self.assigned:
            self.positions[tp] = offset

    def pause(self, *tps: TopicPartition) -> None:
        self.paused.update(tp for tp in tps if tp in self.assigned)

    def resume(self, *tps: TopicPartition) -> None:
        for tp in tps:
            if tp not in self.assigned:
                continue
            self.paused.discard(tp)
            # A resumed partition is fetched again: its high watermark is fresh.
            self.highwaters[tp] = self.broker.log(tp).end
            self.polled[tp] = self.broker.clock.wall_ms()

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highwaters.get(tp) if tp in self.assigned else None

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        return self.polled.get(tp) if tp in self.assigned else None

    async def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        self.broker.check()
        return {tp: self.broker.log(tp).first for tp in tps}

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        self.broker.check()
        return {tp: self.broker.log(tp).end for tp in tps}

    async def committed(self, tp: TopicPartition) -> int | None:
        self.broker.check()
        return self.broker.committed.get(self.group.name, {}).get(tp)

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.broker.check()
        self.broker.committed.setdefault(self.group.name, {}).update(offsets)

    async def topics(self) -> set[str]:
        self.broker.check()
        return {tp.topic for tp in self.broker.logs}


class MemoryPolicyReader:
    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.tp = TopicPartition(topic_name(broker.prefix, POLICY), 0)
        self.position = 0

    async def start_at(self, offset: int | None) -> None:
        self.position = self.broker.log(self.tp).first if offset is None else offset

    async def poll(self, timeout_ms: int) -> list[Record]:
        got = [] if self.broker.down else self.broker.log(self.tp).since(self.position)
        if not got:
            await self.broker.wait_change(timeout_ms / 1000.0)
            got = [] if self.broker.down else self.broker.log(self.tp).since(self.position)
        if got:
            self.position = got[-1].offset + 1
        return list(got)


def _done(value: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


class MemoryProducer:
    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> Awaitable[Any]:
        return _done(self.broker.append(topic, value, key, partition=partition, headers=headers))

    async def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> Any:
        return self.broker.append(topic, value, key)


class MemoryPublisher:
    """The decisions' publisher (:class:`fleetloop.daemon.act.publish.Publisher`'s topics and bytes),
    acknowledged as soon as staged."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        p = broker.prefix
        self.decisions, self.state = topic_name(p, DECISIONS), topic_name(p, STATE)
        self.shadow, self.deadletter = topic_name(p, SHADOW), topic_name(p, DEADLETTER)
        self.end_offset = 0
        self.state_changes = StateChanges(broker.state_refresh_ms)
        self.state_headers = state_headers(broker.state_refresh_ms)

    async def stage(self, decisions: Sequence[Decision], shadow: Sequence[Decision] = ()) -> None:
        if self.broker.stage_delay_s and decisions:
            await asyncio.sleep(self.broker.stage_delay_s)
        for d in shadow:
            self.broker.append(self.shadow, decision_bytes(d), d.key.encode())
        for d in decisions:
            value = decision_bytes(d)
            self.broker.append(self.decisions, value, d.key.encode())
            if d.policy.mode == "enforce" and self.state_changes.publish(d):
                self.broker.append(self.state, value, d.key.encode(), headers=self.state_headers)

    async def flush(self) -> None:
        self.broker.check()

    async def settle(self) -> bool:
        return not self.broker.down

    async def publish(self, decisions: Sequence[Decision], shadow: Sequence[Decision] = ()) -> None:
        await self.stage(decisions, shadow)
        await self.flush()

    async def dead_letter(self, letters: Sequence[DeadLetter], stage: str = "decode") -> list[str]:
        for d in letters:
            key, value, headers = dead_letter_record(d, stage)
            stored = self.broker.append(self.deadletter, value, key, headers=headers)
            self.end_offset = max(self.end_offset, stored.offset + 1)
        return []
