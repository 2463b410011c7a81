"""The ticker: one tick per pool per boundary on ``control.ticks``, with its catch-up and overload rules.

The ticker publishes, for each pool of each shard it owns and has caught up on, one Tick per
``tick_ms`` boundary of wall time (``tick_id = ts_ms // tick_ms``), with the cut in the header
``fleetloop.cut``. It continues from the last tick on ``control.ticks`` for that pool, so after an
outage (of this daemon, of the instance that owned the partition, or of the broker) the missed
boundaries are published late and decided from the recorded inputs (each cut: the records the
broker had stamped by that boundary), never silently skipped. More than ``catchup_max_ticks`` missed
boundaries of one pool are published as one tick record marked ``fleetloop.skipped`` (with the
reason and the first skipped tick id), counted and logged, and the newest ``catchup_max_ticks``
are decided (fewer when the shard's recent pace says deciding them would take longer than
``catchup_budget_s``: :meth:`Ticker.catch_up_keeps`).

Overload. A daemon that decides more slowly than the boundaries come (too little CPU for its
shards) would otherwise decide every boundary in turn, each later than the one before: its
decisions grow minutes stale and never recover, worse than no control plane. So the ticker puts no
new tick on ``control.ticks`` for a pool that has ``overload_max_ticks`` boundaries published and
not yet decided. Once fewer are waiting, it publishes the boundaries it held back as one tick record
marked ``fleetloop.skipped`` (reason ``overload: ...``, first skipped tick id in
``fleetloop.skipped_from``) and then the newest boundary, whose cut folds every record read by
then: the shard decides the newest boundary next, and at most ``overload_max_ticks`` boundaries
ever wait before it (a breaker's trigger among them). A ticker that a busy loop held up past
several boundaries (it woke a tick period or more late) publishes them the same way (the newest
only, when they would make more than ``overload_max_ticks`` wait); boundaries missed while the
broker was unreachable or held the ticker's publish, or before this instance ticked the pool at
all, are an outage's and caught up as above. No record is dropped: the skipped boundaries' records
are folded at the next decided cut. The skips are on the ticks topic like an outage's, so a replay
decides exactly what the daemon decided. Counted (``ticks_overload``, the ticks metric with outcome
``overload``), logged once when a shard goes into overload and once when it is out, and reported
by ``/healthz`` (``overload``: the partitions in it, the ticks skipped). The rule is
:func:`overload_step`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import orjson

from fleetloop.core.decide.engine import Engine
from fleetloop.core.shard import INPUTS
from fleetloop.daemon.observability import logger
from fleetloop.daemon.runtime.config import CUT_HEADER, SKIPPED_FROM_HEADER, SKIPPED_HEADER, DaemonConfig
from fleetloop.daemon.runtime.link import Link
from fleetloop.daemon.runtime.partition import OwnedPartition, Partitions
from fleetloop.daemon.runtime.port import Clock, Producer, TopicPartition
from fleetloop.daemon.runtime.telemetry import DaemonStats, LoopTimes, TripTrace
from fleetloop.daemon.service import metrics
from fleetloop.daemon.service.health import Health
from fleetloop.schemas.control import Tick
from fleetloop.schemas.topics import TICKS, topic_name

log = logger("fleetloop.daemon")


def overload_step(waiting: int, new: int, limit: int, outage: bool) -> int:
    """How many of a pool's ``new`` boundaries due now (the newest ones) the ticker publishes as
    ticks; the older rest go out as one tick marked skipped. ``waiting``: the pool's boundaries
    published by this instance and not yet decided or skipped by its shard; ``limit``:
    ``overload_max_ticks``; ``outage``: the boundaries were missed because nobody could publish
    them (this instance has published none for the pool yet, the broker was unreachable since it
    last published, or its publish was held), not because the loop was too busy deciding to let the
    ticker run (it woke a tick period or more late).

    - the rule off (``limit`` <= 0): all ``new``;
    - ``waiting`` >= ``limit``: 0, held back (overload);
    - an outage: all ``new`` (its catch-up, bounded by ``catchup_max_ticks`` apart; what it adds
      to ``waiting`` holds the next ticks back until decided);
    - ``waiting`` + ``new`` > ``limit``: 1, the newest (a ticker held up by a busy loop adds no
      backlog);
    - else all ``new``."""
    if limit <= 0:
        return new
    if waiting >= limit:
        return 0
    if outage:
        return new
    return 1 if waiting + new > limit else new


class Pace:
    """Per partition index, the recent wall seconds its shard took to decide one boundary (yields
    and the machine's other work included: how long it really takes), each boundary weighing half.
    Kept when the partition goes: it measures this machine."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}

    def note(self, index: int, took_s: float) -> None:
        was = self.seconds.get(index)
        self.seconds[index] = took_s if was is None else (was + took_s) / 2.0

    def of(self, index: int) -> float | None:
        """Shard ``index``'s pace, or (one this instance has not decided a boundary of yet) the mean
        of the others' (the same machine); None with none at all."""
        paces = self.seconds
        return paces.get(index) or (sum(paces.values()) / len(paces) if paces else None)


@dataclass(frozen=True, slots=True)
class _PoolRound:
    """What one pool's round publishes: its ticks, after one skipped record for ``skipped`` (if any)."""

    boundaries: list[int]  # empty: held back (overload)
    skipped: list[int]
    reason: str = ""
    overload: bool = False


class Ticker:
    def __init__(
        self,
        config: DaemonConfig,
        clock: Clock,
        parts: Partitions,
        link: Link,
        *,
        engine: Engine,
        pace: Pace,
        stats: DaemonStats,
        health: Health,
        loop_times: LoopTimes,
        trace: TripTrace,
    ) -> None:
        self.config = config
        self.clock = clock
        self.parts = parts
        self.link = link
        self.engine = engine  # its active policy's tick_ms is the ticker's
        self.pace = pace
        self.stats = stats
        self.health = health
        self.loop_times = loop_times
        self.trace = trace
        self.topic = topic_name(config.prefix, TICKS)
        # Set by the loop when a shard has decided every tick it held while the ticker holds pools
        # of it back: the ticker publishes them then, not at the next boundary (wake_held_back).
        self.tick_now = asyncio.Event()

    # -- what the loop asks ----------------------------------------------------------------------

    def holding_back(self) -> bool:
        """Whether the ticker holds any pool back for overload now."""
        return any(owned.withheld for owned in self.parts)

    def in_flight(self) -> bool:
        """Whether a tick this instance published for a shard it owns is not decided yet while no
        tick is queued: on its way through the broker (``fetch_in_flight`` in the "loop" line)."""
        tick_ms = self.engine.policy.tick_ms
        return any(owned.waiting(pool, tick_ms) > 0 for owned in self.parts for pool in owned.ticked)

    def wake_held_back(self) -> None:
        """Wake the ticker when a shard has decided every tick it held while the ticker holds pools
        of it back and fewer than ``overload_max_ticks`` of such a pool's boundaries wait now.

        Without this the shard sat idle until the next boundary (up to a tick period, and the tick's
        way through the broker) while the records it will fold piled up: on a large daemon behind
        its boundaries, a sixth of its loop's wall time (``fetch_held_back`` in the "loop" line)."""
        if self.tick_now.is_set():
            return
        tick_ms = self.engine.policy.tick_ms
        limit = self.config.overload_max_ticks
        for owned in self.parts:
            if owned.held:
                continue
            if any(owned.waiting(pool, tick_ms) < limit for pool in owned.withheld):
                self.tick_now.set()
                return

    # -- the task ---------------------------------------------------------------------------------

    async def _sleep_to(self, boundary: int, now: int, stop: asyncio.Event) -> None:
        """Until the wall clock reaches ``boundary``, ``stop`` is set or the loop wakes the ticker."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.tick_now.wait())]
        try:
            await asyncio.wait(waits, timeout=(boundary - now) / 1000.0, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def run(self, stop: asyncio.Event) -> None:
        clock = self.clock
        link = self.link
        while not stop.is_set():
            tick_ms = self.engine.policy.tick_ms
            now = clock.wall_ms()
            boundary = (now // tick_ms + 1) * tick_ms
            await self._sleep_to(boundary, now, stop)
            if stop.is_set():
                return
            if self.tick_now.is_set() and clock.wall_ms() < boundary:
                # Woken between boundaries: a shard has decided what waited. Its held-back pools
                # get their ticks now (the newest boundary passed; those before it as skipped).
                self.tick_now.clear()
                try:
                    await self.publish(boundary - tick_ms, tick_ms, held_up=True, held_back_only=True)
                except (link.broker.error, OSError) as exc:
                    link.trouble("tick", exc)
                continue
            self.tick_now.clear()  # the boundary's round covers the held-back pools too
            # Woken a tick period or more after its boundary: the loop held the ticker up (it was
            # deciding); boundaries missed so are overload's. On time, boundaries missed since the
            # last round are an outage's (a publish the broker held, a restart).
            late_ms = clock.wall_ms() - boundary
            times = self.loop_times
            times.ticker_late_s = max(times.ticker_late_s, late_ms / 1000.0)
            started_s = clock.monotonic_s()
            self.trace.stamp(boundary, "woke")
            try:
                if wait_s := self.config.tick_read_wait_s:
                    await self.read_to_now(wait_s, boundary)
                self.trace.stamp(boundary, "read_up")
                await self.publish(boundary, tick_ms, held_up=late_ms >= tick_ms)
                self.trace.stamp(boundary, "ticks_acked")
                times.ticker_s += clock.monotonic_s() - started_s
            except (link.broker.error, OSError) as exc:  # the broker is away: the next round catches up
                link.trouble("tick", exc)

    async def read_to_now(self, limit_s: float, boundary: int | None = None) -> None:
        """Wait, at most ``limit_s``, until every owned input partition is read up to its end as the
        broker reports it now (a round trip; then the loop's own fetches) or, given the tick
        ``boundary``, holds a read record stamped after it: the boundary's cut is the longest prefix
        of records stamped at or before it (:meth:`Shard.cut_by_time`), so it ends before that
        record and reading on cannot change it. When every partition holds one, the wait ends
        without asking the broker (the cut is the one the whole wait would have given)."""
        if self.link.session is None:
            return
        consumer = self.link.consumer
        clock = self.clock
        parts = self.parts
        tps = [tp for p in parts.indexes() for tp in (parts.tp(k, p) for k in INPUTS) if tp in parts.assigned]
        if not tps:
            return
        logical = parts.logical

        def past(tp: TopicPartition) -> bool:
            owned = parts.get(tp.partition)
            return owned is None or (
                boundary is not None and owned.shard.seen_after(logical[tp.topic], boundary)
            )

        if all(past(tp) for tp in tps):
            return
        deadline = clock.monotonic_s() + limit_s
        known = {tp: consumer.highwater(tp) or 0 for tp in tps}  # as of the last fetch, before the boundary
        listing = asyncio.ensure_future(consumer.end_offsets(tps))
        try:
            while not listing.done():
                if clock.monotonic_s() >= deadline or all(past(tp) for tp in tps):
                    return  # the boundary does not wait on a broker that does not answer
                await asyncio.wait([listing], timeout=0.005)
            listed = listing.result()
        except self.link.broker.error:
            return
        finally:
            listing.cancel()
        # The embedded broker's ListOffsets answers the last batch's base offset: the high watermark
        # a fetch saw before the boundary covers that batch when it was fetched by then.
        end = {tp: max(listed[tp], known[tp]) for tp in tps}
        while clock.monotonic_s() < deadline:
            if all(
                (owned := parts.get(tp.partition)) is None
                or owned.shard.read[logical[tp.topic]] >= end[tp]
                or past(tp)
                for tp in tps
            ):
                return
            await asyncio.sleep(0.005)

    # -- one round ---------------------------------------------------------------------------------

    async def publish(
        self, now_b: int, tick_ms: int, *, held_up: bool = False, held_back_only: bool = False
    ) -> None:
        """Publish each owned, caught-up pool's ticks due at boundary ``now_b`` (and those missed since
        its last), under the catch-up and overload rules; ``held_up``: the loop held this round up
        (see :meth:`run`); ``held_back_only``: only the pools held back for overload (a round
        between boundaries, :meth:`wake_held_back`)."""
        futures: list[Awaitable[Any]] = []
        sent: dict[int, dict[str, int]] = {}
        # Boundaries missed while the broker was unreachable, or with the ticker on time, are an
        # outage's, caught up in full (up to catchup_max_ticks); missed because the loop held the
        # ticker up, they are overload's.
        link = self.link
        if held_back_only:
            broker_gap = link.gap  # left for the boundary's round
        else:
            broker_gap, link.gap = link.gap, False
        outage = broker_gap or not held_up
        for owned in self.parts:
            if self.parts.tp(TICKS, owned.index) not in self.parts.assigned or not owned.caught_up():
                continue
            futures += await self._publish_shard(
                owned, now_b, tick_ms, outage=outage, held_back_only=held_back_only, sent=sent
            )
        self.health.overloaded = [owned.index for owned in self.parts if owned.overload is not None]
        self.health.ticks_overload = self.stats.ticks_overload
        if futures:
            await asyncio.gather(*futures)
        for index, pools in sent.items():
            now_owned = self.parts.get(index)
            if now_owned is not None:  # still owned after the acks (or owned again)
                now_owned.ticked.update(pools)

    async def _publish_shard(
        self,
        owned: OwnedPartition,
        now_b: int,
        tick_ms: int,
        *,
        outage: bool,
        held_back_only: bool,
        sent: dict[int, dict[str, int]],
    ) -> list[Awaitable[Any]]:
        """One shard's part of a round: each pool's skipped record first, then the ticks boundary by
        boundary; what was sent (per pool its newest boundary) goes into ``sent``."""
        producer = self.link.producer
        shard = owned.shard
        futures: list[Awaitable[Any]] = []
        held_back = 0  # pools of this shard whose tick is held back at this boundary
        skipped_here = 0  # ... and those whose held-back boundaries went out as skipped
        due: dict[int, list[str]] = {}  # boundary -> pools to tick at it, in pool order
        for pool in shard.pools():
            if held_back_only and pool not in owned.withheld:
                continue
            plan = self._plan(owned, pool, now_b, tick_ms, outage)
            if plan is None:
                continue
            if not plan.boundaries:
                held_back += 1
                continue
            if plan.skipped:
                futures.append(await self._send_skipped(producer, pool, plan.skipped, plan.reason, tick_ms))
                if plan.overload:
                    self.stats.ticks_overload += len(plan.skipped)
                    skipped_here += 1
                    metrics.ticks.add(len(plan.skipped), {"outcome": "overload"})
            if len(plan.boundaries) > 1:
                self.stats.ticks_caught_up += len(plan.boundaries) - 1
            for b in plan.boundaries:
                due.setdefault(b, []).append(pool)
            sent.setdefault(owned.index, {})[pool] = plan.boundaries[-1]
        # The ticks after every pool's skipped record, boundary by boundary: the pools of one
        # boundary stay consecutive on the partition, so the shard decides them in one batch (a
        # skipped record between them would split the batch into one call per pool). A boundary's
        # cut is the shard's, the same for every pool it ticks: computed (a scan of the records read
        # and not folded) and encoded once per boundary, not once per pool (at 10,000 nodes, a
        # third of the daemon's CPU when done per pool).
        for b in sorted(due):
            cut = orjson.dumps(shard.cut_by_time(b), option=orjson.OPT_SORT_KEYS)
            for pool in due[b]:
                value = orjson.dumps(Tick(ts_ms=b, tick_id=b // tick_ms, pool_id=pool).model_dump())
                futures.append(
                    await producer.send(
                        self.topic, key=pool.encode(), value=value, headers=[(CUT_HEADER, cut)]
                    )
                )
        if not held_back_only or held_back or skipped_here:
            self._note_overload(owned, held_back, skipped_here)
        return futures

    def _plan(
        self, owned: OwnedPartition, pool: str, now_b: int, tick_ms: int, outage: bool
    ) -> _PoolRound | None:
        """Which of ``pool``'s boundaries up to ``now_b`` this round publishes, and which go out as
        skipped (overload, or an outage beyond the catch-up); None when none is due. Notes a pool
        held back, and forgets it once it is published again."""
        cfg = self.config
        published = owned.ticked.get(pool)
        decided = owned.shard.last_tick.get(pool)
        last = max(published if published is not None else -1, decided[1] if decided else -1)
        first = (last // tick_ms + 1) * tick_ms if last >= 0 else now_b
        boundaries = list(range(first, now_b + 1, tick_ms))
        if not boundaries:
            return None
        waiting = owned.waiting(pool, tick_ms)  # published (by this instance), not decided
        limit = cfg.overload_max_ticks
        n = overload_step(waiting, len(boundaries), limit, outage or published is None)
        if n == 0:
            owned.withheld.setdefault(pool, (first, waiting))
            return _PoolRound([], [])
        withheld = owned.withheld.pop(pool, None)
        if withheld is not None:
            n, waiting = 1, withheld[1]  # held back before: the newest only, whatever waits now
        if n < len(boundaries):
            reason = (
                f"overload: {len(boundaries) - n} ticks not decided: {waiting} boundaries were "
                f"waiting to be decided (overload_max_ticks {limit}); deciding the newest"
            )
            return _PoolRound(boundaries[-n:], boundaries[:-n], reason, overload=True)
        keep = self.catch_up_keeps(owned.index, len(boundaries))
        if len(boundaries) <= keep:
            return _PoolRound(boundaries, [])
        skipped = boundaries[:-keep]
        if keep == cfg.catchup_max_ticks:
            reason = f"outage: {len(skipped)} ticks missed, beyond the catch-up of {keep}"
        else:
            self.stats.ticks_catchup_capped += len(skipped)
            reason = (
                f"outage: {len(skipped)} ticks missed, beyond the catch-up of {keep}: "
                f"deciding all {keep + len(skipped)} would take longer than catchup_budget_s "
                f"{cfg.catchup_budget_s:g} at this shard's pace"
            )
        return _PoolRound(boundaries[-keep:], skipped, reason)

    def catch_up_keeps(self, index: int, missed: int) -> int:
        """How many of an outage's ``missed`` boundaries of a pool of shard ``index`` (the newest)
        are caught up: ``catchup_max_ticks`` at most, and when the shard's recent pace says deciding
        them would take longer than ``catchup_budget_s``, those that fit it (at least
        ``overload_max_ticks``, at least one). A shard this instance has not decided a boundary of
        yet (a new owner whose checkpoint was written at the revoke: nothing to decide again) takes
        the mean pace of the shards it has decided (:class:`Pace`); with none at all, every missed
        boundary is decided."""
        cfg = self.config
        keep = cfg.catchup_max_ticks
        pace = self.pace.of(index)
        if cfg.catchup_budget_s > 0 and pace and missed * pace > cfg.catchup_budget_s:
            keep = min(keep, max(1, cfg.overload_max_ticks, int(cfg.catchup_budget_s / pace)))
        return keep

    async def _send_skipped(
        self, producer: Producer, pool: str, skipped: list[int], reason: str, tick_ms: int
    ) -> Awaitable[Any]:
        """Send the one tick record that stands for the boundaries ``skipped`` of ``pool`` (an outage's
        beyond the catch-up, or overload's): the last boundary's tick, marked skipped with ``reason``
        and the first skipped tick id. Returns the send's future."""
        end = skipped[-1]
        marker = Tick(ts_ms=end, tick_id=end // tick_ms, pool_id=pool)
        return await producer.send(
            self.topic,
            key=pool.encode(),
            value=orjson.dumps(marker.model_dump()),
            headers=[
                (SKIPPED_HEADER, reason.encode()),
                (SKIPPED_FROM_HEADER, str(skipped[0] // tick_ms).encode()),
            ],
        )

    def _note_overload(self, owned: OwnedPartition, held_back: int, skipped: int) -> None:
        """One log line when shard ``owned`` goes into overload (its ticker held ticks back or
        published boundaries as skipped) and one when it is out: ``overload_max_ticks`` boundaries in
        a row published whole, none held back or skipped (an episode does not end and begin again
        at every boundary while the shard is still too slow)."""
        state = owned.overload
        if held_back or skipped:
            if state is None:
                self.stats.overload_episodes += 1
                log.warning(
                    "overload: the shard decides more slowly than the ticks come; from now on it "
                    "decides the newest boundary next and the boundaries between go out as skipped",
                    partition=owned.index,
                    pools_held_back=held_back,
                    pools_skipped=skipped,
                    overload_max_ticks=self.config.overload_max_ticks,
                )
            owned.overload = (state[0] if state else self.clock.monotonic_s(), 0)
            return
        if state is None:
            return
        clean = 0 if owned.withheld else state[1] + 1
        if clean < max(1, self.config.overload_max_ticks):
            owned.overload = (state[0], clean)
            return
        owned.overload = None
        log.warning(
            "overload over: the shard decides every boundary again",
            partition=owned.index,
            lasted_s=round(self.clock.monotonic_s() - state[0], 1),
            ticks_overload=self.stats.ticks_overload,
        )
