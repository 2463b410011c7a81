"""``fleetloop bench latency``: from a telemetry record that must trip a breaker to the decision on
``control.state``, under background load, on a fleet of ``--nodes``.

``fleetloop bench latency [--nodes 10000] [--trials 20] [--broker tansu|kafka] [--outcomes-per-node 0.5]
[--daemons 1] [--json]``

It starts a broker and the daemon (``fleetloop run``, its own process, as an operator runs it; with
``--daemons N``, N of them in one consumer group splitting the pools), then
plays a generated fleet in real time: every node reports telemetry each second, each on its own
phase (the load goes out in 50 ms slices), and routers report about ``--outcomes-per-node`` calls
per node per second (the background load). Each trial picks a
healthy node of another pool and reports it failing: five failed calls in a row (the default
policy's breaker threshold) in one burst, whose last record is the trigger. A consumer on
``control.state`` notes when the enforced ``open`` breaker decision for that node arrives. The
latency is that arrival minus the moment the trigger was acknowledged by the broker. Target (issue
9): p99 at most the policy's tick period plus 100 ms.

Also reported: the part after the tick boundary (arrival minus the first boundary at or after the
trigger's timestamp, whose cut holds it; about a tick more when it missed that cut), the decision
record's own timestamp against that boundary (when the daemon staged it, whatever the reader), and
how many shard summaries on ``control.summaries`` were published more than once for one boundary.
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

from fleetloop.bench.common import pct, progress
from fleetloop.bench.fleetgen import make_fleet, telemetry_at
from fleetloop.daemon import clock
from fleetloop.daemon.brokers import BrokerStartError, ensure_topics, start_broker
from fleetloop.daemon.cli_common import UsageError, quiet_client_logs
from fleetloop.daemon.observability import configure
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.topics import REQUESTS, STATE, SUMMARIES, TELEMETRY, topic_name


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "latency",
        help="time from a failing node's records to its breaker decision on control.state, under load",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--nodes", type=int, default=10_000, help="fleet size (default 10000)")
    p.add_argument("--trials", type=int, default=20, help="breaker trips to time (default 20)")
    p.add_argument("--broker", choices=("tansu", "kafka"), default="tansu", help="default: tansu")
    p.add_argument(
        "--outcomes-per-node", type=float, default=0.5, help="background calls per node per second (0.5)"
    )
    p.add_argument(
        "--daemons", type=int, default=1, help="fleetloop run processes in one consumer group (default 1)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=handle)


def _failure(node_id: str, pool_id: str, model: str, ts_ms: int, n: int) -> bytes:
    return orjson.dumps(
        {
            "ts_ms": ts_ms,
            "request_id": f"trip-{node_id}-{ts_ms}-{n}",
            "workflow_id": f"trip-{node_id}-{ts_ms}",
            "step_index": n,
            "tenant_id": "bench",
            "priority": 1,
            "latency_budget_ms": 30_000,
            "pool_id": pool_id,
            "node_id": node_id,
            "model": model,
            "prompt_tokens": 1000,
            "e2e_ms": 5000.0,
            "outcome": "error",
        }
    )


class _Load:
    """Telemetry for every node each second and background outcomes, stamped with wall time."""

    def __init__(self, n_nodes: int, per_node: float, trials: int) -> None:
        self.fleet = make_fleet(n_nodes, seed=11, degraded_per_1000=0.0)
        self.per_node = per_node
        first = list(telemetry_at(self.fleet, 0))
        self.rows = [t.model_dump(mode="json") for t in first]
        self.calls = 0
        self.sent = 0  # records produced by play()
        self.lag_s: list[float] = []  # how far each slice of play() fell behind its schedule
        # The nodes to trip, one per trial, in different pools; the background load never calls
        # them (an ok call between the failures would reset their run, as it should).
        pools = self.fleet.pools
        self.targets = [
            (pools[(k * 7) % len(pools)], pools[(k * 7) % len(pools)].node_ids[k % 16]) for k in range(trials)
        ]
        reserved = {node for _, node in self.targets}
        self.callable = [i for i, row in enumerate(self.rows) if row["node_id"] not in reserved]

    def slice(self, k: int, slices: int, ts_ms: int) -> list[tuple[str, bytes, bytes]]:
        """Slice ``k`` of ``slices`` of one second: every node reports once a second, each on its own
        phase (node ``i`` in slice ``i % slices``), and calls are spread the same way."""
        out: list[tuple[str, bytes, bytes]] = []
        rng = self.fleet.rng
        rows = self.rows[k::slices]
        queue = rng.poisson(1.0, len(rows))
        for row, q in zip(rows, queue.tolist(), strict=True):
            row["ts_ms"] = ts_ms
            row["queue_depth"] = q
            out.append((TELEMETRY, row["pool_id"].encode(), orjson.dumps(row)))
        n_calls = int(len(self.rows) * self.per_node / slices)
        picks = rng.integers(0, len(self.callable), n_calls).tolist()
        for j in picks:
            row = self.rows[self.callable[j]]
            self.calls += 1
            value = {
                "ts_ms": ts_ms,
                "request_id": f"bg-{self.calls}",
                "workflow_id": f"bg-{self.calls // 4}",
                "step_index": self.calls % 4,
                "tenant_id": "background",
                "priority": 1,
                "latency_budget_ms": 30_000,
                "pool_id": row["pool_id"],
                "node_id": row["node_id"],
                "model": row["model"],
                "prompt_tokens": 1500,
                "output_tokens": 150,
                "ttft_ms": 300.0,
                "e2e_ms": 3000.0,
                "outcome": "ok",
            }
            out.append((REQUESTS, row["pool_id"].encode(), orjson.dumps(value)))
        return out

    async def play(self, producer: AIOKafkaProducer, names: dict[str, str], stop: asyncio.Event) -> None:
        """Produce the load in real time, ``SLICES`` slices a second, until ``stop`` is set."""
        next_s = clock.monotonic_s()
        k = 0
        while not stop.is_set():
            records = self.slice(k % SLICES, SLICES, clock.wall_ms())
            futures = [await producer.send(names[t], value=v, key=key) for t, key, v in records]
            await asyncio.gather(*futures)
            self.sent += len(records)
            k += 1
            next_s += 1.0 / SLICES
            self.lag_s.append(max(0.0, clock.monotonic_s() - next_s))
            await asyncio.sleep(max(0.0, next_s - clock.monotonic_s()))


SLICES = 20  # the load is produced in 50 ms slices, stamped with the wall time of each


async def _run(bootstrap: str, prefix: str, args: argparse.Namespace, log_path: str) -> dict[str, Any]:
    tick_ms = builtin_policy("default").tick_ms
    load = _Load(args.nodes, args.outcomes_per_node, args.trials)
    names = {TELEMETRY: topic_name(prefix, TELEMETRY), REQUESTS: topic_name(prefix, REQUESTS)}
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=1_048_576
    )
    # The reader of control.state polls every 10 ms: a fetch the broker holds (the client's default
    # waits up to 500 ms, and Tansu answers an empty fetch only then) would time the reader, not
    # when the decision is on the topic.
    state = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_poll_records=20_000, fetch_max_wait_ms=10
    )
    await producer.start()
    await state.start()
    tp = TopicPartition(topic_name(prefix, STATE), 0)
    summaries_tp = TopicPartition(topic_name(prefix, SUMMARIES), 0)
    state.assign([tp, summaries_tp])
    await state.seek_to_end(tp, summaries_tp)
    arrivals: dict[str, float] = {}
    arrivals_wall: dict[str, int] = {}
    stamped: dict[str, int] = {}  # the decision record's own timestamp: when the daemon staged it
    # Per shard summary key and boundary, how many times it was published (once is the contract).
    summaries: dict[tuple[bytes, int], int] = {}
    daemons: list[subprocess.Popen[bytes]] = []
    newest = [0]  # the newest boundary a decision on control.state was made for
    behind_s = 0.0
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            batch = await state.getmany(timeout_ms=200)
            now = clock.monotonic_s()
            wall = clock.wall_ms()
            for part, records in batch.items():
                if part == summaries_tp:
                    for r in records:
                        at = (r.key or b"", int(orjson.loads(r.value)["ts_ms"]))
                        summaries[at] = summaries.get(at, 0) + 1
                    continue
                for r in records:
                    if not (r.key or b"").startswith(b"breaker/"):
                        continue
                    decision = orjson.loads(r.value)
                    newest[0] = max(newest[0], int(decision["ts_ms"]))
                    body = decision["body"]
                    if body["state"] == "open" and body["enforced"]:
                        arrivals.setdefault(body["node_id"], now)
                        arrivals_wall.setdefault(body["node_id"], wall)
                        stamped.setdefault(body["node_id"], r.timestamp)

    tasks = [asyncio.create_task(watch()), asyncio.create_task(load.play(producer, names, stop))]
    try:
        for k in range(args.daemons):
            with open(f"{log_path}.{k}", "wb") as log:
                daemons.append(subprocess.Popen(
                    [sys.executable, "-m", "fleetloop.daemon.cli", "run", "--bootstrap-servers", bootstrap,
                     "--topic-prefix", prefix, "--group-id", f"bench-{prefix}"],
                    stdout=log, stderr=subprocess.STDOUT,
                ))  # fmt: skip
        progress(f"  warming up: {args.nodes:,} nodes reporting, waiting for the daemon's first decisions")
        await _wait_for_decisions(state, prefix, timeout_s=180.0)
        # Give every node a few seconds of history (a node's first ticks are its warm-up), and the
        # daemons time to decide the boundaries they are behind on (at most 60 s more).
        await asyncio.sleep(5.0)
        deadline = clock.monotonic_s() + 60.0
        while clock.wall_ms() - newest[0] > 3 * tick_ms and clock.monotonic_s() < deadline:
            await asyncio.sleep(0.5)
        behind_s = max(0.0, (clock.wall_ms() - newest[0]) / 1000.0)
        latencies: list[float] = []
        after_boundary: list[float] = []  # arrival minus the first tick boundary the trigger falls in
        staged_after: list[float] = []  # the decision record's timestamp minus that boundary
        missed = 0
        for trial, (pool, node_id) in enumerate(load.targets):
            ts = clock.wall_ms()
            futures = [
                await producer.send(names[REQUESTS], value=_failure(node_id, pool.pool_id, pool.model, ts, n),
                                    key=pool.pool_id.encode())
                for n in range(5)
            ]  # fmt: skip
            acked = await asyncio.gather(*futures)
            sent = clock.monotonic_s()
            boundary = -(-max(m.timestamp for m in acked) // tick_ms) * tick_ms  # its tick's cut has it
            deadline = sent + 30.0
            while node_id not in arrivals and clock.monotonic_s() < deadline:
                await asyncio.sleep(0.01)
            if node_id in arrivals:
                latencies.append((arrivals[node_id] - sent) * 1000.0)
                after_boundary.append(float(arrivals_wall[node_id] - boundary))
                staged_after.append(float(stamped[node_id] - boundary))
                progress(
                    f"  trial {trial + 1}/{args.trials}: {latencies[-1]:,.0f} ms "
                    f"({after_boundary[-1]:,.0f} ms after its tick boundary)"
                )
            else:
                missed += 1
                progress(f"  trial {trial + 1}/{args.trials}: no decision within 30 s")
            await asyncio.sleep(0.5 + (trial % 3) * 0.3)  # land at different phases of the tick
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        await state.stop()
        await producer.stop()
    target = tick_ms + 100.0
    p99 = pct(latencies, 99) if latencies else None
    with open(f"{log_path}.0", "rb") as f:
        log_tail = f.read()[-2000:].decode(errors="replace")
    return {
        "bench": "latency",
        "nodes": args.nodes,
        "daemons": args.daemons,
        # How far the newest decision's boundary lagged the wall clock when the trials began.
        "daemon_behind_s_at_start": round(behind_s, 1),
        "pools": len(load.fleet.pools),
        "events_per_s": int(args.nodes * (1 + args.outcomes_per_node)),
        "trials": args.trials,
        "missed": missed,
        "tick_ms": tick_ms,
        "p50_ms": round(pct(latencies, 50), 1) if latencies else None,
        "p99_ms": round(p99, 1) if p99 is not None else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        # The part after the tick boundary (the wait for the boundary is the tick period's share).
        "after_boundary_p50_ms": round(pct(after_boundary, 50), 1) if after_boundary else None,
        "after_boundary_p99_ms": round(pct(after_boundary, 99), 1) if after_boundary else None,
        "latencies_ms": [round(x, 1) for x in latencies],
        "after_boundary_ms": [round(x, 1) for x in after_boundary],
        "staged_after_boundary_p50_ms": round(pct(staged_after, 50), 1) if staged_after else None,
        "staged_after_boundary_ms": [round(x, 1) for x in staged_after],
        "summaries": len(summaries),
        "summaries_repeated": sum(1 for n in summaries.values() if n > 1),
        "load_generator_max_lag_s": round(max(load.lag_s), 3) if load.lag_s else None,
        "target_ms": target,
        "met": p99 is not None and missed == 0 and p99 <= target,
        "daemon_log_tail": log_tail if missed else "",
    }


async def _wait_for_decisions(state: AIOKafkaConsumer, prefix: str, timeout_s: float) -> None:
    deadline = clock.monotonic_s() + timeout_s
    tp = TopicPartition(topic_name(prefix, STATE), 0)
    while clock.monotonic_s() < deadline:
        if (await state.end_offsets([tp])).get(tp, 0) > 0:
            return
        await asyncio.sleep(0.5)
    raise UsageError(f"fleetloop bench latency: the daemon published nothing within {timeout_s:.0f} s")


def handle(args: argparse.Namespace) -> int:
    if not 16 <= args.nodes <= 100_000:
        raise UsageError("fleetloop bench latency: --nodes must be within 16..100000")
    if not 1 <= args.daemons <= 8:
        raise UsageError("fleetloop bench latency: --daemons must be within 1..8")
    if not 1 <= args.trials <= 1000:
        raise UsageError("fleetloop bench latency: --trials must be within 1..1000")
    if not 0.0 <= args.outcomes_per_node <= 100.0:
        raise UsageError("fleetloop bench latency: --outcomes-per-node must be within 0..100")
    quiet_client_logs()
    configure(level="warning")  # the daemon's own log lines go to stderr, and only problems
    progress(f"fleetloop bench latency: starting {args.broker}")
    try:
        broker = start_broker(args.broker)
    except BrokerStartError as exc:
        raise UsageError(f"fleetloop bench latency: {exc}") from None
    with broker, tempfile.TemporaryDirectory(prefix="fleetloop-latency-") as tmp:
        prefix = f"lat-{uuid.uuid4().hex[:8]}"

        async def main() -> dict[str, Any]:
            await ensure_topics(broker.bootstrap_servers, prefix)
            return await _run(broker.bootstrap_servers, prefix, args, os.path.join(tmp, "daemon.log"))

        result = asyncio.run(main())
        result["broker"] = args.broker
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(
            f"breaker latency on {result['nodes']:,} nodes ({result['pools']} pools, "
            f"~{result['events_per_s']:,} events/s background, {result['broker']}): "
            f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms, "
            f"missed {result['missed']}/{result['trials']}; target p99 <= {result['target_ms']:.0f} ms: "
            f"{'met' if result['met'] else 'NOT met'}\n"
            f"after the tick boundary: p50 {result['after_boundary_p50_ms']} ms, "
            f"p99 {result['after_boundary_p99_ms']} ms; shard summaries published twice for one "
            f"boundary: {result['summaries_repeated']} of {result['summaries']}\n"
        )
    return 0
