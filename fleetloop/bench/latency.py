"""``fleetloop bench latency``: a node that served ok calls in a loaded pool starts failing every
call a router still sends it; how long until its breaker is enforced open on ``control.state``, and
whether that ejection holds to its end.

``fleetloop bench latency [--nodes 10000] [--trials 20] [--broker tansu|kafka] [--outcomes-per-node 0.5]
[--daemons 1] [--json]``

It starts a broker and the daemon (``fleetloop run``, its own process, as an operator runs it; with
``--daemons N``, N of them in one consumer group splitting the pools), then plays a generated fleet
in real time from a process of its own (``fleetloop.bench.loadgen``): every node reports telemetry
each second, each on its own phase (the load goes out in 50 ms slices), with a small queue, at
least one call (every pool loaded: no idle node), and routers report about
``--outcomes-per-node`` ok calls per node per second on every node (the background load), the
trial targets included.

Each trial picks a node of another pool that has been serving ok calls and plays the router that
keeps routing to it: from the trial's start the generator reports no more calls on it and the
bench reports the calls a router sends it, at the same rate, each one failed, for as long as the
newest breaker record for the node on ``control.state`` is not an enforced ``open`` (a router
stops sending to a node only once its breaker is enforced; released, it sends again). The failed
call that makes the node's streak the policy's error threshold (five in a row in the default
policy) is the trigger. Per trial:

- the time to an enforced open: from the moment the broker acknowledged the trigger to the
  arrival of the node's enforced open breaker record on ``control.state``; target: p99 at most the
  policy's tick period plus 100 ms, with no flap;
- the part of it after the tick boundary (arrival minus the first boundary at or after the
  trigger's timestamp, whose cut holds it; about a tick more when it missed that cut), and the
  decision record's own timestamp against that boundary (when the daemon staged it);
- the records before it that named the breaker open but not enforced (``detected``: their reasons,
  e.g. ``:capacity-cap``);
- flaps: every release of an enforced ejection before its end, i.e. a record of the node decided
  before the ``until_ms`` of the enforced open before it that is not an enforced open
  (:func:`releases`). The trial watches the node until its first ejection's end (the policy's
  backoff: 30 s by default), so trials run side by side, each in a pool of its own, started a
  second or two apart (on different phases of the tick).

Also reported: how many shard summaries on ``control.summaries`` were published more than once
for one boundary; with every trial, how far the slowest shard's newest summary lags the wall clock
(the daemons' lag), the generator's lag behind its schedule, and the load average; over the
trials, the CPU seconds per second of the generator, the broker, the daemons and the bench itself
(``/proc``), so a figure taken on a machine that could not run the load says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rich.table import Table

from fleetloop import clock, term
from fleetloop.bench.common import pct, progress, sigterm_as_ctrl_c, stop_processes
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
    rebalances_beyond_start,
    stability,
    trial_targets,
)
from fleetloop.daemon.brokers import BrokerStartError, ensure_topics, start_broker
from fleetloop.daemon.children import die_with_parent
from fleetloop.daemon.cli_common import UsageError, quiet_client_logs
from fleetloop.daemon.observability import configure
from fleetloop.policies.registry import CompiledPolicy, builtin_policy
from fleetloop.schemas.topics import REQUESTS, STATE, SUMMARIES, TELEMETRY, topic_name


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "latency",
        help="a node that served ok calls in a loaded pool fails every call: time to its enforced "
        "breaker on control.state, and releases before its backoff ends (flaps), under load",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--nodes", type=int, default=10_000, help="fleet size (default 10000)")
    p.add_argument(
        "--trials",
        type=int,
        default=20,
        help="failing nodes to time, each in a pool of its own at a time (default 20)",
    )
    p.add_argument("--broker", choices=("tansu", "kafka"), default="tansu", help="default: tansu")
    p.add_argument(
        "--outcomes-per-node",
        type=float,
        default=0.5,
        help="background ok calls per node per second, and a router's calls to a trial's node (0.5)",
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
        boundary = row.get("boundary_ms")
        if boundary is None:
            continue  # no trigger (the trial never got its failures in)
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


FIRST_OPEN_TIMEOUT_S = 45.0  # a trial whose node is not ejected this long after its trigger: missed
AFTER_END_S = 1.5  # watched past its ejection's end, so the record at the end (a probe) is seen
PAUSE_AFTER_TAKE_S = 0.3  # the generator's slices in flight land before the first failure


def releases(records: Sequence[tuple[int, str, bool, int | None]]) -> list[int]:
    """The releases of an enforced ejection before its end (flaps), as the decision times (``ts_ms``)
    of the records that released it: ``records`` are one node's breaker records in the order they
    arrived, each (ts_ms, state, enforced, until_ms). A record that is not an enforced ``open``,
    decided before the ``until_ms`` of the enforced open before it (or with none given), releases
    that ejection; one release per return to the rotation, however many ticks it lasts. A record
    at or after the end (the probe: ``half_open``) is no release."""
    out: list[int] = []
    ejected = False
    until: int | None = None
    for ts_ms, state, enforced, until_ms in records:
        if state == "open" and enforced:
            ejected, until = True, until_ms
        elif ejected:
            if until is None or ts_ms < until:
                out.append(ts_ms)
            ejected = False
    return out


def error_threshold(policy: CompiledPolicy) -> int:
    """The failed calls in a row that open the policy's breaker (the default's latency-outlier:
    ``error_threshold``; consecutive-errors: ``threshold``; envoy-outlier: ``consecutive_5xx``)."""
    params = policy.sections["breaker"].params
    for name in ("error_threshold", "threshold", "consecutive_5xx"):
        value = getattr(params, name, None)
        if isinstance(value, int):
            return value
    return 5


@dataclass(slots=True)
class Seen:
    """A breaker record of a trial's node on ``control.state``, as it arrived."""

    ts_ms: int  # the decision's tick boundary (event time)
    state: str
    enforced: bool
    until_ms: int | None
    reason: str
    arrived_s: float  # the bench's monotonic clock
    arrived_wall_ms: int
    record_ts_ms: int  # the record's own timestamp: when the daemon staged it


@dataclass(slots=True)
class _Open:
    """What a run holds open: the load generator, the daemons, the bench's producer (the router's
    failed calls) and its reader of ``control.state`` and ``control.summaries``, with what that
    reader has seen so far (its ``watch`` task fills it)."""

    load: LoadProcess
    producer: AIOKafkaProducer
    state: AIOKafkaConsumer
    summaries_tp: TopicPartition
    requests_topic: str
    watched: dict[bytes, str]  # a trial target's breaker key (Decision.key) -> its node
    broker_pid: int | None
    seen: dict[str, list[Seen]]  # every record of a target, in order
    # Per shard summary key and boundary, how many times it was published (once is the contract).
    summaries: dict[tuple[bytes, int], int] = field(default_factory=dict)
    # Per shard (a summary's key), the newest boundary it published a summary for: the slowest
    # shard says how far behind the daemons are (the shards' decisions share one topic).
    newest: dict[bytes, int] = field(default_factory=dict)
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def behind_s(self, wall_ms: int) -> float:
        return max(0.0, (wall_ms - min(self.newest.values(), default=0)) / 1000.0)

    def routed(self, node_id: str) -> bool:
        """A router following control.state sends calls to the node: its newest breaker record is
        not an enforced open."""
        got = self.seen[node_id]
        return not got or not (got[-1].state == "open" and got[-1].enforced)

    async def watch(self) -> None:
        while not self.stop.is_set():
            batch = await self.state.getmany(timeout_ms=200)
            now = clock.monotonic_s()
            wall = clock.wall_ms()
            for part, records in batch.items():
                if part == self.summaries_tp:
                    for r in records:
                        at = (r.key or b"", int(orjson.loads(r.value)["ts_ms"]))
                        self.summaries[at] = self.summaries.get(at, 0) + 1
                        self.newest[at[0]] = max(self.newest.get(at[0], 0), at[1])
                    continue
                for r in records:
                    node_id = self.watched.get(r.key or b"")
                    if node_id is None:
                        continue  # only the trial targets' breakers are read (10,000 nodes: ~5k a tick)
                    d = orjson.loads(r.value)
                    body = d["body"]
                    self.seen[node_id].append(
                        Seen(int(d["ts_ms"]), body["state"], bool(body["enforced"]), body.get("until_ms"),
                             str(body.get("reason", "")), now, wall, r.timestamp)
                    )  # fmt: skip

    def cpu_now(self) -> dict[str, float | None]:
        daemons = self.daemons
        each = {f"daemon{k}": _cpu_s(d.pid, children=True) for k, d in enumerate(daemons)}
        return {
            "generator": _cpu_s(self.load.pid),
            "broker": _cpu_s(self.broker_pid, children=True),
            # The daemons' own processes (as the earlier results measured them), then with their
            # checkpoint children, in all and one by one: where a missed trial's cores went.
            "daemons": sum(c for d in daemons if (c := _cpu_s(d.pid)) is not None) if daemons else None,
            "daemons_with_children": sum(c for c in each.values() if c is not None) if daemons else None,
            **each,
            "bench": clock.cpu_s(),
            "machine": _machine_busy_s(),
        }


@dataclass(slots=True)
class _Trip:
    """One trial's failed calls: when they started (monotonic), where the node's records from then
    on begin in ``_Open.seen``, how many were sent, the trigger's ack (monotonic) and its tick
    boundary, and the node's first enforced open after them (None: none came)."""

    started: float
    first_seen: int
    failed: int = 0
    sent_at: float | None = None
    boundary: int | None = None
    opened: Seen | None = None


@dataclass(slots=True)
class _Trials:
    """The trials of a run: each plays the router that keeps sending failed calls to its node."""

    run: _Open
    args: argparse.Namespace
    tick_ms: int
    threshold: int
    pool_locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def trial(self, k: int, pool: Any, node_id: str, start_at: float) -> dict[str, Any]:
        """One trial: the router's failing calls to ``node_id`` until its first enforced ejection
        ends (or none came within ``FIRST_OPEN_TIMEOUT_S`` of the trigger)."""
        await asyncio.sleep(max(0.0, start_at - clock.monotonic_s()))
        lock = self.pool_locks.setdefault(pool.pool_id, asyncio.Lock())
        async with lock:
            row: dict[str, Any] = {
                "node": node_id,
                "pool": pool.pool_id,
                "daemons_behind_s": round(self.run.behind_s(clock.wall_ms()), 2),
                "generator_lag_s": round(self.run.load.stats.get(LAG_NOW_S), 3),
                "load_average": _loadavg(),
            }
            self.run.load.take(k)
            await asyncio.sleep(PAUSE_AFTER_TAKE_S)
            trip = await self._fail_until_ejection_ends(pool, node_id)
            self.run.load.take(k, taken=False)
            self._figures(k, node_id, row, trip)
            return row

    async def _fail_until_ejection_ends(self, pool: Any, node_id: str) -> _Trip:
        """The router's failed calls to the node, at its rate while the node is routed, until the
        node's first enforced ejection after them ends (or none came in time)."""
        run = self.run
        interval_s = 1.0 / self.args.outcomes_per_node  # a router's calls to one node of its pool
        trip = _Trip(started=clock.monotonic_s(), first_seen=len(run.seen[node_id]))
        next_call = trip.started
        while True:
            now = clock.monotonic_s()
            if trip.opened is None:
                mine = run.seen[node_id][trip.first_seen :]
                trip.opened = next((x for x in mine if x.state == "open" and x.enforced), None)
            opened = trip.opened
            if (
                opened is not None
                and clock.wall_ms() >= (opened.until_ms or opened.ts_ms) + AFTER_END_S * 1000
            ):
                break  # its first ejection ended (a probe came, or the end passed): watched to the end
            if opened is None and trip.sent_at is not None and now - trip.sent_at > FIRST_OPEN_TIMEOUT_S:
                break
            if (
                opened is None
                and trip.sent_at is None
                and now - trip.started > FIRST_OPEN_TIMEOUT_S + self.threshold * interval_s
            ):
                break
            if run.routed(node_id) and now >= next_call:
                ts = clock.wall_ms()
                fut = await run.producer.send(
                    run.requests_topic, value=_failure(node_id, pool.pool_id, pool.model, ts, trip.failed),
                    key=pool.pool_id.encode(),
                )  # fmt: skip
                meta = await fut
                trip.failed += 1
                next_call += interval_s
                if trip.failed == self.threshold:
                    trip.sent_at = clock.monotonic_s()
                    # its tick's cut has it
                    trip.boundary = -(-meta.timestamp // self.tick_ms) * self.tick_ms
            elif not run.routed(node_id):
                next_call = max(next_call, now)  # a router sends nothing while the node is out
            await asyncio.sleep(0.01)
        return trip

    def _figures(self, k: int, node_id: str, row: dict[str, Any], trip: _Trip) -> None:
        """The trial's figures into its row, and its progress line."""
        mine = self.run.seen[node_id][trip.first_seen :]
        opened, sent_at, boundary, failed = trip.opened, trip.sent_at, trip.boundary, trip.failed
        row["failed_calls"] = failed
        row["boundary_ms"] = boundary
        flaps = releases([(x.ts_ms, x.state, x.enforced, x.until_ms) for x in mine])
        row["flaps"] = len(flaps)
        row["flaps_at_ms_before_end"] = [
            (opened.until_ms - t) if opened is not None and opened.until_ms is not None else None
            for t in flaps
        ]
        before = [x for x in mine if opened is None or x.arrived_s < opened.arrived_s]
        row["detected_before_open"] = sorted(
            {x.reason for x in before if x.state == "open" and not x.enforced}
        )
        trials, threshold = self.args.trials, self.threshold
        if opened is not None and sent_at is not None and boundary is not None:
            row["latency_ms"] = round((opened.arrived_s - sent_at) * 1000.0, 1)
            row["after_boundary_ms"] = float(opened.arrived_wall_ms - boundary)
            row["staged_after_boundary_ms"] = float(opened.record_ts_ms - boundary)
            row["from_first_failure_ms"] = round((opened.arrived_s - trip.started) * 1000.0, 1)
            row["ejected_until_ms"] = opened.until_ms
            row["backoff_ms"] = None if opened.until_ms is None else opened.until_ms - opened.ts_ms
            progress(
                f"  trial {k + 1}/{trials} ({node_id}): enforced open {row['latency_ms']:,.0f} ms "
                f"after its {threshold}th failure in a row ({row['after_boundary_ms']:,.0f} ms after its "
                f"tick boundary), {len(flaps)} flap(s) in its {(row['backoff_ms'] or 0) / 1000:.0f} s "
                f"ejection; daemons {row['daemons_behind_s']:.1f} s behind, load {row['load_average']}"
            )
        else:
            row["latency_ms"] = None
            progress(
                f"  trial {k + 1}/{trials} ({node_id}): no enforced open within "
                f"{FIRST_OPEN_TIMEOUT_S:.0f} s of its trigger ({failed} failed calls; daemons "
                f"{row['daemons_behind_s']:.1f} s behind, generator lag {row['generator_lag_s']:.2f} s)"
            )


@dataclass(slots=True)
class _Timed:
    """The trials' rows, and what the run measured around them: the daemons' lag when they began,
    their wall seconds, CPU per part before and after, and the generator's counters at their start."""

    per_trial: list[dict[str, Any]]
    behind_at_start: float
    wall_trials: float
    cpu0: dict[str, float | None]
    cpu1: dict[str, float | None]
    sent0: float
    load_cpu0: float
    load_wall0: float


async def _run(
    bootstrap: str, prefix: str, args: argparse.Namespace, log_path: str, broker_pid: int | None
) -> dict[str, Any]:
    policy = builtin_policy("default")
    fleet = bench_fleet(args.nodes)
    targets = [(fleet.pools[i], node) for i, node in trial_targets(fleet, args.trials)]
    run = await _open(bootstrap, prefix, args, targets, broker_pid)
    trials = _Trials(run, args, policy.tick_ms, error_threshold(policy))
    run.tasks.append(asyncio.create_task(run.watch()))
    try:
        await _start(run, bootstrap, prefix, args, log_path)
        await _wait_for_decisions(run.state, prefix, timeout_s=180.0)
        timed = await _time_trials(run, trials, targets)
    finally:
        await _close(run)
    return _report(args, trials, timed, n_pools=len(fleet.pools), log_path=log_path)


async def _open(
    bootstrap: str,
    prefix: str,
    args: argparse.Namespace,
    targets: list[tuple[Any, str]],
    broker_pid: int | None,
) -> _Open:
    """The load generator (not started), the bench's producer, and its reader of control.state and
    control.summaries from their ends."""
    topics = (topic_name(prefix, TELEMETRY), topic_name(prefix, REQUESTS))
    # Every node with a queue of at least one call: loaded pools, no idle node to take over a
    # failing one's work (the engine reads any queue as a full node).
    spec = LoadSpec(bootstrap, topics, args.nodes, args.outcomes_per_node, args.trials, min_queue=1)
    load = LoadProcess(spec)
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
    return _Open(
        load=load,
        producer=producer,
        state=state,
        summaries_tp=summaries_tp,
        requests_topic=topics[1],
        watched={f"breaker/node/{node}".encode(): node for _, node in targets},  # Decision.key
        broker_pid=broker_pid,
        seen={node: [] for _, node in targets},
    )


async def _start(run: _Open, bootstrap: str, prefix: str, args: argparse.Namespace, log_path: str) -> None:
    """The load generator, then ``--daemons`` daemons in one consumer group."""
    run.load.start()
    if not await run.load.wait_ready(60.0):
        raise UsageError("fleetloop bench latency: the load generator did not start")
    for k in range(args.daemons):
        # Each daemon in a session of its own, as a service runs: where the kernel shares CPU
        # between sessions (Linux autogroups), N daemons started from the bench's session would
        # share one session's slice with the broker and the generator (stopped in ``finally``).
        with open(f"{log_path}.{k}", "wb") as log:
            run.daemons.append(subprocess.Popen(
                [sys.executable, "-m", "fleetloop.cli.main", "run", "--bootstrap-servers", bootstrap,
                 "--topic-prefix", prefix, "--group-id", f"bench-{prefix}", *overload_args(args)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509 (see die_with_parent)
            ))  # fmt: skip
    progress(f"  warming up: {args.nodes:,} nodes reporting, waiting for the daemon's first decisions")


async def _time_trials(run: _Open, trials: _Trials, targets: list[tuple[Any, str]]) -> _Timed:
    """After the warm-up, every trial side by side, with the CPU each part used meanwhile."""
    load, tick_ms = run.load, trials.tick_ms
    # Give every node a window of history (a node's first ticks are its warm-up, and each
    # target serves ok calls for a while before it fails), and the daemons time to decide the
    # boundaries they are behind on (at most 300 s more: at 10,000 nodes they start about a
    # minute behind, the history read and the group's joins).
    await asyncio.sleep(10.0)
    deadline = clock.monotonic_s() + 300.0
    while run.behind_s(clock.wall_ms()) > 3 * tick_ms / 1000.0 and clock.monotonic_s() < deadline:
        await asyncio.sleep(0.5)
    behind_at_start = run.behind_s(clock.wall_ms())
    progress(
        f"  trials begin: daemons {behind_at_start:.1f} s behind, generator lag "
        f"{load.stats.get(LAG_NOW_S):.2f} s, load average {_loadavg()}; each trial watches its "
        f"node to the end of its ejection"
    )
    cpu0 = run.cpu_now()
    wall0 = clock.monotonic_s()
    sent0, load_cpu0, load_wall0 = (load.stats.get(i) for i in (SENT, CPU_S, WALL_S))
    # Started 1.0-1.8 s apart (different phases of the tick), side by side in distinct pools.
    starts = [wall0 + sum(1.0 + (j % 3) * 0.37 for j in range(k)) for k in range(len(targets))]
    per_trial = list(
        await asyncio.gather(
            *(
                trials.trial(k, pool, node, at)
                for k, ((pool, node), at) in enumerate(zip(targets, starts, strict=True))
            )
        )
    )
    wall_trials = clock.monotonic_s() - wall0
    cpu1 = run.cpu_now()
    return _Timed(per_trial, behind_at_start, wall_trials, cpu0, cpu1, sent0, load_cpu0, load_wall0)


async def _close(run: _Open) -> None:
    """Everything the run holds open, stopped: the reader's task, the generator, the daemons (killed
    after 30 s), the reader and the producer."""
    run.stop.set()
    for t in run.tasks:
        t.cancel()
    for t in run.tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
    run.load.stop()
    stop_processes(run.daemons)
    await run.state.stop()
    await run.producer.stop()


def _cpu_per_s(timed: _Timed) -> dict[str, float | None]:
    """CPU per second of wall time during the trials, per part: where the machine's time went,
    with ``other`` what the machine ran besides this bench's processes."""
    cpu0, cpu1, wall_trials = timed.cpu0, timed.cpu1, timed.wall_trials
    cpu_per_s = {
        k: round((cpu1[k] or 0.0) - (cpu0.get(k) or 0.0), 3) / wall_trials if wall_trials else None
        for k in cpu1
        if cpu1[k] is not None
    }
    machine = cpu_per_s.get("machine")
    if machine is not None:  # what the machine ran besides this bench's processes
        ours = ("generator", "broker", "daemons_with_children", "bench")
        cpu_per_s["other"] = max(0.0, machine - sum(cpu_per_s.get(k) or 0.0 for k in ours))
    return cpu_per_s


def _report(
    args: argparse.Namespace, trials: _Trials, timed: _Timed, *, n_pools: int, log_path: str
) -> dict[str, Any]:
    """The run's figures (the JSON object ``--json`` prints)."""
    run, tick_ms, per_trial = trials.run, trials.tick_ms, timed.per_trial
    load, summaries = run.load, run.summaries
    latencies = [r["latency_ms"] for r in per_trial if r.get("latency_ms") is not None]
    after_boundary = [r["after_boundary_ms"] for r in per_trial if r.get("latency_ms") is not None]
    staged_after = [r["staged_after_boundary_ms"] for r in per_trial if r.get("latency_ms") is not None]
    missed = len(per_trial) - len(latencies)
    flaps = sum(r["flaps"] for r in per_trial)
    target = tick_ms + 100.0
    p99 = pct(latencies, 99) if latencies else None
    with open(f"{log_path}.0", "rb") as f:
        log_tail = f.read()[-2000:].decode(errors="replace")
    load_wall = load.stats.get(WALL_S) - timed.load_wall0
    cpu_per_s = _cpu_per_s(timed)
    return {
        "bench": "latency",
        "nodes": args.nodes,
        "daemons": args.daemons,
        "outcomes_per_node": args.outcomes_per_node,
        "error_threshold": trials.threshold,
        # How far the slowest shard's newest summary (its newest decided boundary) lagged the wall
        # clock when the trials began, and at worst when a trial began.
        "daemon_behind_s_at_start": round(timed.behind_at_start, 1),
        "daemon_behind_s_max": max((r["daemons_behind_s"] for r in per_trial), default=None),
        # Boundaries each daemon published as skipped for overload (None: not known, see
        # overload_skipped), and the limit they ran with (None: the daemon's default).
        "overload_max_ticks": getattr(args, "overload_max_ticks", None),
        "ticks_overload": [overload_skipped(f"{log_path}.{k}") for k in range(args.daemons)],
        "pools": n_pools,
        "events_per_s": int(args.nodes * (1 + args.outcomes_per_node)),
        "trials": args.trials,
        "missed": missed,
        "tick_ms": tick_ms,
        "p50_ms": round(pct(latencies, 50), 1) if latencies else None,
        "p99_ms": round(p99, 1) if p99 is not None else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        # Releases of an enforced ejection before its end, over all trials, and the trials with any.
        "flaps": flaps,
        "trials_with_flaps": sum(1 for r in per_trial if r["flaps"]),
        # Trials whose node was published open but not enforced before its enforced open.
        "trials_detected_first": sum(1 for r in per_trial if r["detected_before_open"]),
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
        "load_generator_records_per_s": round((load.stats.get(SENT) - timed.sent0) / load_wall, 1)
        if load_wall
        else None,
        "load_generator_max_lag_s": round(load.stats.get(LAG_MAX_S), 3),
        "load_generator_late_slices": int(load.stats.get(SLICES_LATE)),
        "load_generator_max_ack_wait_s": round(load.stats.get(ACK_MAX_S), 3),
        "load_generator_cpu_per_s": round((load.stats.get(CPU_S) - timed.load_cpu0) / load_wall, 3)
        if load_wall
        else None,
        "cpu_per_s_during_trials": {k: round(v, 3) for k, v in cpu_per_s.items() if v is not None},
        "cores": os.cpu_count(),
        # Each daemon's consumer loop over its whole run (its "loop" log lines): the share of wall
        # time it ran, was runnable but not run (the machine busy), and waited (on the broker, or
        # with nothing to decide), and the phases that took the most wall time.
        "daemon_loops": [loop_shares(f"{log_path}.{k}") for k in range(args.daemons)],
        # Each daemon's stability over its run ("daemon stopped" line): longest loop stall and GC
        # pause (wall, and without waiting for a core), its assignments, and the group's beyond its
        # start-up's (rebalances_beyond_start).
        "daemon_stability": (stable := [stability(f"{log_path}.{k}") for k in range(args.daemons)]),
        "rebalances_beyond_start": rebalances_beyond_start([x["assignments"] for x in stable]),
        # The after-boundary part by stage, from the daemons' "trip path" lines (runtime.TripTrace)
        # joined to the trials by boundary: per stage p50 / p99 / max ms after the boundary.
        "trip_path_ms": trip_path_stages(
            per_trial, [f"{log_path}.{k}" for k in range(args.daemons)], tick_ms
        ),
        "load_average_min": min((r["load_average"] for r in per_trial), default=None),
        "load_average_max": max((r["load_average"] for r in per_trial), default=None),
        "per_trial": per_trial,
        "target_ms": target,
        "met": p99 is not None and missed == 0 and flaps == 0 and p99 <= target,
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
    if not 0.0 < args.outcomes_per_node <= 100.0:
        # Zero would leave the targets without the ok traffic the bench is about (and a router
        # with no call to send them).
        raise UsageError("fleetloop bench latency: --outcomes-per-node must be above 0 and at most 100")
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
            return await _run(broker.bootstrap_servers, prefix, args, daemon_log_path(args, tmp), broker.pid)

        # SIGTERM (a timeout, a supervisor) stops the run as Ctrl-C does: the daemons, in sessions
        # of their own, are stopped by the run's ``finally``, not left behind.
        with sigterm_as_ctrl_c():
            result = asyncio.run(main())
        result["broker"] = args.broker
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_table(result)
    return 0


def print_table(result: dict[str, Any]) -> None:
    """The run as people read it: one row per trial, then the figures against the target."""
    t = Table(
        title=f"a hard-failing node in a loaded pool: {result['nodes']:,} nodes ({result['pools']} pools, "
        f"~{result['events_per_s']:,} events/s, {result['broker']}, {result['daemons']} daemon(s))"
    )
    for col, justify in (
        ("trial", "right"), ("node", "left"), ("failed calls", "right"), ("to enforced open, ms", "right"),
        ("after its boundary, ms", "right"), ("detected first", "left"), ("ejected for, s", "right"),
        ("flaps", "right"), ("load", "right"),
    ):  # fmt: skip
        t.add_column(col, justify=justify)  # type: ignore[arg-type]

    def ms(x: float | None) -> str:
        return "missed" if x is None else f"{x:,.0f}"

    for k, r in enumerate(result["per_trial"]):
        backoff = r.get("backoff_ms")
        t.add_row(
            str(k + 1), r["node"], str(r["failed_calls"]), ms(r.get("latency_ms")),
            "" if r.get("latency_ms") is None else ms(r.get("after_boundary_ms")),
            ", ".join(x.split(":", 1)[-1] for x in r["detected_before_open"]) or "-",
            "" if backoff is None else f"{backoff / 1000:.0f}", str(r["flaps"]), str(r["load_average"]),
        )  # fmt: skip
    console = term.console()
    console.print(t)
    met = "met" if result["met"] else "NOT met"
    console.print(
        f"time to an enforced open (from the broker's ack of the {result['error_threshold']}th failure in a "
        f"row): p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms; missed "
        f"{result['missed']}/{result['trials']}; after the tick boundary p50 "
        f"{result['after_boundary_p50_ms']} ms, p99 {result['after_boundary_p99_ms']} ms"
    )
    console.print(
        f"flaps (releases of an enforced ejection before its end): {result['flaps']} in "
        f"{result['trials_with_flaps']} of {result['trials']} trials; published open but not enforced "
        f"first in {result['trials_detected_first']} trials"
    )
    stalls = [x.get("loop_stall_max_ms") for x in result.get("daemon_stability", [])]
    own = [x.get("loop_stall_own_max_ms") for x in result.get("daemon_stability", [])]
    pauses = [x.get("gc_pause_max_ms") for x in result.get("daemon_stability", [])]
    console.print(
        f"stability per daemon: longest loop stall {stalls} ms ({own} ms not waiting for a core), longest "
        f"GC pause {pauses} ms; rebalances beyond the start-up's: {result.get('rebalances_beyond_start')}"
    )
    console.print(
        f"target: p99 <= {result['target_ms']:.0f} ms with no flap: {met} (load average "
        f"{result['load_average_min']}-{result['load_average_max']} during the trials; shard summaries "
        f"published twice for one boundary: {result['summaries_repeated']} of {result['summaries']})"
    )
