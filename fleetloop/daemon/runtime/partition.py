"""One record per owned partition index, and the table of them.

Shards. One :class:`~fleetloop.core.shard.Shard` per partition index of the pool-keyed topics
(telemetry, requests, ticks): its own fleet model and policy state, and the offsets they reflect. A
tick is decided from its shard alone and from exactly the records before its cut, so decisions
depend on the topics' contents, not on batching, on which instance owns what, or on restarts.

Everything the runtime keeps about an owned partition index is in its :class:`OwnedPartition`
beside the shard: the ticks read and waiting to be decided, where publishing starts, the catch-up
target, the dead-letter marks, the ticker's per-pool bookkeeping, whether it changed since its last
checkpoint. Forgetting a partition (the group handed it to another instance, or a restore starts
over) is dropping its record (:meth:`Partitions.forget`); a partition the instance keeps across a
rebalance keeps its record, so nothing is read twice. What outlives a partition (the machine's
pace, the checkpoint sequence numbers) is kept by the part it belongs to.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field

from fleetloop.core.shard import INPUTS, Shard
from fleetloop.daemon.runtime.port import TopicPartition
from fleetloop.schemas.control import Tick
from fleetloop.schemas.topics import REQUESTS, TELEMETRY, TICKS, topic_name


@dataclass(frozen=True, slots=True)
class HeldTick:
    """A tick record read and not decided yet, in its partition's queue."""

    offset: int
    tick: Tick | None  # None: a dead-lettered tick record (its offset still has to be passed)
    timestamp_ms: int
    cut: dict[str, int] | None  # from its cut header; None: its cut comes from its record time
    skipped: str | None  # the reason of a record that stands for boundaries not decided
    since_s: float  # when it was read (monotonic)


def boundary_run(held: Sequence[HeldTick], done: Collection[int]) -> int:
    """How many held ticks from the head belong to the head's boundary batch: consecutive ticks
    with the head's cut header, time and tick id (and ticks already decided, ``done``). A tick
    without a cut header (from another ticker: its cut comes from its own record time) is alone."""
    head = held[0]
    tick = head.tick
    if tick is None or head.cut is None:
        return 1
    n = 1
    for h in held[1:]:
        if h.offset in done:
            n += 1
            continue
        t = h.tick
        if t is None or h.skipped is not None or h.cut != head.cut or t.ts_ms != tick.ts_ms:
            break
        if t.tick_id != tick.tick_id:
            break
        n += 1
    return n


@dataclass(eq=False, slots=True)
class OwnedPartition:
    index: int
    shard: Shard
    publish_from: int  # ticks offset from which decisions are published (below: decided again)
    ticks_read: int  # the next ticks offset to read
    # The end offsets at assignment (inputs and ticks), until the shard has read and decided them.
    catchup: dict[str, int] | None = None
    # Dead letters published before a restore, so none is published twice: the offsets below which
    # door dead letters were published (by logical topic, ticks included), those below which fold
    # refusals were (a first start's warm-up history), and the sources found on the dead-letter
    # topic after the checkpoint's mark.
    lettered: dict[str, int] = field(default_factory=dict)
    fold_lettered: dict[str, int] = field(default_factory=dict)
    already: set[tuple[str, int]] = field(default_factory=set)
    held: list[HeldTick] = field(default_factory=list)  # ticks read, in offset order, not decided
    dirty: bool = False  # changed since its last checkpoint
    ticked: dict[str, int] = field(default_factory=dict)  # pool -> last boundary this instance published
    # Overload, per pool: (first boundary held back, boundaries waiting then).
    withheld: dict[str, tuple[int, int]] = field(default_factory=dict)
    # In overload: (when it began, monotonic s; boundaries since published whole).
    overload: tuple[float, int] | None = None

    def marks(self) -> dict[str, int]:
        """What the shard has read, per logical topic (inputs and ticks)."""
        return {**self.shard.read, TICKS: self.ticks_read}

    def caught_up(self) -> bool:
        """True once the shard has read and decided what was on its partitions when it was assigned."""
        target = self.catchup
        if target is None:
            return True
        shard = self.shard
        if shard.ticks_at < target[TICKS] or any(shard.read[k] < target[k] for k in INPUTS):
            return False
        self.catchup = None
        return True

    def waiting(self, pool: str, tick_ms: int) -> int:
        """Boundaries of ``pool`` this instance published and the shard has not decided yet."""
        published = self.ticked.get(pool)
        decided = self.shard.last_tick.get(pool)
        if published is not None and decided is not None and published > decided[1]:
            return (published - decided[1]) // tick_ms
        return 0


class Partitions:
    """The owned partitions by index, the topics they span, and the group's assignment."""

    def __init__(self, prefix: str) -> None:
        # physical topic name -> logical name, of the pool-keyed topics the group consumes
        self.logical = {topic_name(prefix, t): t for t in (TELEMETRY, REQUESTS, TICKS)}
        self.physical = {logical: physical for physical, logical in self.logical.items()}
        self.assigned: set[TopicPartition] = set()  # every partition the group gave this instance
        self.generation = 0  # counts the group's rebalance callbacks
        self._owned: dict[int, OwnedPartition] = {}

    def tp(self, logical: str, index: int) -> TopicPartition:
        return TopicPartition(self.physical[logical], index)

    def get(self, index: int) -> OwnedPartition | None:
        return self._owned.get(index)

    def __getitem__(self, index: int) -> OwnedPartition:
        return self._owned[index]

    def __contains__(self, index: object) -> bool:
        return index in self._owned

    def __len__(self) -> int:
        return len(self._owned)

    def __iter__(self) -> Iterator[OwnedPartition]:
        """The records in index order."""
        return iter([self._owned[p] for p in sorted(self._owned)])

    def indexes(self) -> list[int]:
        return sorted(self._owned)

    def add(self, owned: OwnedPartition) -> None:
        self._owned[owned.index] = owned

    def forget(self, index: int) -> None:
        self._owned.pop(index, None)

    def shards(self) -> dict[int, Shard]:
        return {p: self._owned[p].shard for p in sorted(self._owned)}

    def is_current(self, owned: OwnedPartition) -> bool:
        """Whether ``owned`` is still the record of its index (a rebalance during an await may
        have dropped it, or restored the index as a new record)."""
        return self._owned.get(owned.index) is owned
