"""Checkpointing and commits: what makes restarts and rebalances exact, and at least once.

A shard's state is checkpointed to ``control.checkpoint`` (every ``checkpoint_interval_s`` while
it changes, when its partitions are revoked and at shutdown) with the offsets and last tick it
reflects (:mod:`fleetloop.core.checkpoint` explains why a checkpoint and not a re-read of recent
history; :mod:`fleetloop.daemon.runtime.assignment` how a new owner restores one). The state is
taken at an instant (a forked child encodes a copy-on-write image of it), so the loop goes on
folding and deciding while the child encodes and the chunks are sent; when checkpoints are costly
they are written less often, so the children's CPU stays near ``checkpoint_cpu_share`` of a core.

The group's offsets are committed after each batch, only once its decisions, dead letters and
summaries are acknowledged: at least once, and a duplicate decision is harmless (desired state
keyed by entity). A batch that moved no offset commits nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from fleetloop.core import checkpoint
from fleetloop.core.shard import INPUTS, Shard
from fleetloop.daemon import faults
from fleetloop.daemon.observability import logger
from fleetloop.daemon.runtime.config import DaemonConfig
from fleetloop.daemon.runtime.deadletters import DeadLetters
from fleetloop.daemon.runtime.link import Link
from fleetloop.daemon.runtime.partition import Partitions
from fleetloop.daemon.runtime.port import Clock, Offload, Producer, TopicPartition
from fleetloop.daemon.runtime.telemetry import DaemonStats
from fleetloop.schemas.topics import CHECKPOINT, TICKS, topic_name

log = logger("fleetloop.daemon")


class Checkpoints:
    def __init__(
        self,
        config: DaemonConfig,
        clock: Clock,
        parts: Partitions,
        link: Link,
        *,
        dead_letters: DeadLetters,
        offload: Offload,
        stats: DaemonStats,
    ) -> None:
        self.config = config
        self.clock = clock
        self.parts = parts
        self.link = link
        self.dead_letters = dead_letters  # a checkpoint marks the dead-letter topic's end
        self.offload = offload
        self.stats = stats
        self.topic = topic_name(config.prefix, CHECKPOINT)
        self.seq: dict[int, int] = {}  # per partition index, the last checkpoint's sequence number
        self.at: dict[int, float] = {}  # per partition index, when it was last checkpointed (or restored)
        self.gap_s = config.checkpoint_interval_s  # stretched by the checkpoints' cost
        self.task: asyncio.Task[None] | None = None  # the checkpoint being written, if any
        # (assignment generation, offsets) of the last commit: a batch that moved none commits nothing.
        self._committed: tuple[int, dict[TopicPartition, int]] | None = None

    # -- reading, for a restore --------------------------------------------------------------------

    async def read(self) -> dict[int, checkpoint.Found]:
        """This group's newest complete checkpoint of each partition index."""
        records = await self.link.broker.read_log(
            self.topic, client="restore", fetch_bytes=4 * checkpoint.CHUNK_BYTES
        )
        return checkpoint.scan(self.config.group_id, [(r.key, r.value) for r in records])

    async def decode(self, found: Mapping[int, checkpoint.Found | None]) -> dict[int, Shard | None]:
        """Each partition's newest checkpoint as a shard (None: none, or unusable, said in one line).
        Decoding runs in a thread: at 10k nodes it takes seconds, during which the loop goes on
        deciding the shards it already holds. It gets the interpreter every switch interval, or
        when the thread's C call returns: a checkpoint is parsed a piece at a time
        (:mod:`fleetloop.core.checkpoint`'s format 3), so no call holds it longer than one piece's
        parse (~2 ms, against 130 ms for one 28 MB document)."""
        blobs = {p: f.blob for p, f in found.items() if f is not None and f.blob is not None}
        t0 = self.clock.monotonic_s()
        values = await self.offload.in_thread(_decode_all, blobs) if blobs else {}
        if blobs:
            self.stats.checkpoint_decode_s = round(self.clock.monotonic_s() - t0, 3)
        out: dict[int, Shard | None] = {}
        for p in found:
            value = values.get(p)
            if isinstance(value, checkpoint.CheckpointError):
                log.warning(
                    "checkpoint unusable; starting the shard without it", partition=p, error=str(value)
                )
                value = None
            out[p] = value
        return out

    def restored(self, index: int, found: checkpoint.Found | None) -> None:
        """Partition ``index`` was (re)started: its next checkpoint follows ``found``'s sequence, a
        full interval from now."""
        if found is not None:
            self.seq[index] = max(self.seq.get(index, 0), found.max_seq)
        self.at[index] = self.clock.monotonic_s()

    # -- writing -----------------------------------------------------------------------------------

    async def write(self, *, force: bool = False) -> bool:
        """Checkpoint each changed shard (every ``checkpoint_interval_s``, or now when forced).

        The state is taken at this instant (a forked child encodes a copy-on-write image of it,
        :mod:`fleetloop.daemon.offload`), so the loop goes on folding and deciding while the child
        encodes and the chunks are sent; a periodic checkpoint returns at once, a forced one (revoke,
        shutdown, clean start) when the broker acknowledged it. One checkpoint is in flight at a
        time; one that fails leaves its shards changed, to be written again."""
        if self.link.session is None:
            return False
        producer = self.link.producer
        running = self.task
        if running is not None and not running.done():
            if not force:
                return False  # the next batch tries again
            await asyncio.wait([running])
        now_s = self.clock.monotonic_s()
        due = [
            owned
            for owned in self.parts
            if owned.dirty and (force or now_s - self.at.get(owned.index, 0.0) >= self.gap_s)
        ]
        if not due:
            return False
        values = []
        seqs: dict[int, int] = {}
        for owned in due:
            p, shard = owned.index, owned.shard
            # Every door dead letter of what was read, and every fold refusal of what was folded,
            # is acknowledged by now (the batch publishes them before it checkpoints).
            shard.lettered = owned.marks()
            shard.dl_mark = self.dead_letters.end
            values.append(shard.checkpoint_value())
            seqs[p] = self.seq[p] = self.seq.get(p, 0) + 1
            owned.dirty = False
            self.at[p] = now_s
        started_s = self.clock.monotonic_s()
        encoded = self.offload.encode_timed(checkpoint.encode_many, values)  # the state, as of now
        self.stats.checkpoint_loop_ms = round((self.clock.monotonic_s() - started_s) * 1000.0, 3)
        write = self._write(producer, seqs, encoded, started_s)
        if force:
            await write
            return True
        self.task = asyncio.create_task(self._background(write, [owned.index for owned in due]))
        return True

    async def _write(
        self,
        producer: Producer,
        seqs: Mapping[int, int],
        encoded: Coroutine[Any, Any, tuple[bytes, float]],
        started_s: float,
    ) -> None:
        data, cpu_s = await encoded
        blobs = checkpoint.split_many(data)
        self.stats.checkpoint_encode_s = round(self.clock.monotonic_s() - started_s, 3)
        self.stats.checkpoint_cpu_s = round(cpu_s, 3)
        self.stats.checkpoint_cpu_s_total += cpu_s
        cfg = self.config
        self.gap_s = checkpoint.gap_s(
            cfg.checkpoint_interval_s, cpu_s, cfg.checkpoint_cpu_share, cfg.checkpoint_max_stretch
        )
        self.stats.checkpoint_gap_s = round(self.gap_s, 3)
        chunks = [
            chunk
            for (p, seq), blob in zip(seqs.items(), blobs, strict=True)
            for chunk in checkpoint.to_chunks(cfg.group_id, p, seq, blob)
        ]

        async def send() -> None:
            futures = [await producer.send(self.topic, value=c.value, key=c.key) for c in chunks]
            await asyncio.gather(*futures)

        await self.link.retrying("checkpoint", send)
        self.stats.checkpoint_bytes = max(len(b) for b in blobs)
        self.stats.checkpoints_written += len(seqs)
        faults.reach("after-checkpoint")

    async def _background(self, write: Coroutine[Any, Any, None], due: Sequence[int]) -> None:
        try:
            await write
        except Exception as exc:  # written again with the next batch; an older checkpoint stands
            for p in due:
                if (owned := self.parts.get(p)) is not None:
                    owned.dirty = True
            log.warning(
                "checkpoint failed; it will be written again",
                error=f"{type(exc).__name__}: {exc}"[:300],
                ratelimit_key="checkpoint-failed",
            )

    async def cancel(self) -> None:
        """A stop after a failure: the checkpoint being written is abandoned (the last whole one stands)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    # -- commits -----------------------------------------------------------------------------------

    async def commit(self) -> None:
        """Commit every owned partition's offsets: the inputs as far as :meth:`Shard.commit_offset`
        allows (what was folded), and the ticks once past where publishing starts (not back into
        restored history)."""
        parts = self.parts
        offsets: dict[TopicPartition, int] = {}
        for owned in parts:
            p, shard = owned.index, owned.shard
            for logical in INPUTS:
                tp = parts.tp(logical, p)
                if tp in parts.assigned:
                    offsets[tp] = shard.commit_offset(logical)
            tp = parts.tp(TICKS, p)
            if tp in parts.assigned and shard.ticks_at >= owned.publish_from:
                offsets[tp] = shard.ticks_at
        if not offsets:
            return
        # The same offsets as the last commit under this assignment: nothing to commit. Most batches
        # (input records between boundaries: nothing folded, no tick decided) moved nothing, and
        # each commit is a round trip the loop waited on before its next fetch (a sixth of its wall
        # time on a large daemon): a tick arriving meanwhile was read that much later.
        done = dict(offsets)
        if self._committed == (parts.generation, done):
            self.stats.commits_skipped += 1
            return
        await self.link.consumer.commit(offsets)
        self._committed = (parts.generation, done)
        self.stats.commits += 1


def _decode_all(blobs: Mapping[int, bytes]) -> dict[int, Shard | checkpoint.CheckpointError]:
    """Checkpoint blobs decoded into shards (run in a thread: no loop state is touched)."""
    out: dict[int, Shard | checkpoint.CheckpointError] = {}
    for p, blob in blobs.items():
        try:
            out[p] = Shard.from_checkpoint(checkpoint.decode(blob))
        except checkpoint.CheckpointError as exc:
            out[p] = exc
    return out
