"""The runtime's ports: what it asks of the broker, of the clock and of the machine, as Protocols.

The broker port names every call the runtime makes to its Kafka client, in the runtime's own
types (a :class:`TopicPartition` is any ``(topic, partition)`` pair). The one adapter is
:mod:`fleetloop.daemon.runtime.kafka` (aiokafka; the only module of the runtime that imports it);
unit tests drive the runtime through an in-memory double (``tests/support/memory_broker.py``).

- :class:`Broker` opens a :class:`Session` (the producer, the group consumer of the pool-keyed
  topics, the policy reader and the decisions' publisher, started together and stopped in reverse
  order) and makes the one-off reads of a restore or a start (the checkpoint topic, the active
  policy, a range of the dead-letter topic). It also tells its client's errors apart: which are the
  broker's (``error``), which pass once the broker answers again (``transient``), and a commit
  refused because the group moved the partitions (``commit_failed``).
- :class:`Clock` is every reading of time the runtime makes; the real one is :mod:`fleetloop.clock`
  (the only module that reads the wall clock). Waiting is asyncio's: a test runs the runtime on an
  event loop whose time is virtual and reads it through a fake clock (``tests/support/virtual_time.py``).
- :class:`Offload` is the work the runtime moves off its event loop (a checkpoint encoded in a
  forked child, decoded in a thread); a test does it in the loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple, Protocol, TypeVar

from fleetloop.daemon.observe.decode import DeadLetter, RecordLike
from fleetloop.schemas.decisions import Decision

T = TypeVar("T")
A = TypeVar("A")


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Record(RecordLike, Protocol):
    """A consumed record with its headers."""

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


def header(record: Record, name: str) -> bytes | None:
    """The value of a record's header ``name`` (the first), or None."""
    for k, v in record.headers or ():
        if k == name:
            return bytes(v)
    return None


class Rebalance(Protocol):
    """What the group consumer calls when the group moves partitions (beside the runtime's loop)."""

    async def on_revoked(self, revoked: list[TopicPartition]) -> None: ...
    async def on_assigned(self, assigned: list[TopicPartition]) -> None: ...


class GroupConsumer(Protocol):
    """The consumer group member that reads the pool-keyed topics (telemetry, requests, ticks)."""

    def subscribe(self, topics: Sequence[str], listener: Rebalance) -> None: ...
    async def getmany(
        self, *, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, Sequence[Record]]:
        """Records of the assigned, unpaused partitions from their positions, at most ``max_records``;
        waits up to ``timeout_ms`` when there are none."""
        ...

    def assignment(self) -> set[TopicPartition]: ...
    def seek(self, tp: TopicPartition, offset: int) -> None: ...
    def pause(self, *tps: TopicPartition) -> None: ...
    def resume(self, *tps: TopicPartition) -> None: ...
    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's end as of the last fetch (None: not fetched yet, or not assigned). A
        rebalance can take a partition during any await, so a partition not assigned is no error
        here or in ``seek``, ``pause``, ``resume`` (no-ops) and ``last_poll_timestamp`` (None)."""
        ...

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None: ...
    async def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...
    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...
    async def committed(self, tp: TopicPartition) -> int | None: ...
    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None: ...
    async def topics(self) -> set[str]:
        """The cluster's topics (a metadata round trip: the broker watch)."""
        ...


class PolicyReader(Protocol):
    """A consumer outside the group on control.policy's one partition."""

    async def start_at(self, offset: int | None) -> None:
        """Read from ``offset`` on (None: from the beginning)."""
        ...

    async def poll(self, timeout_ms: int) -> list[Record]:
        """The next records in offset order; waits up to ``timeout_ms`` when there are none."""
        ...


class Producer(Protocol):
    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> Awaitable[Any]:
        """Queue one record; returns what the broker's acknowledgement completes (await it)."""
        ...

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> Any: ...


class DecisionPublisher(Protocol):
    """Decisions to control.decisions / control.state / control.shadow and dead letters
    (:class:`fleetloop.daemon.act.publish.Publisher`)."""

    @property
    def end_offset(self) -> int:
        """One past the highest dead letter the broker acknowledged."""
        ...

    async def stage(self, decisions: Sequence[Decision], shadow: Sequence[Decision] = ()) -> None: ...
    async def flush(self) -> None: ...
    async def settle(self) -> bool: ...
    async def publish(self, decisions: Sequence[Decision], shadow: Sequence[Decision] = ()) -> None: ...
    async def dead_letter(self, letters: Sequence[DeadLetter], stage: str = "decode") -> list[str]: ...


class Session(Protocol):
    """The clients of one run of the daemon, started and connected."""

    @property
    def producer(self) -> Producer: ...
    @property
    def consumer(self) -> GroupConsumer: ...
    @property
    def policies(self) -> PolicyReader: ...
    @property
    def publisher(self) -> DecisionPublisher: ...


class Broker(Protocol):
    @property
    def error(self) -> type[Exception]:
        """The base class of the client's errors."""
        ...

    def transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` passes once the broker answers again (a retry is worth it)."""
        ...

    def commit_failed(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a commit refused because the group handed the partitions out again."""
        ...

    def timeout_error(self) -> Exception:
        """The client's error for a request the broker did not answer in time."""
        ...

    def session(self) -> AbstractAsyncContextManager[Session]: ...

    async def read_log(self, topic: str, *, client: str, fetch_bytes: int | None = None) -> list[Record]:
        """Every record of ``topic``'s partition 0, from its beginning to its end (as it grows while
        read), with a consumer of its own (client id suffix ``client``)."""
        ...

    async def read_tail(self, topic: str, since: int, *, client: str) -> tuple[list[Record], int, int]:
        """The records of ``topic``'s partition 0 from offset ``since`` (or its first, when later) to
        its end at the start of the read; and its first and end offsets."""
        ...


class Clock(Protocol):
    def wall_ms(self) -> int: ...
    def monotonic_s(self) -> float: ...
    def thread_sched_s(self) -> tuple[float, float]: ...


class Offload(Protocol):
    def encode_timed(
        self, encode: Callable[[Any], bytes], value: Any
    ) -> Coroutine[Any, Any, tuple[bytes, float]]:
        """``encode(value)`` of the state as of this call, off the loop; (bytes, CPU seconds) when awaited."""
        ...

    async def in_thread(self, fn: Callable[[A], T], arg: A) -> T: ...
