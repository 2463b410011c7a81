"""The daemon: observe -> model -> decide -> act over Kafka (the imperative shell).

One loop, one batch at a time::

    records  = consumer.getmany()                 # telemetry, request outcomes, ticks (by pool)
    decoded  = intake.read(records)               # bad records -> fleet.deadletter, with the reason
    for tick in ticks (offset order, per shard):  # ticks are events: a replay sees the same ones
        fold the shard's pending records up to the tick's cut; decide(snapshot, policy, state)
    publish(decisions); wait for acks             # control.decisions always, control.state if enforced
    every few seconds: checkpoint each changed shard to control.checkpoint; wait for acks
    commit(offsets)                               # only now: at least once, duplicates harmless

:class:`Daemon` only wires the parts together and runs their tasks (the consumer loop, the ticker,
the policy follower, the broker watch), each part in its own module:
:mod:`~fleetloop.daemon.runtime.partition` (one record per owned partition),
:mod:`~fleetloop.daemon.runtime.assignment` (assignment and restore),
:mod:`~fleetloop.daemon.runtime.intake` (reading a batch), :mod:`~fleetloop.daemon.runtime.decider`
(deciding the ready ticks), :mod:`~fleetloop.daemon.runtime.ticker` (the ticker, its catch-up and
overload rules), :mod:`~fleetloop.daemon.runtime.follower` (the policy and shadow follower),
:mod:`~fleetloop.daemon.runtime.checkpoints` (checkpoints and commits),
:mod:`~fleetloop.daemon.runtime.deadletters`, :mod:`~fleetloop.daemon.runtime.summaries` and
:mod:`~fleetloop.daemon.runtime.telemetry`. They reach the broker through
:mod:`~fleetloop.daemon.runtime.link` over the broker port (:mod:`~fleetloop.daemon.runtime.port`,
whose one adapter is :mod:`~fleetloop.daemon.runtime.kafka`), and read time through an injected clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from fleetloop import clock as wall_clock
from fleetloop.core.decide.engine import Engine
from fleetloop.core.shard import Shard
from fleetloop.daemon import faults
from fleetloop.daemon.observability import logger, tracer
from fleetloop.daemon.offload import Forked
from fleetloop.daemon.runtime.assignment import Assignment
from fleetloop.daemon.runtime.checkpoints import Checkpoints
from fleetloop.daemon.runtime.config import DaemonConfig
from fleetloop.daemon.runtime.deadletters import DeadLetters
from fleetloop.daemon.runtime.decider import Decider
from fleetloop.daemon.runtime.follower import PolicyFollower
from fleetloop.daemon.runtime.intake import Intake
from fleetloop.daemon.runtime.kafka import KafkaBroker
from fleetloop.daemon.runtime.link import Link
from fleetloop.daemon.runtime.partition import Partitions
from fleetloop.daemon.runtime.port import Broker, Clock, Offload, Record, TopicPartition
from fleetloop.daemon.runtime.summaries import Summaries
from fleetloop.daemon.runtime.telemetry import (
    DaemonStats,
    LoopTimes,
    StallSampler,
    StallWatch,
    TripTrace,
    freeze_survivors,
    tune_gc,
)
from fleetloop.daemon.runtime.ticker import Pace, Ticker
from fleetloop.daemon.service import metrics
from fleetloop.daemon.service.health import Health, supervise
from fleetloop.kafka_security import shown
from fleetloop.schemas.control import ActivePolicy
from fleetloop.schemas.decisions import Decision

log = logger("fleetloop.daemon")
OnDecisions = Callable[[Sequence[Decision]], None]


class Daemon:
    """fleetloop's control loop on one process. ``await run(stop)`` until ``stop`` is set.

    ``broker``: the broker port (default: Kafka through aiokafka); ``clock``: every reading of
    time (default: :mod:`fleetloop.clock`); ``offload``: checkpoint encoding and decoding off the
    loop (default: a forked child and a thread). Tests pass doubles of all three."""

    def __init__(
        self,
        config: DaemonConfig,
        on_decisions: OnDecisions | None = None,
        *,
        broker: Broker | None = None,
        clock: Clock = wall_clock,
        offload: Offload | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.engine = Engine(config.policy)  # holds the active policy; state lives in the shards
        self.stats = stats = DaemonStats()
        self.loop_times = LoopTimes(clock=clock, stats=stats)
        self.trace = TripTrace(clock=clock)
        self.health = Health(policy_loaded=True)
        self._on_decisions = on_decisions
        self._parts = parts = Partitions(config.prefix)
        self._link = link = Link(broker or KafkaBroker(config), self.health, shown(config.bootstrap_servers))
        pace = Pace()
        self._dead_letters = dead = DeadLetters(config.prefix, parts, link, stats=stats)
        self._follower = PolicyFollower(
            config, clock, parts, link, engine=self.engine, dead_letters=dead, stats=stats
        )
        self._checkpoints = Checkpoints(
            config, clock, parts, link, dead_letters=dead, offload=offload or Forked(), stats=stats
        )
        self._intake = Intake(config, clock, parts, link, dead_letters=dead, stats=stats)
        self._assignment = Assignment(
            config,
            clock,
            parts,
            link,
            checkpoints=self._checkpoints,
            dead_letters=dead,
            intake=self._intake,
            stats=stats,
        )
        self._summaries = Summaries(config, parts, link, engine=self.engine, stats=stats)
        self._decider = Decider(
            config,
            clock,
            parts,
            link,
            follower=self._follower,
            summaries=self._summaries,
            pace=pace,
            trace=self.trace,
            stats=stats,
        )
        self._ticker = Ticker(
            config,
            clock,
            parts,
            link,
            engine=self.engine,
            pace=pace,
            stats=stats,
            health=self.health,
            loop_times=self.loop_times,
            trace=self.trace,
        )
        self.ready = self._assignment.ready  # set once partitions are assigned and restored

    @property
    def shards(self) -> dict[int, Shard]:
        """The owned partitions' shards by index (a snapshot)."""
        return self._parts.shards()

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        if cfg.gc_gen0_threshold:
            tune_gc(cfg.gc_gen0_threshold)
        gc.callbacks.append(self.loop_times.on_gc)
        try:
            await self._run(stop)
        finally:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self.loop_times.on_gc)

    async def _run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        link = self._link
        link.stop = stop
        metrics.register(self)
        try:
            async with link.broker.session() as session:
                try:
                    link.session = session
                    session.consumer.subscribe(sorted(self._parts.logical), listener=self._assignment)
                    await self._follower.load_active()
                    considered = self._follower.considered
                    await session.policies.start_at(considered + 1 if considered >= 0 else None)
                    self.health.connected = True
                    jobs = {
                        "consumer": lambda: self._loop(stop),
                        "policy": lambda: self._follower.follow(stop),
                        "broker-watch": lambda: link.watch(stop, self._refresh_health),
                    }
                    if self.clock is wall_clock:
                        # Stalls are the real loop's: on a virtual clock there are none to measure,
                        # and a 20 ms timer would only reorder the virtual schedule the tests pin.
                        # The sampler is built here, on the loop's thread: the thread it watches.
                        watch = StallWatch(self.clock, self.loop_times.on_stall, StallSampler(self.clock))
                        jobs["stall-watch"] = lambda: watch.run(stop)
                    if cfg.run_ticker:
                        jobs["ticker"] = lambda: self._ticker.run(stop)
                    in_force = self.engine.policy.stamp  # the resumed one, not --policy's, after a restart
                    log.info(
                        "daemon started",
                        bootstrap=link.shown,
                        prefix=cfg.prefix,
                        policy=in_force.name,
                        version=in_force.version,
                        hash=in_force.hash,
                    )
                    # Every task is supervised: the first to die stops the daemon and is raised (TaskDied).
                    await supervise(self.health, jobs, stop)
                    # A clean stop leaves a checkpoint of where it stopped: the next start reads
                    # nothing twice.
                    await self._checkpoints.write(force=True)
                finally:
                    stop.set()
                    await self._checkpoints.cancel()  # after a failure: the last whole checkpoint stands
        finally:
            link.session = None
            metrics.unregister(self)
            # With the longest stalls of the loop's own time and what ran in each (bench sizing reads them).
            log.info("daemon stopped", **self.summary(), stalls=self.stats.stalls_shown())

    def summary(self) -> dict[str, int]:
        return self.stats.summary()

    # -- the loop -------------------------------------------------------------------------------

    async def _loop(self, stop: asyncio.Event) -> None:
        consumer = self._link.consumer
        parts = self._parts
        times = self.loop_times
        while not stop.is_set():
            try:
                if (figures := times.report()) is not None:
                    log.info("loop", **figures)
                freeze_survivors(times, self.config.gc_gen0_threshold > 0)
                times.lap("loop")
                if self._assignment.needed:
                    await self._assignment.restore()
                    times.lap("restore")
                queued = any(owned.held for owned in parts)
                batch = await consumer.getmany(timeout_ms=200, max_records=self.config.max_batch)
                if queued:
                    times.lap("fetch")  # with ticks queued (their cuts' records on the way)
                elif self._ticker.in_flight():
                    times.lap("fetch_in_flight")
                else:
                    times.lap("fetch_held_back" if self._ticker.holding_back() else "fetch_idle")
                await self._follower.apply_pending()
                if batch or any(owned.held for owned in parts):
                    await self.process(batch)
                    # A turn for the loop's other tasks (the ticker, the client's heartbeat and
                    # sends) before the next fetch: with records buffered, the fetch returns without
                    # waiting, and a batch with no tick to decide awaits nothing, so the loop read
                    # batch after batch in one step (up to 130 ms of its own CPU at 10,000 nodes).
                    await asyncio.sleep(0)
                elif any(owned.dirty for owned in parts):
                    await self._checkpoints.write()
                    times.lap("checkpoint")
            except (self._link.broker.error, OSError) as exc:
                # The broker went away mid-batch (or came back empty). What was decided but not
                # acknowledged is not committed: start again from the checkpoints, which decides
                # exactly those ticks again and publishes them.
                log.warning(
                    "broker error; resuming from the last checkpoint",
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
                self._assignment.needed = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)

    async def process(self, batch: Mapping[TopicPartition, Sequence[Record]]) -> list[Decision]:
        """Read one batch into the shards, decide the ticks that are ready, publish, checkpoint, commit."""
        link = self._link
        times = self.loop_times
        with tracer.start_as_current_span("fleetloop.batch") as span:
            read = self._intake.read(batch)
            if read is None:  # the client reset a position: the broker lost records
                self._assignment.needed = True
                return []
            n, dead = read
            span.set_attribute("records", n)
            times.lap("read")
            if dead:
                await self._dead_letters.publish(dead)
                times.lap("dead_letters")
            if n:
                faults.reach("mid-batch")
            # The collector is held while the ready ticks are folded and decided (it runs as usual
            # while the decider awaits, for the other tasks' steps): a young collection that comes
            # due runs at the decider's next turn (after a fold step, after a batch's decisions are
            # staged) or here, before the acknowledgements are awaited, never inside a batch; timed
            # as every collection (LoopTimes.on_gc) and seen by the stall watch as the pause of the
            # loop it is (CollectorHold).
            collector = self._decider.collector
            collector.hold()
            try:
                decisions = await self._decider.decide_ready()
            except BaseException:
                collector.release()
                raise
            self._ticker.wake_held_back()
            times.lap("decide")
            collector.release()
            times.lap("collect")
            shadowed = self._decider.take_shadowed()
            # Records the shards did not fold (a cap, a fold that raised) and ticks whose decision
            # raised: published before the checkpoint and the commit that cover them.
            refused = self._dead_letters.take_refusals()
            if refused:
                await self._dead_letters.publish(refused, stage="fold")
            if self._decider.failed:
                await link.retrying("tick-failed", self._decider.publish_failed)
            times.lap("dead_letters")
            if decisions or shadowed:
                await self._acknowledged(decisions, shadowed)
            times.lap("acks")
            if self._summaries.due:
                await link.retrying("summaries", self._summaries.publish)
            times.lap("summaries")
            await self._checkpoints.write()
            times.lap("checkpoint")
            await link.retrying("commit", self._checkpoints.commit)
            times.lap("commit")
        return decisions

    async def _acknowledged(self, decisions: list[Decision], shadowed: list[Decision]) -> None:
        """Wait until the broker acknowledged the batch's decisions (each was sent as its tick was
        decided), then count them and hand them to ``on_decisions``."""
        link = self._link
        publisher = link.publisher
        try:
            await publisher.flush()
        except link.broker.error as exc:
            if not link.broker.transient(exc):
                raise
            link.trouble("publish", exc)  # send them all again (same bytes, harmless)
            await link.retrying("publish", lambda: publisher.publish(decisions, shadowed))
        stats = self.stats
        stats.decisions_published += len(decisions)
        # Marked once the broker acknowledged them (each pool's decisions are sent as it is decided,
        # the acks awaited here): what waits on it may read them and the counters.
        if decisions:
            newest = max(d.ts_ms for d in decisions)
            stats.last_decision_ts_ms = max(stats.last_decision_ts_ms, newest)
        stats.shadow_decisions += len(shadowed)
        # One counter update per kind and reason, not per decision (~15,000 a tick at 10,000 nodes:
        # each update costs ~10 us in the metrics SDK).
        for (kind, reason), count in Counter((d.body.kind, d.body.reason) for d in decisions).items():
            metrics.decisions.add(count, {"kind": kind, "reason": reason})
        if self._on_decisions is not None:
            self._on_decisions(decisions)
        faults.reach("after-publish")
        self.trace.acked()

    # -- what others read -------------------------------------------------------------------------

    def input_offsets(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for owned in self._parts:
            out.update(owned.shard.input_offsets())
        return dict(sorted(out.items()))

    def active_record(self) -> ActivePolicy:
        return self._follower.active_record()

    def _refresh_health(self) -> None:
        h = self.health
        h.assigned = len(self._parts.assigned)
        h.assigned_once = h.assigned_once or self.ready.is_set()
        # Warm: every shard has read and decided what was on its partitions when it was assigned.
        h.warm = self.ready.is_set() and all(owned.caught_up() for owned in self._parts)

    def lag(self) -> dict[tuple[str, int], int]:
        if self._link.session is None:
            return {}
        consumer = self._link.consumer
        logical = self._parts.logical
        out: dict[tuple[str, int], int] = {}
        for tp in sorted(self._parts.assigned, key=lambda t: (t.topic, t.partition)):
            high = consumer.highwater(tp)
            if high is not None:
                out[(logical.get(tp.topic, tp.topic), tp.partition)] = max(
                    0, high - self._intake.position(tp)
                )
        return out

    def model_sizes(self) -> dict[str, int]:
        models = [owned.shard.model for owned in self._parts]
        return {
            "pools": sum(len(m.pools) for m in models),
            "nodes": sum(len(m.nodes) for m in models),
            "open_workflows": sum(len(m.ledger.active) for m in models),
        }

    def policy_in_force(self) -> tuple[str, int, str]:
        s = self.engine.policy.stamp
        return s.name, s.version, s.hash

    def broker_connected(self) -> bool:
        return self.health.connected

    def is_ready(self) -> bool:
        self._refresh_health()
        return self.health.ready()[0]

    def stability(self) -> dict[str, float]:
        return self.stats.stability()
