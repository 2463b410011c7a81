"""``fleetloop bench soak``: a live daemon overloaded for minutes; lag and RSS sampled, both bounded.

A producer in a child process (so it does not share this process's CPU and GIL with the daemon)
plays ``--pools`` pools of ``--nodes`` nodes: telemetry from every node every second, and request
outcomes, five calls per agent task over twenty tenants, so the workflow ledger fills and turns
over the way it does in production. The daemon runs in this process with its ticker (real time)
and the production door.

Three phases, on the same daemon:

1. **capacity** (``--calibrate-s``, 20 s): the producer sends as fast as it can; the daemon's
   sustainable ingest rate is what it consumes per second while records are waiting for it (lag
   above zero at both ends of a sample). If the daemon keeps up with everything the producer can
   send, the rate is producer-bound and the result says so.
2. **overload** (``--minutes``): outcomes at twice that rate (or ``--rate`` when given), sampled
   every ``--sample-s`` (10 s): lag (records on the input partitions not yet read), RSS, records
   in per second, ticks decided, how old the newest decision is.
3. **drain**: the producer stops; how long the daemon takes to read the backlog.

At twice its capacity the backlog grows for as long as the overload lasts; Kafka holds it, not
the daemon. Bounded means: RSS grew by at most 10% (+20 MiB) over the second half of the overload
(the backlog is not in memory), ticks were decided in every sample (no starvation), none failed,
and the lag drained to at most 1,000 records within the drain allowance (``max(60 s, 1.5 x the
overload's length)``). The exit code is 0 when all hold. ``--minutes 0.5
--calibrate-s 10`` is the short form CI runs on both brokers.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner
from rich.table import Table

from fleetloop import clock, term
from fleetloop.bench.live import (
    BrokerInfo,
    drop_topics,
    fresh_prefix,
    outcome_bytes,
    progress,
    rss_mib,
    run_live,
    running_daemon,
    telemetry_bytes,
)
from fleetloop.daemon.cli_common import UsageError
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.kafka_security import bootstrap_arg
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.topics import REQUESTS, TELEMETRY, topic_name


def register(sub: Any) -> None:
    p = sub.add_parser("soak", help="a live daemon under steady load: lag and RSS sampled, both bounded")
    p.add_argument("--minutes", type=float, default=5.0, metavar="N", help="duration (default 5)")
    p.add_argument(
        "--rate",
        type=int,
        default=None,
        metavar="N",
        help="request outcomes per second (default: twice the capacity measured first)",
    )
    p.add_argument(
        "--calibrate-s", type=float, default=20.0, metavar="S", help="capacity phase, seconds (default 20)"
    )
    p.add_argument("--pools", type=int, default=4, metavar="N", help="pools (default 4)")
    p.add_argument("--nodes", type=int, default=25, metavar="N", help="nodes per pool (default 25)")
    p.add_argument("--sample-s", type=float, default=10.0, metavar="S", help="sampling period (default 10)")
    bootstrap_arg(p, required=False)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    p.set_defaults(handler=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    if not 0.2 <= args.minutes <= 24 * 60:
        raise UsageError("fleetloop bench soak: --minutes must be between 0.2 and 1440")
    rate_ok = args.rate is None or 1 <= args.rate <= 1_000_000
    if not rate_ok or not 1 <= args.pools <= 1000 or not 1 <= args.nodes <= 10_000:
        raise UsageError("fleetloop bench soak: --rate 1..1000000, --pools 1..1000, --nodes 1..10000")
    if not 5.0 <= args.calibrate_s <= 600:
        raise UsageError("fleetloop bench soak: --calibrate-s must be between 5 and 600")
    if not 1.0 <= args.sample_s <= 600:
        raise UsageError("fleetloop bench soak: --sample-s must be between 1 and 600")
    result = run_live(args, "soak", soak, _print)
    return 0 if all(v for k, v in result["bounded"].items() if isinstance(v, bool)) else 1


# -- the producer (child process) ------------------------------------------------------------------


def _produce(bootstrap: str, prefix: str, shape: tuple[int, int, int], seconds: float, tag: str) -> None:
    """``shape``: (outcomes per second, pools, nodes per pool); ``tag`` keeps ids of runs apart."""
    asyncio.run(_produce_async(bootstrap, prefix, shape, seconds, tag))


class _Batches:
    """One round's records, in a batch per topic-partition (full ones go out as they fill)."""

    def __init__(self, producer: Any, parts: dict[str, dict[str, int]]) -> None:
        self.producer = producer
        self.parts = parts
        self.batches: dict[tuple[str, int], Any] = {}
        self.sent: list[Any] = []

    async def add(self, topic: str, pool: str, value: bytes) -> None:
        key = (topic, self.parts[topic][pool])
        batch = self.batches.get(key)
        if batch is None:
            batch = self.batches[key] = self.producer.create_batch()
        if batch.append(key=pool.encode(), value=value, timestamp=None) is None:
            self.sent.append(await self.producer.send_batch(batch, topic, partition=key[1]))
            batch = self.batches[key] = self.producer.create_batch()
            batch.append(key=pool.encode(), value=value, timestamp=None)

    async def flush(self) -> list[Any]:
        for (topic, partition), batch in self.batches.items():
            if batch.record_count():
                self.sent.append(await self.producer.send_batch(batch, topic, partition=partition))
        self.batches = {}
        return self.sent


async def _produce_async(
    bootstrap: str, prefix: str, shape: tuple[int, int, int], seconds: float, tag: str
) -> None:
    """Records built into per-partition batches (``create_batch``/``send_batch``): several times
    faster than one ``send`` per record, so one process can offer twice what the daemon reads."""
    rate, pools, nodes = shape

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20)
    await producer.start()
    tel_topic, req_topic = topic_name(prefix, TELEMETRY), topic_name(prefix, REQUESTS)
    pool_ids = [f"soak-{i}" for i in range(pools)]
    partitioner = DefaultPartitioner()
    parts = {}
    for topic in (tel_topic, req_topic):
        ids = sorted(await producer.partitions_for(topic))
        parts[topic] = {p: partitioner(p.encode(), ids, ids) for p in pool_ids}
    start_s = clock.monotonic_s()
    sent = 0
    next_tel_s = start_s
    task = 0
    inflight: list[Any] = []
    per_round = max(1, min(rate, 200_000) // 10)  # the time check runs at least every ~100 ms of work
    try:
        while (now_s := clock.monotonic_s()) - start_s < seconds:
            ts = clock.wall_ms()
            out = _Batches(producer, parts)
            if now_s >= next_tel_s:
                next_tel_s += 1.0
                for p in pool_ids:
                    for j in range(nodes):
                        await out.add(tel_topic, p, telemetry_bytes(p, f"{p}/{j}", ts, queue_depth=j % 3))
            due = int((now_s - start_s) * rate) - sent
            for _ in range(max(0, min(due, per_round))):
                p = pool_ids[sent % pools]
                step = sent % 5
                if step == 0:
                    task += 1
                value = outcome_bytes(
                    p,
                    f"{p}/{sent % nodes}",
                    ts,
                    f"r{tag}{sent}",
                    f"w{tag}{task}",
                    tenant=f"t{task % 20}",
                    task_outcome="succeeded" if step == 4 else None,
                )
                await out.add(req_topic, p, value)
                sent += 1
            pending = await out.flush()
            # Acknowledged before the round after next: bounded memory in the producer, too.
            if inflight:
                await asyncio.gather(*inflight)
            inflight = pending
            if due <= per_round:
                await asyncio.sleep(0.05)
        if inflight:
            await asyncio.gather(*inflight)
    finally:
        await producer.stop()


# -- the daemon and the samples --------------------------------------------------------------------


def _lag(daemon: Daemon) -> int:
    """Records on the daemon's input partitions not yet read."""
    return sum(v for (logical, _), v in daemon.lag().items() if logical in (TELEMETRY, REQUESTS))


MAX_RATE = 1_000_000  # "as fast as it can": the producer's own speed is the limit


def _start_producer(
    info: BrokerInfo, prefix: str, shape: tuple[int, int, int], seconds: float, tag: str
) -> Any:
    child = multiprocessing.get_context("spawn").Process(
        target=_produce, args=(info.bootstrap_servers, prefix, shape, seconds, tag), daemon=True
    )
    child.start()
    return child


def _stop_producer(child: Any) -> None:
    child.join(timeout=10)
    if child.is_alive():
        child.terminate()
        child.join(timeout=5)


def _sample(daemon: Daemon, elapsed: float, last_events: int, period_s: float) -> dict[str, Any]:
    s = daemon.stats
    ledgers = [shard.model.ledger for shard in daemon.shards.values()]
    newest = s.last_decision_ts_ms
    return {
        "t_s": round(elapsed, 1),
        "lag": _lag(daemon),
        "rss_mib": round(rss_mib(), 1),
        "events_in": s.events_in,
        "events_per_s": round((s.events_in - last_events) / period_s),
        "ticks_decided": s.ticks_decided,
        "ticks_failed": s.ticks_failed,
        "decision_age_s": round((clock.wall_ms() - newest) / 1000.0, 1) if newest else None,
        "dead_letters": s.dead_letters,
        "open_workflows": sum(len(x.active) for x in ledgers),
        "finished_workflows": sum(len(x.finished) for x in ledgers),
    }


async def _capacity(running: Any, info: BrokerInfo, prefix: str, args: argparse.Namespace) -> dict[str, Any]:
    """Records per second the daemon consumes while a backlog waits for it."""
    daemon = running.daemon
    period = min(2.0, args.calibrate_s / 5)
    child = _start_producer(info, prefix, (MAX_RATE, args.pools, args.nodes), args.calibrate_s, "c")
    rates: list[float] = []
    offered = 0
    start_s = clock.monotonic_s()
    try:
        last_events, last_lag = daemon.stats.events_in, _lag(daemon)
        while child.is_alive() and running.crashed is None:
            await asyncio.sleep(period)
            events, lag = daemon.stats.events_in, _lag(daemon)
            rate = (events - last_events) / period
            offered = max(offered, events + lag)
            if last_lag > 0 and lag > 0:
                rates.append(rate)
            progress(f"  capacity: {clock.monotonic_s() - start_s:>5.0f}s  in {rate:>8,.0f}/s  lag {lag:>9,}")
            last_events, last_lag = events, lag
    finally:
        _stop_producer(child)
    elapsed = max(clock.monotonic_s() - start_s, 1e-9)
    drain_s = await _drain(running, timeout_s=max(60.0, 3 * args.calibrate_s))
    if rates:
        rates.sort()
        return {"events_per_s": round(rates[len(rates) // 2]), "bound": "daemon", "drain_s": drain_s}
    # Never behind: the daemon read everything the producer managed to send.
    return {"events_per_s": round(offered / elapsed), "bound": "producer", "drain_s": drain_s}


async def _drain(running: Any, timeout_s: float, limit: int = 1_000) -> float | None:
    """Seconds until the lag is at most ``limit`` (None: not within ``timeout_s``)."""
    start_s = clock.monotonic_s()
    while clock.monotonic_s() - start_s < timeout_s and running.crashed is None:
        if _lag(running.daemon) <= limit:
            return round(clock.monotonic_s() - start_s, 1)
        await asyncio.sleep(0.5)
    return None


async def soak(args: argparse.Namespace, info: BrokerInfo) -> dict[str, Any]:
    prefix, idempotent = await fresh_prefix(info, "soak")
    seconds = args.minutes * 60.0
    config = DaemonConfig(
        bootstrap_servers=info.bootstrap_servers,
        policy=builtin_policy("default"),
        prefix=prefix,
        group_id=f"{prefix}-fleetloop",
        idempotence=idempotent,
    )
    samples: list[dict[str, Any]] = []
    telemetry_per_s = args.pools * args.nodes
    async with running_daemon(config) as running:
        daemon = running.daemon
        capacity: dict[str, Any] | None = None
        rate = args.rate
        if rate is None:
            progress(
                f"fleetloop bench soak: measuring the daemon's ingest capacity ({args.calibrate_s:g} s) "
                f"on {info.kind}"
            )
            capacity = await _capacity(running, info, prefix, args)
            rate = max(1, 2 * capacity["events_per_s"] - telemetry_per_s)
        progress(
            f"fleetloop bench soak: {args.minutes:g} min at {rate:,} outcomes/s + "
            f"{telemetry_per_s:,} nodes' telemetry/s on {info.kind}"
        )
        child = _start_producer(info, prefix, (rate, args.pools, args.nodes), seconds, "s")
        start_s = clock.monotonic_s()
        last_events = daemon.stats.events_in
        try:
            while True:
                await asyncio.sleep(args.sample_s)
                elapsed = clock.monotonic_s() - start_s
                sample = _sample(daemon, elapsed, last_events, args.sample_s)
                last_events = sample["events_in"]
                samples.append(sample)
                line = (
                    "  {t_s:>6.0f}s  lag {lag:>9,}  RSS {rss_mib:>6.1f} MiB  in {events_per_s:>7,}/s  "
                    "ticks {ticks_decided:,}  newest decision {decision_age_s}s old  "
                    "open wf {open_workflows:,}"
                )
                progress(line.format(**sample))
                if running.crashed is not None or (not child.is_alive() and elapsed >= seconds):
                    break
        finally:
            _stop_producer(child)
        drain_allowance = max(60.0, 1.5 * seconds)
        progress(f"fleetloop bench soak: draining the backlog (at most {drain_allowance:.0f} s)")
        lag_limit = 1_000
        drain_s = await _drain(running, drain_allowance, lag_limit)
        final_lag = _lag(daemon)
        crashed = running.crashed
    await drop_topics(info, prefix)
    half = samples[len(samples) // 2 :] if samples else []
    rss_second_half = (half[-1]["rss_mib"] - half[0]["rss_mib"]) if len(half) >= 2 else 0.0
    rss_limit = 0.10 * (half[0]["rss_mib"] if half else 0.0) + 20.0
    decided = [x["ticks_decided"] for x in samples]
    starved = sum(1 for a, b in zip([0, *decided], decided, strict=False) if b <= a)
    return {
        "broker": info.kind,
        "minutes": args.minutes,
        "capacity": capacity,
        "rate_per_s": rate,
        "offered_events_per_s": rate + telemetry_per_s,
        "nodes": telemetry_per_s,
        "crashed": f"{type(crashed).__name__}: {crashed}" if crashed is not None else None,
        "samples": samples,
        "max_lag": max((x["lag"] for x in samples), default=0),
        "last_lag": samples[-1]["lag"] if samples else 0,
        "drain_s": drain_s,
        "final_lag": final_lag,
        "rss_mib": {
            "first": samples[0]["rss_mib"] if samples else None,
            "last": samples[-1]["rss_mib"] if samples else None,
            "max": max((x["rss_mib"] for x in samples), default=None),
            "second_half_growth": round(rss_second_half, 1),
        },
        "events_in": samples[-1]["events_in"] if samples else 0,
        "ticks_decided": samples[-1]["ticks_decided"] if samples else 0,
        "ticks_failed": samples[-1]["ticks_failed"] if samples else 0,
        "samples_without_a_decided_tick": starved,
        "bounded": {
            "lag": crashed is None and bool(samples) and drain_s is not None,
            "rss": crashed is None and rss_second_half <= rss_limit,
            "ticks": crashed is None and starved == 0 and bool(samples) and samples[-1]["ticks_failed"] == 0,
            "lag_limit": lag_limit,
            "drain_allowance_s": drain_allowance,
            "rss_growth_limit_mib": round(rss_limit, 1),
        },
    }


def _print(r: dict[str, Any]) -> None:
    t = Table(title=f"fleetloop bench soak — {r['minutes']:g} min on {r['broker']}")
    for col in ("t (s)", "lag", "RSS MiB", "in /s", "ticks", "decision age s", "open wf", "finished wf"):
        t.add_column(col, justify="right")
    for x in r["samples"]:
        t.add_row(
            f"{x['t_s']:.0f}",
            f"{x['lag']:,}",
            f"{x['rss_mib']:.1f}",
            f"{x['events_per_s']:,}",
            f"{x['ticks_decided']:,}",
            str(x["decision_age_s"]),
            f"{x['open_workflows']:,}",
            f"{x['finished_workflows']:,}",
        )
    out = term.console()
    out.print(t)
    b = r["bounded"]
    cap = r["capacity"]
    if cap is not None:
        out.print(
            f"capacity {cap['events_per_s']:,} records/s ({cap['bound']}-bound); overload offered "
            f"{r['offered_events_per_s']:,}/s"
        )
    out.print(
        f"max lag {r['max_lag']:,} records; drained to {r['final_lag']:,} in {r['drain_s']} s "
        f"(limit {b['lag_limit']:,} within {b['drain_allowance_s']:.0f} s): "
        f"{'bounded' if b['lag'] else 'NOT bounded'}"
    )
    out.print(
        f"ticks decided {r['ticks_decided']:,}, failed {r['ticks_failed']}, samples without a decided "
        f"tick {r['samples_without_a_decided_tick']}: {'ok' if b['ticks'] else 'NOT ok'}"
    )
    rss = r["rss_mib"]
    out.print(
        f"RSS {rss['first']} -> {rss['last']} MiB (max {rss['max']}), "
        f"second half +{rss['second_half_growth']} MiB "
        f"(limit {b['rss_growth_limit_mib']}): {'bounded' if b['rss'] else 'NOT bounded'}"
    )
    if r["crashed"]:
        out.print(f"the daemon crashed: {r['crashed']}")
