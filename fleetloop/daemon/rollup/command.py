"""``fleetloop rollup``: the fleet-wide second stage as a process of its own.

``fleetloop rollup --bootstrap-servers HOST:PORT [--group-id G] [--hold-s S] [--live-s S]``

Reads ``control.summaries`` (one record per daemon shard per tick boundary it decided, published
by ``fleetloop run``), folds them with :class:`fleetloop.core.rollup.FleetRollup`, and
publishes the fleet figures of each boundary to ``control.state`` under the key ``fleet/fleet``
(a :class:`~fleetloop.schemas.decisions.FleetDecision`; routers ignore it, dashboards and operators
read it). A boundary is published as soon as every live shard reported it (``complete``), or
``--hold-s`` after its first summary arrived with whatever the others last said (``partial``).
On start it reads the summaries topic from its beginning without publishing, then publishes the
newest boundary and follows. Not published to ``control.decisions``: replay compares the daemon's
decisions, and fleet figures are a function of them, not a decision of a policy.

Why its own process and not faust-streaming: the fold is a few dict updates per summary (a 10,000
node fleet has 4-64 shards per second); the cost that matters is the latency it adds after the
shards decide, which is one poll of one partition here (measured in tests/integration/test_rollup.py
and by ``fleetloop bench rollup``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from fleetloop import clock
from fleetloop.core.rollup import Figures, FleetRollup
from fleetloop.daemon.cli_common import UsageError, connection_from, log_args, quiet_client_logs
from fleetloop.daemon.observability import configure, logger
from fleetloop.kafka_security import Bootstrap, bootstrap_arg, connect, error_text, shown
from fleetloop.schemas.decisions import Decision, PolicyStamp
from fleetloop.schemas.summary import ShardSummary
from fleetloop.schemas.topics import STATE, SUMMARIES, topic_name
from fleetloop.topic_layout import TopicLayoutError, require_topics

log = logger("fleetloop.rollup")

STAMP = PolicyStamp(
    name="fleet-rollup",
    version=1,
    hash=hashlib.sha256(b"fleetloop rollup v1").hexdigest()[:16],
    mode="enforce",
)
FLEET_KEY = b"fleet/fleet"


@dataclass(slots=True)
class RollupStats:
    summaries: int = 0
    malformed: int = 0
    published: int = 0
    partial: int = 0
    stage_latency_ms: list[float] = field(default_factory=list)  # newest part's arrival -> published


def register(sub: Any) -> None:
    p = sub.add_parser(
        "rollup",
        help="fleet-wide figures from every shard's summary (the second stage), to control.state",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    bootstrap_arg(p, required=True)
    p.add_argument(
        "--group-id", default="fleetloop", help="the daemons' consumer group to fold (default fleetloop)"
    )
    p.add_argument(
        "--hold-s",
        type=float,
        default=2.0,
        metavar="S",
        help="publish a boundary S seconds after its first summary even if a shard is behind (default 2)",
    )
    p.add_argument(
        "--live-s",
        type=float,
        default=30.0,
        metavar="S",
        help="a shard silent this long (event time) no longer holds boundaries back (default 30)",
    )
    log_args(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if not 0.0 <= args.hold_s <= 600.0:
        raise UsageError("fleetloop rollup: --hold-s must be within 0..600")
    if not 1.0 <= args.live_s <= 86_400.0:
        raise UsageError("fleetloop rollup: --live-s must be within 1..86400")
    configure(level=args.log_level, fmt=args.log_format)
    quiet_client_logs()  # connection trouble is reported here, in one line
    bootstrap = connection_from(args)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await run_rollup(
            bootstrap, args.topic_prefix, args.group_id, stop, hold_s=args.hold_s, live_s=args.live_s
        )

    try:
        asyncio.run(main())
    except (KafkaError, OSError) as exc:
        raise UsageError(f"fleetloop rollup: cannot reach {shown(bootstrap)}: {error_text(exc)}") from None
    return 0


def decision_of(fig: Figures, offset: int) -> Decision:
    return Decision(
        ts_ms=fig.ts_ms,
        tick_id=fig.tick_id,
        policy=STAMP,
        input_offsets={f"{SUMMARIES}:0": offset},
        body=fig.body,
    )


async def run_rollup(
    bootstrap: Bootstrap,
    prefix: str,
    group: str,
    stop: asyncio.Event,
    *,
    hold_s: float = 2.0,
    live_s: float = 30.0,
    on_published: Callable[[Decision], None] | None = None,
) -> RollupStats:
    """Fold ``control.summaries`` and publish fleet figures until ``stop`` is set."""
    stats = RollupStats()
    rollup = FleetRollup(group, live_ms=round(live_s * 1000))
    tp = TopicPartition(topic_name(prefix, SUMMARIES), 0)
    state_topic = topic_name(prefix, STATE)
    consumer = AIOKafkaConsumer(**connect(bootstrap), client_id="fleetloop-rollup", enable_auto_commit=False)
    producer = AIOKafkaProducer(**connect(bootstrap), client_id="fleetloop-rollup", acks="all", linger_ms=0)
    await consumer.start()
    try:
        await producer.start()
    except BaseException:
        await consumer.stop()
        raise
    first_seen: dict[int, float] = {}  # boundary -> monotonic time its first summary arrived
    arrived: dict[int, float] = {}  # boundary -> monotonic time its newest summary arrived
    next_offset = 0
    try:
        try:  # created by nobody here: the producer's first send would auto-create control.state
            await require_topics(bootstrap, prefix, [SUMMARIES, STATE])
        except TopicLayoutError as exc:
            raise UsageError(f"fleetloop rollup: {exc}") from None
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        caught_up = end == 0
        while not stop.is_set():
            try:
                batch = await consumer.getmany(tp, timeout_ms=100, max_records=5000)
            except KafkaError as exc:  # the broker went away: one line per kind, then try again
                log.warning("broker error; retrying", error=f"{type(exc).__name__}: {exc}"[:300])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
                continue
            now = clock.monotonic_s()
            for r in batch.get(tp, []):
                next_offset = r.offset + 1
                try:
                    s = ShardSummary.model_validate_json(r.value or b"")
                except ValidationError:
                    stats.malformed += 1
                    continue
                stats.summaries += 1
                if rollup.add(s):
                    first_seen.setdefault(s.ts_ms, now)
                    arrived[s.ts_ms] = now
            if not caught_up:
                if next_offset < end:
                    continue
                caught_up = True  # history folded: publish only from the newest boundary on
                done = rollup.complete()
                if len(done) > 1:
                    rollup.published_ms = done[-2]
                first_seen = {t: now for t in first_seen if t > rollup.published_ms}
            due = rollup.complete()
            pending = rollup.pending()
            due += [t for t in pending if t not in due and now - first_seen.get(t, now) >= hold_s]
            for t in sorted(set(due)):
                if t <= rollup.published_ms:
                    continue
                fig = rollup.figures(t)
                d = decision_of(fig, next_offset)
                await (
                    await producer.send(
                        state_topic, key=FLEET_KEY, value=orjson.dumps(d.model_dump(mode="json"))
                    )
                )
                stats.published += 1
                stats.partial += fig.body.reason != "complete"
                stats.stage_latency_ms.append(1000.0 * (clock.monotonic_s() - arrived.get(t, now)))
                if on_published is not None:
                    on_published(d)
            for t in [t for t in first_seen if t <= rollup.published_ms]:
                del first_seen[t]
                arrived.pop(t, None)
    finally:
        await consumer.stop()
        await producer.stop()
    return stats
