"""The daemon: observe -> model -> decide -> act over Kafka (the imperative shell).

One loop, one batch at a time::

    records  = consumer.getmany()                 # telemetry, request outcomes, ticks (by pool)
    decoded  = decode_batch(...)                  # bad records -> fleet.deadletter, with the reason
    shard.add(records)                            # pending, per partition index (daemon/shard.py)
    for tick in ticks (offset order, per shard):  # ticks are events: a replay sees the same ones
        fold the shard's pending records up to the tick's cut; decide(snapshot, policy, state)
    publish(decisions); wait for acks             # control.decisions always, control.state if enforced
    every few seconds: checkpoint each changed shard to control.checkpoint; wait for acks
    commit(offsets)                               # only now: at least once, duplicates harmless

Shards. One :class:`~fleetloop.core.shard.Shard` per partition index of the pool-keyed topics:
its own fleet model and policy state, and the offsets they reflect. A tick is decided from its
shard alone and from exactly the records before its cut, so decisions depend on the topics'
contents, not on batching, on which instance owns what, or on restarts.

Restarts and rebalances are exact. A shard's state is checkpointed (every ``checkpoint_interval_s``,
when its partitions are revoked and at shutdown) with the offsets and last tick it reflects
(:mod:`fleetloop.core.checkpoint` explains why a checkpoint and not a re-read of recent history).
A newly assigned partition restores its newest complete checkpoint and reads on from the
checkpoint's offsets: the ticks between the checkpoint and the group's committed offset are decided
again to rebuild the state and not republished; later ones are published (a crash between publish
and commit republishes the same bytes). A partition the instance already owned keeps its shard and
its read position across a rebalance: nothing is read twice. A consumer group without a checkpoint
(its first start) reads up to ``warmup_records`` of history before its committed offset as an
approximate warm-up; that is the only approximate start.

An emptied broker (the embedded broker keeps topics in memory; a restart re-creates them empty) is
detected at assignment when a checkpoint or committed offset lies beyond a partition's end: the
daemon logs one line and starts that shard clean from the beginning of what the broker has.

The ticker publishes, for each pool of each shard it owns and has caught up on, one Tick per
``tick_ms`` boundary of wall time (``tick_id = ts_ms // tick_ms``), with the cut in the header
``fleetloop.cut``. It continues from the last tick on ``control.ticks`` for that pool, so after an
outage (of this daemon, of the instance that owned the partition, or of the broker) the missed
boundaries are published late and decided from the recorded inputs (each cut: the records the
broker had stamped by that boundary), never silently skipped. More than ``catchup_max_ticks`` missed
boundaries of one pool are published as one tick record marked ``fleetloop.skipped`` (with the
reason and the first skipped tick id), counted and logged, and the newest ``catchup_max_ticks``
are decided.

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
all, are an outage's and caught up as above. No record is dropped:
the skipped boundaries' records are folded at the next decided cut. The skips are on the ticks
topic like an outage's, so a replay decides exactly what the daemon decided. Counted
(``ticks_overload``, the ticks metric with outcome ``overload``), logged once when a shard goes
into overload and once when it is out, and reported by ``/healthz`` (``overload``: the partitions
in it, the ticks skipped). The rule is :func:`overload_step`.

Policy documents arrive on ``control.policy``; a valid one with the followed name and a higher
version replaces the active policy between batches; an invalid one is refused (logged and
dead-lettered) and the active one stays in force.

A document with ``spec.mode: shadow`` (key ``<name>/shadow``) does not replace the enforcing
policy: it runs beside it from the next tick boundary, on the same ticks and the same folded
records, with its own policy state per pool (:meth:`Shard.decide_shadow`), and its decisions go to
``control.shadow``. A tombstone on ``<name>/shadow`` removes it. The shadow in force is part of the
record on ``control.policy.active``, so a restart resumes it like the enforcing policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections import Counter
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import CommitFailedError, KafkaConnectionError, KafkaError, KafkaTimeoutError
from aiokafka.structs import OffsetAndMetadata

from fleetloop import clock
from fleetloop.core import checkpoint
from fleetloop.core.decide.engine import Engine, envelope_of
from fleetloop.core.model.fleet import ModelConfig
from fleetloop.core.rollup import summarize
from fleetloop.core.shard import INPUTS, Refusal, Row, Shadow, Shard
from fleetloop.daemon import faults, offload
from fleetloop.daemon.act.publish import Publisher
from fleetloop.daemon.observability import logger, tracer
from fleetloop.daemon.observe.decode import (
    DeadLetter,
    Door,
    dead_letter_of,
    decode_batch,
    decode_rows,
    reason_of,
)
from fleetloop.daemon.service import metrics
from fleetloop.daemon.service.health import Health, one_line, supervise
from fleetloop.kafka_security import Bootstrap, connect, shown
from fleetloop.policies.registry import CompiledPolicy, PolicyError, compile_policy, parse_document
from fleetloop.schemas.control import Activation, ActivePolicy, ShadowActivation, Tick
from fleetloop.schemas.decisions import Decision, RetryBudgetDecision
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN, Twin
from fleetloop.schemas.topics import (
    CHECKPOINT,
    DEADLETTER,
    POLICY,
    POLICY_ACTIVE,
    REQUESTS,
    SUMMARIES,
    TELEMETRY,
    TICKS,
    topic_name,
)

log = logger("fleetloop.daemon")
BROKER_WATCH_S = 2.0  # how often the broker watch asks for metadata (connection state, /readyz)
RETRY_MAX_S = 5.0  # longest backoff between retries of a Kafka operation while the broker is away


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (KafkaConnectionError, KafkaTimeoutError)) or (
        isinstance(exc, KafkaError) and exc.retriable
    )


CUT_HEADER = "fleetloop.cut"
SKIPPED_HEADER = "fleetloop.skipped"
SKIPPED_FROM_HEADER = "fleetloop.skipped_from"


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
    warmup_records: int = 10_000  # history read by a group without a checkpoint (its first start)
    max_tick_hold_s: float = 2.0  # a tick without a cut waits at most this long for its inputs
    checkpoint_interval_s: float = 5.0  # checkpoint a changed shard at most this often
    # ... and, when checkpoints are costly, less often: so the encoding children's CPU stays near
    # this share of one core (the next gap is the last checkpoint's CPU over it), at most
    # ``checkpoint_max_stretch`` times the interval (``checkpoint.gap_s``). A longer gap costs a new
    # owner (a restart, a rebalance) that much more fold-forward of records. 0: no stretch.
    checkpoint_cpu_share: float = 0.05
    checkpoint_max_stretch: float = 6.0
    # The consumer group's session timeout: a member whose heartbeats stop this long loses its
    # partitions (the failover time after a crash). Short, the embedded broker completes a join in
    # about half of it; a large fleet on a busy machine may need longer (its heartbeats come late and
    # the group rebalances over and over: every 15-26 s at 10,000 nodes, load 13-19, Kafka;
    # bench/results/latency-s10.md). The heartbeat interval is a sixth of it, at most 1 s.
    session_timeout_s: float = 6.0
    catchup_max_ticks: int = 600  # missed boundaries decided after an outage, per pool; older: skipped
    # ... and fewer when the shard is already slow: when its recent pace (wall seconds per boundary
    # decided) says the catch-up would take longer than this, the newest boundaries that fit it (at
    # least overload_max_ticks) are decided and the older ones skipped. A new owner after a
    # rebalance on a starved machine otherwise decided 20-90 boundaries before the newest, seconds
    # each (bench/results/latency-s10.md). 0: off (catchup_max_ticks alone).
    catchup_budget_s: float = 10.0
    # Overload: a pool with this many boundaries published and not yet decided gets no new tick; once
    # fewer are waiting, the ticker publishes the boundaries it held back as one tick marked skipped
    # ("overload: ...") and the newest boundary. 0: never (every boundary is decided, however late).
    # 2: a shard more than one boundary behind. Each boundary allowed to wait adds one boundary's
    # decide time to how stale the decisions are (seconds each for a starved daemon at 10k nodes:
    # with 5, one daemon at 0.19 of a core was 35 s behind at p50; bench/results/latency-s9.md).
    overload_max_ticks: int = 2
    # At a boundary the ticker waits at most this long for the loop to read every input record the
    # broker had acknowledged then, so a record acknowledged just before the boundary is in its cut
    # (not one tick later); 0: the cut is what was read at the boundary (bench/results/latency-s6.md).
    tick_read_wait_s: float = 0.1
    # Cyclic GC: the young generation is collected every this many new container objects (Python's
    # default, 700, runs it every few dozen decoded records: ~25% of ingest CPU, measured by
    # ``fleetloop bench ingest``). 0 leaves the interpreter's settings alone.
    gc_gen0_threshold: int = 100_000
    door: Door = field(default_factory=Door)  # record size, event-time window around the broker's
    max_policy_version_step: int = 1000  # refuse a policy version further above the active one
    model: ModelConfig = field(default_factory=ModelConfig)  # caps and retention of each shard's model


@dataclass(slots=True)
class DaemonStats:
    events_in: int = 0
    telemetry_in: int = 0
    outcomes_in: int = 0
    ticks_in: int = 0
    ticks_decided: int = 0
    summaries_published: int = 0
    ticks_restored: int = 0  # decided again after a restore to rebuild state, not republished
    ticks_no_data: int = 0
    ticks_forced: int = 0
    ticks_duplicate: int = 0
    ticks_skipped: int = 0  # boundaries published as skipped (an outage beyond the catch-up)
    ticks_failed: int = 0  # ticks whose decision raised: published as skipped with the reason
    fold_steps: int = 0  # far cuts' folds split with a yield after each step (FOLD_STEP_ROWS)
    last_tick_failure: str = ""
    dead_letters_lost: int = 0  # dead letters the broker refused to take (counted, logged)
    dead_letters_suppressed: int = 0  # not published again after a restore: published before
    dead_letter_scans: int = 0  # reads of the dead-letter topic at a restore: one per assignment
    dead_letter_marks_lost: int = 0  # restored shards whose dead-letter range retention removed
    ticks_caught_up: int = 0  # missed boundaries this instance's ticker published late
    ticks_catchup_capped: int = 0  # missed boundaries published as skipped: beyond catchup_budget_s
    ticks_overload: int = 0  # boundaries this instance's ticker published as skipped: overload
    overload_episodes: int = 0  # times a shard of this instance went into overload
    dead_letters: int = 0
    decisions_published: int = 0
    breaker_opens: int = 0
    policies_applied: int = 0
    policies_refused: int = 0
    shadow_decisions: int = 0  # decisions of the shadow policy published to control.shadow
    shadow_failed: int = 0  # ticks the shadow policy could not decide (the enforced ones were)
    commits: int = 0
    commits_skipped: int = 0  # batches that moved no offset since the last commit: none sent
    checkpoints_written: int = 0
    checkpoint_bytes: int = 0  # the largest shard's checkpoint last written, compressed
    checkpoint_loop_ms: float = 0.0  # time the loop spent starting the last checkpoint (the fork)
    checkpoint_encode_s: float = 0.0  # time from that start to the encoded bytes (in the child)
    checkpoint_cpu_s: float = 0.0  # the CPU the last checkpoint's child used (its own, not in /proc's)
    checkpoint_cpu_s_total: float = 0.0  # ... and every checkpoint's since the start
    checkpoint_gap_s: float = 0.0  # how often a changed shard is checkpointed now (checkpoint.gap_s)
    checkpoint_decode_s: float = 0.0  # the last assignment's checkpoint decoding (in a thread)
    shards_restored: int = 0
    shards_started_clean: int = 0
    last_decision_ts_ms: int = 0  # the newest tick whose decisions the broker acknowledged
    dead_by_reason: dict[str, int] = field(default_factory=dict)  # reason kind -> dead letters
    last_refusal: str = ""
    breaker_open_nodes: set[str] = field(default_factory=set)


LOOP_REPORT_S = 30.0  # how often the daemon logs where its consumer loop's time went ("loop")


@dataclass(slots=True)
class LoopTimes:
    """Where the consumer loop's wall time goes, by what it was doing or waiting on: per phase the
    wall seconds, and of them the seconds the loop's thread ran (``cpu``) and was runnable but not
    run (``runq``: the machine's other work had the cores, :func:`clock.thread_sched_s`); the rest
    is time the loop waited on something (the broker, a fetch with nothing to do). A daemon behind
    its boundaries that waits rather than computes, or is not run, shows it here.

    Phases (each :meth:`lap` gives the time since the previous one to its phase): ``fetch`` (a fetch
    with ticks queued: their cuts' records on the way), ``fetch_in_flight`` (no tick queued, but
    ticks this instance published are not read back yet: the broker's round trip),
    ``fetch_idle`` (a fetch with no tick queued or in flight: every published boundary decided, the
    next one not yet due), ``fetch_held_back`` (the same while the ticker holds pools back for
    overload, which :meth:`Daemon._wake_held_back` ends), ``read`` (decode into the shards),
    ``decide`` (folding, deciding and staging; the ticker's and the client's turns between batches
    included), ``acks`` (waiting for the broker to acknowledge the decisions), ``summaries``,
    ``dead_letters``, ``checkpoint``, ``commit``, ``restore``, ``loop`` (the rest).
    ``ticker_late_s``: the latest the ticker woke after a boundary; ``ticker_s``: the ticker's
    rounds (reads awaited, ticks sent and acknowledged)."""

    wall_s: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    runq_s: dict[str, float] = field(default_factory=dict)
    mark: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (monotonic, cpu, runq) at the last lap
    since_s: float = 0.0  # monotonic start of the current report window
    ticker_late_s: float = 0.0
    ticker_s: float = 0.0
    # The cyclic collector's pauses (``gc.callbacks``, process-wide: the loop waits through each):
    # seconds in all, the longest one, and how many were full (generation 2) collections.
    gc_s: float = 0.0
    gc_max_s: float = 0.0
    gc_full: int = 0
    gc_started: float = 0.0

    def on_gc(self, phase: str, info: Mapping[str, Any]) -> None:
        """A ``gc.callbacks`` entry: time each collection."""
        now = clock.monotonic_s()
        if phase == "start":
            self.gc_started = now
            return
        if not self.gc_started:
            return
        took = now - self.gc_started
        self.gc_started = 0.0
        self.gc_s += took
        self.gc_max_s = max(self.gc_max_s, took)
        if info.get("generation") == 2:
            self.gc_full += 1

    def lap(self, phase: str) -> None:
        """Give the time since the previous lap to ``phase``."""
        now = clock.monotonic_s()
        cpu, runq = clock.thread_sched_s()
        w0, c0, r0 = self.mark
        if w0:
            self.wall_s[phase] = self.wall_s.get(phase, 0.0) + (now - w0)
            self.cpu_s[phase] = self.cpu_s.get(phase, 0.0) + (cpu - c0)
            self.runq_s[phase] = self.runq_s.get(phase, 0.0) + (runq - r0)
        self.mark = (now, cpu, runq)

    def report(self) -> dict[str, Any] | None:
        """The window's figures once ``LOOP_REPORT_S`` passed (then a new window), else None: per
        phase "wall/cpu/runq" seconds, and the totals."""
        now = clock.monotonic_s()
        if self.since_s == 0.0:
            self.since_s = now
            return None
        span = now - self.since_s
        if span < LOOP_REPORT_S:
            return None
        wall, cpu, runq = (sum(d.values()) for d in (self.wall_s, self.cpu_s, self.runq_s))
        out: dict[str, Any] = {
            "window_s": round(span, 1),
            "cpu_s": round(cpu, 2),
            "runq_s": round(runq, 2),
            "waiting_s": round(max(0.0, wall - cpu - runq), 2),
            **{
                k: f"{v:.2f}/{self.cpu_s[k]:.2f}/{self.runq_s[k]:.2f}" for k, v in sorted(self.wall_s.items())
            },
            "ticker_late_s": round(self.ticker_late_s, 2),
            "ticker_s": round(self.ticker_s, 2),
            "gc_s": round(self.gc_s, 3),
            "gc_max_s": round(self.gc_max_s, 3),
            "gc_full": self.gc_full,
        }
        self.wall_s, self.cpu_s, self.runq_s = {}, {}, {}
        self.since_s = now
        self.ticker_late_s = self.ticker_s = 0.0
        self.gc_s = self.gc_max_s = 0.0
        self.gc_full = 0
        return out


TRACE_BOUNDARIES = 16  # boundaries whose stage times the trace keeps (the oldest go first)


@dataclass(slots=True)
class TripTrace:
    """When each stage of a tripping breaker's way out happened after its tick boundary: one
    "trip path" log line per boundary at which a shard decided a pool with a failed call among the
    records its cut folds (``Shard.troubled``: decided first, :meth:`Daemon._decide_ready`), in
    milliseconds after the boundary. The stages, in order: ``woke`` (the ticker woke for the
    boundary), ``read_up`` (its read-up-to-now wait ended, :meth:`Daemon._read_to_now`),
    ``ticks_acked`` (every tick of the boundary acknowledged by the broker), ``ticks_read`` (the
    loop read the tripping pool's tick back), ``cut_ready`` (the loop started deciding it: its
    cut's records read), ``folded`` (the shard folded up to the cut), ``decided``, ``staged`` (its
    decisions handed to the publisher), ``acked`` (the broker acknowledged them). What a boundary
    did not reach is left out. Observation only: nothing is decided or published differently."""

    marks: dict[int, dict[str, int]] = field(default_factory=dict)  # boundary -> stage -> wall ms
    trips: set[int] = field(default_factory=set)  # boundaries with a trip staged, not yet acked

    def stamp(self, boundary: int, stage: str, at_ms: int | None = None) -> None:
        """Note ``stage`` of ``boundary`` now (or at ``at_ms``): the first time only."""
        marks = self.marks.get(boundary)
        if marks is None:
            while len(self.marks) >= TRACE_BOUNDARIES:
                old = min(self.marks)
                del self.marks[old]
                self.trips.discard(old)
            marks = self.marks[boundary] = {}
        marks.setdefault(stage, clock.wall_ms() if at_ms is None else at_ms)

    def after(self, boundary: int) -> dict[str, int]:
        """Each noted stage of ``boundary`` in milliseconds after it."""
        return {k: v - boundary for k, v in self.marks.get(boundary, {}).items()}


OnDecisions = Callable[[Sequence[Decision]], None]
MAX_FETCH_BYTES = 2 * 1024 * 1024


# Ticks of one shard and boundary decided in one call at most: a batch is decided without yielding
# to the loop (~1 ms per pool of 40 nodes), so the ticker and the consumer wait at most that long.
DECIDE_BATCH_MAX = 64
# Records folded without yielding to the loop, at most, before a cut is decided (Shard.step_toward):
# a far cut (40 s of one 10k shard's records, 167,731 rows: 1.33 CPU-s, ~6.6 s at a fifth of a core)
# held the loop past the group's 6 s session timeout, and the group took the partitions away
# (bench/results/latency-s9.md). 10,000 rows: ~0.05 CPU-s.
FOLD_STEP_ROWS = 10_000


def _boundary_run(held: Sequence[_HeldTick], done: Collection[int]) -> int:
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


async def _send_skipped(
    producer: AIOKafkaProducer, topic: str, pool: str, skipped: list[int], *, reason: str, tick_ms: int
) -> Any:
    """Send the one tick record that stands for the boundaries ``skipped`` of ``pool`` (an outage's
    beyond the catch-up, or overload's): the last boundary's tick, marked skipped with ``reason``
    and the first skipped tick id. Returns the send's future."""
    end = skipped[-1]
    marker = Tick(ts_ms=end, tick_id=end // tick_ms, pool_id=pool)
    return await producer.send(
        topic,
        key=pool.encode(),
        value=orjson.dumps(marker.model_dump()),
        headers=[
            (SKIPPED_HEADER, reason.encode()),
            (SKIPPED_FROM_HEADER, str(skipped[0] // tick_ms).encode()),
        ],
    )


@dataclass(frozen=True, slots=True)
class _HeldTick:
    offset: int
    tick: Tick | None  # None: a dead-lettered tick record (its offset still has to be passed)
    timestamp_ms: int
    cut: dict[str, int] | None
    skipped: str | None
    since_s: float


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.daemon._assign_gen += 1
        await self.daemon._on_revoked(sorted(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.daemon._assign_gen += 1
        try:
            await self.daemon._on_assigned(sorted(assigned))
        except (KafkaError, OSError) as exc:  # the loop restores once the broker answers again
            log.warning("assignment failed; will restore", error=f"{type(exc).__name__}: {exc}"[:300])
            self.daemon._restore_needed = True


def _header(record: Any, name: str) -> bytes | None:
    for k, v in record.headers or ():
        if k == name:
            return bytes(v)
    return None


class Daemon:
    """fleetloop's control loop on one process. ``await run(stop)`` until ``stop`` is set."""

    def __init__(self, config: DaemonConfig, on_decisions: OnDecisions | None = None) -> None:
        self.config = config
        self.engine = Engine(config.policy)  # holds the active policy; state lives in the shards
        self.stats = DaemonStats()
        self.loop_times = LoopTimes()
        self.trace = TripTrace()
        self._on_decisions = on_decisions
        p = config.prefix
        self._topics = {
            topic_name(p, TELEMETRY): TELEMETRY,
            topic_name(p, REQUESTS): REQUESTS,
            topic_name(p, TICKS): TICKS,
        }
        self._physical = {logical: physical for physical, logical in self._topics.items()}
        self._policy_topic = topic_name(p, POLICY)
        self._checkpoint_topic = topic_name(p, CHECKPOINT)
        self._summaries_topic = topic_name(p, SUMMARIES)
        # The fleet-wide second stage's input (fleetloop.daemon.rollup): per shard, the newest tick
        # decided in this batch, and per pool its newest pool-wide retry budget.
        self._summary_due: dict[int, tuple[int, int]] = {}
        self._retries_allowed: dict[int, dict[str, int]] = {}
        self._deadletter_topic = topic_name(p, DEADLETTER)
        # Dead letters published before a restore, so none is published twice: per shard, the
        # offsets below which door dead letters were published (by topic, "ticks" included), and
        # the sources found on the dead-letter topic after the checkpoint's mark.
        self._lettered: dict[int, dict[str, int]] = {}
        self._fold_lettered: dict[int, dict[str, int]] = {}  # a first start's warm-up history
        self._already: dict[int, set[tuple[str, int]]] = {}
        self._dl_end = 0  # the dead-letter topic's end as this instance last knew it
        self._failed_ticks: list[tuple[int, int, Tick, str]] = []  # (shard, offset, tick, reason)
        self.shards: dict[int, Shard] = {}
        self._held: dict[int, list[_HeldTick]] = {}
        self._publish_from: dict[int, int] = {}  # ticks offset from which decisions are published
        self._catchup: dict[int, dict[str, int]] = {}  # end offsets at assignment, until caught up
        self._ticked: dict[tuple[int, str], int] = {}  # (shard, pool) -> last boundary published
        # (shard, pool) -> (first boundary held back, boundaries waiting then): overload, per pool
        self._withheld: dict[tuple[int, str], tuple[int, int]] = {}
        # Set by the loop when a shard has decided every tick it held while the ticker holds pools
        # of it back: the ticker publishes them then, not at the next boundary (_wake_held_back).
        self._tick_now = asyncio.Event()
        # Counts the group's rebalance callbacks: a restore that saw it change while it awaited
        # the broker restores again (_restore_assignment).
        self._assign_gen = 0
        # (assignment generation, offsets) of the last commit: a batch that moved none commits nothing.
        self._committed: tuple[int, dict[TopicPartition, int]] | None = None
        # Shards in overload -> (when it began, monotonic s; boundaries since without a tick held back)
        self._overloaded: dict[int, tuple[float, int]] = {}
        self._broker_gap = False  # the broker was unreachable since the ticker last published
        self._ticks_read: dict[int, int] = {}  # next ticks offset read, per shard
        self._pace_s: dict[int, float] = {}  # per shard: recent wall seconds to decide one boundary
        self._ckpt_seq: dict[int, int] = {}
        self._ckpt_at: dict[int, float] = {}
        self._ckpt_gap_s = config.checkpoint_interval_s  # stretched by the checkpoints' cost
        self._dirty: set[int] = set()
        self._ckpt_task: asyncio.Task[None] | None = None  # the checkpoint being written, if any
        self._owned: set[TopicPartition] = set()
        self._expect: dict[TopicPartition, int] = {}  # first fetch after a seek must start here
        self._restore_needed = False
        self._emptied_hint: set[int] = set()  # shards found beyond the broker's ends at a restore
        self._pending_policy: CompiledPolicy | None = None
        self._pending_offset = -1
        # Policies by the event time from which they decide, oldest first (the last one is active):
        # a tick is decided under the policy active at its time, also when decided again after a
        # restore, so a restart across a policy change stays exact.
        self._activations: list[tuple[int, CompiledPolicy]] = [(0, config.policy)]
        # The shadow policy by the event time from which it decides (None: removed), oldest first.
        self._shadows: list[tuple[int, Shadow | None]] = []
        self._pending_shadow: tuple[Shadow | None] | None = None  # a 1-tuple: None inside removes
        self._shadow_out: list[Decision] = []
        self._active_topic = topic_name(p, POLICY_ACTIVE)
        self._considered = -1  # control.policy offset considered up to
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._publisher: Publisher | None = None
        self.ready = asyncio.Event()
        self.health = Health(policy_loaded=True)
        self._stop: asyncio.Event | None = None

    def _tp(self, logical: str, partition: int) -> TopicPartition:
        return TopicPartition(self._physical[logical], partition)

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
        producer = AIOKafkaProducer(
            **connect(cfg.bootstrap_servers),
            client_id=f"{cfg.client_id}-producer",
            acks="all",
            enable_idempotence=cfg.idempotence,
            linger_ms=5,
            # A tick's decisions (two records per node: control.decisions and control.state) go
            # out in a few batches instead of one per 16 KiB (the client's default), which took
            # ~200 ms of round trips per publish at 1,000 nodes and held the loop (and the next
            # records and ticks) while it waited (bench/results/latency-s5.md).
            max_batch_size=checkpoint.CHUNK_BYTES,
            max_request_size=2 * checkpoint.CHUNK_BYTES,
        )
        consumer = AIOKafkaConsumer(
            **connect(cfg.bootstrap_servers),
            client_id=cfg.client_id,
            group_id=cfg.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            partition_assignment_strategy=(RangePartitionAssignor,),
            max_poll_records=cfg.max_batch,
            # A fetch answers within 20 ms even when the broker does not answer it as soon as
            # records arrive (the embedded broker holds an empty fetch for the whole wait: with the
            # client's default 500 ms, and still with 100 ms, the loop read its own ticks back ~45 ms
            # after they were acknowledged, on the breaker-latency path; bench/results/latency-s6.md).
            # Costs at most fifty empty fetches a second on an idle partition set.
            fetch_max_wait_ms=20,
            # Short sessions: the embedded broker completes a join in about half the session timeout.
            session_timeout_ms=int(cfg.session_timeout_s * 1000),
            heartbeat_interval_ms=int(min(1.0, cfg.session_timeout_s / 6.0) * 1000),
            # Above any record the broker accepts (Kafka's default limit is 1 MiB): a record larger
            # than the fetch size would stall the partition; fetched, the door refuses it.
            max_partition_fetch_bytes=MAX_FETCH_BYTES,
            # A fetch that the broker never answers (seen on the embedded broker under floods)
            # stalls every partition until it times out: 15 s, not the client's default 40 s.
            request_timeout_ms=15_000,
        )
        policy_consumer = AIOKafkaConsumer(
            **connect(cfg.bootstrap_servers),
            client_id=f"{cfg.client_id}-policy",
            enable_auto_commit=False,
            max_partition_fetch_bytes=MAX_FETCH_BYTES,
        )
        self._stop = stop
        metrics.register(self)
        await producer.start()
        try:
            await consumer.start()
            try:
                await policy_consumer.start()
                self._consumer = consumer
                self._producer = producer
                self._publisher = Publisher(producer, cfg.prefix)
                consumer.subscribe(sorted(self._topics), listener=_Rebalance(self))
                policy_tp = TopicPartition(self._policy_topic, 0)
                policy_consumer.assign([policy_tp])
                await self._load_active(producer)
                if self._considered >= 0:
                    policy_consumer.seek(policy_tp, self._considered + 1)
                else:
                    await policy_consumer.seek_to_beginning()
                self.health.connected = True
                jobs = {
                    "consumer": lambda: self._loop(consumer, stop),
                    "policy": lambda: self._follow_policies(policy_consumer, stop),
                    "broker-watch": lambda: self._watch_broker(consumer, stop),
                }
                if cfg.run_ticker:
                    jobs["ticker"] = lambda: self._ticker(producer, stop)
                in_force = self.engine.policy.stamp  # the resumed one, not --policy's, after a restart
                log.info(
                    "daemon started",
                    bootstrap=shown(cfg.bootstrap_servers),
                    prefix=cfg.prefix,
                    policy=in_force.name,
                    version=in_force.version,
                    hash=in_force.hash,
                )
                # Every task is supervised: the first to die stops the daemon and is raised (TaskDied).
                await supervise(self.health, jobs, stop)
                # A clean stop leaves a checkpoint of where it stopped: the next start reads nothing twice.
                await self._checkpoint(force=True)
            finally:
                stop.set()
                if self._ckpt_task is not None and not self._ckpt_task.done():
                    self._ckpt_task.cancel()  # a stop after a failure: the last whole checkpoint stands
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._ckpt_task
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
            "ticks_restored": s.ticks_restored,
            "ticks_caught_up": s.ticks_caught_up,
            "ticks_skipped": s.ticks_skipped,
            "ticks_overload": s.ticks_overload,
            "ticks_catchup_capped": s.ticks_catchup_capped,
            "overload_episodes": s.overload_episodes,
            "decisions_published": s.decisions_published,
            "dead_letters": s.dead_letters,
            "breaker_opens": s.breaker_opens,
            "commits": s.commits,
            "commits_skipped": s.commits_skipped,
            "checkpoints_written": s.checkpoints_written,
            "checkpoint_cpu_ms": round(s.checkpoint_cpu_s_total * 1000.0),
        }

    # -- assignment -----------------------------------------------------------------------------

    async def _on_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        """Checkpoint every shard now, so whoever gets a partition next starts from here. The shards
        stay in memory: a partition assigned back to this instance goes on without a re-read."""
        self._owned.difference_update(revoked)
        if self._publisher is not None and not await self._publisher.settle():
            # Decisions sent but not acknowledged: a checkpoint now would let the next owner start
            # past them. It starts from the last checkpoint instead and decides them again.
            log.warning("decisions not acknowledged at revoke; no checkpoint written")
            return
        if self._producer is not None and self.shards:
            try:
                await self._checkpoint(force=True)
            except Exception as exc:  # the next owner falls back to an older checkpoint
                log.warning("checkpoint at revoke failed", error=f"{type(exc).__name__}: {exc}")

    async def _read_checkpoints(self) -> dict[int, checkpoint.Found]:
        cfg = self.config
        consumer = AIOKafkaConsumer(
            **connect(cfg.bootstrap_servers),
            client_id=f"{cfg.client_id}-restore",
            enable_auto_commit=False,
            max_partition_fetch_bytes=4 * checkpoint.CHUNK_BYTES,
        )
        await consumer.start()
        try:
            tp = TopicPartition(self._checkpoint_topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            records: list[tuple[bytes | None, bytes | None]] = []
            while await consumer.position(tp) < end:
                batch = await consumer.getmany(tp, timeout_ms=500)
                records.extend((r.key, r.value) for r in batch.get(tp, ()))
                end = max(end, consumer.highwater(tp) or 0)
            return checkpoint.scan(cfg.group_id, records)
        finally:
            await consumer.stop()

    async def _on_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        """Restore (or keep) a shard per assigned partition index, each sought to where it goes on.

        The partitions are paused from when their end offsets are known until they are sought:
        the client would otherwise go on fetching them from the committed offsets while checkpoints
        are read and decoded (seconds at fleet scale), and every such batch was unpacked only to be
        dropped ("fetched while the assignment callback was still seeking") and fetched again after
        the seek: a 60,000-record backlog was fetched twice (``bench/results/ingest-s6.md``). Not
        paused from the start: the first fetch's high watermark is what corrects the embedded
        broker's end offsets (its ListOffsets answers the last batch's base offset: 511 for 714
        records), and without it a restart took the broker for emptied and started clean.
        Resumed whatever happens, so a failed restore leaves them as before."""
        consumer = self._consumer
        assert consumer is not None
        held = [tp for tp in assigned if tp.topic in self._topics]
        try:
            await self._assign(consumer, assigned, held)
        finally:
            mine = consumer.assignment()
            consumer.resume(*[tp for tp in held if tp in mine])

    async def _assign(
        self, consumer: AIOKafkaConsumer, assigned: Sequence[TopicPartition], held: Sequence[TopicPartition]
    ) -> None:
        parts = sorted({tp.partition for tp in assigned if tp.topic in self._topics})
        for gone in sorted(set(self.shards) - set(parts)):
            self._forget(gone)
        self._owned = set(assigned)
        if not parts:
            self.ready.set()
            return
        new = [p for p in parts if p not in self.shards]
        emptied: set[int] = set()
        tps = [self._tp(logical, p) for p in parts for logical in (*INPUTS, TICKS)]
        begin = await consumer.beginning_offsets(tps)
        end = await self._end_offsets(tps)
        consumer.pause(*held)  # until sought (see _on_assigned)
        found = await self._read_checkpoints() if new else {}
        if new:  # dead letters this instance publishes from now on lie at or after this offset
            dl_tp = TopicPartition(self._deadletter_topic, 0)
            self._dl_end = max(self._dl_end, (await consumer.end_offsets([dl_tp]))[dl_tp])
        if any(self._beyond(p, end) for p in parts):
            # The embedded broker's ListOffsets can lag what it has acknowledged: ask again before
            # calling the broker emptied.
            await self._look_again(held)
            end = await self._end_offsets(tps)
        # Every new shard's checkpoint decoded (off the loop), then the dead-letter topic read once
        # for all of them, all before the first shard is registered (see ``_restore``).
        decoded = await self._decode_checkpoints({p: found.get(p) for p in new})
        letters = await self._scan_lettered(decoded)
        for p in parts:
            shard = self.shards.get(p)
            if shard is not None and self._beyond(p, end):
                emptied.add(p)
                self._forget(p)
                shard = None
                new.append(p)
                found = found or await self._read_checkpoints()
            if shard is not None:  # kept across the rebalance: go on where we were
                for logical in INPUTS:
                    self._seek(self._tp(logical, p), shard.read[logical])
                self._seek(self._tp(TICKS, p), self._ticks_read[p])
                continue
            if p not in decoded:
                decoded.update(await self._decode_checkpoints({p: found.get(p)}))
                letters.update(await self._scan_lettered({p: decoded[p]}))
            if await self._restore(p, found.get(p), decoded[p], letters.get(p, set()), begin=begin, end=end):
                emptied.add(p)
        if emptied:
            self.stats.shards_started_clean += len(emptied)
            log.warning(
                "the broker has less data than this group had read, checkpointed or committed "
                "(emptied or re-created topics, e.g. a restarted in-memory broker): starting clean",
                partitions=sorted(emptied),
            )
            # Supersede whatever stale checkpoint the emptied broker holds now (one written at a
            # revoke after it came back), so the next assignment does not start clean again.
            self._dirty.update(emptied)
            try:
                await self._checkpoint(force=True)
            except (KafkaError, OSError) as exc:
                log.warning(
                    "checkpoint after a clean start failed", error=f"{type(exc).__name__}: {exc}"[:300]
                )
        log.info(
            "partitions assigned",
            shards={
                str(p): {
                    "inputs": {k: self.shards[p].folded[k] for k in INPUTS},
                    "ticks": self.shards[p].ticks_at,
                    "publish_from": self._publish_from[p],
                    "kept": p not in new,
                }
                for p in parts
            },
        )
        self.ready.set()

    async def _look_again(self, tps: Sequence[TopicPartition]) -> None:
        """Give the broker a second before its end offsets are asked again, with ``tps`` fetched
        until each has a fresh high watermark (one fetch answer each, dropped), then paused again:
        on the embedded broker the high watermark is what corrects its ListOffsets (see
        :meth:`_on_assigned`)."""
        consumer = self._consumer
        assert consumer is not None
        t0 = clock.monotonic_s()
        mine = consumer.assignment()
        tps = [tp for tp in tps if tp in mine]  # a rebalance may have taken some since they were listed
        polled = {tp: consumer.last_poll_timestamp(tp) for tp in tps}
        consumer.resume(*tps)
        try:
            while clock.monotonic_s() - t0 < 1.0:
                mine = consumer.assignment()
                waiting = [
                    tp for tp, was in polled.items() if tp in mine and consumer.last_poll_timestamp(tp) == was
                ]
                if not waiting:
                    break
                await asyncio.sleep(0.01)
        finally:
            mine = consumer.assignment()
            consumer.pause(*[tp for tp in tps if tp in mine])
        await asyncio.sleep(max(0.0, 1.0 - (clock.monotonic_s() - t0)))

    async def _end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        consumer = self._consumer
        assert consumer is not None
        end = await consumer.end_offsets(list(tps))
        # The client knows a high watermark only of a partition still assigned: a rebalance during
        # the await may have taken some (its accessors assert on a partition not assigned).
        mine = consumer.assignment()
        return {tp: max(end[tp], (consumer.highwater(tp) if tp in mine else None) or 0) for tp in tps}

    def _beyond(self, p: int, end: Mapping[TopicPartition, int]) -> bool:
        """Whether shard ``p``, kept in memory, has read past the partitions' ends."""
        shard = self.shards.get(p)
        if shard is None:
            return False
        marks = {**shard.read, TICKS: self._ticks_read.get(p, 0)}
        return any(marks[k] > end[self._tp(k, p)] for k in marks)

    def _forget(self, p: int) -> None:
        self.shards.pop(p, None)
        self._held.pop(p, None)
        self._publish_from.pop(p, None)
        self._catchup.pop(p, None)
        self._ticks_read.pop(p, None)
        self._lettered.pop(p, None)
        self._fold_lettered.pop(p, None)
        self._already.pop(p, None)
        self._dirty.discard(p)
        for key in [k for k in self._ticked if k[0] == p]:
            del self._ticked[key]
        for key in [k for k in self._withheld if k[0] == p]:
            del self._withheld[key]
        self._overloaded.pop(p, None)

    def _seek(self, tp: TopicPartition, offset: int) -> None:
        assert self._consumer is not None
        self._consumer.seek(tp, offset)
        self._expect[tp] = offset

    async def _decode_checkpoints(
        self, found: Mapping[int, checkpoint.Found | None]
    ) -> dict[int, Shard | None]:
        """Each partition's newest checkpoint as a shard (None: none, or unusable, said in one line).
        Decoding runs in a thread: at 10k nodes it takes seconds, during which the loop goes on
        deciding the shards it already holds (it gets the interpreter every switch interval)."""
        blobs = {p: f.blob for p, f in found.items() if f is not None and f.blob is not None}
        t0 = clock.monotonic_s()
        values = await asyncio.to_thread(_decode_all, blobs) if blobs else {}
        if blobs:
            self.stats.checkpoint_decode_s = round(clock.monotonic_s() - t0, 3)
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

    async def _scan_lettered(self, shards: Mapping[int, Shard | None]) -> dict[int, set[tuple[str, int]]]:
        """For each restored shard, the sources dead-lettered from its checkpoint's mark on: one
        read of the dead-letter topic from the lowest mark, however many shards were restored."""
        marks = {p: s.dl_mark for p, s in shards.items() if s is not None and 0 <= s.dl_mark < self._dl_end}
        if not marks:
            return {}
        self.stats.dead_letter_scans += 1
        found, first = await self._read_lettered(set(marks), min(marks.values()))
        lost = sorted(p for p, mark in marks.items() if mark < first)
        if lost:
            self.stats.dead_letter_marks_lost += len(lost)
            log.warning(
                "dead letters after these shards' checkpoints are gone from the dead-letter topic "
                "(retention): those published between the checkpoint and the crash may be published again",
                partitions=lost,
                earliest_offset=first,
                marks={str(p): marks[p] for p in lost},
            )
        return {p: {(lg, off) for at, lg, off in found.get(p, ()) if at >= marks[p]} for p in marks}

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
        consumer = self._consumer
        assert consumer is not None
        ticks_tp = self._tp(TICKS, p)
        committed_ticks = await consumer.committed(ticks_tp)
        shard = restored
        if found is not None:
            self._ckpt_seq[p] = max(self._ckpt_seq.get(p, 0), found.max_seq)
        emptied = False
        if shard is not None:
            marks = {**{logical: shard.folded[logical] for logical in INPUTS}, TICKS: shard.ticks_at}
            emptied = any(marks[k] > end[self._tp(k, p)] for k in marks)
        if committed_ticks is not None and committed_ticks > end[ticks_tp]:
            emptied = True
        if p in self._emptied_hint:
            self._emptied_hint.discard(p)
            emptied = True  # measured against fresh end offsets already
        elif emptied:  # the embedded broker's ListOffsets can lag: look again before believing it
            await self._look_again([self._tp(k, p) for k in (*INPUTS, TICKS)])
            end = {**end, **await self._end_offsets([self._tp(k, p) for k in (*INPUTS, TICKS)])}
            marks = {**(dict(shard.folded) if shard else {}), TICKS: shard.ticks_at if shard else 0}
            emptied = any(marks[k] > end[self._tp(k, p)] for k in marks) or (
                committed_ticks is not None and committed_ticks > end[ticks_tp]
            )
        if emptied:
            shard, committed_ticks = None, None
            self._publish_from[p] = begin[ticks_tp]
        if shard is None:
            shard = Shard(p, self.config.model)
            start = {}
            for logical in (*INPUTS, TICKS):
                tp = self._tp(logical, p)
                resume = end[tp] if emptied else (await consumer.committed(tp))
                if resume is None:
                    resume = end[tp]
                start[logical] = begin[tp] if emptied else max(begin[tp], resume - self.config.warmup_records)
                # The warm-up re-reads history a previous run handled: its dead letters went out.
                shard.lettered[logical] = begin[tp] if emptied else resume
            shard.start_at(start, start[TICKS])
            if not emptied:
                self._publish_from[p] = committed_ticks if committed_ticks is not None else end[ticks_tp]
        else:
            self.stats.shards_restored += 1
            self._publish_from[p] = committed_ticks if committed_ticks is not None else shard.ticks_at
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
        self.shards[p] = shard
        self._held[p] = []
        self._ticks_read[p] = shard.ticks_at
        self._lettered[p] = lettered
        self._already[p] = already
        # A first start's warm-up re-folds history a previous run handled (up to its commit): the
        # refusals among it are not news. A restored shard re-folds only what it had not checkpointed.
        self._fold_lettered[p] = dict(shard.lettered) if shard.dl_mark < 0 else {}
        self._catchup[p] = {logical: end[self._tp(logical, p)] for logical in (*INPUTS, TICKS)}
        self._ckpt_at[p] = clock.monotonic_s()
        # From the checkpoint's offsets: nothing it folded is read again. What lies between them and
        # the group's commit (folded by the previous run after its last checkpoint; the commit moves
        # every batch, a checkpoint every ``checkpoint_interval_s``) is read and folded again: the
        # checkpoint does not hold it, and folding it forward is what makes the restored state the
        # continuous one. A clean stop checkpoints last, so after one nothing is read twice.
        for logical in INPUTS:
            self._seek(self._tp(logical, p), shard.folded[logical])
        self._seek(ticks_tp, shard.ticks_at)
        return emptied

    # -- the loop -------------------------------------------------------------------------------

    async def _loop(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        times = self.loop_times
        while not stop.is_set():
            try:
                if (figures := times.report()) is not None:
                    log.info("loop", **figures)
                times.lap("loop")
                if self._restore_needed:
                    await self._restore_assignment()
                    times.lap("restore")
                queued = any(self._held.values())
                batch = await consumer.getmany(timeout_ms=200, max_records=self.config.max_batch)
                if queued:
                    times.lap("fetch")  # with ticks queued (their cuts' records on the way)
                elif self._ticks_in_flight():
                    times.lap("fetch_in_flight")
                else:
                    times.lap("fetch_held_back" if self._withheld else "fetch_idle")
                if self._pending_policy is not None:
                    await self._activate(self._pending_policy, self._pending_offset)
                    self._pending_policy = None
                if self._pending_shadow is not None:
                    await self._activate_shadow(self._pending_shadow[0], self._pending_offset)
                    self._pending_shadow = None
                if batch or any(self._held.values()):
                    await self.process(batch)
                elif self._dirty:
                    await self._checkpoint()
                    times.lap("checkpoint")
            except (KafkaError, OSError) as exc:
                # The broker went away mid-batch (or came back empty). What was decided but not
                # acknowledged is not committed: start again from the checkpoints, which decides
                # exactly those ticks again and publishes them.
                log.warning(
                    "broker error; resuming from the last checkpoint",
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
                self._restore_needed = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)

    async def _restore_assignment(self) -> None:
        """Forget every shard and restore the current assignment from the checkpoints (after a
        broker error, or when the client had to reset a position: the broker lost records)."""
        consumer = self._consumer
        assert consumer is not None
        gen = self._assign_gen
        assigned = sorted(tp for tp in consumer.assignment() if tp.topic in self._topics)
        if assigned:
            end = await self._end_offsets(assigned)
            self._emptied_hint = {p for p in self.shards if self._beyond(p, end)}
        for p in sorted(self.shards):
            self._forget(p)
        self._restore_needed = False
        if assigned:
            await self._on_assigned(assigned)
        if self._assign_gen != gen:
            # The group moved partitions while this restore awaited the broker (the rebalance
            # callbacks run beside the loop): what it restored may be another owner's now.
            # Restore the current assignment again, from the checkpoints.
            self._restore_needed = True

    async def process(self, batch: Mapping[TopicPartition, Sequence[Any]]) -> list[Decision]:
        """Read one batch into the shards, decide the ticks that are ready, publish, checkpoint, commit."""
        assert self._publisher is not None
        dead: list[DeadLetter] = []
        times = self.loop_times
        with tracer.start_as_current_span("fleetloop.batch") as span:
            n = 0
            for tp in sorted(batch, key=lambda t: (t.topic, t.partition)):
                records = batch[tp]
                shard = self.shards.get(tp.partition)
                if not records or tp not in self._owned or shard is None:
                    continue  # fetched while the assignment callback was still seeking
                expect = self._expect.pop(tp, None)
                if expect is not None and records[0].offset > expect:
                    # The client's own start position (the committed offset) landed after ours.
                    self._seek(tp, expect)
                    continue
                if expect is None and records[0].offset < self._position(tp):
                    # The client reset its position by itself (offset out of range): the broker
                    # lost records this shard had read. Restore decides how to go on.
                    self._restore_needed = True
                    return []
                n += len(records)
                logical = self._topics[tp.topic]
                metrics.events_consumed.add(len(records), {"topic": logical})
                if logical in INPUTS:
                    # One pass: decoded through the door into the shard's rows (a refused record's
                    # row holds no item), and the dead letters.
                    twin: Twin[Any] = TELEMETRY_TWIN if logical == TELEMETRY else OUTCOME_TWIN
                    rows, refused = decode_rows(twin, records, self.config.door, Row)
                    shard.add(logical, rows)
                    if logical == TELEMETRY:
                        self.stats.telemetry_in += len(rows) - len(refused)
                    else:
                        self.stats.outcomes_in += len(rows) - len(refused)
                    dead.extend(d for d in refused if self._fresh(tp.partition, logical, d.offset, True))
                else:
                    dead.extend(
                        d
                        for d in self._read_ticks(tp.partition, records)
                        if self._fresh(tp.partition, TICKS, d.offset, True)
                    )
            self.stats.events_in += n
            span.set_attribute("records", n)
            times.lap("read")
            if dead:
                await self._dead_letter(dead)
                times.lap("dead_letters")
            if n:
                faults.reach("mid-batch")
            decisions = await self._decide_ready()
            self._wake_held_back()
            times.lap("decide")
            shadowed, self._shadow_out = self._shadow_out, []
            # Records the shards did not fold (a cap, a fold that raised) and ticks whose decision
            # raised: published before the checkpoint and the commit that cover them.
            refused = self._take_refusals()
            if refused:
                await self._dead_letter(refused, stage="fold")
            if self._failed_ticks:
                await self._retrying("tick-failed", self._publish_failed_ticks)
            times.lap("dead_letters")
            if decisions or shadowed:
                publisher = self._publisher
                try:  # every decision was sent as its tick was decided: wait for the acks
                    await publisher.flush()
                except KafkaError as exc:
                    if not _transient(exc):
                        raise
                    self._broker_trouble("publish", exc)  # send them all again (same bytes, harmless)
                    await self._retrying("publish", lambda: publisher.publish(decisions, shadowed))
                self.stats.decisions_published += len(decisions)
                # Marked once the broker acknowledged them (each pool's decisions are sent as it is
                # decided, the acks awaited here): what waits on it may read them and the counters.
                if decisions:
                    newest = max(d.ts_ms for d in decisions)
                    self.stats.last_decision_ts_ms = max(self.stats.last_decision_ts_ms, newest)
                self.stats.shadow_decisions += len(shadowed)
                # One counter update per kind and reason, not per decision (~15,000 a tick at
                # 10,000 nodes: each update costs ~10 us in the metrics SDK).
                for (kind, reason), count in Counter((d.body.kind, d.body.reason) for d in decisions).items():
                    metrics.decisions.add(count, {"kind": kind, "reason": reason})
                if self._on_decisions is not None:
                    self._on_decisions(decisions)
                faults.reach("after-publish")
                self._log_trips()
            times.lap("acks")
            if self._summary_due:
                await self._retrying("summaries", self._publish_summaries)
            times.lap("summaries")
            await self._checkpoint()
            times.lap("checkpoint")
            await self._retrying("commit", self._commit)
            times.lap("commit")
        return decisions

    def _fresh(self, p: int, logical: str, offset: int, at_door: bool) -> bool:
        """Whether a dead letter for ``offset`` of ``logical`` in shard ``p`` is still to publish:
        not below what was dead-lettered at the door before the shard's checkpoint, and not found
        on the dead-letter topic after it (a restore re-reads and re-folds those records)."""
        marks = self._lettered if at_door else self._fold_lettered
        if offset < marks.get(p, {}).get(logical, 0):
            self.stats.dead_letters_suppressed += 1
            return False
        already = self._already.get(p)
        if already and (logical, offset) in already:
            already.discard((logical, offset))
            self.stats.dead_letters_suppressed += 1
            return False
        return True

    def _take_refusals(self) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        for p in sorted(self.shards):
            shard = self.shards[p]
            taken: list[Refusal] | None = shard.refusals
            if not taken:
                continue
            shard.refusals = []
            self._dirty.add(p)
            out.extend(
                DeadLetter(self._physical[r.logical], p, r.offset, r.key, r.value, r.timestamp_ms, r.reason)
                for r in taken
                if self._fresh(p, r.logical, r.offset, False)
            )
        return out

    async def _read_lettered(
        self, parts: set[int], since: int
    ) -> tuple[dict[int, list[tuple[int, str, int]]], int]:
        """Sources of shards ``parts`` dead-lettered at or after offset ``since`` of the dead-letter
        topic (published after a shard's checkpoint, before a crash): not to publish again. Per
        partition (dead-letter offset, logical topic, source offset); and the topic's first offset
        (above ``since``: retention removed part of the range)."""
        cfg = self.config
        consumer = AIOKafkaConsumer(
            **connect(cfg.bootstrap_servers),
            client_id=f"{cfg.client_id}-lettered",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_partition_fetch_bytes=MAX_FETCH_BYTES,
        )
        await consumer.start()
        found: dict[int, list[tuple[int, str, int]]] = {}
        try:
            tp = TopicPartition(self._deadletter_topic, 0)
            consumer.assign([tp])
            first = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            self._dl_end = max(self._dl_end, end)
            start = max(since, first)
            if start >= end:
                return found, first
            consumer.seek(tp, start)
            while await consumer.position(tp) < end:
                batch = await consumer.getmany(tp, timeout_ms=500)
                for r in batch.get(tp, ()):
                    source = _header(r, "fleetloop.source")
                    if source is None:
                        continue
                    topic, _, rest = source.decode(errors="replace").rpartition(":")
                    topic, _, part = topic.rpartition(":")
                    logical = self._topics.get(topic)
                    if logical is not None and part.isdigit() and int(part) in parts and rest.isdigit():
                        found.setdefault(int(part), []).append((r.offset, logical, int(rest)))
        finally:
            await consumer.stop()
        return found, first

    async def _publish_failed_ticks(self) -> None:
        """A tick whose decision raised goes on control.ticks as skipped, with the reason: nothing
        is silently missing for whoever reads the ticks (replay decides it again and fails alike)."""
        producer = self._producer
        assert producer is not None
        topic = topic_name(self.config.prefix, TICKS)
        futures = []
        for p, offset, tick, reason in self._failed_ticks:
            if offset < self._publish_from.get(p, 0):
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
        self._failed_ticks = []

    async def _dead_letter(self, dead: Sequence[DeadLetter], stage: str = "decode") -> None:
        """Publish dead letters (bounded copies) and count them by reason; one log line per reason
        kind per window (the logger's rate limit), never one per record."""
        publisher = self._publisher
        assert publisher is not None
        failures: list[str] = await self._retrying("dead-letter", lambda: publisher.dead_letter(dead, stage))
        self._dl_end = max(self._dl_end, publisher.end_offset)
        stats = self.stats
        stats.dead_letters += len(dead)
        for d in dead:
            kind = metrics.reason_kind(d.reason)
            stats.dead_by_reason[kind] = stats.dead_by_reason.get(kind, 0) + 1
            metrics.dead_letters.add(1, {"reason": kind})
            log.warning(
                "dead letter",
                source=f"{d.topic}:{d.partition}:{d.offset}",
                reason=d.reason,
                ratelimit_key=kind,
            )
        if failures:
            stats.dead_letters_lost += len(failures)
            log.error(
                "dead letters not published (the records are committed past anyway)",
                count=len(failures),
                first=failures[0],
                ratelimit_key="dead-letter-lost",
            )

    def _read_ticks(self, p: int, records: Sequence[Any]) -> list[DeadLetter]:
        held = self._held[p]
        decoded = decode_batch(Tick, records, self.config.door)
        good = dict(zip(decoded.offsets, decoded.items, strict=True))
        now_s = clock.monotonic_s()
        for r in records:
            if r.offset < self._ticks_read[p]:
                continue
            cut: dict[str, int] | None = None
            raw_cut = _header(r, CUT_HEADER)
            if raw_cut is not None:
                with contextlib.suppress(orjson.JSONDecodeError, TypeError, ValueError):
                    parsed = orjson.loads(raw_cut)
                    cut = {k: int(parsed[k]) for k in INPUTS}
            skipped = _header(r, SKIPPED_HEADER)
            held.append(
                _HeldTick(
                    r.offset,
                    good.get(r.offset),
                    r.timestamp,
                    cut,
                    skipped.decode(errors="replace") if skipped is not None else None,
                    now_s,
                )
            )
            self._ticks_read[p] = r.offset + 1
        self.stats.ticks_in += len(decoded.items)
        return decoded.dead

    def _cut_of(self, p: int, h: _HeldTick) -> dict[str, int] | None:
        """The cut of a held tick, or None while its inputs are not read far enough to know it."""
        shard = self.shards[p]
        consumer = self._consumer
        assert consumer is not None
        if h.cut is not None:
            for logical in INPUTS:
                if shard.read[logical] < h.cut[logical]:
                    highwater = consumer.highwater(self._tp(logical, p))
                    if highwater is None or highwater > shard.read[logical]:
                        return None  # not read yet
            return h.cut
        # A tick without a cut (from another ticker): its record time closes the prefix once each
        # input shows a later record, or is read to its end, or the tick waited max_tick_hold_s.
        for logical in INPUTS:
            if shard.seen_after(logical, h.timestamp_ms):
                continue
            highwater = consumer.highwater(self._tp(logical, p))
            waited_s = clock.monotonic_s() - h.since_s
            # Read to the end as of the last fetch, and that fetch came after the tick arrived.
            if highwater is not None and shard.read[logical] >= highwater and waited_s >= 0.3:
                continue
            if waited_s >= self.config.max_tick_hold_s:
                self.stats.ticks_forced += 1
                metrics.ticks.add(1, {"outcome": "forced"})
                break
            return None
        return shard.cut_by_time(h.timestamp_ms)

    def _policy_at(self, ts_ms: int) -> CompiledPolicy:
        for from_ts, policy in reversed(self._activations):
            if from_ts <= ts_ms:
                return policy
        return self._activations[0][1]

    async def _decide_ready(self) -> list[Decision]:
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
        # Per shard: its queue and the offsets in it of held ticks decided ahead of order. The queue
        # too: a shard that went and came back during an await (a rebalance; the settle below is a
        # round trip) has a new queue, restored from a checkpoint, whose ticks are all its own to decide.
        early: dict[int, tuple[list[_HeldTick], set[int]]] = {}
        for p, hs in self._troubled_heads():
            shard = self.shards.get(p)
            queue = self._held.get(p)
            if shard is None or queue is None:
                continue  # the shard went (a rebalance during a yield)
            await self._decide_held(p, shard, hs, out, trip=True)
            if self.shards.get(p) is not shard or self._held.get(p) is not queue:
                continue  # it went during a yield: decided again from its checkpoint
            early.setdefault(p, (queue, set()))[1].update(h.offset for h in hs)
            self._dirty.add(p)
        if early and self._publisher is not None:
            # The tripping pools' decisions are on the broker before any routine pool is decided.
            # Staged only, they went out when the client's tasks got turns of the loop between the
            # routine batches (tens of ms each) and shared a request with them: ~80 ms from staged
            # to control.state at p50, half the after-boundary part (one 2,500-node daemon,
            # bench/results/latency-s11.md). A failure is raised by process()'s flush, as before.
            await self._publisher.settle()
            self._log_trips()
        for p in sorted(self._held):
            shard = self.shards.get(p)
            held = self._held.get(p)
            mark = early.get(p)
            done = mark[1] if mark is not None and mark[0] is held else set()
            while held and shard is not None and self.shards.get(p) is shard and self._held.get(p) is held:
                h = held[0]
                run = 1  # held ticks this step passes
                if h.offset in done:
                    pass  # decided above, out of order: only its place in the queue remains
                elif h.tick is not None and h.skipped is None:
                    cut = self._cut_of(p, h)
                    if cut is None:
                        break  # ticks of one partition are decided in order
                    run = _boundary_run(held, done)
                    started_s = clock.monotonic_s()
                    await self._decide_held(
                        p, shard, [x for x in held[:run] if x.offset not in done], out, cut
                    )
                    self._note_pace(p, clock.monotonic_s() - started_s)
                    if self.shards.get(p) is not shard or self._held.get(p) is not held:
                        break  # the shard went during the yield: its new owner decides from its checkpoint
                elif h.tick is not None and shard.skip(h.tick):
                    self.stats.ticks_skipped += 1
                    metrics.ticks.add(1, {"outcome": "missed"})
                    log.warning(
                        "ticks skipped",
                        pool=h.tick.pool_id,
                        through_tick=h.tick.tick_id,
                        reason=h.skipped,
                    )
                shard.ticks_at = held[run - 1].offset + 1
                del held[:run]
                self._dirty.add(p)
        return out

    def _log_trips(self) -> None:
        """The broker acknowledged what was staged: one "trip path" line per boundary whose
        tripping pools' decisions were among it (:class:`TripTrace`)."""
        trace = self.trace
        for boundary in sorted(trace.trips):
            trace.stamp(boundary, "acked")
            log.info("trip path", boundary=boundary, **trace.after(boundary))
        trace.trips.clear()

    def _note_pace(self, p: int, took_s: float) -> None:
        """Shard ``p`` decided a boundary's ticks in ``took_s`` of wall time (yields and the
        machine's other work included: how long it really takes): its recent pace, each boundary
        weighing half. Kept when the partition goes (``_forget``): it measures this machine."""
        was = self._pace_s.get(p)
        self._pace_s[p] = took_s if was is None else (was + took_s) / 2.0

    def _catch_up_keeps(self, p: int, missed: int) -> int:
        """How many of an outage's ``missed`` boundaries of a pool of shard ``p`` (the newest) are
        caught up: ``catchup_max_ticks`` at most, and when the shard's recent pace says deciding them
        would take longer than ``catchup_budget_s``, those that fit it (at least
        ``overload_max_ticks``, at least one). A shard this instance has not decided a boundary of
        yet (a new owner whose checkpoint was written at the revoke: nothing to decide again) takes
        the mean pace of the shards it has decided (kept when a partition goes: the same machine);
        with none at all, every missed boundary is decided."""
        cfg = self.config
        keep = cfg.catchup_max_ticks
        paces = self._pace_s
        pace = paces.get(p) or (sum(paces.values()) / len(paces) if paces else None)
        if cfg.catchup_budget_s > 0 and pace and missed * pace > cfg.catchup_budget_s:
            keep = min(keep, max(1, cfg.overload_max_ticks, int(cfg.catchup_budget_s / pace)))
        return keep

    def _troubled_heads(self) -> list[tuple[int, list[_HeldTick]]]:
        """Per shard, the ticks of the boundary at the head of its queue (same time, same cut, all
        ready) whose pool has a failed call among the records that cut folds, in queue order."""
        out: list[tuple[int, list[_HeldTick]]] = []
        for p in sorted(self._held):
            held = self._held[p]
            if not held or held[0].tick is None or held[0].skipped is not None or held[0].cut is None:
                continue
            head = held[0]
            assert head.tick is not None
            if self._cut_of(p, head) is None:
                continue
            troubled = self.shards[p].troubled(head.cut or {})
            if not troubled:
                continue
            found: list[_HeldTick] = []
            for h in held:
                same = h.tick is not None and h.skipped is None and h.cut == head.cut
                if not same or h.tick is None or h.tick.ts_ms != head.tick.ts_ms:
                    break  # the head boundary ends here
                if h.tick.pool_id in troubled:
                    found.append(h)
            if found:
                out.append((p, found))
        return out

    async def _decide_held(
        self,
        p: int,
        shard: Shard,
        hs: Sequence[_HeldTick],
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
            await self._decide_batch(p, shard, hs[start:end], out, cut, trip=trip)
            if self.shards.get(p) is not shard:
                return  # the shard went during the yield: its new owner decides from its checkpoint
            start = end

    async def _decide_batch(
        self,
        p: int,
        shard: Shard,
        hs: Sequence[_HeldTick],
        out: list[Decision],
        cut: dict[str, int] | None,
        *,
        trip: bool = False,
    ) -> None:
        """Decide held ticks of one boundary and distinct pools in one :meth:`Shard.decide_many`, as
        one :meth:`Shard.decide` each would (a tick that raises costs only itself); stage their
        decisions in order, then yield to the loop."""
        ticks: list[Tick] = []
        for h in hs:
            assert h.tick is not None
            ticks.append(h.tick)
        batch_cut = cut if cut is not None else hs[0].cut
        assert batch_cut is not None
        trace = self.trace
        boundary = ticks[0].ts_ms
        if trip:
            now_ms, now_s = clock.wall_ms(), clock.monotonic_s()
            trace.stamp(boundary, "ticks_read", now_ms - int((now_s - min(h.since_s for h in hs)) * 1000))
            trace.stamp(boundary, "cut_ready", now_ms)
        if not await self._fold_in_steps(p, shard, ticks, batch_cut):
            return  # the shard went during a yield: its new owner decides from its checkpoint
        if trip:
            trace.stamp(boundary, "folded")
        started_s = clock.monotonic_s()
        policy = self._policy_at(ticks[0].ts_ms)
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
        share_s = (clock.monotonic_s() - started_s) / len(ticks)
        if trip:
            trace.stamp(boundary, "decided")
        for h, d in zip(hs, decided, strict=True):
            assert h.tick is not None
            if isinstance(d, Exception):  # one pool's bad tick must not stop the others' decisions
                self._tick_failed(p, h.offset, h.tick, d)
                continue
            published = self._settle(p, h.offset, d, share_s)
            if published:
                out.extend(published)
                self._note_summary(p, h.tick, published)
                shadow = shadowed.get(h.tick.pool_id, ())
                self._shadow_out.extend(shadow)
                assert self._publisher is not None
                await self._publisher.stage(published, shadow)
                if self.shards.get(p) is not shard:
                    return  # the shard went during the hand-over (as it would have between ticks)
        if trip and out:
            trace.stamp(boundary, "staged")
            trace.trips.add(boundary)
        # The client hands the batch over; the ticker, the consumer's fetches and the group
        # heartbeat get a turn (also between ticks decided again after a restore, not published).
        await asyncio.sleep(0)

    async def _fold_in_steps(
        self, p: int, shard: Shard, ticks: Sequence[Tick], cut: Mapping[str, int]
    ) -> bool:
        """Fold what ``ticks`` (one boundary) would fold first, ``FOLD_STEP_ROWS`` records at a time
        with a yield to the loop after each step, and leave the rest (at most that many) to the
        decide; the shard ends as the decide's own fold would leave it (:meth:`Shard.step_toward`).
        Nothing is folded when every tick is a duplicate (the decide folds nothing then either).
        False when the shard went during a yield."""
        if all((last := shard.last_tick.get(t.pool_id)) is not None and t.tick_id <= last[0] for t in ticks):
            return True
        while (step := shard.step_toward(cut, FOLD_STEP_ROWS)) is not None:
            shard.fold_to(step)
            self.stats.fold_steps += 1
            await asyncio.sleep(0)
            if self.shards.get(p) is not shard:
                return False
        return True

    def _shadow_at(self, ts_ms: int) -> Shadow | None:
        for from_ts, shadow in reversed(self._shadows):
            if from_ts <= ts_ms:
                return shadow
        return None

    def _decide_shadows(self, shard: Shard, ticks: Sequence[Tick]) -> dict[str, tuple[Decision, ...]]:
        """The shadow policy's decisions on ticks of one boundary just decided, by pool; a failure
        costs only that tick's shadow decisions."""
        if not ticks:
            return {}
        try:
            results = shard.decide_shadow_many(ticks, self._shadow_at(ticks[0].ts_ms))
        except Exception as exc:
            results = [exc for _ in ticks]
        out: dict[str, tuple[Decision, ...]] = {}
        for tick, result in zip(ticks, results, strict=True):
            if isinstance(result, Exception):
                self._shadow_failed(tick, result)
            else:
                out[tick.pool_id] = result
        return out

    def _shadow_failed(self, tick: Tick, exc: Exception) -> None:
        self.stats.shadow_failed += 1
        log.error(
            "shadow policy could not decide a tick; the enforced decisions stand",
            pool=tick.pool_id,
            tick_id=tick.tick_id,
            error=reason_of(exc),
            ratelimit_key=f"shadow-failed:{tick.pool_id}",
        )

    def _settle(
        self, p: int, offset: int, decided: tuple[Decision, ...] | None, duration_s: float
    ) -> Sequence[Decision]:
        """Count a decided tick by outcome; the decisions to publish (none for a tick decided again)."""
        if decided is None:
            self.stats.ticks_duplicate += 1
            metrics.ticks.add(1, {"outcome": "duplicate"})
        elif not decided:
            self.stats.ticks_no_data += 1  # no data on this pool in its shard
            metrics.ticks.add(1, {"outcome": "skipped"})
        elif offset < self._publish_from[p]:
            self.stats.ticks_restored += 1  # rebuilds state after a restore; published before
            metrics.ticks.add(1, {"outcome": "warmup"})
        else:
            metrics.tick_duration.record(duration_s)
            metrics.ticks.add(1, {"outcome": "decided"})
            self._account(decided)
            return decided
        return ()

    def _tick_failed(self, p: int, offset: int, tick: Tick, exc: Exception) -> None:
        """A tick whose decision raised: counted, logged (rate-limited per pool) and published as
        skipped with the reason (:meth:`_publish_failed_ticks`), not decided."""
        self.stats.ticks_failed += 1
        self.stats.last_tick_failure = f"pool {tick.pool_id} tick {tick.tick_id}: {reason_of(exc)}"
        self._failed_ticks.append((p, offset, tick, f"decide-failed: {reason_of(exc)}"))
        metrics.ticks.add(1, {"outcome": "failed"})
        log.error(
            "tick not decided: deciding raised; the loop goes on",
            pool=tick.pool_id,
            tick_id=tick.tick_id,
            error=reason_of(exc),
            ratelimit_key=f"tick-failed:{tick.pool_id}",
        )

    def _note_summary(self, p: int, tick: Tick, decided: Sequence[Decision]) -> None:
        """A shard decided ``tick``: its summary is due (for the newest boundary of the batch)."""
        due = self._summary_due.get(p)
        if due is None or tick.ts_ms >= due[0]:
            self._summary_due[p] = (tick.ts_ms, tick.tick_id)
        allowed = self._retries_allowed.setdefault(p, {})
        for d in decided:
            body = d.body
            if isinstance(body, RetryBudgetDecision) and body.tenant_id is None:
                allowed[body.pool_id] = body.retries_allowed_now

    async def _publish_summaries(self) -> None:
        """Each shard that decided ticks in this batch publishes its summary (``control.summaries``)
        for the newest boundary it decided, once every tick of that boundary it holds is decided: a
        boundary whose pools' ticks were split over two batches is summarized once, after the
        second, with every pool's retry budget of that boundary (it was published after each
        batch, the first time without the pools still to decide)."""
        producer = self._producer
        due, self._summary_due = self._summary_due, {}
        if producer is None or not due:
            return
        window_ms = envelope_of(self.engine.policy).window_ms
        futures = []
        for p, (ts_ms, tick_id) in sorted(due.items()):
            shard = self.shards.get(p)
            if shard is None:
                continue
            held = self._held.get(p)
            if held and held[0].tick is not None and held[0].tick.ts_ms <= ts_ms:
                self._summary_due[p] = (ts_ms, tick_id)  # ticks of this boundary still to decide
                continue
            allowed = self._retries_allowed.get(p, {})
            for pool in [q for q in allowed if q not in shard.model.pools]:
                del allowed[pool]  # evicted pools: bounded by the model's pool cap
            summary = summarize(
                shard.model,
                group=self.config.group_id,
                partition=p,
                ts_ms=ts_ms,
                tick_id=tick_id,
                window_ms=window_ms,
                retries_allowed=allowed,
            )
            futures.append(
                await producer.send(
                    self._summaries_topic,
                    key=f"{self.config.group_id}/{p}".encode(),
                    value=orjson.dumps(summary.model_dump(mode="json")),
                )
            )
        await asyncio.gather(*futures)
        self.stats.summaries_published += len(futures)

    def _account(self, decided: Sequence[Decision]) -> None:
        self.stats.ticks_decided += 1
        for d in decided:
            body = d.body
            if body.kind == "breaker":
                if body.state == "open" and body.enforced:
                    if body.node_id not in self.stats.breaker_open_nodes:
                        self.stats.breaker_opens += 1
                        self.stats.breaker_open_nodes.add(body.node_id)
                        log.info("breaker opened", node=body.node_id, reason=body.reason, **body.inputs)
                elif body.state == "closed":
                    self.stats.breaker_open_nodes.discard(body.node_id)

    def input_offsets(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in sorted(self.shards):
            out.update(self.shards[p].input_offsets())
        return dict(sorted(out.items()))

    async def _checkpoint(self, *, force: bool = False) -> bool:
        """Checkpoint each changed shard (every ``checkpoint_interval_s``, or now when forced).

        The state is taken at this instant (a forked child encodes a copy-on-write image of it,
        :mod:`fleetloop.daemon.offload`), so the loop goes on folding and deciding while the child
        encodes and the chunks are sent; a periodic checkpoint returns at once, a forced one (revoke,
        shutdown, clean start) when the broker acknowledged it. One checkpoint is in flight at a
        time; one that fails leaves its shards changed, to be written again."""
        producer = self._producer
        if producer is None:
            return False
        running = self._ckpt_task
        if running is not None and not running.done():
            if not force:
                return False  # the next batch tries again
            await asyncio.wait([running])
        now_s = clock.monotonic_s()
        due = [
            p
            for p in sorted(self._dirty)
            if p in self.shards and (force or now_s - self._ckpt_at.get(p, 0.0) >= self._ckpt_gap_s)
        ]
        if not due:
            return False
        values = []
        seqs: dict[int, int] = {}
        for p in due:
            shard = self.shards[p]
            # Every door dead letter of what was read, and every fold refusal of what was folded,
            # is acknowledged by now (process publishes them before it checkpoints).
            shard.lettered = {**shard.read, TICKS: self._ticks_read.get(p, shard.ticks_at)}
            shard.dl_mark = self._dl_end
            values.append(shard.checkpoint_value())
            seqs[p] = self._ckpt_seq[p] = self._ckpt_seq.get(p, 0) + 1
            self._dirty.discard(p)
            self._ckpt_at[p] = now_s
        started_s = clock.monotonic_s()
        encoded = offload.encode_timed_in_child(checkpoint.encode_many, values)  # the state, as of now
        self.stats.checkpoint_loop_ms = round((clock.monotonic_s() - started_s) * 1000.0, 3)
        write = self._write_checkpoints(producer, seqs, encoded, started_s)
        if force:
            await write
            return True
        self._ckpt_task = asyncio.create_task(self._background_checkpoint(write, due))
        return True

    async def _write_checkpoints(
        self,
        producer: AIOKafkaProducer,
        seqs: Mapping[int, int],
        encoded: Coroutine[Any, Any, tuple[bytes, float]],
        started_s: float,
    ) -> None:
        data, cpu_s = await encoded
        blobs = checkpoint.split_many(data)
        self.stats.checkpoint_encode_s = round(clock.monotonic_s() - started_s, 3)
        self.stats.checkpoint_cpu_s = round(cpu_s, 3)
        self.stats.checkpoint_cpu_s_total += cpu_s
        cfg = self.config
        self._ckpt_gap_s = checkpoint.gap_s(
            cfg.checkpoint_interval_s, cpu_s, cfg.checkpoint_cpu_share, cfg.checkpoint_max_stretch
        )
        self.stats.checkpoint_gap_s = round(self._ckpt_gap_s, 3)
        chunks = [
            chunk
            for (p, seq), blob in zip(seqs.items(), blobs, strict=True)
            for chunk in checkpoint.to_chunks(self.config.group_id, p, seq, blob)
        ]

        async def send() -> None:
            futures = [await producer.send(self._checkpoint_topic, value=c.value, key=c.key) for c in chunks]
            await asyncio.gather(*futures)

        await self._retrying("checkpoint", send)
        self.stats.checkpoint_bytes = max(len(b) for b in blobs)
        self.stats.checkpoints_written += len(seqs)
        faults.reach("after-checkpoint")

    async def _background_checkpoint(self, write: Coroutine[Any, Any, None], due: Sequence[int]) -> None:
        try:
            await write
        except Exception as exc:  # written again with the next batch; an older checkpoint stands
            self._dirty.update(p for p in due if p in self.shards)
            log.warning(
                "checkpoint failed; it will be written again",
                error=f"{type(exc).__name__}: {exc}"[:300],
                ratelimit_key="checkpoint-failed",
            )

    async def _commit(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for p, shard in sorted(self.shards.items()):
            for logical in INPUTS:
                tp = self._tp(logical, p)
                if tp in self._owned:
                    offsets[tp] = OffsetAndMetadata(shard.commit_offset(logical), "")
            tp = self._tp(TICKS, p)
            # Ticks are committed once past where publishing starts (not back into restored history).
            if tp in self._owned and shard.ticks_at >= self._publish_from[p]:
                offsets[tp] = OffsetAndMetadata(shard.ticks_at, "")
        if not offsets:
            return
        # The same offsets as the last commit under this assignment: nothing to commit. Most batches
        # (input records between boundaries: nothing folded, no tick decided) moved nothing, and
        # each commit is a round trip the loop waited on before its next fetch: 14-16% of its wall
        # time on one 2,500-node daemon (bench/results/latency-s11.md), a tick arriving meanwhile
        # read that much later.
        done = {tp: o.offset for tp, o in offsets.items()}
        if self._committed == (self._assign_gen, done):
            self.stats.commits_skipped += 1
            return
        await consumer.commit(offsets)
        self._committed = (self._assign_gen, done)
        self.stats.commits += 1

    # -- side tasks -----------------------------------------------------------------------------

    def _caught_up(self, p: int) -> bool:
        """True once a shard has read and decided what was on its partitions when it was assigned."""
        target = self._catchup.get(p)
        if target is None:
            return True
        shard = self.shards[p]
        if shard.ticks_at < target[TICKS] or any(shard.read[k] < target[k] for k in INPUTS):
            return False
        del self._catchup[p]
        return True

    def _waiting(self, p: int, pool: str, tick_ms: int) -> int:
        """Boundaries of ``pool`` this instance published and shard ``p`` has not decided yet."""
        published = self._ticked.get((p, pool))
        decided = self.shards[p].last_tick.get(pool)
        if published is not None and decided is not None and published > decided[1]:
            return (published - decided[1]) // tick_ms
        return 0

    def _ticks_in_flight(self) -> bool:
        """Whether a tick this instance published for a shard it owns is not decided yet while no
        tick is queued: on its way through the broker (``fetch_in_flight`` in the "loop" line)."""
        tick_ms = self.engine.policy.tick_ms
        return any(p in self.shards and self._waiting(p, pool, tick_ms) > 0 for p, pool in self._ticked)

    def _wake_held_back(self) -> None:
        """Wake the ticker when a shard has decided every tick it held while the ticker holds pools
        of it back and fewer than ``overload_max_ticks`` of such a pool's boundaries wait now.

        Without this the shard sat idle until the next boundary (up to a tick period, and the tick's
        way through the broker) while the records it will fold piled up: measured on a 10k daemon
        behind its boundaries, a sixth of its loop's wall time (``fetch_held_back`` in the "loop"
        line, bench/results/latency-s10.md)."""
        if not self._withheld or self._tick_now.is_set():
            return
        tick_ms = self.engine.policy.tick_ms
        limit = self.config.overload_max_ticks
        for p, pool in self._withheld:
            if p in self.shards and not self._held.get(p) and self._waiting(p, pool, tick_ms) < limit:
                self._tick_now.set()
                return

    async def _sleep_to(self, boundary: int, now: int, stop: asyncio.Event) -> None:
        """Until the wall clock reaches ``boundary``, ``stop`` is set or the loop wakes the ticker."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._tick_now.wait())]
        try:
            await asyncio.wait(waits, timeout=(boundary - now) / 1000.0, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _ticker(self, producer: AIOKafkaProducer, stop: asyncio.Event) -> None:
        topic = topic_name(self.config.prefix, TICKS)
        while not stop.is_set():
            tick_ms = self.engine.policy.tick_ms
            now = clock.wall_ms()
            boundary = (now // tick_ms + 1) * tick_ms
            await self._sleep_to(boundary, now, stop)
            if stop.is_set():
                return
            if self._tick_now.is_set() and clock.wall_ms() < boundary:
                # Woken between boundaries: a shard has decided what waited. Its held-back pools
                # get their ticks now (the newest boundary passed; those before it as skipped).
                self._tick_now.clear()
                try:
                    passed = boundary - tick_ms
                    await self._publish_ticks(
                        producer, topic, passed, tick_ms, held_up=True, held_back_only=True
                    )
                except (KafkaError, OSError) as exc:
                    self._broker_trouble("tick", exc)
                continue
            self._tick_now.clear()  # the boundary's round covers the held-back pools too
            # Woken a tick period or more after its boundary: the loop held the ticker up (it was
            # deciding); boundaries missed so are overload's. On time, boundaries missed since the
            # last round are an outage's (a publish the broker held, a restart).
            late_ms = clock.wall_ms() - boundary
            held_up = late_ms >= tick_ms
            times = self.loop_times
            times.ticker_late_s = max(times.ticker_late_s, late_ms / 1000.0)
            started_s = clock.monotonic_s()
            trace = self.trace
            trace.stamp(boundary, "woke")
            try:
                if wait_s := self.config.tick_read_wait_s:
                    await self._read_to_now(wait_s, boundary)
                trace.stamp(boundary, "read_up")
                await self._publish_ticks(producer, topic, boundary, tick_ms, held_up=held_up)
                trace.stamp(boundary, "ticks_acked")
                times.ticker_s += clock.monotonic_s() - started_s
            except (KafkaError, OSError) as exc:  # the broker is away: the next round catches up
                self._broker_trouble("tick", exc)

    async def _read_to_now(self, limit_s: float, boundary: int | None = None) -> None:
        """Wait, at most ``limit_s``, until every owned input partition is read up to its end as the
        broker reports it now (a round trip; then the loop's own fetches) or, given the tick
        ``boundary``, holds a read record stamped after it: the boundary's cut is the longest prefix
        of records stamped at or before it (:meth:`Shard.cut_by_time`), so it ends before that
        record and reading on cannot change it. When every partition holds one, the wait ends
        without asking the broker (the cut is the one the whole wait would have given)."""
        consumer = self._consumer
        if consumer is None:
            return
        tps = [
            tp for p in sorted(self.shards) for tp in (self._tp(k, p) for k in INPUTS) if tp in self._owned
        ]
        if not tps:
            return
        topics = self._topics

        def past(tp: TopicPartition) -> bool:
            shard = self.shards.get(tp.partition)
            return shard is None or (boundary is not None and shard.seen_after(topics[tp.topic], boundary))

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
        except KafkaError:
            return
        finally:
            listing.cancel()
        # The embedded broker's ListOffsets answers the last batch's base offset: the high watermark
        # a fetch saw before the boundary covers that batch when it was fetched by then.
        end = {tp: max(listed[tp], known[tp]) for tp in tps}
        while clock.monotonic_s() < deadline:
            if all(
                (shard := self.shards.get(tp.partition)) is None
                or shard.read[topics[tp.topic]] >= end[tp]
                or past(tp)
                for tp in tps
            ):
                return
            await asyncio.sleep(0.005)

    async def _publish_ticks(
        self,
        producer: AIOKafkaProducer,
        topic: str,
        now_b: int,
        tick_ms: int,
        *,
        held_up: bool = False,
        held_back_only: bool = False,
    ) -> None:
        """Publish each owned, caught-up pool's ticks due at boundary ``now_b`` (and those missed since
        its last), under the catch-up and overload rules; ``held_up``: the loop held this round up
        (see :meth:`_ticker`); ``held_back_only``: only the pools held back for overload (a round
        between boundaries, :meth:`_wake_held_back`)."""
        limit = self.config.catchup_max_ticks
        overload = self.config.overload_max_ticks
        futures = []
        sent: dict[tuple[int, str], int] = {}
        # Boundaries missed while the broker was unreachable, or with the ticker on time, are an
        # outage's, caught up in full (up to catchup_max_ticks); missed because the loop held the
        # ticker up, they are overload's.
        if held_back_only:
            broker_gap = self._broker_gap  # left for the boundary's round
        else:
            broker_gap, self._broker_gap = self._broker_gap, False
        outage = broker_gap or not held_up
        for p in sorted(self.shards):
            if self._tp(TICKS, p) not in self._owned or not self._caught_up(p):
                continue
            shard = self.shards[p]
            held_back = 0  # pools of this shard whose tick is held back at this boundary
            due: dict[int, list[str]] = {}  # boundary -> pools to tick at it, in pool order
            skipped_here = 0  # ... and those whose held-back boundaries went out as skipped
            # A boundary's cut is the shard's, the same for every pool it ticks: computed (a scan of
            # the records read and not folded) and encoded once per boundary, not once per pool
            # (at 10,000 nodes, ~60 pools x ~4,000 pending records a shard: a third of the daemon's
            # CPU, and more the further it fell behind; bench/results/latency-s7.md).
            headers: dict[int, bytes] = {}
            for pool in shard.pools():
                if held_back_only and (p, pool) not in self._withheld:
                    continue
                published = self._ticked.get((p, pool))
                decided = shard.last_tick.get(pool)
                last = max(published if published is not None else -1, decided[1] if decided else -1)
                first = (last // tick_ms + 1) * tick_ms if last >= 0 else now_b
                boundaries = list(range(first, now_b + 1, tick_ms))
                if not boundaries:
                    continue
                waiting = self._waiting(p, pool, tick_ms)  # published (by this instance), not decided
                n = overload_step(waiting, len(boundaries), overload, outage or published is None)
                if n == 0:
                    self._withheld.setdefault((p, pool), (first, waiting))
                    held_back += 1
                    continue
                withheld = self._withheld.pop((p, pool), None)
                if withheld is not None:
                    n, waiting = 1, withheld[1]  # held back before: the newest only, whatever waits now
                if n < len(boundaries):
                    skipped, boundaries = boundaries[:-n], boundaries[-n:]
                    reason = (
                        f"overload: {len(skipped)} ticks not decided: {waiting} boundaries were "
                        f"waiting to be decided (overload_max_ticks {overload}); deciding the newest"
                    )
                    futures.append(
                        await _send_skipped(producer, topic, pool, skipped, reason=reason, tick_ms=tick_ms)
                    )
                    self.stats.ticks_overload += len(skipped)
                    skipped_here += 1
                    metrics.ticks.add(len(skipped), {"outcome": "overload"})
                elif len(boundaries) > (keep := self._catch_up_keeps(p, len(boundaries))):
                    skipped, boundaries = boundaries[:-keep], boundaries[-keep:]
                    if keep == limit:
                        reason = f"outage: {len(skipped)} ticks missed, beyond the catch-up of {limit}"
                    else:
                        self.stats.ticks_catchup_capped += len(skipped)
                        reason = (
                            f"outage: {len(skipped)} ticks missed, beyond the catch-up of {keep}: "
                            f"deciding all {keep + len(skipped)} would take longer than catchup_budget_s "
                            f"{self.config.catchup_budget_s:g} at this shard's pace"
                        )
                    futures.append(
                        await _send_skipped(producer, topic, pool, skipped, reason=reason, tick_ms=tick_ms)
                    )
                if len(boundaries) > 1:
                    self.stats.ticks_caught_up += len(boundaries) - 1
                for b in boundaries:
                    due.setdefault(b, []).append(pool)
                sent[(p, pool)] = boundaries[-1]
            # The ticks after every pool's skipped record, boundary by boundary: the pools of one
            # boundary stay consecutive on the partition, so the shard decides them in one batch
            # (a skipped record between them would split the batch into one call per pool).
            for b in sorted(due):
                cut = headers.get(b)
                if cut is None:
                    cut = headers[b] = orjson.dumps(shard.cut_by_time(b), option=orjson.OPT_SORT_KEYS)
                for pool in due[b]:
                    value = orjson.dumps(Tick(ts_ms=b, tick_id=b // tick_ms, pool_id=pool).model_dump())
                    futures.append(
                        await producer.send(
                            topic, key=pool.encode(), value=value, headers=[(CUT_HEADER, cut)]
                        )
                    )
            if not held_back_only or held_back or skipped_here:
                self._note_overload(p, held_back, skipped_here)
        self.health.overloaded = sorted(self._overloaded)
        self.health.ticks_overload = self.stats.ticks_overload
        if futures:
            await asyncio.gather(*futures)
        self._ticked.update(sent)

    def _note_overload(self, p: int, held_back: int, skipped: int) -> None:
        """One log line when shard ``p`` goes into overload (its ticker held ticks back or published
        boundaries as skipped) and one when it is out: ``overload_max_ticks`` boundaries in a row
        published whole, none held back or skipped (an episode does not end and begin again at
        every boundary while the shard is still too slow)."""
        state = self._overloaded.get(p)
        if held_back or skipped:
            if state is None:
                self.stats.overload_episodes += 1
                log.warning(
                    "overload: the shard decides more slowly than the ticks come; from now on it "
                    "decides the newest boundary next and the boundaries between go out as skipped",
                    partition=p,
                    pools_held_back=held_back,
                    pools_skipped=skipped,
                    overload_max_ticks=self.config.overload_max_ticks,
                )
            self._overloaded[p] = (state[0] if state else clock.monotonic_s(), 0)
            return
        if state is None:
            return
        clean = 0 if any(k[0] == p for k in self._withheld) else state[1] + 1
        if clean < max(1, self.config.overload_max_ticks):
            self._overloaded[p] = (state[0], clean)
            return
        del self._overloaded[p]
        log.warning(
            "overload over: the shard decides every boundary again",
            partition=p,
            lasted_s=round(clock.monotonic_s() - state[0], 1),
            ticks_overload=self.stats.ticks_overload,
        )

    # -- service: broker watch, retries, metric sources -----------------------------------------

    def _broker_trouble(self, operation: str, exc: BaseException) -> None:
        self._broker_gap = True
        self.health.connected = False
        self.health.connection_error = one_line(exc)
        metrics.broker_errors.add(1, {"operation": operation})
        log.warning("broker unavailable; retrying", operation=operation, error=one_line(exc))

    async def _retrying(self, operation: str, op: Callable[[], Any]) -> Any:
        """``await op()``, retried with backoff while the broker is away (transient errors only).

        The batch waits: nothing is committed before what was computed from it is acknowledged,
        and publishing the same decisions again is harmless (desired state keyed by entity). A
        non-transient error reaches the loop, which resumes from the checkpoints.
        """
        delay_s = 0.1
        while True:
            try:
                return await op()
            except CommitFailedError as exc:
                if operation != "commit":
                    raise
                # The group rebalanced while the broker was away: these partitions were handed out
                # again, and whoever owns them now resumes from the last commit (at least once;
                # decisions made again are the same desired state, harmless).
                metrics.broker_errors.add(1, {"operation": operation})
                log.warning("commit skipped: the group rebalanced", error=one_line(exc)[:200])
                return None
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
                self._broker_gap = True
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
        # Warm: every shard has read and decided what was on its partitions when it was assigned.
        h.warm = self.ready.is_set() and all(self._caught_up(p) for p in sorted(self.shards))

    def _position(self, tp: TopicPartition) -> int:
        shard = self.shards.get(tp.partition)
        logical = self._topics.get(tp.topic)
        if shard is None or logical is None:
            return 0
        return self._ticks_read.get(tp.partition, 0) if logical == TICKS else shard.read[logical]

    def lag(self) -> dict[tuple[str, int], int]:
        consumer = self._consumer
        if consumer is None:
            return {}
        out: dict[tuple[str, int], int] = {}
        for tp in sorted(self._owned, key=lambda t: (t.topic, t.partition)):
            high = consumer.highwater(tp)
            if high is not None:
                out[(self._topics.get(tp.topic, tp.topic), tp.partition)] = max(0, high - self._position(tp))
        return out

    def model_sizes(self) -> dict[str, int]:
        models = [self.shards[p].model for p in sorted(self.shards)]
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

    # -- policy lifecycle -----------------------------------------------------------------------

    async def _read_active(self) -> ActivePolicy | None:
        """This group's record on control.policy.active (the newest), if any."""
        consumer = AIOKafkaConsumer(
            **connect(self.config.bootstrap_servers),
            client_id=f"{self.config.client_id}-active",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            return await read_active(consumer, self._active_topic, self.config.group_id)
        finally:
            await consumer.stop()

    async def _load_active(self, producer: AIOKafkaProducer) -> None:
        """Resume the policy this group had activated; the initial policy only starts a new group
        (or is activated like any newer version, when it is one)."""
        self._producer = producer
        record = await self._read_active()
        initial = self.config.policy
        if record is not None:
            restored: list[tuple[int, CompiledPolicy]] = []
            for a in record.history:
                try:
                    restored.append((a.from_ts_ms, compile_policy(a.document)))
                except PolicyError as exc:
                    log.warning("an activated policy no longer compiles; skipped", error=str(exc)[:300])
            self._considered = record.considered_offset
            for sa in record.shadow:
                try:
                    doc = sa.document
                    self._shadows.append((sa.from_ts_ms, Shadow.of(compile_policy(doc)) if doc else None))
                except PolicyError as exc:
                    log.warning("a shadow policy no longer compiles; skipped", error=str(exc)[:300])
            if self._shadow_now() is not None:
                s = self._shadows[-1]
                assert s[1] is not None
                log.info(
                    "shadow policy resumed",
                    name=s[1].stamp.name,
                    version=s[1].stamp.version,
                    hash=s[1].stamp.hash,
                    from_tick=s[0] // self.engine.policy.tick_ms,
                )
            self.stats.policies_refused = record.refused
            self.stats.last_refusal = record.last_refusal
            if restored:
                self._activations = restored
                self.engine.set_policy(restored[-1][1])
                log.info(
                    "policy resumed",
                    name=record.name,
                    version=record.version,
                    hash=record.hash,
                    from_tick=record.from_tick_id,
                )
            active = self.engine.policy.stamp
            if initial.stamp.name == active.name and initial.stamp.version > active.version:
                await self._activate(initial, self._considered)
            return
        await self._publish_active()

    def _next_boundary(self, tick_ms: int) -> int:
        """The first tick boundary after now and after every tick already decided."""
        decided = max((ts for s in self.shards.values() for _, ts in s.last_tick.values()), default=0)
        start = max(clock.wall_ms(), decided + 1)
        return -(-start // tick_ms) * tick_ms

    def _shadow_now(self) -> Shadow | None:
        return self._shadows[-1][1] if self._shadows else None

    async def _activate_shadow(self, shadow: Shadow | None, offset: int) -> None:
        """Run ``shadow`` beside the enforcing policy (None: stop) from the next tick boundary."""
        tick_ms = self.engine.policy.tick_ms
        from_ts = self._next_boundary(tick_ms)
        self._shadows = [*self._shadows[-7:], (from_ts, shadow)]
        self._considered = max(self._considered, offset)
        if shadow is None:
            log.info("shadow policy removed", from_tick=from_ts // tick_ms)
        else:
            log.info(
                "shadow policy activated",
                name=shadow.stamp.name,
                version=shadow.stamp.version,
                hash=shadow.stamp.hash,
                from_tick=from_ts // tick_ms,
            )
        await self._publish_active()

    async def _activate(self, policy: CompiledPolicy, offset: int) -> None:
        """Make ``policy`` decide every tick from the next boundary after any decided one."""
        tick_ms = policy.tick_ms
        from_ts = self._next_boundary(tick_ms)
        self._activations = [*self._activations[-7:], (from_ts, policy)]
        self.engine.set_policy(policy)
        self._considered = max(self._considered, offset)
        self.stats.policies_applied += 1
        log.info(
            "policy activated",
            name=policy.stamp.name,
            version=policy.stamp.version,
            hash=policy.stamp.hash,
            from_tick=from_ts // tick_ms,
        )
        await self._publish_active()

    def active_record(self) -> ActivePolicy:
        from_ts, policy = self._activations[-1]
        return ActivePolicy(
            group=self.config.group_id,
            name=policy.stamp.name,
            version=policy.stamp.version,
            hash=policy.stamp.hash,
            from_ts_ms=from_ts,
            from_tick_id=from_ts // policy.tick_ms,
            considered_offset=self._considered,
            refused=self.stats.policies_refused,
            last_refusal=self.stats.last_refusal[:500],
            history=[Activation(from_ts_ms=t, document=p.document) for t, p in self._activations],
            shadow=[
                ShadowActivation(from_ts_ms=t, document=s.policy.document if s is not None else None)
                for t, s in self._shadows
            ],
        )

    async def _publish_active(self) -> None:
        producer = self._producer
        if producer is None:
            return
        value = orjson.dumps(self.active_record().model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        key = self.config.group_id.encode()
        await self._retrying(
            "policy-active", lambda: producer.send_and_wait(self._active_topic, value=value, key=key)
        )

    async def _follow_policies(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        follow = self.config.follow_policy or self.config.policy.stamp.name
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=500)
            records = sorted((r for rs in batch.values() for r in rs), key=lambda r: r.offset)
            if not records:
                continue
            refused = [letter for r in records if (letter := self._consider_policy(r, follow)) is not None]
            if refused and self._publisher is not None:
                await self._dead_letter_policies(self._publisher, refused)
            if self._pending_policy is None and self._pending_shadow is None:
                # Everything up to here is decided (refused or ignored): a restart starts after it.
                self._considered = max(self._considered, records[-1].offset)
                await self._publish_active()
            else:
                self._pending_offset = max(self._pending_offset, records[-1].offset)

    async def _dead_letter_policies(self, publisher: Publisher, letters: list[DeadLetter]) -> None:
        await self._retrying("dead-letter", lambda: publisher.dead_letter(letters, stage="policy"))

    def _refuse(self, record: Any, reason: str) -> DeadLetter:
        self.stats.policies_refused += 1
        self.stats.last_refusal = reason
        log.error("policy refused; the active policy stays in force", reason=reason)
        return dead_letter_of(record, reason)

    def _consider_policy(self, record: Any, follow: str) -> DeadLetter | None:
        """Take a valid newer policy for the next batch; a dead letter (an event, counted once) for
        an invalid one, an older version, or the active version with other content. A shadow
        document (``spec.mode: shadow``) is held to the same rules against the shadow in force."""
        if not record.value and record.key is not None and bytes(record.key).endswith(b"/shadow"):
            if record.key != f"{follow}/shadow".encode():
                return None  # another group's shadow removal, on a shared topic
            current = self._pending_shadow[0] if self._pending_shadow is not None else self._shadow_now()
            if current is not None:
                self._pending_shadow = (None,)
                self._pending_offset = record.offset
                log.info("shadow policy removal accepted", name=follow)
            return None
        try:
            if not record.value:
                raise PolicyError("empty policy record")
            if len(record.value) > self.config.door.max_record_bytes:
                raise PolicyError(
                    f"record-too-large: {len(record.value)} bytes > {self.config.door.max_record_bytes}"
                )
            compiled = compile_policy(
                parse_document(orjson.loads(record.value), f"{record.topic}@{record.offset}")
            )
        except Exception as exc:  # whatever the record holds, the active policy stays in force
            return self._refuse(record, reason_of(exc) if not isinstance(exc, PolicyError) else str(exc))
        active = self._pending_policy or self.engine.policy
        if compiled.stamp.name != follow:
            return None  # another daemon group's policy on a shared topic
        if compiled.document.spec.mode == "shadow":
            return self._consider_shadow(record, compiled, active)
        if compiled.stamp.hash == active.stamp.hash:
            return None  # the active document itself (re-read, or re-published)
        step = self.config.max_policy_version_step
        if compiled.stamp.version > active.stamp.version + step:
            # A forged version 10**15 would lock the operator out of every later real version.
            return self._refuse(
                record,
                f"policy-version-jump: version {compiled.stamp.version} is more than {step} above the "
                f"active version {active.stamp.version}",
            )
        if compiled.stamp.version <= active.stamp.version:
            return self._refuse(
                record,
                f"{compiled.stamp.name} v{compiled.stamp.version} is not newer than the active "
                f"v{active.stamp.version} (hash {active.stamp.hash})",
            )
        self._pending_policy = compiled
        self._pending_offset = record.offset
        log.info(
            "policy accepted",
            name=compiled.stamp.name,
            version=compiled.stamp.version,
            hash=compiled.stamp.hash,
        )
        return None

    def _consider_shadow(
        self, record: Any, compiled: CompiledPolicy, active: CompiledPolicy
    ) -> DeadLetter | None:
        current = self._pending_shadow[0] if self._pending_shadow is not None else self._shadow_now()
        if current is not None and compiled.stamp.hash == current.stamp.hash:
            return None  # the shadow in force itself
        base = current.stamp.version if current is not None else active.stamp.version
        step = self.config.max_policy_version_step
        if compiled.stamp.version > base + step:
            return self._refuse(
                record,
                f"policy-version-jump: shadow version {compiled.stamp.version} is more than {step} "
                f"above version {base}",
            )
        if current is not None and compiled.stamp.version <= current.stamp.version:
            return self._refuse(
                record,
                f"shadow {compiled.stamp.name} v{compiled.stamp.version} is not newer than the shadow "
                f"in force v{current.stamp.version} (hash {current.stamp.hash})",
            )
        try:
            shadow = Shadow.of(compiled)
        except PolicyError as exc:
            return self._refuse(record, str(exc))
        self._pending_shadow = (shadow,)
        self._pending_offset = record.offset
        log.info(
            "shadow policy accepted",
            name=compiled.stamp.name,
            version=compiled.stamp.version,
            hash=compiled.stamp.hash,
        )
        return None


async def read_active(consumer: AIOKafkaConsumer, topic: str, group: str) -> ActivePolicy | None:
    """The newest ActivePolicy for ``group`` on ``topic`` (``consumer`` started, not subscribed)."""
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    end = (await consumer.end_offsets([tp]))[tp]
    latest: bytes | None = None
    key = group.encode()
    while await consumer.position(tp) < end:
        batch = await consumer.getmany(tp, timeout_ms=500)
        for r in batch.get(tp, ()):
            if r.key == key and r.value:
                latest = r.value
        end = max(end, consumer.highwater(tp) or 0)
    if latest is None:
        return None
    try:
        return ActivePolicy.model_validate_json(latest)
    except ValueError:
        log.warning("control.policy.active holds an unreadable record for this group; ignored")
        return None


def _decode_all(blobs: Mapping[int, bytes]) -> dict[int, Shard | checkpoint.CheckpointError]:
    """Checkpoint blobs decoded into shards (run in a thread: no loop state is touched)."""
    out: dict[int, Shard | checkpoint.CheckpointError] = {}
    for p, blob in blobs.items():
        try:
            out[p] = Shard.from_checkpoint(checkpoint.decode(blob))
        except checkpoint.CheckpointError as exc:
            out[p] = exc
    return out
