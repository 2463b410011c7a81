"""``fleetloop bench latency``: from a telemetry record that must trip a breaker to the decision on
``control.state``, under background load, on a fleet of ``--nodes``.

``fleetloop bench latency [--nodes 10000] [--trials 20] [--broker tansu|kafka] [--outcomes-per-node 0.5]
[--daemons 1] [--json]``

It starts a broker and the daemon (``fleetloop run``, its own process, as an operator runs it; with
``--daemons N``, N of them in one consumer group splitting the pools), then
plays a generated fleet in real time from a process of its own (``fleetloop.bench.loadgen``): every
node reports telemetry each second, each on its own phase (the load goes out in 50 ms slices), and
routers report about ``--outcomes-per-node`` calls per node per second (the background load). Each
trial picks a healthy node of another pool and reports it failing: five failed calls in a row (the
default policy's breaker threshold) in one burst, whose last record is the trigger. A consumer on
``control.state`` notes when the enforced ``open`` breaker decision for that node arrives. The
latency is that arrival minus the moment the trigger was acknowledged by the broker. Target (issue
9): p99 at most the policy's tick period plus 100 ms.

Also reported: the part after the tick boundary (arrival minus the first boundary at or after the
trigger's timestamp, whose cut holds it; about a tick more when it missed that cut), the decision
record's own timestamp against that boundary (when the daemon staged it, whatever the reader), and
how many shard summaries on ``control.summaries`` were published more than once for one boundary.
With every trial: how far the slowest shard's newest summary lags the wall clock (the daemons'
lag), the generator's lag behind its schedule, and the load average; over the trials, the CPU
seconds per second of the generator, the broker, the daemons and the bench itself (``/proc``), so
a figure taken on a machine that could not run the load says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from fleetloop.bench.common import pct, progress
from fleetloop.bench.loadgen import (
    ACK_MAX_S,
    CPU_S,
    LAG_MAX_S,
    LAG_NOW_S,
    SENT,
    SLICES_LATE,
    WALL_S,
    LoadProcess,
    LoadSpec,
    add_daemon_log_arg,
    add_overload_arg,
    bench_fleet,
    daemon_log_path,
    loop_shares,
    overload_args,
    overload_skipped,
    trial_targets,
)
from fleetloop.daemon import clock
from fleetloop.daemon.brokers import BrokerStartError, ensure_topics, start_broker
from fleetloop.daemon.children import die_with_parent
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
    add_overload_arg(p)
    add_daemon_log_arg(p)
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


def _cpu_s(pid: int | None, *, children: bool = False) -> float | None:
    """CPU seconds (user + system) a process has used so far, from /proc; with ``children``, also
    its children's that it has waited for (a daemon's checkpoint encoders, forked and reaped every
    few seconds); None where unreadable."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float | None:
    """CPU seconds every core of the machine has been busy so far (``/proc/stat``: all but idle
    and I/O wait), so the share the bench's own processes did not use (other work) shows too."""
    try:
        with open("/proc/stat", "rb") as f:
            cpu = f.readline().split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in cpu[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


TRIP_STAGES = (
    "woke", "read_up", "ticks_acked", "ticks_read", "cut_ready", "folded", "decided", "staged", "acked",
)  # fmt: skip


def trip_lines(log_paths: list[str]) -> dict[int, dict[str, int]]:
    """The daemons' "trip path" lines (``runtime.TripTrace``): boundary -> stage -> ms after it
    (the earliest of the daemons' for a stage, as a trial's pool is one daemon's)."""
    out: dict[int, dict[str, int]] = {}
    for path in log_paths:
        with contextlib.suppress(OSError), open(path, "rb") as f:
            for line in f:
                if b"trip path" not in line:
                    continue
                fields = {k.decode(): v for k, v in re.findall(rb"(\w+)=(-?\d+)", line)}
                if "boundary" not in fields:
                    continue
                marks = out.setdefault(int(fields.pop("boundary")), {})
                for k, v in fields.items():
                    marks[k] = min(int(v), marks.get(k, int(v)))
    return out


def trip_path_stages(
    per_trial: list[dict[str, Any]], log_paths: list[str], tick_ms: int = 1000
) -> dict[str, Any]:
    """Per stage of the after-boundary part, p50 / p99 / max ms after the boundary over the trials
    the daemons traced, then ``arrived`` (on control.state, the bench's clock); each trial's stages
    go into its row (``path_ms``). A trial whose trigger missed its boundary's cut (acknowledged
    just before it, read after) trips at the next boundary: its stages are that line's, counted
    from the trial's boundary (a tick more), and its row says ``path_next_boundary``."""
    lines = trip_lines(log_paths)
    seen: dict[str, list[float]] = {}
    for row in per_trial:
        boundary = row.get("boundary_ms", -1)
        late = 0
        marks = lines.get(boundary)
        if marks is None and (marks := lines.get(boundary + tick_ms)) is not None:
            late = tick_ms
            row["path_next_boundary"] = True
        if marks is None:
            continue
        path = {k: marks[k] + late for k in TRIP_STAGES if k in marks}
        if row.get("after_boundary_ms") is not None:
            path["arrived"] = row["after_boundary_ms"]
        row["path_ms"] = path
        for k, v in path.items():
            seen.setdefault(k, []).append(float(v))
    return {
        "trials_traced": sum(1 for row in per_trial if "path_ms" in row),
        "trials_at_the_next_boundary": sum(1 for row in per_trial if row.get("path_next_boundary")),
        **{
            k: {"p50": round(pct(v, 50), 1), "p99": round(pct(v, 99), 1), "max": round(max(v), 1)}
            for k, v in seen.items()
        },
    }


def _loadavg() -> float:
    return round(os.getloadavg()[0], 2)


async def _run(
    bootstrap: str, prefix: str, args: argparse.Namespace, log_path: str, broker_pid: int | None
) -> dict[str, Any]:
    tick_ms = builtin_policy("default").tick_ms
    fleet = bench_fleet(args.nodes)
    targets = [(fleet.pools[i], node) for i, node in trial_targets(fleet, args.trials)]
    watched = {f"breaker/node/{node}".encode(): node for _, node in targets}  # Decision.key
    names = {TELEMETRY: topic_name(prefix, TELEMETRY), REQUESTS: topic_name(prefix, REQUESTS)}
    topics = (names[TELEMETRY], names[REQUESTS])
    load = LoadProcess(LoadSpec(bootstrap, topics, args.nodes, args.outcomes_per_node, args.trials))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    # The reader of control.state polls every 10 ms: a fetch the broker holds (the client's default
    # waits up to 500 ms, and Tansu answers an empty fetch only then) would time the reader, not
    # when the decision is on the topic.
    state = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_poll_records=50_000, fetch_max_wait_ms=10
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
    # Per shard (a summary's key), the newest boundary it published a summary for: the slowest
    # shard says how far behind the daemons are (the shards' decisions share one topic).
    newest: dict[bytes, int] = {}

    def behind_s(wall_ms: int) -> float:
        return max(0.0, (wall_ms - min(newest.values(), default=0)) / 1000.0)

    behind_at_start = 0.0
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
                        newest[at[0]] = max(newest.get(at[0], 0), at[1])
                    continue
                for r in records:
                    node_id = watched.get(r.key or b"")
                    if node_id is None or node_id in arrivals:
                        continue  # only the trial targets' breakers are timed (10,000 nodes: ~15k a tick)
                    body = orjson.loads(r.value)["body"]
                    if body["state"] == "open" and body["enforced"]:
                        arrivals[node_id] = now
                        arrivals_wall[node_id] = wall
                        stamped[node_id] = r.timestamp

    def cpu_now() -> dict[str, float | None]:
        each = {f"daemon{k}": _cpu_s(d.pid, children=True) for k, d in enumerate(daemons)}
        return {
            "generator": _cpu_s(load.pid),
            "broker": _cpu_s(broker_pid, children=True),
            # The daemons' own processes (as every earlier session measured them), then with their
            # checkpoint children, in all and one by one: where a missed trial's cores went.
            "daemons": sum(c for d in daemons if (c := _cpu_s(d.pid)) is not None) if daemons else None,
            "daemons_with_children": sum(c for c in each.values() if c is not None) if daemons else None,
            **each,
            "bench": clock.cpu_s(),
            "machine": _machine_busy_s(),
        }

    tasks = [asyncio.create_task(watch())]
    per_trial: list[dict[str, Any]] = []
    cpu0: dict[str, float | None] = {}
    cpu1: dict[str, float | None] = {}
    wall_trials = 0.0
    sent0 = 0.0
    load_cpu0 = 0.0
    load_wall0 = 0.0
    try:
        load.start()
        if not await load.wait_ready(60.0):
            raise UsageError("fleetloop bench latency: the load generator did not start")
        for k in range(args.daemons):
            # Each daemon in a session of its own, as a service runs: where the kernel shares CPU
            # between sessions (Linux autogroups), N daemons started from the bench's session would
            # share one session's slice with the broker and the generator (stopped in ``finally``).
            with open(f"{log_path}.{k}", "wb") as log:
                daemons.append(subprocess.Popen(
                    [sys.executable, "-m", "fleetloop.daemon.cli", "run", "--bootstrap-servers", bootstrap,
                     "--topic-prefix", prefix, "--group-id", f"bench-{prefix}", *overload_args(args)],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=die_with_parent,  # noqa: PLW1509 (see die_with_parent)
                ))  # fmt: skip
        progress(f"  warming up: {args.nodes:,} nodes reporting, waiting for the daemon's first decisions")
        await _wait_for_decisions(state, prefix, timeout_s=180.0)
        # Give every node a few seconds of history (a node's first ticks are its warm-up), and the
        # daemons time to decide the boundaries they are behind on (at most 300 s more: at 10,000
        # nodes they start about a minute behind, the history read and the group's joins).
        await asyncio.sleep(5.0)
        deadline = clock.monotonic_s() + 300.0
        while behind_s(clock.wall_ms()) > 3 * tick_ms / 1000.0 and clock.monotonic_s() < deadline:
            await asyncio.sleep(0.5)
        behind_at_start = behind_s(clock.wall_ms())
        progress(
            f"  trials begin: daemons {behind_at_start:.1f} s behind, generator lag "
            f"{load.stats.get(LAG_NOW_S):.2f} s, load average {_loadavg()}"
        )
        latencies: list[float] = []
        after_boundary: list[float] = []  # arrival minus the first tick boundary the trigger falls in
        staged_after: list[float] = []  # the decision record's timestamp minus that boundary
        missed = 0
        cpu0 = cpu_now()
        wall0 = clock.monotonic_s()
        sent0, load_cpu0, load_wall0 = (load.stats.get(i) for i in (SENT, CPU_S, WALL_S))
        for trial, (pool, node_id) in enumerate(targets):
            ts = clock.wall_ms()
            row: dict[str, Any] = {
                "node": node_id,
                "daemons_behind_s": round(behind_s(ts), 2),
                "generator_lag_s": round(load.stats.get(LAG_NOW_S), 3),
                "load_average": _loadavg(),
            }
            futures = [
                await producer.send(names[REQUESTS], value=_failure(node_id, pool.pool_id, pool.model, ts, n),
                                    key=pool.pool_id.encode())
                for n in range(5)
            ]  # fmt: skip
            acked = await asyncio.gather(*futures)
            sent = clock.monotonic_s()
            boundary = -(-max(m.timestamp for m in acked) // tick_ms) * tick_ms  # its tick's cut has it
            row["boundary_ms"] = boundary
            deadline = sent + 30.0
            while node_id not in arrivals and clock.monotonic_s() < deadline:
                await asyncio.sleep(0.01)
            if node_id in arrivals:
                latencies.append((arrivals[node_id] - sent) * 1000.0)
                after_boundary.append(float(arrivals_wall[node_id] - boundary))
                staged_after.append(float(stamped[node_id] - boundary))
                row.update(latency_ms=round(latencies[-1], 1), after_boundary_ms=after_boundary[-1])
                progress(
                    f"  trial {trial + 1}/{args.trials}: {latencies[-1]:,.0f} ms "
                    f"({after_boundary[-1]:,.0f} ms after its tick boundary; daemons "
                    f"{row['daemons_behind_s']:.1f} s behind, generator lag {row['generator_lag_s']:.2f} s, "
                    f"load {row['load_average']})"
                )
            else:
                missed += 1
                row["latency_ms"] = None
                progress(
                    f"  trial {trial + 1}/{args.trials}: no decision within 30 s (daemons "
                    f"{row['daemons_behind_s']:.1f} s behind, generator lag {row['generator_lag_s']:.2f} s)"
                )
            per_trial.append(row)
            await asyncio.sleep(0.5 + (trial % 3) * 0.3)  # land at different phases of the tick
        wall_trials = clock.monotonic_s() - wall0
        cpu1 = cpu_now()
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        load.stop()
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
    load_wall = load.stats.get(WALL_S) - load_wall0
    # CPU per second of wall time during the trials, per part: where the machine's time went.
    cpu_per_s = {
        k: round((cpu1[k] or 0.0) - (cpu0.get(k) or 0.0), 3) / wall_trials if wall_trials else None
        for k in cpu1
        if cpu1[k] is not None
    }
    machine = cpu_per_s.get("machine")
    if machine is not None:  # what the machine ran besides this bench's processes
        ours = ("generator", "broker", "daemons_with_children", "bench")
        cpu_per_s["other"] = max(0.0, machine - sum(cpu_per_s.get(k) or 0.0 for k in ours))
    return {
        "bench": "latency",
        "nodes": args.nodes,
        "daemons": args.daemons,
        # How far the slowest shard's newest summary (its newest decided boundary) lagged the wall
        # clock when the trials began, and at worst when a trial began.
        "daemon_behind_s_at_start": round(behind_at_start, 1),
        "daemon_behind_s_max": max((r["daemons_behind_s"] for r in per_trial), default=None),
        # Boundaries each daemon published as skipped for overload (None: not known, see
        # overload_skipped), and the limit they ran with (None: the daemon's default).
        "overload_max_ticks": getattr(args, "overload_max_ticks", None),
        "ticks_overload": [overload_skipped(f"{log_path}.{k}") for k in range(args.daemons)],
        "pools": len(fleet.pools),
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
        # The generator: records a second it produced during the trials against its schedule, its
        # lag behind that schedule, and its CPU seconds per second of load.
        "load_generator_records_per_s": round((load.stats.get(SENT) - sent0) / load_wall, 1)
        if load_wall
        else None,
        "load_generator_max_lag_s": round(load.stats.get(LAG_MAX_S), 3),
        "load_generator_late_slices": int(load.stats.get(SLICES_LATE)),
        "load_generator_max_ack_wait_s": round(load.stats.get(ACK_MAX_S), 3),
        "load_generator_cpu_per_s": round((load.stats.get(CPU_S) - load_cpu0) / load_wall, 3)
        if load_wall
        else None,
        "cpu_per_s_during_trials": {k: round(v, 3) for k, v in cpu_per_s.items() if v is not None},
        "cores": os.cpu_count(),
        # Each daemon's consumer loop over its whole run (its "loop" log lines): the share of wall
        # time it ran, was runnable but not run (the machine busy), and waited (on the broker, or
        # with nothing to decide), and the phases that took the most wall time.
        "daemon_loops": [loop_shares(f"{log_path}.{k}") for k in range(args.daemons)],
        # The after-boundary part by stage, from the daemons' "trip path" lines (runtime.TripTrace)
        # joined to the trials by boundary: per stage p50 / p99 / max ms after the boundary.
        "trip_path_ms": trip_path_stages(
            per_trial, [f"{log_path}.{k}" for k in range(args.daemons)], tick_ms
        ),
        "load_average_min": min((r["load_average"] for r in per_trial), default=None),
        "load_average_max": max((r["load_average"] for r in per_trial), default=None),
        "per_trial": per_trial,
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
            # SIGTERM (a timeout, a supervisor) stops the run as Ctrl-C does: the daemons, in
            # sessions of their own, are stopped by the run's ``finally``, not left behind.
            main_task = asyncio.current_task()
            assert main_task is not None
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
            await ensure_topics(broker.bootstrap_servers, prefix)
            return await _run(broker.bootstrap_servers, prefix, args, daemon_log_path(args, tmp), broker.pid)

        try:
            result = asyncio.run(main())
        except asyncio.CancelledError:  # SIGTERM: stopped as Ctrl-C is
            raise KeyboardInterrupt from None
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
