"""Deciding the ticks that are ready: each shard's queue in offset order, a tripping breaker first.

A tick is ready once its shard has read the records of its cut (the ``fleetloop.cut`` header; a
tick from another ticker, without one, is cut by its record time once each input shows a later
record, is read to its end, or the tick waited ``max_tick_hold_s``). Its shard folds up to the cut
and decides it under the policy active at its time (:meth:`PolicyFollower.policy_at`), the shadow
beside it; each tick's decisions are staged with the publisher as soon as its batch is decided and
acknowledged with the batch (``Daemon.process``). A tick decided again after a restore (below where
publishing starts) rebuilds the state and is not published; a tick whose decision raises costs only
itself: it goes on ``control.ticks`` as skipped, with the reason. A record on the ticks topic that
stands for boundaries not decided (marked skipped: an outage's, overload's) is passed, and its
records are folded at the next decided cut.

The order is for latency only: a pool's decisions depend on its tick, the shard's cut and that
pool's own state, so decisions depend on the topics' contents, not on batching or on this order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

import orjson

from fleetloop.core.shard import INPUTS, Shard
from fleetloop.daemon.observability import logger
from fleetloop.daemon.observe.decode import reason_of
from fleetloop.daemon.runtime.config import SKIPPED_FROM_HEADER, SKIPPED_HEADER, DaemonConfig
from fleetloop.daemon.runtime.follower import PolicyFollower
from fleetloop.daemon.runtime.link import Link
from fleetloop.daemon.runtime.partition import HeldTick, OwnedPartition, Partitions, boundary_run
from fleetloop.daemon.runtime.port import Clock
from fleetloop.daemon.runtime.summaries import Summaries
from fleetloop.daemon.runtime.telemetry import CollectorHold, DaemonStats, TripTrace
from fleetloop.daemon.runtime.ticker import Pace
from fleetloop.daemon.service import metrics
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.topics import TICKS, topic_name

log = logger("fleetloop.daemon")

# Ticks of one shard and boundary decided in one call at most: a batch is decided and staged
# without yielding to the loop, so the ticker, the consumer and the group heartbeat wait that long.
# At 10,000 nodes in 4 shards (~62 pools a shard) one call of 64 was a shard's whole boundary;
# decided and staged with its fold it held the loop 100-250 ms of its own CPU (placed with a
# per-callback timer in `bench sizing --nodes 10000 --daemons 3`). 16: a quarter of the decide and
# staging per turn of the loop; the shard's snapshot is taken once per boundary and shared.
DECIDE_BATCH_MAX = 16
# Records folded without yielding to the loop, at most, before a cut is decided (Shard.step_toward):
# a far cut (40 s of one 10k shard's records: 1.33 CPU-s, ~6.6 s at a fifth of a core) held the loop
# past the group's session timeout, and the group took the partitions away. And a boundary's own
# second of records (~7,500 rows a shard at 10,000 nodes, 2 calls per node per second) folded in
# the decide's call was most of a 100-250 ms stall. In steps of 2,000 rows the longest stalls left
# were single steps (50-86 ms of the loop's own time on a loaded machine: a pool's eviction,
# closing workflows); of 1,000, decide batches, at about the same CPU in all.
FOLD_STEP_ROWS = 1_000


class Decider:
    def __init__(
        self,
        config: DaemonConfig,
        clock: Clock,
        parts: Partitions,
        link: Link,
        *,
        follower: PolicyFollower,
        summaries: Summaries,
        pace: Pace,
        trace: TripTrace,
        stats: DaemonStats,
    ) -> None:
        self.config = config
        self.clock = clock
        self.parts = parts
        self.link = link
        self.follower = follower
        self.summaries = summaries
        self.pace = pace
        self.trace = trace
        self.stats = stats
        self.fold_step_rows = FOLD_STEP_ROWS
        # Held by ``Daemon.process`` over decide_ready, relieved at this decider's turns (_turn).
        self.collector = CollectorHold(config.gc_gen0_threshold)
        self.shadowed: list[Decision] = []  # the shadow's decisions staged since the last take
        self.failed: list[tuple[int, int, Tick, str]] = []  # (partition, offset, tick, reason)

    def take_shadowed(self) -> list[Decision]:
        shadowed, self.shadowed = self.shadowed, []
        return shadowed

    async def decide_ready(self) -> list[Decision]:
        """Decide every held tick whose inputs are read, and send each tick's decisions as soon as
        its batch is decided (acknowledged later, before the checkpoint and the commit: ``process``).

        First, across shards, the ticks at the head of each shard's queue (one boundary, one cut)
        whose pool has a failed call among the records the cut folds: a tripping breaker goes out
        before the other pools' routine decisions, and is acknowledged before they are decided
        (:meth:`Publisher.settle`). Then every ready tick in offset order. A pool's
        decisions depend only on its tick, the shard's cut and that pool's own state, so this order
        decides nothing differently (replay, in log order, produces the same bytes). The ticks of
        one shard at one boundary (the same time and cut, consecutive in its queue) are decided in
        one :meth:`Shard.decide_many`, at most ``DECIDE_BATCH_MAX`` at a time; between batches the
        loop yields: the client sends what was staged, the ticker publishes on time, and the
        consumer keeps fetching while a large fleet is decided."""
        out: list[Decision] = []
        parts = self.parts
        # Per partition: its record and the offsets in its queue of held ticks decided ahead of
        # order. The record too: a partition that went and came back during an await (a rebalance;
        # the settle below is a round trip) has a new record, restored from a checkpoint, whose
        # queued ticks are all its own to decide.
        early: dict[int, tuple[OwnedPartition, set[int]]] = {}
        for p, hs in self._troubled_heads():
            owned = parts.get(p)
            if owned is None:
                continue  # the partition went (a rebalance during a yield)
            await self._decide_held(owned, hs, out, trip=True)
            if not parts.is_current(owned):
                continue  # it went during a yield: decided again from its checkpoint
            early.setdefault(p, (owned, set()))[1].update(h.offset for h in hs)
            owned.dirty = True
        if early and self.link.session is not None:
            # The tripping pools' decisions are on the broker before any routine pool is decided.
            # Staged only, they went out when the client's tasks got turns of the loop between the
            # routine batches (tens of ms each) and shared a request with them: about half of the
            # time from the boundary to control.state on a large daemon. A failure is raised by
            # process()'s flush, as before.
            await self.collector.unheld(self.link.publisher.settle())
            self.trace.acked()
        for p in parts.indexes():
            owned = parts.get(p)
            if owned is not None:
                mark = early.get(p)
                await self._decide_queue(
                    owned, mark[1] if mark is not None and mark[0] is owned else set(), out
                )
        return out

    async def _decide_queue(self, owned: OwnedPartition, done: set[int], out: list[Decision]) -> None:
        """Decide ``owned``'s queue in order up to the first tick not ready; ``done``: offsets
        decided ahead of order (only their place in the queue remains)."""
        shard, held = owned.shard, owned.held
        while held and self.parts.is_current(owned):
            h = held[0]
            run = 1  # held ticks this step passes
            if h.offset in done:
                pass  # decided above, out of order: only its place in the queue remains
            elif h.tick is not None and h.skipped is None:
                cut = self._cut_of(owned, h)
                if cut is None:
                    break  # ticks of one partition are decided in order
                run = boundary_run(held, done)
                started_s = self.clock.monotonic_s()
                await self._decide_held(owned, [x for x in held[:run] if x.offset not in done], out, cut)
                self.pace.note(owned.index, self.clock.monotonic_s() - started_s)
                if not self.parts.is_current(owned):
                    break  # the shard went during the yield: its new owner decides from its checkpoint
            elif h.tick is not None and shard.skip(h.tick):
                self.stats.ticks_skipped += 1
                metrics.ticks.add(1, {"outcome": "missed"})
                log.warning(
                    "ticks skipped", pool=h.tick.pool_id, through_tick=h.tick.tick_id, reason=h.skipped
                )
            shard.ticks_at = held[run - 1].offset + 1
            del held[:run]
            owned.dirty = True

    def _cut_of(self, owned: OwnedPartition, h: HeldTick) -> dict[str, int] | None:
        """The cut of a held tick, or None while its inputs are not read far enough to know it."""
        shard = owned.shard
        consumer = self.link.consumer
        p = owned.index
        if h.cut is not None:
            for logical in INPUTS:
                if shard.read[logical] < h.cut[logical]:
                    highwater = consumer.highwater(self.parts.tp(logical, p))
                    if highwater is None or highwater > shard.read[logical]:
                        return None  # not read yet
            return h.cut
        # A tick without a cut (from another ticker): its record time closes the prefix once each
        # input shows a later record, or is read to its end, or the tick waited max_tick_hold_s.
        for logical in INPUTS:
            if shard.seen_after(logical, h.timestamp_ms):
                continue
            highwater = consumer.highwater(self.parts.tp(logical, p))
            waited_s = self.clock.monotonic_s() - h.since_s
            # Read to the end as of the last fetch, and that fetch came after the tick arrived.
            if highwater is not None and shard.read[logical] >= highwater and waited_s >= 0.3:
                continue
            if waited_s >= self.config.max_tick_hold_s:
                self.stats.ticks_forced += 1
                metrics.ticks.add(1, {"outcome": "forced"})
                break
            return None
        return shard.cut_by_time(h.timestamp_ms)

    def _troubled_heads(self) -> list[tuple[int, list[HeldTick]]]:
        """Per partition, the ticks of the boundary at the head of its queue (same time, same cut,
        all ready) whose pool has a failed call among the records that cut folds, in queue order."""
        out: list[tuple[int, list[HeldTick]]] = []
        for owned in self.parts:
            held = owned.held
            if not held or held[0].tick is None or held[0].skipped is not None or held[0].cut is None:
                continue
            head = held[0]
            assert head.tick is not None
            if self._cut_of(owned, head) is None:
                continue
            troubled = owned.shard.troubled(head.cut or {})
            if not troubled:
                continue
            found: list[HeldTick] = []
            for h in held:
                same = h.tick is not None and h.skipped is None and h.cut == head.cut
                if not same or h.tick is None or h.tick.ts_ms != head.tick.ts_ms:
                    break  # the head boundary ends here
                if h.tick.pool_id in troubled:
                    found.append(h)
            if found:
                out.append((owned.index, found))
        return out

    async def _decide_held(
        self,
        owned: OwnedPartition,
        hs: Sequence[HeldTick],
        out: list[Decision],
        cut: dict[str, int] | None = None,
        *,
        trip: bool = False,
    ) -> None:
        """Decide held ticks of one boundary (their cut ready), in batches of distinct pools of at
        most ``DECIDE_BATCH_MAX``; stage each tick's decisions in queue order, yielding after each
        batch. ``trip``: pools with a failed call, decided first (their stages go to ``trace``)."""
        start = 0
        while start < len(hs):
            pools: set[str] = set()
            end = start
            while end < len(hs) and end - start < DECIDE_BATCH_MAX:
                tick = hs[end].tick
                assert tick is not None
                if tick.pool_id in pools:
                    break  # the same pool twice (a duplicate tick record): the second in the next batch
                pools.add(tick.pool_id)
                end += 1
            await self._decide_batch(owned, hs[start:end], out, cut, trip=trip)
            if not self.parts.is_current(owned):
                return  # the shard went during the yield: its new owner decides from its checkpoint
            start = end

    async def _decide_batch(
        self,
        owned: OwnedPartition,
        hs: Sequence[HeldTick],
        out: list[Decision],
        cut: dict[str, int] | None,
        *,
        trip: bool = False,
    ) -> None:
        """Decide held ticks of one boundary and distinct pools in one :meth:`Shard.decide_many`, as
        one :meth:`Shard.decide` each would (a tick that raises costs only itself); stage their
        decisions in order, then yield to the loop."""
        shard = owned.shard
        ticks: list[Tick] = []
        for h in hs:
            assert h.tick is not None
            ticks.append(h.tick)
        batch_cut = cut if cut is not None else hs[0].cut
        assert batch_cut is not None
        trace = self.trace
        boundary = ticks[0].ts_ms
        if trip:
            now_ms, now_s = self.clock.wall_ms(), self.clock.monotonic_s()
            trace.stamp(boundary, "ticks_read", now_ms - int((now_s - min(h.since_s for h in hs)) * 1000))
            trace.stamp(boundary, "cut_ready", now_ms)
        if not await self._fold_in_steps(owned, ticks, batch_cut):
            return  # the shard went during a yield: its new owner decides from its checkpoint
        if trip:
            trace.stamp(boundary, "folded")
        started_s = self.clock.monotonic_s()
        policy = self.follower.policy_at(ticks[0].ts_ms)
        decided: list[tuple[Decision, ...] | Exception | None]
        try:
            decided = shard.decide_many(ticks, batch_cut, policy)
        except Exception:  # as each tick's decide would (the fold, say): one by one, as before
            decided = []
            for tick in ticks:
                try:
                    decided.append(shard.decide(tick, batch_cut, policy))
                except Exception as exc:
                    decided.append(exc)
        shadowed = self._decide_shadows(
            shard, [t for t, d in zip(ticks, decided, strict=True) if d and not isinstance(d, Exception)]
        )
        # Each tick's share of the batch's time: what a tick costs to decide (snapshot + policies).
        share_s = (self.clock.monotonic_s() - started_s) / len(ticks)
        if trip:
            trace.stamp(boundary, "decided")
        for h, d in zip(hs, decided, strict=True):
            assert h.tick is not None
            if isinstance(d, Exception):  # one pool's bad tick must not stop the others' decisions
                self._tick_failed(owned.index, h.offset, h.tick, d)
                continue
            published = self._settle(owned, h.offset, d, share_s)
            if published:
                out.extend(published)
                self.summaries.note(owned.index, h.tick, published)
                shadow = shadowed.get(h.tick.pool_id, ())
                self.shadowed.extend(shadow)
                await self.collector.unheld(self.link.publisher.stage(published, shadow))
                if not self.parts.is_current(owned):
                    return  # the shard went during the hand-over (as it would have between ticks)
        if trip and out:
            trace.stamp(boundary, "staged")
            trace.trips.add(boundary)
        # The client hands the batch over; the ticker, the consumer's fetches and the group
        # heartbeat get a turn (also between ticks decided again after a restore, not published).
        await self._turn()

    async def _turn(self) -> None:
        """A turn of the loop between steps, the collector running as usual for the other tasks'
        steps (:meth:`CollectorHold.unheld`); then, with the young generation still past the
        threshold, a collection and another turn: the collection is a step of its own, never inside
        a batch's decide (:meth:`CollectorHold.relieve`)."""
        await self.collector.unheld(asyncio.sleep(0))
        if self.collector.relieve():
            await self.collector.unheld(asyncio.sleep(0))

    async def _fold_in_steps(
        self, owned: OwnedPartition, ticks: Sequence[Tick], cut: Mapping[str, int]
    ) -> bool:
        """Fold what ``ticks`` (one boundary) would fold first, ``fold_step_rows`` records at a time
        with a yield to the loop after each step, the last step included, so the decide's own fold
        finds nothing left and the loop is never held for a fold and a decide at once; the shard
        ends as the decide's own fold would leave it (:meth:`Shard.step_toward`). Nothing is folded
        when every tick is a duplicate (the decide folds nothing then either). False when the
        shard went during a yield."""
        shard = owned.shard
        if all((last := shard.last_tick.get(t.pool_id)) is not None and t.tick_id <= last[0] for t in ticks):
            return True
        while (step := shard.step_toward(cut, self.fold_step_rows)) is not None:
            shard.fold_to(step)
            self.stats.fold_steps += 1
            await self._turn()
            if not self.parts.is_current(owned):
                return False
        if any(q and q[0].offset < cut.get(k, shard.folded[k]) for k, q in shard.pending.items()):
            shard.fold_to(cut)  # the last step (at most fold_step_rows): the decide folds nothing
            await self._turn()
            if not self.parts.is_current(owned):
                return False
        return True

    def _decide_shadows(self, shard: Shard, ticks: Sequence[Tick]) -> dict[str, tuple[Decision, ...]]:
        """The shadow policy's decisions on ticks of one boundary just decided, by pool; a failure
        costs only that tick's shadow decisions."""
        if not ticks:
            return {}
        try:
            results = shard.decide_shadow_many(ticks, self.follower.shadow_at(ticks[0].ts_ms))
        except Exception as exc:
            results = [exc for _ in ticks]
        out: dict[str, tuple[Decision, ...]] = {}
        for tick, result in zip(ticks, results, strict=True):
            if isinstance(result, Exception):
                self.stats.shadow_failed += 1
                log.error(
                    "shadow policy could not decide a tick; the enforced decisions stand",
                    pool=tick.pool_id,
                    tick_id=tick.tick_id,
                    error=reason_of(result),
                    ratelimit_key=f"shadow-failed:{tick.pool_id}",
                )
            else:
                out[tick.pool_id] = result
        return out

    def _settle(
        self, owned: OwnedPartition, offset: int, decided: tuple[Decision, ...] | None, duration_s: float
    ) -> Sequence[Decision]:
        """Count a decided tick by outcome; the decisions to publish (none for a tick decided again)."""
        if decided is None:
            self.stats.ticks_duplicate += 1
            metrics.ticks.add(1, {"outcome": "duplicate"})
        elif not decided:
            self.stats.ticks_no_data += 1  # no data on this pool in its shard
            metrics.ticks.add(1, {"outcome": "skipped"})
        elif offset < owned.publish_from:
            self.stats.ticks_restored += 1  # rebuilds state after a restore; published before
            metrics.ticks.add(1, {"outcome": "warmup"})
        else:
            metrics.tick_duration.record(duration_s)
            metrics.ticks.add(1, {"outcome": "decided"})
            self._account(decided)
            return decided
        return ()

    def _account(self, decided: Sequence[Decision]) -> None:
        stats = self.stats
        stats.ticks_decided += 1
        for d in decided:
            body = d.body
            if body.kind == "breaker":
                if body.state == "open" and body.enforced:
                    if body.node_id not in stats.breaker_open_nodes:
                        stats.breaker_opens += 1
                        stats.breaker_open_nodes.add(body.node_id)
                        log.info("breaker opened", node=body.node_id, reason=body.reason, **body.inputs)
                elif body.state == "closed":
                    stats.breaker_open_nodes.discard(body.node_id)

    def _tick_failed(self, p: int, offset: int, tick: Tick, exc: Exception) -> None:
        """A tick whose decision raised: counted, logged (rate-limited per pool) and published as
        skipped with the reason (:meth:`publish_failed`), not decided."""
        self.stats.ticks_failed += 1
        self.stats.last_tick_failure = f"pool {tick.pool_id} tick {tick.tick_id}: {reason_of(exc)}"
        self.failed.append((p, offset, tick, f"decide-failed: {reason_of(exc)}"))
        metrics.ticks.add(1, {"outcome": "failed"})
        log.error(
            "tick not decided: deciding raised; the loop goes on",
            pool=tick.pool_id,
            tick_id=tick.tick_id,
            error=reason_of(exc),
            ratelimit_key=f"tick-failed:{tick.pool_id}",
        )

    async def publish_failed(self) -> None:
        """A tick whose decision raised goes on control.ticks as skipped, with the reason: nothing
        is silently missing for whoever reads the ticks (replay decides it again and fails alike)."""
        producer = self.link.producer
        topic = topic_name(self.config.prefix, TICKS)
        futures: list[Awaitable[Any]] = []
        for p, offset, tick, reason in self.failed:
            owned = self.parts.get(p)
            if offset < (owned.publish_from if owned is not None else 0):
                continue  # decided again after a restore: published before
            futures.append(
                await producer.send(
                    topic,
                    key=tick.pool_id.encode(),
                    value=orjson.dumps(tick.model_dump()),
                    headers=[
                        (SKIPPED_HEADER, reason.encode()[:1000]),
                        (SKIPPED_FROM_HEADER, str(tick.tick_id).encode()),
                    ],
                    partition=p,  # beside the tick it stands for, whatever partitioner keyed that one
                )
            )
        if futures:
            await asyncio.gather(*futures)
        self.failed = []
