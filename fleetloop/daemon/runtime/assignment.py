"""Assignment and restore: which partitions this instance owns, and where each one's shard goes on.

Restarts and rebalances are exact. A newly assigned partition restores its newest complete
checkpoint (:mod:`fleetloop.daemon.runtime.checkpoints`) and reads on from the checkpoint's
offsets: the ticks between the checkpoint and the group's committed offset are decided again to
rebuild the state and not republished; later ones are published (a crash between publish and
commit republishes the same bytes). A partition the instance already owned keeps its shard and its
read position across a rebalance: nothing is read twice. A revoked partition is checkpointed at
once, so whoever gets it next starts from there; one the group no longer gives this instance is
forgotten (its record dropped). A consumer group without a checkpoint (its first start) reads up to
``warmup_records`` of history before its committed offset as an approximate warm-up; that is the
only approximate start.

An emptied broker (the embedded broker keeps topics in memory; a restart re-creates them empty) is
detected at assignment when a checkpoint or committed offset lies beyond a partition's end: the
daemon logs one line and starts that shard clean from the beginning of what the broker has. The
same holds when the client resets a position by itself, or the broker fails mid-batch: the loop
then forgets every shard and restores the current assignment (:meth:`Assignment.restore`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from fleetloop.core import checkpoint
from fleetloop.core.shard import INPUTS, Shard
from fleetloop.daemon.observability import logger
from fleetloop.daemon.runtime.checkpoints import Checkpoints
from fleetloop.daemon.runtime.config import DaemonConfig
from fleetloop.daemon.runtime.deadletters import DeadLetters
from fleetloop.daemon.runtime.intake import Intake
from fleetloop.daemon.runtime.link import Link
from fleetloop.daemon.runtime.partition import OwnedPartition, Partitions
from fleetloop.daemon.runtime.port import Clock, GroupConsumer, TopicPartition
from fleetloop.daemon.runtime.telemetry import DaemonStats, gc_held
from fleetloop.schemas.topics import TICKS

log = logger("fleetloop.daemon")
LOOK_AGAIN_S = 1.0  # how long a doubtful "emptied" waits before the broker's end offsets are asked again


class Assignment:
    def __init__(
        self,
        config: DaemonConfig,
        clock: Clock,
        parts: Partitions,
        link: Link,
        *,
        checkpoints: Checkpoints,
        dead_letters: DeadLetters,
        intake: Intake,
        stats: DaemonStats,
    ) -> None:
        self.config = config
        self.clock = clock
        self.parts = parts
        self.link = link
        self.checkpoints = checkpoints
        self.dead_letters = dead_letters
        self.intake = intake
        self.stats = stats
        self.ready = asyncio.Event()  # set once the first assignment is in place
        self.needed = False  # the loop restores the assignment before its next fetch
        self._emptied_hint: set[int] = set()  # shards found beyond the broker's ends at a restore

    # -- the group's callbacks ---------------------------------------------------------------------

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        """Checkpoint every shard now, so whoever gets a partition next starts from here. The shards
        stay in memory: a partition assigned back to this instance goes on without a re-read."""
        self.parts.generation += 1
        self.parts.assigned.difference_update(revoked)
        link = self.link
        if link.session is not None and not await link.publisher.settle():
            # Decisions sent but not acknowledged: a checkpoint now would let the next owner start
            # past them. It starts from the last checkpoint instead and decides them again.
            log.warning("decisions not acknowledged at revoke; no checkpoint written")
            return
        if link.session is not None and self.parts:
            try:
                await self.checkpoints.write(force=True)
            except Exception as exc:  # the next owner falls back to an older checkpoint
                log.warning("checkpoint at revoke failed", error=f"{type(exc).__name__}: {exc}")

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        self.parts.generation += 1
        if self.link.stop is None or not self.link.stop.is_set():
            # Counted while running: the group hands a stopping member's partitions on as it stops
            # (another member's leave), which is the stop's, not a rebalance of a running group.
            self.stats.assignments += 1
        try:
            await self.assign(assigned)
        except (self.link.broker.error, OSError) as exc:  # the loop restores once the broker answers again
            log.warning("assignment failed; will restore", error=f"{type(exc).__name__}: {exc}"[:300])
            self.needed = True

    # -- assigning ---------------------------------------------------------------------------------

    async def assign(self, assigned: Sequence[TopicPartition]) -> None:
        """Restore (or keep) a shard per assigned partition index (:meth:`_held`), with the cyclic
        collector held meanwhile and the restored shards frozen out of its sight
        (:func:`~fleetloop.daemon.runtime.telemetry.gc_held`)."""
        with gc_held(self.config.gc_gen0_threshold > 0):
            await self._held(assigned)

    async def _held(self, assigned: Sequence[TopicPartition]) -> None:
        """Restore (or keep) a shard per assigned partition index, each sought to where it goes on.

        The partitions are paused from when their end offsets are known until they are sought:
        the client would otherwise go on fetching them from the committed offsets while checkpoints
        are read and decoded (seconds at fleet scale), and every such batch was unpacked only to be
        dropped ("fetched while the assignment callback was still seeking") and fetched again after
        the seek: a large backlog was fetched twice. Not paused from the start: the first fetch's
        high watermark is what corrects the embedded broker's end offsets (its ListOffsets answers
        the last batch's base offset: 511 for 714 records), and without it a restart took the
        broker for emptied and started clean. Resumed whatever happens, so a failed restore leaves
        them as before."""
        consumer = self.link.consumer
        held = [tp for tp in assigned if tp.topic in self.parts.logical]
        try:
            await self._assign(consumer, assigned, held)
        finally:
            consumer.resume(*held)  # one a rebalance took meanwhile is skipped by the consumer (port)

    async def _assign(
        self, consumer: GroupConsumer, assigned: Sequence[TopicPartition], held: Sequence[TopicPartition]
    ) -> None:
        parts = self.parts
        indexes = sorted({tp.partition for tp in assigned if tp.topic in parts.logical})
        for gone in sorted(set(parts.indexes()) - set(indexes)):
            parts.forget(gone)
        parts.assigned = set(assigned)
        if not indexes:
            self.ready.set()
            return
        new = [p for p in indexes if p not in parts]
        emptied: set[int] = set()
        tps = [parts.tp(logical, p) for p in indexes for logical in (*INPUTS, TICKS)]
        begin = await consumer.beginning_offsets(tps)
        end = await self.end_offsets(tps)
        consumer.pause(*held)  # until sought (see assign)
        found = await self.checkpoints.read() if new else {}
        if new:  # dead letters this instance publishes from now on lie at or after this offset
            await self.dead_letters.note_end()
        if any(self._beyond(p, end) for p in indexes):
            # The embedded broker's ListOffsets can lag what it has acknowledged: ask again before
            # calling the broker emptied.
            await self.look_again(held)
            end = await self.end_offsets(tps)
        # Every new shard's checkpoint decoded (off the loop), then the dead-letter topic read once
        # for all of them, all before the first shard is registered (see ``_restore``).
        decoded = await self.checkpoints.decode({p: found.get(p) for p in new})
        letters = await self.dead_letters.scan(decoded)
        for p in indexes:
            owned = parts.get(p)
            if owned is not None and self._beyond(p, end):
                emptied.add(p)
                parts.forget(p)
                owned = None
                new.append(p)
                found = found or await self.checkpoints.read()
            if owned is not None:  # kept across the rebalance: go on where we were
                for logical in INPUTS:
                    self.intake.seek(parts.tp(logical, p), owned.shard.read[logical])
                self.intake.seek(parts.tp(TICKS, p), owned.ticks_read)
                continue
            if p not in decoded:
                decoded.update(await self.checkpoints.decode({p: found.get(p)}))
                letters.update(await self.dead_letters.scan({p: decoded[p]}))
            if await self._restore(p, found.get(p), decoded[p], letters.get(p, set()), begin=begin, end=end):
                emptied.add(p)
        if emptied:
            await self._started_clean(emptied)
        log.info(
            "partitions assigned",
            shards={
                str(p): {
                    "inputs": {k: parts[p].shard.folded[k] for k in INPUTS},
                    "ticks": parts[p].shard.ticks_at,
                    "publish_from": parts[p].publish_from,
                    "kept": p not in new,
                }
                for p in indexes
            },
        )
        self.ready.set()

    async def _started_clean(self, emptied: set[int]) -> None:
        self.stats.shards_started_clean += len(emptied)
        log.warning(
            "the broker has less data than this group had read, checkpointed or committed "
            "(emptied or re-created topics, e.g. a restarted in-memory broker): starting clean",
            partitions=sorted(emptied),
        )
        # Supersede whatever stale checkpoint the emptied broker holds now (one written at a revoke
        # after it came back), so the next assignment does not start clean again.
        for p in emptied:
            self.parts[p].dirty = True
        try:
            await self.checkpoints.write(force=True)
        except (self.link.broker.error, OSError) as exc:
            log.warning("checkpoint after a clean start failed", error=f"{type(exc).__name__}: {exc}"[:300])

    async def look_again(self, tps: Sequence[TopicPartition]) -> None:
        """Give the broker a second before its end offsets are asked again, with ``tps`` fetched
        until each has a fresh high watermark (one fetch answer each, dropped), then paused again:
        on the embedded broker the high watermark is what corrects its ListOffsets (see
        :meth:`assign`)."""
        consumer = self.link.consumer
        clock = self.clock
        t0 = clock.monotonic_s()
        # Only those assigned as the look starts (a filter for meaning, the port makes any call on
        # the others safe): one a rebalance assigns during the wait is that assignment's to pause
        # and resume, and this look's closing pause would hold it.
        mine = consumer.assignment()
        tps = [tp for tp in tps if tp in mine]
        polled = {tp: consumer.last_poll_timestamp(tp) for tp in tps}
        consumer.resume(*tps)
        try:
            while clock.monotonic_s() - t0 < LOOK_AGAIN_S:
                # Only those still assigned are waited for (meaning, not safety): one taken reads
                # None (the port), equal to the None of one not fetched yet when listed, and would
                # be waited for to the end though no fetch of it is coming.
                mine = consumer.assignment()
                waiting = [
                    tp for tp, was in polled.items() if tp in mine and consumer.last_poll_timestamp(tp) == was
                ]
                if not waiting:
                    break
                await asyncio.sleep(0.01)
        finally:
            consumer.pause(*tps)  # one a rebalance took meanwhile is skipped by the consumer (port)
        await asyncio.sleep(max(0.0, LOOK_AGAIN_S - (clock.monotonic_s() - t0)))

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        consumer = self.link.consumer
        end = await consumer.end_offsets(list(tps))
        # The client knows a high watermark only of a partition still assigned: of one a rebalance
        # took during the await it is unknown (None, see the port), and the broker's end stands.
        return {tp: max(end[tp], consumer.highwater(tp) or 0) for tp in tps}

    def _beyond(self, p: int, end: Mapping[TopicPartition, int]) -> bool:
        """Whether shard ``p``, kept in memory, has read past the partitions' ends."""
        owned = self.parts.get(p)
        if owned is None:
            return False
        return any(mark > end[self.parts.tp(k, p)] for k, mark in owned.marks().items())

    async def _restore(
        self,
        p: int,
        found: checkpoint.Found | None,
        restored: Shard | None,
        already: set[tuple[str, int]],
        *,
        begin: Mapping[TopicPartition, int],
        end: Mapping[TopicPartition, int],
    ) -> bool:
        """Restore shard ``p`` from its decoded checkpoint (``restored``), ``already`` the sources
        on the dead-letter topic after its mark; True when the broker turned out emptied."""
        parts = self.parts
        ticks_tp = parts.tp(TICKS, p)
        committed_ticks = await self.link.consumer.committed(ticks_tp)
        emptied = await self._emptied(p, restored, committed_ticks, end)
        shard = restored
        if emptied:
            shard, committed_ticks = None, None
        if shard is None:
            shard, publish_from = await self._start(p, emptied, begin=begin, end=end)
            if not emptied:
                publish_from = committed_ticks if committed_ticks is not None else end[ticks_tp]
        else:
            self.stats.shards_restored += 1
            publish_from = committed_ticks if committed_ticks is not None else shard.ticks_at
        # Dead letters published before: below the shard's marks, and ``already`` (found on the
        # dead-letter topic from its checkpoint's mark on: published between that checkpoint and a
        # crash). Read before the shard is registered: from then on to its seeks nothing may await
        # (a batch fetched from the committed offsets would land in a shard not yet positioned).
        if shard is not restored:
            already = set()  # started clean: its checkpoint's marks do not apply
        lettered = dict(shard.lettered)
        if not shard.lettered and shard.dl_mark < 0 and not emptied:
            # A checkpoint from before dead letters were tracked: its run dead-lettered at read,
            # before it checkpointed or committed, so the committed offsets were handled.
            lettered = {k: shard.folded[k] for k in INPUTS}
            if committed_ticks is not None:
                lettered[TICKS] = committed_ticks
        shard.refusals = []
        shard.model.config = self.config.model  # caps as configured now, also for a restored model
        parts.add(
            OwnedPartition(
                p,
                shard,
                publish_from=publish_from,
                ticks_read=shard.ticks_at,
                catchup={logical: end[parts.tp(logical, p)] for logical in (*INPUTS, TICKS)},
                lettered=lettered,
                # A first start's warm-up re-folds history a previous run handled (up to its commit):
                # the refusals among it are not news. A restored shard re-folds only what it had not
                # checkpointed.
                fold_lettered=dict(shard.lettered) if shard.dl_mark < 0 else {},
                already=already,
            )
        )
        self.checkpoints.restored(p, found)
        # From the checkpoint's offsets: nothing it folded is read again. What lies between them and
        # the group's commit (folded by the previous run after its last checkpoint; the commit moves
        # every batch, a checkpoint every ``checkpoint_interval_s``) is read and folded again: the
        # checkpoint does not hold it, and folding it forward is what makes the restored state the
        # continuous one. A clean stop checkpoints last, so after one nothing is read twice.
        for logical in INPUTS:
            self.intake.seek(parts.tp(logical, p), shard.folded[logical])
        self.intake.seek(ticks_tp, shard.ticks_at)
        return emptied

    async def _emptied(
        self, p: int, restored: Shard | None, committed_ticks: int | None, end: Mapping[TopicPartition, int]
    ) -> bool:
        """Whether the broker holds less of partition ``p`` than the checkpoint or the group's
        commit says was read: emptied (looked at again before it is believed)."""
        parts = self.parts
        ticks_tp = parts.tp(TICKS, p)
        emptied = False
        if restored is not None:
            marks = {**{logical: restored.folded[logical] for logical in INPUTS}, TICKS: restored.ticks_at}
            emptied = any(marks[k] > end[parts.tp(k, p)] for k in marks)
        if committed_ticks is not None and committed_ticks > end[ticks_tp]:
            emptied = True
        if p in self._emptied_hint:
            self._emptied_hint.discard(p)
            return True  # measured against fresh end offsets already
        if emptied:  # the embedded broker's ListOffsets can lag: look again before believing it
            tps = [parts.tp(k, p) for k in (*INPUTS, TICKS)]
            await self.look_again(tps)
            end = {**end, **await self.end_offsets(tps)}
            marks = {
                **(dict(restored.folded) if restored else {}),
                TICKS: restored.ticks_at if restored else 0,
            }
            emptied = any(marks[k] > end[parts.tp(k, p)] for k in marks) or (
                committed_ticks is not None and committed_ticks > end[ticks_tp]
            )
        return emptied

    async def _start(
        self, p: int, emptied: bool, *, begin: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
    ) -> tuple[Shard, int]:
        """A shard for partition ``p`` without a checkpoint: from the beginning of what an emptied
        broker has, or the warm-up before the group's committed offsets; and where publishing starts
        (an emptied broker's: its beginning)."""
        shard = Shard(p, self.config.model)
        start = {}
        for logical in (*INPUTS, TICKS):
            tp = self.parts.tp(logical, p)
            resume = end[tp] if emptied else (await self.link.consumer.committed(tp))
            if resume is None:
                resume = end[tp]
            start[logical] = begin[tp] if emptied else max(begin[tp], resume - self.config.warmup_records)
            # The warm-up re-reads history a previous run handled: its dead letters went out.
            shard.lettered[logical] = begin[tp] if emptied else resume
        shard.start_at(start, start[TICKS])
        return shard, begin[self.parts.tp(TICKS, p)]

    # -- after a broker error ----------------------------------------------------------------------

    async def restore(self) -> None:
        """Forget every shard and restore the current assignment from the checkpoints (after a
        broker error, or when the client had to reset a position: the broker lost records)."""
        consumer = self.link.consumer
        parts = self.parts
        generation = parts.generation
        assigned = sorted(tp for tp in consumer.assignment() if tp.topic in parts.logical)
        if assigned:
            end = await self.end_offsets(assigned)
            self._emptied_hint = {p for p in parts.indexes() if self._beyond(p, end)}
        for p in parts.indexes():
            parts.forget(p)
        self.needed = False
        if assigned:
            await self.assign(assigned)
        if parts.generation != generation:
            # The group moved partitions while this restore awaited the broker (the rebalance
            # callbacks run beside the loop): what it restored may be another owner's now.
            # Restore the current assignment again, from the checkpoints.
            self.needed = True
