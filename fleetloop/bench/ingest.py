"""``fleetloop bench ingest``: events per second through the daemon's real path, against a floor
and a peer measured in the same run, on the same pre-produced topics.

``fleetloop bench ingest [--events N] [--broker tansu|kafka|both] [--nodes N] [--no-faust] [--json]``

For each broker it starts one (:mod:`fleetloop.daemon.brokers`), creates the registry's topics under
a fresh prefix and produces ``--events`` records of a generated fleet (one telemetry report per node
per second and about two router outcomes per node per second, keyed by pool). Then, one after the
other, on the same records:

- **floor**: a bare aiokafka consumer, ``getmany`` and ``orjson.loads`` per record, nothing else;
- **fleetloop**: the real daemon (:class:`fleetloop.daemon.runtime.Daemon`, its own consumer group):
  decode and validate every record (into the wire models' msgspec twins), dead-letter nothing,
  commit offsets, and fold what it has read into the shards' models every few milliseconds, as its
  ticks would (no ticker runs: deciding is ``fleetloop bench decide``'s to measure);
- **faust**: a faust-streaming app (:mod:`fleetloop.bench.faust_peer`, its own process) decoding
  into typed records and aggregating per pool.

Each is timed from when its partitions are assigned (group joins and start-up excluded; faust: from
its first record) to its last record, in wall time and in CPU seconds of its own process; events
per CPU-second is the steadier figure on a shared machine. Targets: fleetloop >= 50% of the floor
and >= 15x faust.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import uuid
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rich.table import Table

from fleetloop import clock, term
from fleetloop.bench.common import progress
from fleetloop.bench.fleetgen import make_fleet, outcomes_at, telemetry_at
from fleetloop.daemon.brokers import BrokerStartError, ensure_topics, start_broker
from fleetloop.daemon.cli_common import UsageError, quiet_client_logs
from fleetloop.daemon.observability import configure
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.topics import REQUESTS, TELEMETRY, TOPICS, topic_name

TARGET_FLOOR_FRAC = 0.5
TARGET_FAUST_X = 15.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ingest",
        help="events/s through decode + fold against a bare consumer and a faust app, same topics",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--events", type=int, default=200_000, help="records to produce and read (default 200000)")
    p.add_argument("--broker", choices=("tansu", "kafka", "both"), default="both", help="default: both")
    p.add_argument("--nodes", type=int, default=1000, help="nodes in the generated fleet (default 1000)")
    p.add_argument("--no-faust", action="store_true", help="skip the faust-streaming peer")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=handle)


def _records(n_events: int, n_nodes: int, end_ms: int) -> list[tuple[str, bytes, bytes]]:
    """(logical topic, key, value) in event-time order, ``n_events`` of them, the last second
    ending at ``end_ms`` (recent event times: the daemon's door refuses records far from their
    broker timestamp, and a benchmark of dead-lettering is not one of decoding)."""
    fleet = make_fleet(n_nodes)
    out: list[tuple[str, bytes, bytes]] = []
    seconds = n_events // (3 * n_nodes) + 2  # about one report and two calls per node per second
    ts = end_ms - seconds * 1000
    k = 0
    while len(out) < n_events:
        ts += 1000
        out.extend(
            (TELEMETRY, t.pool_id.encode(), orjson.dumps(t.model_dump(mode="json")))
            for t in telemetry_at(fleet, ts)
        )
        out.extend(
            (REQUESTS, o.pool_id.encode(), orjson.dumps(o.model_dump(mode="json")))
            for o in outcomes_at(fleet, ts, 2.0, workflow_base=k)
        )
        k += 10 * n_nodes
    return out[:n_events]


async def _produce(bootstrap: str, prefix: str, records: list[tuple[str, bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=1_048_576
    )
    await producer.start()
    try:
        names = {TELEMETRY: topic_name(prefix, TELEMETRY), REQUESTS: topic_name(prefix, REQUESTS)}
        chunk = 20_000
        for i in range(0, len(records), chunk):
            futures = [
                await producer.send(names[logical], value=value, key=key)
                for logical, key, value in records[i : i + chunk]
            ]
            await asyncio.gather(*futures)
            progress(f"  produced {min(i + chunk, len(records)):,}/{len(records):,}")
    finally:
        await producer.stop()


def _partitions(prefix: str) -> list[TopicPartition]:
    return [
        TopicPartition(topic_name(prefix, logical), p)
        for logical in (TELEMETRY, REQUESTS)
        for p in range(TOPICS[logical].partitions)
    ]


async def _floor(bootstrap: str, prefix: str, total: int) -> dict[str, float]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, max_poll_records=5000)
    await consumer.start()
    try:
        consumer.assign(_partitions(prefix))
        await consumer.seek_to_beginning()
        seen = 0
        loads = orjson.loads
        wall0, cpu0 = clock.monotonic_s(), clock.cpu_s()
        while seen < total:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for records in batch.values():
                for r in records:
                    loads(r.value)
                seen += len(records)
        return {"events": seen, "wall_s": clock.monotonic_s() - wall0, "cpu_s": clock.cpu_s() - cpu0}
    finally:
        await consumer.stop()


def _fold(daemon: Daemon) -> None:
    """Fold what the daemon has read, as its ticks would (the bench runs no ticker: it measures
    decode + fold, not decisions; ``fleetloop bench decide`` measures those)."""
    for shard in daemon.shards.values():
        shard.fold_read()


async def _fleetloop(bootstrap: str, prefix: str, total: int, idempotence: bool) -> dict[str, float]:
    config = DaemonConfig(
        bootstrap_servers=bootstrap,
        policy=builtin_policy("default"),
        prefix=prefix,
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        client_id="fleetloop-bench",
        run_ticker=False,
        idempotence=idempotence,
        warmup_records=total,  # a fresh group reads the whole topic (as history: decode and fold alike)
    )
    daemon = Daemon(config)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    try:
        await asyncio.wait_for(daemon.ready.wait(), 120)
        # Partitions are assigned and sought: from here on it is fetching, decoding and folding.
        wall0, cpu0 = clock.monotonic_s(), clock.cpu_s()
        while daemon.stats.events_in < total:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
            _fold(daemon)
        _fold(daemon)
        wall, cpu = clock.monotonic_s() - wall0, clock.cpu_s() - cpu0
        s = daemon.stats
        return {
            "events": s.events_in,
            "wall_s": wall,
            "cpu_s": cpu,
            "dead_letters": s.dead_letters,
            "telemetry": s.telemetry_in,
            "outcomes": s.outcomes_in,
            "folded": sum(sum(shard.folded.values()) for shard in daemon.shards.values()),
            "fold_errors": sum(shard.fold_errors for shard in daemon.shards.values()),
        }
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=30)


def _faust(bootstrap: str, prefix: str, total: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleetloop-faust-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        cmd = [
            sys.executable,
            "-m",
            "fleetloop.bench.faust_peer",
            bootstrap,
            topic_name(prefix, TELEMETRY),
            topic_name(prefix, REQUESTS),
            str(total),
            result_path,
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp)
        try:
            _, err = proc.communicate(timeout=max(180.0, total / 1_000.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            return {"error": f"faust did not read {total:,} events in time", "stderr": err.decode()[-800:]}
        if not os.path.exists(result_path):
            return {
                "error": f"faust exited {proc.returncode} without a result",
                "stderr": err.decode()[-800:],
            }
        with open(result_path, "rb") as f:
            result: dict[str, Any] = orjson.loads(f.read())
        return result


def _rates(r: dict[str, Any]) -> dict[str, Any]:
    if "error" in r:
        return r
    out = dict(r)
    out["events_per_s"] = round(r["events"] / r["wall_s"]) if r["wall_s"] > 0 else None
    out["events_per_cpu_s"] = round(r["events"] / r["cpu_s"]) if r["cpu_s"] > 0 else None
    out["wall_s"] = round(r["wall_s"], 3)
    out["cpu_s"] = round(r["cpu_s"], 3)
    return out


async def measure_on(
    bootstrap: str,
    prefix: str,
    records: list[tuple[str, bytes, bytes]],
    *,
    idempotence: bool,
    label: str = "",
) -> dict[str, Any]:
    """Create the topics under ``prefix`` on a running broker, produce ``records``, then read them
    all with the floor and with the daemon. Raw figures (see :func:`_rates` for the rates)."""
    await ensure_topics(bootstrap, prefix)
    await _produce(bootstrap, prefix, records)
    progress(f"  {label}: floor (aiokafka getmany + orjson)")
    floor = await _floor(bootstrap, prefix, len(records))
    progress(f"  {label}: fleetloop (decode + fold through the daemon)")
    ours = await _fleetloop(bootstrap, prefix, len(records), idempotence)
    return {"floor": floor, "fleetloop": ours}


def run_broker(kind: str, events: int, nodes: int, faust: bool) -> dict[str, Any]:
    progress(f"fleetloop bench ingest: starting {kind}")
    records = _records(events, nodes, clock.wall_ms())
    with start_broker(kind) as broker:
        bootstrap = broker.bootstrap_servers
        idempotence = broker.capabilities.idempotent_producer
        prefix = f"bench-{uuid.uuid4().hex[:8]}"

        row = asyncio.run(measure_on(bootstrap, prefix, records, idempotence=idempotence, label=kind))
        if faust:
            progress(f"  {kind}: faust-streaming peer")
            row["faust"] = _faust(bootstrap, prefix, events)
    row = {k: _rates(v) for k, v in row.items()}
    ours, floor = row["fleetloop"], row["floor"]
    if ours.get("dead_letters"):
        progress(f"  {kind}: WARNING: {ours['dead_letters']:,} records were dead-lettered, not folded")
    row["broker"] = kind
    row["vs_floor_cpu"] = round(ours["events_per_cpu_s"] / floor["events_per_cpu_s"], 3)
    row["vs_floor_wall"] = round(ours["events_per_s"] / floor["events_per_s"], 3)
    peer = row.get("faust")
    if peer is not None and "error" not in peer:
        row["vs_faust_cpu"] = round(ours["events_per_cpu_s"] / peer["events_per_cpu_s"], 2)
        row["vs_faust_wall"] = round(ours["events_per_s"] / peer["events_per_s"], 2)
    return row


def handle(args: argparse.Namespace) -> int:
    if not 1_000 <= args.events <= 20_000_000:
        raise UsageError("fleetloop bench ingest: --events must be within 1000..20000000")
    if not 16 <= args.nodes <= 100_000:
        raise UsageError("fleetloop bench ingest: --nodes must be within 16..100000")
    quiet_client_logs()
    configure(level="warning")  # the daemon's own log lines go to stderr, and only problems
    kinds = ("tansu", "kafka") if args.broker == "both" else (args.broker,)
    faust = not args.no_faust
    if faust:
        try:
            import faust as _faust_module  # noqa: F401, PLC0415 - optional: is the bench extra installed?
        except ImportError:
            raise UsageError(
                "fleetloop bench ingest: faust-streaming is not installed "
                "(pip install -e '.[bench]'), or pass --no-faust"
            ) from None
    rows = []
    for kind in kinds:
        try:
            rows.append(run_broker(kind, args.events, args.nodes, faust))
        except BrokerStartError as exc:
            raise UsageError(f"fleetloop bench ingest: {exc}") from None
    result = {
        "bench": "ingest",
        "events": args.events,
        "nodes": args.nodes,
        "cpus": os.cpu_count(),
        "brokers": rows,
        "targets": {"vs_floor": TARGET_FLOOR_FRAC, "vs_faust": TARGET_FAUST_X},
    }
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print(result)
    return 0


def _print(result: dict[str, Any]) -> None:
    t = Table(title=f"ingest: {result['events']:,} events (telemetry + outcomes) per run")
    for col in ("broker", "consumer", "events/s", "events/CPU-s", "vs floor (CPU)", "vs faust (CPU)"):
        t.add_column(col, justify="right")
    for row in result["brokers"]:
        for name in ("floor", "fleetloop", "faust"):
            r = row.get(name)
            if r is None:
                continue
            if "error" in r:
                t.add_row(row["broker"], name, r["error"], "", "", "")
                continue
            vs_floor = (
                f"{r['events_per_cpu_s'] / row['floor']['events_per_cpu_s']:.2f}" if name != "floor" else ""
            )
            vs_faust = f"{row['vs_faust_cpu']:.1f}x" if name == "fleetloop" and "vs_faust_cpu" in row else ""
            t.add_row(
                row["broker"],
                name,
                f"{r['events_per_s']:,}",
                f"{r['events_per_cpu_s']:,}",
                vs_floor,
                vs_faust,
            )
    console = term.console()
    console.print(t)
    console.print(
        f"targets: fleetloop >= {TARGET_FLOOR_FRAC:.0%} of the floor and >= {TARGET_FAUST_X:.0f}x faust"
    )
