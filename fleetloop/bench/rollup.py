"""``fleetloop bench rollup``: the fleet-wide second stage's latency, from the last shard summary of
a tick boundary to its fleet figure on ``control.state``.

``fleetloop bench rollup [--shards 8] [--boundaries 60] [--interval-ms 200] [--broker tansu|kafka]
[--json]``

It starts a broker and the second stage as ``fleetloop rollup`` runs it (:func:`run_rollup`, in this
process), then plays ``--shards`` daemon shards: for each of ``--boundaries`` tick boundaries, one
:class:`ShardSummary` per shard on ``control.summaries``, every ``--interval-ms``. The latency of a
boundary is the moment its fleet figure was acknowledged on ``control.state`` minus the moment the
last of its shard summaries was acknowledged: the time the stage adds between the daemons' last
word on a tick and the fleet-wide figure (broker delivery both ways included). Reported: p50, p99
and max over the boundaries, how many were published complete, and the stage's CPU seconds.

A faust-streaming version of this stage was not built: ``fleetloop bench ingest`` measures faust's
own per-event cost at ~130-150 µs, and this stage folds a handful of summaries per second, so what
it would change is the delivery latency measured here, not the throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import uuid
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from fleetloop import clock
from fleetloop.bench.common import bench_broker, pct, progress, within
from fleetloop.daemon.brokers import ensure_topics
from fleetloop.daemon.rollup.command import run_rollup
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.summary import ShardSummary
from fleetloop.schemas.topics import SUMMARIES, topic_name

GROUP = "bench-rollup"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rollup",
        help="the fleet-wide second stage's latency: last shard summary -> fleet figure on control.state",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--shards", type=int, default=8, help="daemon shards (partitions) summarized (default 8)")
    p.add_argument("--boundaries", type=int, default=60, help="tick boundaries played (default 60)")
    p.add_argument("--interval-ms", type=int, default=200, help="between boundaries (default 200)")
    p.add_argument("--broker", choices=("tansu", "kafka"), default="tansu", help="default: tansu")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=handle)


def summary(partition: int, ts_ms: int, k: int) -> ShardSummary:
    """Shard ``partition``'s summary at boundary ``ts_ms`` (the ``k``-th), plausible figures."""
    return ShardSummary(
        ts_ms=ts_ms,
        tick_id=ts_ms // 1000,
        group=GROUP,
        partition=partition,
        window_ms=10_000,
        pools=4,
        nodes=160,
        cost_rate_usd_per_h=160 * 4.0,
        requests_w=3_000,
        retries_w=30,
        shed_w=5,
        retries_allowed=300,
        tasks_started=100 * (k + 1),
        tasks_succeeded=95 * (k + 1),
        tasks_failed=5 * (k + 1),
        fleet_cost_nusd=160 * 1_111_111 * (k + 1),
        spend_on_failed_nusd=1_000_000 * (k + 1),
    )


async def measure(
    bootstrap: str, prefix: str, shards: int, boundaries: int, interval_ms: int
) -> dict[str, Any]:
    """Play the shards' summaries against a running stage; latencies and counts (raw)."""
    published_at: dict[int, float] = {}
    complete: set[int] = set()

    def on_published(d: Decision) -> None:
        published_at.setdefault(d.ts_ms, clock.monotonic_s())
        if d.body.reason == "complete":
            complete.add(d.ts_ms)

    stop = asyncio.Event()
    cpu0 = clock.cpu_s()
    stage = asyncio.create_task(run_rollup(bootstrap, prefix, GROUP, stop, on_published=on_published))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    topic = topic_name(prefix, SUMMARIES)
    last_ack: dict[int, float] = {}
    base_ms = (clock.wall_ms() // 1000) * 1000
    try:
        for k in range(boundaries):
            if stage.done():
                stage.result()  # its error, if any
            ts = base_ms + k * 1000
            for p in range(shards):
                value = orjson.dumps(summary(p, ts, k).model_dump(mode="json"))
                await (await producer.send(topic, value=value, key=f"{GROUP}/{p}".encode()))
            last_ack[ts] = clock.monotonic_s()
            if (k + 1) % 20 == 0:
                progress(f"  {k + 1}/{boundaries} boundaries")
            await asyncio.sleep(interval_ms / 1000.0)
        deadline = clock.monotonic_s() + 15.0
        while any(t not in published_at for t in last_ack) and clock.monotonic_s() < deadline:
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(stage, 30)
        await producer.stop()
    stats = stage.result()
    cpu = clock.cpu_s() - cpu0
    lat = [1000.0 * (published_at[t] - last_ack[t]) for t in sorted(last_ack) if t in published_at]
    return {
        "boundaries": boundaries,
        "shards": shards,
        "published": len([t for t in last_ack if t in published_at]),
        "complete": len([t for t in last_ack if t in complete]),
        "latency_p50_ms": round(pct(lat, 50), 1) if lat else None,
        "latency_p99_ms": round(pct(lat, 99), 1) if lat else None,
        "latency_max_ms": round(max(lat), 1) if lat else None,
        "in_process_p99_ms": round(pct(stats.stage_latency_ms, 99), 1) if stats.stage_latency_ms else None,
        "malformed": stats.malformed,
        "cpu_s": round(cpu, 3),  # this process: the stage and the players' producer
    }


def handle(args: argparse.Namespace) -> int:
    within("rollup", "--shards", args.shards, 1, 1000)
    within("rollup", "--boundaries", args.boundaries, 1, 100_000)
    within("rollup", "--interval-ms", args.interval_ms, 0, 60_000)
    with bench_broker("rollup", args.broker) as broker:
        prefix = f"rollup-{uuid.uuid4().hex[:8]}"

        async def main() -> dict[str, Any]:
            await ensure_topics(broker.bootstrap_servers, prefix)
            return await measure(
                broker.bootstrap_servers, prefix, args.shards, args.boundaries, args.interval_ms
            )

        result = {"bench": "rollup", "broker": args.broker, "cpus": os.cpu_count(), **asyncio.run(main())}
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        r = result
        sys.stdout.write(
            f"rollup ({r['broker']}): {r['shards']} shards x {r['boundaries']} boundaries, "
            f"{r['published']} fleet figures published ({r['complete']} complete); last shard summary "
            f"-> fleet figure p50 {r['latency_p50_ms']} ms, p99 {r['latency_p99_ms']} ms, "
            f"max {r['latency_max_ms']} ms\n"
        )
    return 0
