"""The daemon: observe -> model -> decide -> act over Kafka (the imperative shell).

One loop, one batch at a time::

    records  = consumer.getmany()                 # telemetry, request outcomes, ticks (by pool)
    decoded  = decode_batch(...)                  # bad records -> fleet.deadletter, with the reason
    model    = apply(model, good records)         # pure reducer
    for tick in ticks (event-time order):         # ticks are events: a replay sees the same ones
        result = decide(snapshot(model, tick.ts_ms), policy, state, tick, input offsets)
    publish(decisions); wait for acks             # control.decisions always, control.state if enforced
    commit(input offsets)                         # only now: at least once, duplicates harmless

Start-up and rebalance: for every partition it is given, the daemon seeks back up to
``warmup_records`` before its committed offset and folds that history (running the ticks in it
through the policies too, without publishing), so a restarted daemon decides from the same kind of
model and breaker states it had, and resumes publishing exactly at the committed offset. A fresh
consumer group treats everything already on the topic as history.

The ticker publishes one Tick per owned pool every ``tick_ms`` of wall time; ``tick_id`` is
``ts_ms // tick_ms``, so a restarted or second ticker produces the same ids, not new ones.
Policy documents arrive on ``control.policy``; a valid one with the followed name and a higher
version replaces the active policy between batches; an invalid one is refused (logged and
dead-lettered) and the active one stays in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from aiokafka.structs import OffsetAndMetadata

from fleetloop.daemon import clock
from fleetloop.daemon.act.publish import Publisher
from fleetloop.daemon.decide.engine import Engine, envelope_of
from fleetloop.daemon.model.fleet import FleetModel, snapshot
from fleetloop.daemon.observability import logger, tracer
from fleetloop.daemon.observe.decode import DeadLetter, decode_batch, reason_of
from fleetloop.daemon.service import metrics
from fleetloop.daemon.service.health import Health, one_line, supervise
from fleetloop.daemon.service.security import Bootstrap, connect, shown
from fleetloop.policies.base import FleetSnapshot
from fleetloop.policies.registry import CompiledPolicy, PolicyError, compile_policy, parse_document
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.schemas.topics import POLICY, REQUESTS, TELEMETRY, TICKS, topic_name

log = logger("fleetloop.daemon")
BROKER_WATCH_S = 2.0  # how often the broker watch asks for metadata (connection state, /readyz)
RETRY_MAX_S = 5.0  # longest backoff between retries of a Kafka operation while the broker is away


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (KafkaConnectionError, KafkaTimeoutError)) or (
        isinstance(exc, KafkaError) and exc.retriable
    )


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    bootstrap_servers: Bootstrap  # a host:port list, or a KafkaConnection with TLS / SASL settings
    policy: CompiledPolicy
    prefix: str = ""
    group_id: str = "fleetloop"
    client_id: str = "fleetloop"
    follow_policy: str | None = None  # policy name to follow on control.policy (default: the initial's)
    run_ticker: bool = True
    idempotence: bool = True
    max_batch: int = 5000
    warmup_records: int = 10_000
    max_tick_hold_s: float = 2.0  # decide a tick at the latest this long after it arrived
    # Cyclic GC: the young generation is collected every this many new container objects (Python's
    # default, 700, runs it every few dozen decoded records: ~25% of ingest CPU, measured by
    # ``fleetloop bench ingest``). 0 leaves the interpreter's settings alone.
    gc_gen0_threshold: int = 100_000


@dataclass(slots=True)
class DaemonStats:
    events_in: int = 0
    telemetry_in: int = 0
    outcomes_in: int = 0
    ticks_in: int = 0
    ticks_decided: int = 0
    ticks_warmup: int = 0
    ticks_no_data: int = 0
    ticks_forced: int = 0
    dead_letters: int = 0
    decisions_published: int = 0
    breaker_opens: int = 0
    policies_applied: int = 0
    policies_refused: int = 0
    commits: int = 0
    last_decision_ts_ms: int = 0
    last_refusal: str = ""
    breaker_open_nodes: set[str] = field(default_factory=set)


OnDecisions = Callable[[Sequence[Decision]], None]


def tune_gc(gen0_threshold: int) -> None:
    """Collect young objects every ``gen0_threshold`` allocations instead of every 700, and move
    what exists at start-up (modules, compiled policies) out of the collector's sight for good.

    Reference counting frees almost everything the loop allocates (decoded records, snapshots); the
    cyclic collector only finds cycles, and with the default threshold it walked the young
    generation after every few dozen records. Process-wide, so the daemon's process sets it."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


@dataclass(frozen=True, slots=True)
class _HeldTick:
    tick: Tick
    tp: TopicPartition
    offset: int
    since_s: float


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.daemon._owned.difference_update(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.daemon._on_assigned(sorted(assigned))


class Daemon:
    """fleetloop's control loop on one process. ``await run(stop)`` until ``stop`` is set."""

    def __init__(self, config: DaemonConfig, on_decisions: OnDecisions | None = None) -> None:
        self.config = config
        self.engine = Engine(config.policy)
        self.model = FleetModel()
        self.stats = DaemonStats()
        self._on_decisions = on_decisions
        p = config.prefix
        self._topics = {
            topic_name(p, TELEMETRY): TELEMETRY,
            topic_name(p, REQUESTS): REQUESTS,
            topic_name(p, TICKS): TICKS,
        }
        self._policy_topic = topic_name(p, POLICY)
        self._resume_at: dict[TopicPartition, int] = {}
        self._positions: dict[TopicPartition, int] = {}
        self._owned: set[TopicPartition] = set()
        self._unverified: set[TopicPartition] = set()  # assigned, first fetch not yet checked
        self._pool_partition: dict[str, int] = {}
        self._watermark: dict[TopicPartition, int] = {}  # newest event time folded, per input partition
        self._held: list[_HeldTick] = []
        self._pending_policy: CompiledPolicy | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._publisher: Publisher | None = None
        self.ready = asyncio.Event()
        self.health = Health(policy_loaded=True)
        self._stop: asyncio.Event | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        if cfg.gc_gen0_threshold:
            tune_gc(cfg.gc_gen0_threshold)
        producer = AIOKafkaProducer(
            **connect(cfg.bootstrap_servers),
            client_id=f"{cfg.client_id}-producer",
            acks="all",
            enable_idempotence=cfg.idempotence,
            linger_ms=5,
        )
        consumer = AIOKafkaConsumer(
            **connect(cfg.bootstrap_servers),
            client_id=cfg.client_id,
            group_id=cfg.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            partition_assignment_strategy=(RangePartitionAssignor,),
            max_poll_records=cfg.max_batch,
            # Short sessions: the embedded broker completes a join in about half the session timeout.
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )
        policy_consumer = AIOKafkaConsumer(
            **connect(cfg.bootstrap_servers),
            client_id=f"{cfg.client_id}-policy",
            enable_auto_commit=False,
        )
        self._stop = stop
        metrics.register(self)
        await producer.start()
        try:
            await consumer.start()
            try:
                await policy_consumer.start()
                self._consumer = consumer
                self._publisher = Publisher(producer, cfg.prefix)
                consumer.subscribe(sorted(self._topics), listener=_Rebalance(self))
                policy_consumer.assign([TopicPartition(self._policy_topic, 0)])
                await policy_consumer.seek_to_beginning()
                self.health.connected = True
                jobs = {
                    "consumer": lambda: self._loop(consumer, stop),
                    "policy": lambda: self._follow_policies(policy_consumer, stop),
                    "broker-watch": lambda: self._watch_broker(consumer, stop),
                }
                if cfg.run_ticker:
                    jobs["ticker"] = lambda: self._ticker(producer, stop)
                log.info(
                    "daemon started",
                    bootstrap=shown(cfg.bootstrap_servers),
                    prefix=cfg.prefix,
                    policy=cfg.policy.stamp.name,
                    version=cfg.policy.stamp.version,
                    hash=cfg.policy.stamp.hash,
                )
                # Every task is supervised: the first to die stops the daemon and is raised (TaskDied).
                await supervise(self.health, jobs, stop)
            finally:
                stop.set()
                await policy_consumer.stop()
                await consumer.stop()
        finally:
            await producer.stop()
            metrics.unregister(self)
            log.info("daemon stopped", **self.summary())

    def summary(self) -> dict[str, int]:
        s = self.stats
        return {
            "events_in": s.events_in,
            "ticks_decided": s.ticks_decided,
            "decisions_published": s.decisions_published,
            "dead_letters": s.dead_letters,
            "breaker_opens": s.breaker_opens,
            "commits": s.commits,
        }

    async def _on_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        consumer = self._consumer
        assert consumer is not None
        if not assigned:
            self.ready.set()
            return
        begin = await consumer.beginning_offsets(list(assigned))
        end = await consumer.end_offsets(list(assigned))
        for tp in assigned:
            committed = await consumer.committed(tp)
            resume = committed if committed is not None else end[tp]
            start = max(begin[tp], resume - self.config.warmup_records)
            self._resume_at[tp] = resume
            self._positions[tp] = start
            consumer.seek(tp, start)
        self._owned.update(assigned)
        self._unverified.update(assigned)
        log.info(
            "partitions assigned",
            partitions={
                f"{tp.topic}:{tp.partition}": f"{self._positions[tp]}..{self._resume_at[tp]}"
                for tp in assigned
            },
        )
        self.ready.set()

    # -- the loop -------------------------------------------------------------------------------

    async def _loop(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=self.config.max_batch)
            if self._pending_policy is not None:
                self.engine.set_policy(self._pending_policy)
                self._pending_policy = None
            if batch or self._held:
                await self.process(batch)

    async def process(self, batch: Mapping[TopicPartition, Sequence[Any]]) -> list[Decision]:
        """Fold one batch, decide on its ticks, publish, then commit. Returns what was published."""
        assert self._publisher is not None
        dead: list[DeadLetter] = []
        model = self.model
        with tracer.start_as_current_span("fleetloop.batch") as span:
            n = 0
            for tp in sorted(batch, key=lambda t: (t.topic, t.partition)):
                records = batch[tp]
                if not records or tp not in self._owned:
                    # Fetched while the assignment callback was still seeking: the seek re-reads them.
                    continue
                if tp in self._unverified:
                    # The client's own start position (the committed offset) can land after our
                    # warm-up seek; the first fetch after an assignment must start where we sought.
                    self._unverified.discard(tp)
                    if records[0].offset != self._positions[tp]:
                        assert self._consumer is not None
                        self._consumer.seek(tp, self._positions[tp])
                        continue
                n += len(records)
                logical = self._topics[tp.topic]
                metrics.events_consumed.add(len(records), {"topic": logical})
                if logical == TELEMETRY:
                    tel = decode_batch(NodeTelemetry, records)
                    for t in tel.items:
                        model.fold_telemetry(t)
                        self._pool_partition[t.pool_id] = tp.partition
                    if tel.items:
                        self._watermark[tp] = max(self._watermark.get(tp, 0), *(t.ts_ms for t in tel.items))
                    self.stats.telemetry_in += len(tel.items)
                    dead.extend(tel.dead)
                elif logical == REQUESTS:
                    out = decode_batch(RequestOutcome, records)
                    for o in out.items:
                        model.fold_outcome(o)
                    if out.items:
                        self._watermark[tp] = max(self._watermark.get(tp, 0), *(o.ts_ms for o in out.items))
                    self.stats.outcomes_in += len(out.items)
                    dead.extend(out.dead)
                else:
                    tk = decode_batch(Tick, records)
                    now_s = clock.monotonic_s()
                    self._held.extend(
                        _HeldTick(t, tp, off, now_s) for t, off in zip(tk.items, tk.offsets, strict=True)
                    )
                    self.stats.ticks_in += len(tk.items)
                    dead.extend(tk.dead)
                self._positions[tp] = records[-1].offset + 1
            self.stats.events_in += n
            span.set_attribute("records", n)
            if dead:
                publisher = self._publisher
                await self._retrying("dead-letter", lambda: publisher.dead_letter(dead))
                self.stats.dead_letters += len(dead)
                for d in dead:
                    kind = metrics.reason_kind(d.reason)
                    metrics.dead_letters.add(1, {"reason": kind})
                    # One line per reason kind per window, with a count: never one line per record.
                    log.warning(
                        "dead letter",
                        source=f"{d.topic}:{d.partition}:{d.offset}",
                        reason=d.reason,
                        ratelimit_key=kind,
                    )
            decisions = self._decide(self._ready_ticks())
            if decisions:
                publisher = self._publisher
                await self._retrying("publish", lambda: publisher.publish(decisions))
                self.stats.decisions_published += len(decisions)
                for dec in decisions:
                    metrics.decisions.add(1, {"kind": dec.body.kind, "reason": dec.body.reason})
                if self._on_decisions is not None:
                    self._on_decisions(decisions)
            await self._retrying("commit", lambda: self._commit(batch))
        return decisions

    def _caught_up(self, tick: Tick) -> bool:
        """True when every owned input partition has been read to its end or past ``tick.ts_ms``."""
        consumer = self._consumer
        assert consumer is not None
        for tp in self._owned:
            if self._topics.get(tp.topic) not in (TELEMETRY, REQUESTS):
                continue
            if self._watermark.get(tp, -1) >= tick.ts_ms:
                continue
            highwater = consumer.highwater(tp)
            if highwater is None or self._positions.get(tp, 0) < highwater:
                return False
        return True

    def _ready_ticks(self) -> list[tuple[Tick, TopicPartition, int]]:
        """Release held ticks whose inputs have caught up (or that waited ``max_tick_hold_s``).

        Cross-topic order within a batch is up to the broker and client: a tick can arrive before
        the telemetry it should see. Holding it until the inputs catch up keeps decisions from
        being made on a model that is behind, without ever waiting on a silent pool for long.
        """
        if not self._held:
            return []
        now_s = clock.monotonic_s()
        ready: list[tuple[Tick, TopicPartition, int]] = []
        still: list[_HeldTick] = []
        for h in sorted(self._held, key=lambda h: (h.tick.ts_ms, h.tick.pool_id, h.tick.tick_id)):
            if still and still[-1].tp == h.tp:
                still.append(h)  # keep order within a ticks partition
            elif self._caught_up(h.tick):
                ready.append((h.tick, h.tp, h.offset))
            elif now_s - h.since_s >= self.config.max_tick_hold_s:
                self.stats.ticks_forced += 1
                metrics.ticks.add(1, {"outcome": "forced"})
                ready.append((h.tick, h.tp, h.offset))
            else:
                still.append(h)
        self._held = still
        return ready

    def input_offsets(self) -> dict[str, int]:
        return {
            f"{self._topics[tp.topic]}:{tp.partition}": pos
            for tp, pos in sorted(self._positions.items(), key=lambda kv: (kv[0].topic, kv[0].partition))
            if self._topics.get(tp.topic) in (TELEMETRY, REQUESTS)
        }

    def _decide(self, ticks: list[tuple[Tick, TopicPartition, int]]) -> list[Decision]:
        out: list[Decision] = []
        if not ticks:
            return out
        env = envelope_of(self.engine.policy)
        offsets = self.input_offsets()
        # One snapshot per tick time, shared by every pool ticking at it: the model does not change
        # while a batch's ticks are decided, so a per-pool snapshot would be the same one rebuilt.
        snaps: dict[int, FleetSnapshot] = {}
        for tick, tp, offset in sorted(ticks, key=lambda x: (x[0].ts_ms, x[0].pool_id, x[0].tick_id)):
            snap = snaps.get(tick.ts_ms)
            if snap is None:
                snap = snaps[tick.ts_ms] = snapshot(
                    self.model, tick.ts_ms, window_ms=env.window_ms, stale_after_ms=env.stale_after_ms
                )
            if tick.pool_id not in snap.pools:
                self.stats.ticks_no_data += 1  # a pool this instance has no data on: nothing to decide from
                metrics.ticks.add(1, {"outcome": "skipped"})
                continue
            started_s = clock.monotonic_s()
            result = self.engine.tick(snap, tick, offsets)
            metrics.tick_duration.record(clock.monotonic_s() - started_s)
            if offset < self._resume_at.get(tp, 0):
                self.stats.ticks_warmup += 1  # history: rebuilds policy state, already published
                metrics.ticks.add(1, {"outcome": "warmup"})
                continue
            self.stats.ticks_decided += 1
            metrics.ticks.add(1, {"outcome": "decided"})
            self.stats.last_decision_ts_ms = tick.ts_ms
            for d in result.decisions:
                body = d.body
                if body.kind == "breaker":
                    if body.state == "open" and body.enforced:
                        if body.node_id not in self.stats.breaker_open_nodes:
                            self.stats.breaker_opens += 1
                            self.stats.breaker_open_nodes.add(body.node_id)
                            log.info("breaker opened", node=body.node_id, reason=body.reason, **body.inputs)
                    elif body.state == "closed":
                        self.stats.breaker_open_nodes.discard(body.node_id)
            out.extend(result.decisions)
        return out

    async def _commit(self, batch: Mapping[TopicPartition, Sequence[Any]]) -> None:
        consumer = self._consumer
        assert consumer is not None
        # A ticks partition is committed only up to its oldest tick still held back.
        held_at: dict[TopicPartition, int] = {}
        for h in self._held:
            held_at[h.tp] = min(held_at.get(h.tp, h.offset), h.offset)
        offsets = {
            tp: OffsetAndMetadata(held_at.get(tp, self._positions[tp]), "")
            for tp in batch
            if tp in self._owned
            and tp in self._positions
            and held_at.get(tp, self._positions[tp]) >= self._resume_at.get(tp, 0)
        }
        if offsets:
            await consumer.commit(offsets)
            self.stats.commits += 1

    # -- side tasks -----------------------------------------------------------------------------

    async def _ticker(self, producer: AIOKafkaProducer, stop: asyncio.Event) -> None:
        topic = topic_name(self.config.prefix, TICKS)
        last = 0
        while not stop.is_set():
            tick_ms = self.engine.policy.tick_ms
            now = clock.wall_ms()
            boundary = (now // tick_ms + 1) * tick_ms
            if last and boundary - last > tick_ms:
                # Boundaries passed while a send waited on an unreachable broker: missed, not late.
                metrics.ticks.add((boundary - last) // tick_ms - 1, {"outcome": "missed"})
            last = boundary
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=(boundary - now) / 1000.0)
                return
            try:
                await self._send_ticks(producer, topic, boundary, tick_ms)
            except KafkaError as exc:
                if not _transient(exc):
                    raise
                self._broker_trouble("tick", exc)
                metrics.ticks.add(1, {"outcome": "missed"})

    async def _send_ticks(self, producer: AIOKafkaProducer, topic: str, boundary: int, tick_ms: int) -> None:
        owned = {tp.partition for tp in self._owned if self._topics.get(tp.topic) == TICKS}
        pools = sorted(p for p, part in self._pool_partition.items() if part in owned)
        futures = []
        for pool in pools:
            tick = Tick(ts_ms=boundary, tick_id=boundary // tick_ms, pool_id=pool)
            value = orjson.dumps(tick.model_dump(mode="json"))
            futures.append(await producer.send(topic, value=value, key=pool.encode()))
        if futures:
            await asyncio.gather(*futures)

    # -- service: broker watch, retries, metric sources -----------------------------------------

    def _broker_trouble(self, operation: str, exc: BaseException) -> None:
        self.health.connected = False
        self.health.connection_error = one_line(exc)
        metrics.broker_errors.add(1, {"operation": operation})
        log.warning("broker unavailable; retrying", operation=operation, error=one_line(exc))

    async def _retrying(self, operation: str, op: Callable[[], Any]) -> Any:
        """``await op()``, retried with backoff while the broker is away (transient errors only).

        The batch waits: nothing is committed before what was computed from it is acknowledged,
        and publishing the same decisions again is harmless (desired state keyed by entity).
        """
        delay_s = 0.1
        while True:
            try:
                return await op()
            except KafkaError as exc:
                stop = self._stop
                if not _transient(exc) or (stop is not None and stop.is_set()):
                    raise
                self._broker_trouble(operation, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait() if stop else asyncio.sleep(delay_s), delay_s)
                delay_s = min(delay_s * 2, RETRY_MAX_S)

    async def _watch_broker(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        """Ask the broker for metadata every ``BROKER_WATCH_S``: the connection state of /readyz."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(consumer.topics(), timeout=max(BROKER_WATCH_S * 2, 5.0))
            except (KafkaError, TimeoutError) as exc:
                if self.health.connected or not self.health.connection_error:
                    self._broker_trouble(
                        "metadata", exc if isinstance(exc, KafkaError) else KafkaTimeoutError()
                    )
                self.health.connected = False
            else:
                if not self.health.connected:
                    log.info("broker reachable", bootstrap=shown(self.config.bootstrap_servers))
                self.health.connected = True
                self.health.connection_error = ""
            self._refresh_health()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=BROKER_WATCH_S)

    def _refresh_health(self) -> None:
        h = self.health
        h.assigned = len(self._owned)
        h.assigned_once = h.assigned_once or self.ready.is_set()
        h.warm = self.ready.is_set() and all(
            self._positions.get(tp, 0) >= self._resume_at.get(tp, 0) for tp in self._owned
        )

    def lag(self) -> dict[tuple[str, int], int]:
        consumer = self._consumer
        if consumer is None:
            return {}
        out: dict[tuple[str, int], int] = {}
        for tp in sorted(self._owned, key=lambda t: (t.topic, t.partition)):
            high = consumer.highwater(tp)
            if high is not None:
                out[(self._topics.get(tp.topic, tp.topic), tp.partition)] = max(
                    0, high - self._positions.get(tp, 0)
                )
        return out

    def model_sizes(self) -> dict[str, int]:
        m = self.model
        return {"pools": len(m.pools), "nodes": len(m.nodes), "open_workflows": len(m.ledger.active)}

    def policy_in_force(self) -> tuple[str, int, str]:
        s = self.engine.policy.stamp
        return s.name, s.version, s.hash

    def broker_connected(self) -> bool:
        return self.health.connected

    def is_ready(self) -> bool:
        self._refresh_health()
        return self.health.ready()[0]

    async def _follow_policies(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        follow = self.config.follow_policy or self.config.policy.stamp.name
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=500)
            refused = [
                letter
                for records in batch.values()
                for r in records
                if (letter := self._consider_policy(r, follow)) is not None
            ]
            if refused and self._publisher is not None:
                await self._publisher.dead_letter(refused, stage="policy")

    def _consider_policy(self, record: Any, follow: str) -> DeadLetter | None:
        """Take a valid newer policy for the next batch; return a dead letter for an invalid one."""
        try:
            if not record.value:
                raise PolicyError("empty policy record")
            compiled = compile_policy(
                parse_document(orjson.loads(record.value), f"{record.topic}@{record.offset}")
            )
        except (PolicyError, orjson.JSONDecodeError) as exc:
            reason = reason_of(exc) if not isinstance(exc, PolicyError) else str(exc)
            self.stats.policies_refused += 1
            self.stats.last_refusal = reason
            log.error("policy refused; the active policy stays in force", reason=reason)
            return DeadLetter(
                record.topic,
                record.partition,
                record.offset,
                record.key,
                record.value,
                record.timestamp,
                reason,
            )
        active = self._pending_policy or self.engine.policy
        if compiled.stamp.name != follow:
            return None
        if compiled.stamp.version <= active.stamp.version:
            if compiled.stamp.hash != active.stamp.hash and compiled.stamp.version == active.stamp.version:
                log.warning("policy ignored: same version, different content", version=compiled.stamp.version)
            return None
        self._pending_policy = compiled
        self.stats.policies_applied += 1
        log.info(
            "policy applied",
            name=compiled.stamp.name,
            version=compiled.stamp.version,
            hash=compiled.stamp.hash,
        )
        return None
