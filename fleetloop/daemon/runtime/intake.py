"""Reading a batch into the shards: each fetched record through the door into its shard's rows
(inputs) or queue (ticks), in one pass, and the dead letters of what the door refused.

A tick is held in its partition's queue with its cut (header ``fleetloop.cut``) until the shard has
read its cut's records (:mod:`fleetloop.daemon.runtime.decider` decides it then). The intake also
keeps the group consumer's positions honest: the first fetch after the runtime sought a partition
must start where it sought (the client's own start position, the committed offset, may land after
it: sought again), and a fetch that starts before what the shard has read means the client reset
its position by itself (offset out of range: the broker lost records the shard had read), which a
restore resolves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from fleetloop.core.shard import INPUTS, Row
from fleetloop.daemon.observe.decode import DeadLetter, decode_batch, decode_rows
from fleetloop.daemon.runtime.config import CUT_HEADER, SKIPPED_HEADER, DaemonConfig
from fleetloop.daemon.runtime.deadletters import DeadLetters
from fleetloop.daemon.runtime.link import Link
from fleetloop.daemon.runtime.partition import HeldTick, OwnedPartition, Partitions
from fleetloop.daemon.runtime.port import Clock, Record, TopicPartition, header
from fleetloop.daemon.runtime.telemetry import DaemonStats
from fleetloop.daemon.service import metrics
from fleetloop.schemas.control import Tick
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN, Twin
from fleetloop.schemas.topics import TELEMETRY, TICKS


class Intake:
    def __init__(
        self,
        config: DaemonConfig,
        clock: Clock,
        parts: Partitions,
        link: Link,
        *,
        dead_letters: DeadLetters,
        stats: DaemonStats,
    ) -> None:
        self.config = config
        self.clock = clock
        self.parts = parts
        self.link = link
        self.dead_letters = dead_letters
        self.stats = stats
        self.expect: dict[TopicPartition, int] = {}  # first fetch after a seek must start here

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.link.consumer.seek(tp, offset)
        self.expect[tp] = offset

    def position(self, tp: TopicPartition) -> int:
        """The next offset the shard reads on ``tp`` (0: not owned)."""
        owned = self.parts.get(tp.partition)
        logical = self.parts.logical.get(tp.topic)
        if owned is None or logical is None:
            return 0
        return owned.ticks_read if logical == TICKS else owned.shard.read[logical]

    def read(self, batch: Mapping[TopicPartition, Sequence[Record]]) -> tuple[int, list[DeadLetter]] | None:
        """Read ``batch`` into the shards: (records read, the dead letters still to publish); None
        when the client reset a position by itself (the loop restores the assignment)."""
        dead: list[DeadLetter] = []
        n = 0
        fresh = self.dead_letters.fresh
        for tp in sorted(batch, key=lambda t: (t.topic, t.partition)):
            records = batch[tp]
            owned = self.parts.get(tp.partition)
            if not records or tp not in self.parts.assigned or owned is None:
                continue  # fetched while the assignment callback was still seeking
            expect = self.expect.pop(tp, None)
            if expect is not None and records[0].offset > expect:
                # The client's own start position (the committed offset) landed after ours.
                self.seek(tp, expect)
                continue
            if expect is None and records[0].offset < self.position(tp):
                # The client reset its position by itself (offset out of range): the broker lost
                # records this shard had read. Restore decides how to go on.
                return None
            n += len(records)
            logical = self.parts.logical[tp.topic]
            metrics.events_consumed.add(len(records), {"topic": logical})
            if logical in INPUTS:
                # One pass: decoded through the door into the shard's rows (a refused record's row
                # holds no item), and the dead letters.
                twin: Twin[Any] = TELEMETRY_TWIN if logical == TELEMETRY else OUTCOME_TWIN
                rows, refused = decode_rows(twin, records, self.config.door, Row)
                owned.shard.add(logical, rows)
                if logical == TELEMETRY:
                    self.stats.telemetry_in += len(rows) - len(refused)
                else:
                    self.stats.outcomes_in += len(rows) - len(refused)
                dead.extend(d for d in refused if fresh(owned, logical, d.offset, True))
            else:
                dead.extend(
                    d for d in self._read_ticks(owned, records) if fresh(owned, TICKS, d.offset, True)
                )
        self.stats.events_in += n
        return n, dead

    def _read_ticks(self, owned: OwnedPartition, records: Sequence[Record]) -> list[DeadLetter]:
        """Queue the tick records (a malformed one too, with no tick: its offset is still passed)."""
        held = owned.held
        decoded = decode_batch(Tick, records, self.config.door)
        good = dict(zip(decoded.offsets, decoded.items, strict=True))
        now_s = self.clock.monotonic_s()
        for r in records:
            if r.offset < owned.ticks_read:
                continue
            cut: dict[str, int] | None = None
            raw_cut = header(r, CUT_HEADER)
            if raw_cut is not None:
                with contextlib.suppress(orjson.JSONDecodeError, TypeError, ValueError):
                    parsed = orjson.loads(raw_cut)
                    cut = {k: int(parsed[k]) for k in INPUTS}
            skipped = header(r, SKIPPED_HEADER)
            held.append(
                HeldTick(
                    r.offset,
                    good.get(r.offset),
                    r.timestamp,
                    cut,
                    skipped.decode(errors="replace") if skipped is not None else None,
                    now_s,
                )
            )
            owned.ticks_read = r.offset + 1
        self.stats.ticks_in += len(decoded.items)
        return decoded.dead
