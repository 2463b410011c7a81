"""Running the daemon on the in-memory broker in virtual time (``tests/support/memory_broker.py``,
``tests/support/virtual_time.py``): a fleet that reports, daemons that start and stop, and what
the topics hold. For unit tests of the runtime's logic (ticker, overload, catch-up, restore)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import orjson
from fleetloop.core.decide.engine import Engine
from fleetloop.core.shard import Shard
from fleetloop.daemon.observe.decode import decode_batch
from fleetloop.daemon.replay.replay import ReplayReport, Window, group_ticks, replay_window
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.daemon.runtime.assignment import Assignment
from fleetloop.daemon.runtime.checkpoints import Checkpoints
from fleetloop.daemon.runtime.config import SKIPPED_FROM_HEADER, SKIPPED_HEADER
from fleetloop.daemon.runtime.deadletters import DeadLetters
from fleetloop.daemon.runtime.decider import Decider
from fleetloop.daemon.runtime.follower import PolicyFollower
from fleetloop.daemon.runtime.intake import Intake
from fleetloop.daemon.runtime.link import Link
from fleetloop.daemon.runtime.partition import OwnedPartition, Partitions
from fleetloop.daemon.runtime.port import Offload
from fleetloop.daemon.runtime.summaries import Summaries
from fleetloop.daemon.runtime.telemetry import DaemonStats, LoopTimes, TripTrace
from fleetloop.daemon.runtime.ticker import Pace, Ticker
from fleetloop.daemon.service.health import Health
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import Decision, NodeTelemetry, RequestOutcome, Tick
from fleetloop.schemas.topics import DECISIONS, REQUESTS, TELEMETRY, TICKS, topic_name
from tests.support.memory_broker import Inline, MemoryBroker, MemorySession, Stored
from tests.support.records import outcome, telemetry, to_bytes
from tests.support.virtual_time import FakeClock, run_virtual

T = TypeVar("T")

TICK_MS = 1000  # the built-in policies' tick


def config(**kw: Any) -> DaemonConfig:
    """A daemon's settings for the in-memory broker: the default policy, the interpreter's GC left
    alone (tests share the process), the rest as given."""
    base = DaemonConfig(bootstrap_servers="memory:0", policy=builtin_policy("default"), gc_gen0_threshold=0)
    return replace(base, **kw)


def daemon(broker: MemoryBroker, clock: FakeClock, **kw: Any) -> Daemon:
    return Daemon(config(**kw), broker=broker, clock=clock, offload=Inline())


@contextlib.asynccontextmanager
async def running(d: Daemon) -> AsyncIterator[Daemon]:
    """``d`` running until the block ends (then stopped cleanly); ready when the block starts."""
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        await asyncio.wait_for(d.ready.wait(), 60)
        yield d
    finally:
        stop.set()
        await task


async def crash(d: Daemon, task: asyncio.Task[None]) -> None:
    """Stop a running daemon the way a kill does: nothing more is written (no last checkpoint, no
    commit); its group membership ends as its session times out."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def fleet(
    broker: MemoryBroker,
    clock: FakeClock,
    pools: Sequence[str],
    until_ms: int,
    *,
    nodes: int = 3,
    every_ms: int = 250,
    failing: str | None = None,
) -> None:
    """Every ``every_ms`` until the wall clock reads ``until_ms``: each node of each pool reports
    its telemetry and one request outcome (``failing``: that node's calls fail)."""
    n = 0
    while (now := clock.wall_ms()) < until_ms:
        for pool in pools:
            for i in range(nodes):
                node = f"{pool}/{i}"
                key = pool.encode()
                broker.append(topic_name(broker.prefix, TELEMETRY), to_bytes(telemetry(node, pool, now)), key)
                kind = "error" if node == failing else "ok"
                call = outcome(node, kind, pool, now, n=n)
                broker.append(topic_name(broker.prefix, REQUESTS), to_bytes(call), key)
                n += 1
        await asyncio.sleep(every_ms / 1000.0)


def ticks(broker: MemoryBroker, pool: str | None = None) -> list[tuple[Tick, dict[str, bytes]]]:
    """The tick records on control.ticks (of ``pool``), in offset order, with their headers."""
    out = []
    for r in broker.records(TICKS):
        tick = Tick.model_validate_json(r.value or b"")
        if pool is None or tick.pool_id == pool:
            out.append((tick, dict(r.headers)))
    return out


def skipped(headers: dict[str, bytes]) -> tuple[str, int] | None:
    """A skipped tick record's (reason, first skipped tick id); None for a tick to decide."""
    if SKIPPED_HEADER not in headers:
        return None
    return headers[SKIPPED_HEADER].decode(), int(headers[SKIPPED_FROM_HEADER])


def decisions(broker: MemoryBroker) -> list[Decision]:
    return [Decision.model_validate_json(r.value or b"") for r in broker.records(DECISIONS)]


def decided_ticks(broker: MemoryBroker, pool: str) -> list[int]:
    """The tick ids whose decisions for ``pool`` are on control.decisions, each once, in order."""
    seen: list[int] = []
    for d in decisions(broker):
        if getattr(d.body, "pool_id", None) == pool and (not seen or seen[-1] != d.tick_id):
            seen.append(d.tick_id)
    return seen


def decision_bytes_by_tick(broker: MemoryBroker) -> dict[tuple[int, str], list[bytes]]:
    """Each decision's bytes on control.decisions by (tick id, pool), in offset order."""
    out: dict[tuple[int, str], list[bytes]] = {}
    for r in broker.records(DECISIONS):
        d = orjson.loads(r.value or b"")
        out.setdefault((d["tick_id"], d["body"].get("pool_id", "")), []).append(r.value or b"")
    return out


def topic(broker: MemoryBroker, logical: str) -> list[Stored]:
    return broker.records(logical)


def replay(broker: MemoryBroker, d: Daemon) -> ReplayReport:
    """Replay what the topics hold (every recorded tick decided again from the recorded inputs, as
    ``fleetloop replay`` does) against the decisions on control.decisions; a decision published
    twice (decided again after a crash, the same bytes) counts once."""
    seen: set[bytes] = set()
    log: list[Decision] = []
    for r in broker.records(DECISIONS):
        if r.value and r.value not in seen:
            seen.add(r.value)
            log.append(Decision.model_validate_json(r.value))
    inputs: dict[str, list[tuple[int, NodeTelemetry | RequestOutcome | None]]] = {}
    models: dict[str, type[NodeTelemetry] | type[RequestOutcome]] = {
        TELEMETRY: NodeTelemetry,
        REQUESTS: RequestOutcome,
    }
    for logical, model in models.items():
        for p in range(broker.partitions):
            records = broker.records(logical, p)
            decoded = decode_batch(model, records, d.config.door)
            good = dict(zip(decoded.offsets, decoded.items, strict=True))
            inputs[f"{logical}:{p}"] = [(r.offset, good.get(r.offset)) for r in records]
    policy = d.config.policy
    report, _ = replay_window(group_ticks(log), inputs, {policy.stamp.hash: policy}, Window())
    return report


# -- the runtime's parts, wired as the daemon wires them, for a test of one part ---------------------


@dataclass
class Rig:
    """The shared pieces the daemon hands its parts (settings, clock, owned partitions, broker
    link, stats, health), on a memory broker's session, and the parts built on them."""

    config: DaemonConfig
    clock: FakeClock
    broker: MemoryBroker
    session: MemorySession
    parts: Partitions
    link: Link
    stats: DaemonStats
    health: Health
    engine: Engine
    pace: Pace
    loop_times: LoopTimes
    trace: TripTrace

    def own(self, index: int, shard: Shard | None = None, *, publish_from: int = 0) -> OwnedPartition:
        """Own partition ``index`` (every pool-keyed topic's) with ``shard``."""
        shard = shard if shard is not None else Shard(index)
        owned = OwnedPartition(index, shard, publish_from=publish_from, ticks_read=shard.ticks_at)
        self.parts.add(owned)
        self.parts.assigned |= {self.parts.tp(k, index) for k in (TELEMETRY, REQUESTS, TICKS)}
        return owned

    def ticker(self) -> Ticker:
        return Ticker(
            self.config,
            self.clock,
            self.parts,
            self.link,
            engine=self.engine,
            pace=self.pace,
            stats=self.stats,
            health=self.health,
            loop_times=self.loop_times,
            trace=self.trace,
        )

    def dead_letters(self) -> DeadLetters:
        return DeadLetters(self.config.prefix, self.parts, self.link, stats=self.stats)

    def checkpoints(
        self, dead_letters: DeadLetters | None = None, offload: Offload | None = None
    ) -> Checkpoints:
        return Checkpoints(
            self.config,
            self.clock,
            self.parts,
            self.link,
            dead_letters=dead_letters or self.dead_letters(),
            offload=offload or Inline(),
            stats=self.stats,
        )

    def intake(self, dead_letters: DeadLetters | None = None) -> Intake:
        return Intake(
            self.config,
            self.clock,
            self.parts,
            self.link,
            dead_letters=dead_letters or self.dead_letters(),
            stats=self.stats,
        )

    def assignment(self) -> Assignment:
        dead_letters = self.dead_letters()
        return Assignment(
            self.config,
            self.clock,
            self.parts,
            self.link,
            checkpoints=self.checkpoints(dead_letters),
            dead_letters=dead_letters,
            intake=self.intake(dead_letters),
            stats=self.stats,
        )

    def summaries(self) -> Summaries:
        return Summaries(self.config, self.parts, self.link, engine=self.engine, stats=self.stats)

    def decider(self, follower: PolicyFollower | None = None) -> Decider:
        return Decider(
            self.config,
            self.clock,
            self.parts,
            self.link,
            follower=follower or self.follower(),
            summaries=self.summaries(),
            pace=self.pace,
            trace=self.trace,
            stats=self.stats,
        )

    def follower(self) -> PolicyFollower:
        """A policy follower whose engine is a new one (a restart's)."""
        return PolicyFollower(
            self.config,
            self.clock,
            self.parts,
            self.link,
            engine=Engine(self.config.policy),
            dead_letters=self.dead_letters(),
            stats=self.stats,
        )


def on_rig(
    check: Callable[[Rig], Awaitable[T]],
    *,
    consumer: Any = None,
    publisher: Any = None,
    wall_ms: int = 1_800_000_000_000,
    **kw: Any,
) -> T:
    """``check(rig)`` in virtual time from ``wall_ms``, on a rig whose group consumer or publisher
    are replaced by the given stand-ins (when given), with the settings ``kw``."""

    async def run(clock: FakeClock) -> T:
        async with rig(clock, **kw) as r:
            if consumer is not None:
                r.link.session = replace(r.session, consumer=consumer)
            if publisher is not None:
                r.link.session = replace(r.link.session or r.session, publisher=publisher)
            return await check(r)

    return run_virtual(run, wall_ms=wall_ms)


@contextlib.asynccontextmanager
async def rig(clock: FakeClock, broker: MemoryBroker | None = None, **kw: Any) -> AsyncIterator[Rig]:
    """A :class:`Rig` on ``broker`` (default: a new one with one partition per topic, so what is
    sent lands on one log in send order) with the settings ``kw``."""
    broker = broker or MemoryBroker(clock, partitions=1)
    cfg = config(**kw)
    health = Health(policy_loaded=True)
    async with broker.session() as session:
        link = Link(broker, health, "memory")
        link.session = session
        yield Rig(
            cfg,
            clock,
            broker,
            session,
            Partitions(cfg.prefix),
            link,
            DaemonStats(),
            health,
            Engine(cfg.policy),
            Pace(),
            LoopTimes(clock=clock),
            TripTrace(clock=clock),
        )
