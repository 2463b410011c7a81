"""``fleetloop bench soak``: a live daemon under steady load for minutes; lag and RSS sampled.

A producer in a child process (so it does not share this process's CPU and GIL with the daemon)
plays ``--pools`` pools of ``--nodes`` nodes: telemetry from every node every second, and request
outcomes at ``--rate`` per second, five calls per agent task over twenty tenants, so the
workflow ledger fills and turns over the way it does in production. The daemon runs in this
process with its ticker (real time) and the production door. Every ``--sample-s`` (10 s) the
bench samples the consumer lag (records on the input partitions not yet read) and RSS.

Bounded means: the lag at the end is at most ``5 s x rate`` records (the daemon keeps up, give or
take a batch) and RSS grew by at most 10% (+20 MiB) over the second half of the run. The exit code
is 0 when both hold. ``--minutes 0.5`` is the short form CI runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
from typing import Any

from fleetloop.bench.live import (
    BrokerInfo,
    broker,
    fresh_prefix,
    outcome_bytes,
    progress,
    rss_mib,
    running_daemon,
    telemetry_bytes,
)
from fleetloop.daemon import clock
from fleetloop.daemon.brokers import delete_topics
from fleetloop.daemon.cli_common import UsageError, bootstrap_arg, quiet_client_logs
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.topics import REQUESTS, TELEMETRY, topic_name


def register(sub: Any) -> None:
    p = sub.add_parser("soak", help="a live daemon under steady load: lag and RSS sampled, both bounded")
    p.add_argument("--minutes", type=float, default=5.0, metavar="N", help="duration (default 5)")
    p.add_argument("--rate", type=int, default=2_000, metavar="N", help="request outcomes per second (2000)")
    p.add_argument("--pools", type=int, default=4, metavar="N", help="pools (default 4)")
    p.add_argument("--nodes", type=int, default=25, metavar="N", help="nodes per pool (default 25)")
    p.add_argument("--sample-s", type=float, default=10.0, metavar="S", help="sampling period (default 10)")
    bootstrap_arg(p, required=False)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    p.set_defaults(handler=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    if not 0.2 <= args.minutes <= 24 * 60:
        raise UsageError("fleetloop bench soak: --minutes must be between 0.2 and 1440")
    if not 1 <= args.rate <= 1_000_000 or not 1 <= args.pools <= 1000 or not 1 <= args.nodes <= 10_000:
        raise UsageError("fleetloop bench soak: --rate 1..1000000, --pools 1..1000, --nodes 1..10000")
    if not 1.0 <= args.sample_s <= 600:
        raise UsageError("fleetloop bench soak: --sample-s must be between 1 and 600")
    from fleetloop.daemon import observability

    observability.configure(level="error")
    quiet_client_logs()
    with broker(args.bootstrap_servers, "soak") as info:
        result = asyncio.run(soak(args, info))
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        _print(result)
    return 0 if result["bounded"]["lag"] and result["bounded"]["rss"] else 1


# -- the producer (child process) ------------------------------------------------------------------


def _produce(bootstrap: str, prefix: str, shape: tuple[int, int, int], seconds: float) -> None:
    """``shape``: (outcomes per second, pools, nodes per pool)."""
    asyncio.run(_produce_async(bootstrap, prefix, shape, seconds))


async def _produce_async(bootstrap: str, prefix: str, shape: tuple[int, int, int], seconds: float) -> None:
    rate, pools, nodes = shape
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20)
    await producer.start()
    tel_topic, req_topic = topic_name(prefix, TELEMETRY), topic_name(prefix, REQUESTS)
    pool_ids = [f"soak-{i}" for i in range(pools)]
    start_s = clock.monotonic_s()
    sent = 0
    next_tel_s = start_s
    task = 0
    try:
        while (now_s := clock.monotonic_s()) - start_s < seconds:
            ts = clock.wall_ms()
            if now_s >= next_tel_s:
                next_tel_s += 1.0
                for p in pool_ids:
                    for j in range(nodes):
                        value = telemetry_bytes(p, f"{p}/{j}", ts, queue_depth=j % 3)
                        await producer.send(tel_topic, value, p.encode())
            due = int((now_s - start_s) * rate) - sent
            for _ in range(max(0, min(due, rate))):
                p = pool_ids[sent % pools]
                step = sent % 5
                if step == 0:
                    task += 1
                value = outcome_bytes(
                    p,
                    f"{p}/{sent % nodes}",
                    ts,
                    f"r{sent}",
                    f"w{task}",
                    tenant=f"t{task % 20}",
                    task_outcome="succeeded" if step == 4 else None,
                )
                await producer.send(req_topic, value, p.encode())
                sent += 1
            await asyncio.sleep(0.05)
        await producer.flush()
    finally:
        await producer.stop()


# -- the daemon and the samples --------------------------------------------------------------------


def _lag(daemon: Daemon) -> int:
    """Records on the daemon's input partitions not yet read."""
    return sum(v for (logical, _), v in daemon.lag().items() if logical in (TELEMETRY, REQUESTS))


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
    progress(
        f"fleetloop bench soak: {args.minutes:g} min at {args.rate:,} outcomes/s + "
        f"{args.pools * args.nodes:,} nodes' telemetry/s on {info.kind}"
    )
    async with running_daemon(config) as running:
        daemon = running.daemon
        ctx = multiprocessing.get_context("spawn")
        child = ctx.Process(
            target=_produce,
            args=(info.bootstrap_servers, prefix, (args.rate, args.pools, args.nodes), seconds),
            daemon=True,
        )
        child.start()
        start_s = clock.monotonic_s()
        last_events = 0
        try:
            while True:
                await asyncio.sleep(args.sample_s)
                elapsed = clock.monotonic_s() - start_s
                s = daemon.stats
                ledgers = [shard.model.ledger for shard in daemon.shards.values()]
                sample = {
                    "t_s": round(elapsed, 1),
                    "lag": _lag(daemon),
                    "rss_mib": round(rss_mib(), 1),
                    "events_in": s.events_in,
                    "events_per_s": round((s.events_in - last_events) / args.sample_s),
                    "ticks_decided": s.ticks_decided,
                    "ticks_failed": s.ticks_failed,
                    "dead_letters": s.dead_letters,
                    "open_workflows": sum(len(x.active) for x in ledgers),
                    "finished_workflows": sum(len(x.finished) for x in ledgers),
                }
                last_events = s.events_in
                samples.append(sample)
                line = (
                    "  {t_s:>6.0f}s  lag {lag:>7,}  RSS {rss_mib:>6.1f} MiB  in {events_per_s:>6,}/s  "
                    "ticks {ticks_decided:,}  open wf {open_workflows:,}  finished wf {finished_workflows:,}"
                )
                progress(line.format(**sample))
                if running.crashed is not None or (not child.is_alive() and elapsed >= seconds):
                    break
        finally:
            child.join(timeout=10)
            if child.is_alive():
                child.terminate()
                child.join(timeout=5)
        crashed = running.crashed
    try:
        await delete_topics(info.bootstrap_servers, prefix)
    except Exception as exc:  # leftover topics are harmless; say so and go on
        progress(f"  could not delete the topics under {prefix}: {type(exc).__name__}")
    half = samples[len(samples) // 2 :] if samples else []
    rss_second_half = (half[-1]["rss_mib"] - half[0]["rss_mib"]) if len(half) >= 2 else 0.0
    rss_limit = 0.10 * (half[0]["rss_mib"] if half else 0.0) + 20.0
    lag_limit = max(1_000, 5 * args.rate)
    last_lag = samples[-1]["lag"] if samples else 0
    return {
        "broker": info.kind,
        "minutes": args.minutes,
        "rate_per_s": args.rate,
        "nodes": args.pools * args.nodes,
        "crashed": f"{type(crashed).__name__}: {crashed}" if crashed is not None else None,
        "samples": samples,
        "max_lag": max((x["lag"] for x in samples), default=0),
        "last_lag": last_lag,
        "rss_mib": {
            "first": samples[0]["rss_mib"] if samples else None,
            "last": samples[-1]["rss_mib"] if samples else None,
            "max": max((x["rss_mib"] for x in samples), default=None),
            "second_half_growth": round(rss_second_half, 1),
        },
        "events_in": samples[-1]["events_in"] if samples else 0,
        "ticks_decided": samples[-1]["ticks_decided"] if samples else 0,
        "ticks_failed": samples[-1]["ticks_failed"] if samples else 0,
        "bounded": {
            "lag": crashed is None and bool(samples) and last_lag <= lag_limit,
            "rss": crashed is None and rss_second_half <= rss_limit,
            "lag_limit": lag_limit,
            "rss_growth_limit_mib": round(rss_limit, 1),
        },
    }


def _print(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"fleetloop bench soak — {r['minutes']:g} min on {r['broker']}")
    for col in ("t (s)", "lag", "RSS MiB", "in /s", "ticks", "open wf", "finished wf"):
        t.add_column(col, justify="right")
    for x in r["samples"]:
        t.add_row(
            f"{x['t_s']:.0f}",
            f"{x['lag']:,}",
            f"{x['rss_mib']:.1f}",
            f"{x['events_per_s']:,}",
            f"{x['ticks_decided']:,}",
            f"{x['open_workflows']:,}",
            f"{x['finished_workflows']:,}",
        )
    out = Console(highlight=False)
    out.print(t)
    b = r["bounded"]
    out.print(
        f"max lag {r['max_lag']:,} records, at the end {r['last_lag']:,} (limit {b['lag_limit']:,}): "
        f"{'bounded' if b['lag'] else 'NOT bounded'}"
    )
    rss = r["rss_mib"]
    out.print(
        f"RSS {rss['first']} -> {rss['last']} MiB (max {rss['max']}), "
        f"second half +{rss['second_half_growth']} MiB "
        f"(limit {b['rss_growth_limit_mib']}): {'bounded' if b['rss'] else 'NOT bounded'}"
    )
    if r["crashed"]:
        out.print(f"the daemon crashed: {r['crashed']}")
