"""``fleetloop bench sizing``: one daemon at the sizing rule's per-process size, in real time: does it
decide every tick of every pool, and how far behind the tick boundary?

``fleetloop bench sizing [--nodes 1500] [--seconds 60] [--outcomes-per-node 2] [--broker tansu|kafka]
[--daemons 1] [--session-timeout-s S] [--json]``

The sizing rule of docs/performance.md (about 1,500 nodes, ~4,500 events/s, per process at
one-second ticks) is what this measures end to end: a rule derived from per-event and per-pool costs
measured apart did not hold when the whole daemon ran.
It starts a broker and one daemon (``fleetloop run``, its own process, ticker on, default policy), and plays a
generated fleet of ``--nodes`` in real time: every node reports telemetry once a second and routers
report ``--outcomes-per-node`` calls per node per second, in 50 ms slices (the load generator of
``fleetloop bench latency``). After a warm-up (the daemon's first decisions, then 10 s), it measures
for ``--seconds``:

- **ticks**: every tick record the ticker published for a boundary inside the window, per pool,
  and whether a routing decision for that pool and tick id reached ``control.decisions`` (a pool
  with nodes gets one every tick); ticks published as skipped, and boundaries with no tick at all,
  count as not decided;
- **lag**: the decision record's broker timestamp minus its tick's boundary (p50, p99, max);
- **CPU**: the daemon process's CPU seconds per wall second (``/proc``), the share of one core the
  rule's size costs.

Then the load stops and the daemon decides what is left of the window's ticks:

- **cost**: the daemon's CPU seconds from its start until every pool's last tick of the window is
  decided, per second of fleet time decided by then (ticks decided / pools x the tick period;
  ``cpu_s_per_fleet_s``): what one second of this fleet costs one process, whether or not the
  machine gave it a core meanwhile (start-up counts too: the figure errs high), and from it the
  nodes one core serves at the rule's 70% busy.

With ``--daemons N`` the fleet is split by N daemons in one consumer group: the CPU figures are
their sum, with each one's share beside, and the stability figures the worst daemon's. And over
each daemon's whole run, from its "daemon stopped" line: the longest event-loop stall and
collector pause, and the group's assignments (``rebalances`` after the first); ``stable`` when it
never rebalanced and neither took more than 100 ms; ``nodes_per_half_core`` at the window's CPU share.
And where the loop's time went in its longest stalls (``loop_stalls_top``, the daemons' longest of
their own time, each with what the loop's thread ran meanwhile: ``own/wall ms@where``, ``+gcN``
when collector pauses took N ms of it).

Verdicts: ``keeps_up`` (real time): every tick in the window decided and the p99 lag within one
tick period; on a shared machine that gives the daemon less than a core this fails for the
machine's sake, and the daemon's CPU share says so. ``within_rule``: one second of the fleet costs
at most 0.7 CPU seconds (the rule's size must fit one core at 70% busy).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from fleetloop import clock
from fleetloop.bench.common import bench_broker, pct, progress, stop_processes, within
from fleetloop.bench.loadgen import (
    LAG_MAX_S,
    SENT,
    LoadProcess,
    LoadSpec,
    add_daemon_log_arg,
    add_overload_arg,
    bench_fleet,
    daemon_log_path,
    overload_args,
    overload_skipped,
    rebalances_beyond_start,
    stability,
    stopped_stalls,
)
from fleetloop.daemon.brokers import ensure_topics
from fleetloop.daemon.children import die_with_parent
from fleetloop.daemon.cli_common import UsageError
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.topics import DECISIONS, REQUESTS, TELEMETRY, TICKS, TOPICS, topic_name

RULE_NODES = 1500  # docs/performance.md: about 1,500 nodes (~4,500 events/s) per process at one-second ticks
RULE_CPU_FRAC = 0.7  # ... costing at most 70% of one core
STALL_MAX_MS = 100  # stable: the event loop never ran more than this late, nor a GC pause took longer
WARMUP_S = 10.0
CATCH_UP_S = 240.0  # after the window, at most this long for the daemon to decide its last ticks
SKIPPED_HEADER = "fleetloop.skipped"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sizing",
        help="one daemon at the sizing rule's size in real time: every tick decided? lag? CPU share?",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--nodes", type=int, default=RULE_NODES, help=f"fleet size (default {RULE_NODES})")
    p.add_argument("--seconds", type=float, default=60.0, help="measured window after warm-up (default 60)")
    p.add_argument(
        "--outcomes-per-node", type=float, default=2.0, help="routed calls per node per second (default 2)"
    )
    p.add_argument("--broker", choices=("tansu", "kafka"), default="tansu", help="default: tansu")
    p.add_argument(
        "--daemons",
        type=int,
        default=1,
        help="fleetloop run processes in one consumer group splitting the pools (default 1); the CPU "
        "and stability figures are per daemon",
    )
    p.add_argument(
        "--session-timeout-s",
        type=float,
        default=None,
        metavar="S",
        help="the daemon's consumer-group session timeout (default: the daemon's own)",
    )
    add_overload_arg(p)
    add_daemon_log_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=handle)


def session_args(args: argparse.Namespace) -> list[str]:
    s = getattr(args, "session_timeout_s", None)
    return [] if s is None else ["--session-timeout-s", str(s)]


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``); with ``children``,
    those of its children that ended and were waited for instead (the daemon's checkpoint
    encoders, forked: ``fleetloop.daemon.offload``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    at = 13 if children else 11
    return (int(fields[at]) + int(fields[at + 1])) / os.sysconf("SC_CLK_TCK")


async def _read_topic(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every record of ``topic`` now (all partitions, from the start)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_poll_records=20_000
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out: list[Any] = []
        deadline = clock.monotonic_s() + 60.0
        while clock.monotonic_s() < deadline:
            behind = [tp for tp in tps if await consumer.position(tp) < end[tp]]
            if not behind:
                break
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                out.extend(records)
        return out
    finally:
        await consumer.stop()


def judge(
    ticks: list[Any], decisions: list[Any], pools: set[str], *, t0_ms: int, t1_ms: int, tick_ms: int
) -> dict[str, Any]:
    """Ticks of boundaries in ``[t0_ms, t1_ms)``: expected (pools x boundaries), published, skipped,
    decided (a routing decision for the pool and tick id), and the decision lag in ms."""
    published: dict[tuple[str, int], int] = {}  # (pool, tick id) -> boundary ts_ms
    skipped = 0
    for r in ticks:
        tick = orjson.loads(r.value)
        if not t0_ms <= tick["ts_ms"] < t1_ms:
            continue
        if any(k == SKIPPED_HEADER for k, _ in r.headers or ()):
            skipped += 1
            continue
        published[(tick["pool_id"], tick["tick_id"])] = tick["ts_ms"]
    first: dict[tuple[str, int], int] = {}  # (pool, tick id) -> first decision's broker timestamp
    for r in decisions:
        d = orjson.loads(r.value)
        body = d["body"]
        if body.get("kind") != "routing":
            continue
        key = (body["pool_id"], d["tick_id"])
        if key in published and (key not in first or r.timestamp < first[key]):
            first[key] = r.timestamp
    boundaries = max(0, (t1_ms - t0_ms) // tick_ms)
    # A tick's id is its boundary in tick periods (what waiting for the last one relies on).
    ids_are_boundaries = all(tick_id * tick_ms == ts for (_, tick_id), ts in published.items())
    lags = [float(first[k] - published[k]) for k in sorted(first)]
    return {
        "boundaries": boundaries,
        "ticks_expected": boundaries * len(pools),
        "ticks_published": len(published),
        "ticks_skipped": skipped,
        "ticks_decided": len(first),
        "tick_ids_are_boundaries": ids_are_boundaries,
        "lag_p50_ms": round(pct(lags, 50), 1) if lags else None,
        "lag_p99_ms": round(pct(lags, 99), 1) if lags else None,
        "lag_max_ms": round(max(lags), 1) if lags else None,
    }


async def _decided_through(
    watch: AIOKafkaConsumer, tp: TopicPartition, pools: set[str], last_tick_id: int, timeout_s: float
) -> tuple[float | None, int]:
    """Seconds until every pool has a routing decision for tick ``last_tick_id`` or later on
    ``control.decisions`` (read from the start by ``watch``; None when that takes over
    ``timeout_s``), and how many ticks (pool, tick id) had been decided by then."""
    start = clock.monotonic_s()
    newest: dict[str, int] = {}
    decided: set[tuple[str, int]] = set()
    watch.assign([tp])
    await watch.seek_to_beginning(tp)
    while clock.monotonic_s() - start < timeout_s:
        batch = await watch.getmany(timeout_ms=500, max_records=50_000)
        for records in batch.values():
            for r in records:
                d = orjson.loads(r.value)
                body = d["body"]
                if body.get("kind") != "routing":
                    continue
                decided.add((body["pool_id"], d["tick_id"]))
                if d["tick_id"] > newest.get(body["pool_id"], -1):
                    newest[body["pool_id"]] = d["tick_id"]
        if all(newest.get(p, -1) >= last_tick_id for p in pools):
            return clock.monotonic_s() - start, len(decided)
    return None, len(decided)


@dataclass(slots=True)
class _Window:
    """The measured window, under load: its boundaries ``[t0_ms, t1_ms)``, its wall seconds, each
    daemon's CPU seconds in it, the records the generator sent in it and its largest lag."""

    t0_ms: int
    t1_ms: int
    wall: float
    cpus: list[float]
    events: float
    gen_lag: float


@dataclass(slots=True)
class _CatchUp:
    """After the load stopped: the seconds until every pool's last tick of the window was decided
    (None: not within ``CATCH_UP_S``), the ticks (pool, tick id) decided by then, and the daemons'
    CPU seconds since they started, their own and their checkpoint encoders'."""

    caught_up_s: float | None
    pool_ticks: int
    cpu_all: float
    children_all: float


async def _run(bootstrap: str, prefix: str, args: argparse.Namespace, log_path: str) -> dict[str, Any]:
    n_daemons = getattr(args, "daemons", 1)
    # One log per daemon: PATH for one (as before), PATH.0, PATH.1, ... for several.
    log_paths = [log_path] if n_daemons == 1 else [f"{log_path}.{k}" for k in range(n_daemons)]
    tick_ms = builtin_policy("default").tick_ms
    pools = {p.pool_id for p in bench_fleet(args.nodes).pools}
    topics = (topic_name(prefix, TELEMETRY), topic_name(prefix, REQUESTS))
    load = LoadProcess(LoadSpec(bootstrap, topics, args.nodes, args.outcomes_per_node, 0))
    load.start()
    daemons: list[subprocess.Popen[bytes]] = []
    decisions_tp = TopicPartition(topic_name(prefix, DECISIONS), 0)
    watch = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await watch.start()
    try:
        if not await load.wait_ready(60.0):
            raise UsageError("fleetloop bench sizing: the load generator did not start")
        _start_daemons(bootstrap, prefix, args, log_paths, daemons)
        await _warm_up(watch, decisions_tp, daemons, args.nodes)
        window = await _measure_window(args.seconds, load, daemons, tick_ms)
        # The load stops; the daemon decides what is left of the window's ticks. The CPU it spent
        # until its last tick is decided, per second of fleet time decided, is what one second of
        # this fleet costs, whether or not the machine gave it a core meanwhile.
        load.stop()
        progress("  load stopped; waiting for the daemon to decide the window's last ticks")
        caught_up_s, pool_ticks = await _decided_through(
            watch, decisions_tp, pools, window.t1_ms // tick_ms - 1, CATCH_UP_S
        )
        catch_up = _CatchUp(
            caught_up_s,
            pool_ticks,
            sum(cpu_seconds(d.pid) for d in daemons),  # since they started: start-up counts too
            sum(cpu_seconds(d.pid, children=True) for d in daemons),  # checkpoint encoders
        )
    finally:
        load.stop()
        stop_processes(daemons)
        await watch.stop()
    ticks = await _read_topic(bootstrap, topic_name(prefix, TICKS), TOPICS[TICKS].partitions)
    decisions = await _read_topic(bootstrap, topic_name(prefix, DECISIONS), TOPICS[DECISIONS].partitions)
    verdict = judge(ticks, decisions, pools, t0_ms=window.t0_ms, t1_ms=window.t1_ms, tick_ms=tick_ms)
    return _report(
        args,
        n_pools=len(pools),
        tick_ms=tick_ms,
        window=window,
        catch_up=catch_up,
        verdict=verdict,
        log_paths=log_paths,
    )


def _start_daemons(
    bootstrap: str,
    prefix: str,
    args: argparse.Namespace,
    log_paths: list[str],
    daemons: list[subprocess.Popen[bytes]],
) -> None:
    """One ``fleetloop run`` per log path, in one consumer group, appended to ``daemons`` as each
    starts (so the caller stops those that started when a later one fails to)."""
    for path in log_paths:
        with open(path, "wb") as log:
            daemons.append(subprocess.Popen(
                [sys.executable, "-m", "fleetloop.cli.main", "run", "--bootstrap-servers", bootstrap,
                 "--topic-prefix", prefix, "--group-id", f"bench-{prefix}", *overload_args(args),
                 *session_args(args)],
                stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,  # noqa: PLW1509 (see die_with_parent)
            ))  # fmt: skip


async def _warm_up(
    watch: AIOKafkaConsumer,
    decisions_tp: TopicPartition,
    daemons: list[subprocess.Popen[bytes]],
    nodes: int,
) -> None:
    """Until the daemons' first decision is on ``control.decisions`` (at most 180 s), then
    ``WARMUP_S`` more."""
    progress(f"  warming up: {nodes:,} nodes reporting, waiting for the daemon's first decisions")
    deadline = clock.monotonic_s() + 180.0
    while (await watch.end_offsets([decisions_tp])).get(decisions_tp, 0) == 0:
        if any(d.poll() is not None for d in daemons) or clock.monotonic_s() > deadline:
            raise UsageError("fleetloop bench sizing: the daemon published no decision within 180 s")
        await asyncio.sleep(0.5)
    await asyncio.sleep(WARMUP_S)


async def _measure_window(
    seconds: float, load: LoadProcess, daemons: list[subprocess.Popen[bytes]], tick_ms: int
) -> _Window:
    """``seconds`` under load from the next tick boundary, the daemons watched for an exit."""
    # The window starts at the next boundary and covers whole tick periods.
    t0_ms = (clock.wall_ms() // tick_ms + 1) * tick_ms
    await asyncio.sleep(max(0.0, t0_ms / 1000.0 - clock.wall_ms() / 1000.0))
    cpu0 = [cpu_seconds(d.pid) for d in daemons]
    wall0, sent0 = clock.monotonic_s(), load.stats.get(SENT)
    while clock.monotonic_s() - wall0 < seconds:
        await asyncio.sleep(min(5.0, seconds - (clock.monotonic_s() - wall0)))
        progress(f"  {clock.monotonic_s() - wall0:,.0f}/{seconds:,.0f} s")
        for d in daemons:
            if d.poll() is not None:
                raise UsageError(f"fleetloop bench sizing: a daemon exited ({d.returncode})")
    return _Window(
        t0_ms=t0_ms,
        t1_ms=t0_ms + int(seconds * 1000) // tick_ms * tick_ms,
        wall=clock.monotonic_s() - wall0,
        cpus=[cpu_seconds(d.pid) - c0 for d, c0 in zip(daemons, cpu0, strict=True)],
        events=load.stats.get(SENT) - sent0,
        gen_lag=load.stats.get(LAG_MAX_S),  # the largest since it started (warm-up included)
    )


def _report(
    args: argparse.Namespace,
    *,
    n_pools: int,
    tick_ms: int,
    window: _Window,
    catch_up: _CatchUp,
    verdict: dict[str, Any],
    log_paths: list[str],
) -> dict[str, Any]:
    """The run's figures and verdicts (the JSON object ``--json`` prints)."""
    n_daemons = len(log_paths)
    wall, cpus = window.wall, window.cpus
    cpu = sum(cpus)
    cpu_all, children_all, caught_up_s = catch_up.cpu_all, catch_up.children_all, catch_up.caught_up_s
    cpu_frac = cpu / wall if wall > 0 else None
    # Fleet time the daemon decided by then: every pool's ticks decided, in tick periods (a
    # partition ahead of the others decides past the window meanwhile; that counts too).
    fleet_s = catch_up.pool_ticks / n_pools * tick_ms / 1000.0
    per_fleet_s = cpu_all / fleet_s if caught_up_s is not None and fleet_s > 0 else None
    # Per daemon; the run's figure is the worst daemon's, and the rebalances the group's beyond its
    # start-up's (rebalances_beyond_start).
    per_daemon = [stability(path) for path in log_paths]
    stall = _worst(x["loop_stall_max_ms"] for x in per_daemon)
    gc_pause = _worst(x["gc_pause_max_ms"] for x in per_daemon)
    rebalances = rebalances_beyond_start([x["assignments"] for x in per_daemon])
    cpu_frac_max = max(cpus) / wall if wall > 0 else None
    keeps_up = (
        verdict["ticks_expected"] > 0
        and verdict["ticks_decided"] == verdict["ticks_expected"]
        and verdict["lag_p99_ms"] is not None
        and verdict["lag_p99_ms"] <= tick_ms
    )
    return {
        "bench": "sizing",
        "nodes": args.nodes,
        "pools": n_pools,
        "partitions": TOPICS[TELEMETRY].partitions,
        "tick_ms": tick_ms,
        "seconds": round(wall, 1),
        "events_per_s": round(window.events / wall) if wall > 0 else None,
        "daemon_cpu_s": round(cpu, 2),
        "daemon_cpu_frac": round(cpu_frac, 3) if cpu_frac is not None else None,
        **verdict,
        "caught_up_after_s": round(caught_up_s, 1) if caught_up_s is not None else None,
        "fleet_s_decided": round(fleet_s, 1),
        "daemon_cpu_s_total": round(cpu_all, 2),
        "cpu_s_per_fleet_s": round(per_fleet_s, 3) if per_fleet_s is not None else None,
        # The forked checkpoint encoders' CPU, not in the figures above (a child's CPU is its own).
        "children_cpu_s_total": round(children_all, 2),
        "children_cpu_s_per_fleet_s": (
            round(children_all / fleet_s, 3) if caught_up_s is not None and fleet_s > 0 else None
        ),
        "nodes_per_core_at_rule_busy": (
            int(args.nodes * RULE_CPU_FRAC / per_fleet_s) if per_fleet_s else None
        ),
        "load_generator_max_lag_s": round(window.gen_lag, 3),
        # Boundaries the daemon published as skipped for overload over its whole run (None: not
        # known), and the limit it ran with (None: the daemon's default).
        "overload_max_ticks": getattr(args, "overload_max_ticks", None),
        "ticks_overload": _total(overload_skipped(path) for path in log_paths),
        # Stability over the daemon's whole run (start-up and restore included), from its "daemon
        # stopped" line: the longest the event loop ran late (its heartbeats with it), the longest
        # collector pause, and the group's assignments (1: never rebalanced). None: not reported.
        "daemons": n_daemons,
        "loop_stall_max_ms": stall,
        "gc_pause_max_ms": gc_pause,
        # ... without the time a daemon's loop thread waited for a core: its own work's share.
        "loop_stall_own_max_ms": _worst(x["loop_stall_own_max_ms"] for x in per_daemon),
        "gc_pause_own_max_ms": _worst(x["gc_pause_own_max_ms"] for x in per_daemon),
        "daemon_stability": per_daemon,
        # The longest stalls of the loop's own time over the daemons' runs, with what ran.
        "loop_stalls_top": top_stalls([stopped_stalls(path) for path in log_paths]),
        "rebalances": rebalances,
        "stable": (
            None
            if stall is None or gc_pause is None or rebalances is None
            else rebalances == 0 and stall <= STALL_MAX_MS and gc_pause <= STALL_MAX_MS
        ),
        # Each daemon's share of a core in the window (the busiest's is the one that counts), and
        # the nodes one daemon serves at half a core at that share.
        "daemon_cpu_frac_each": [round(c / wall, 3) for c in cpus] if wall > 0 else None,
        "nodes_per_half_core": int(args.nodes / n_daemons * 0.5 / cpu_frac_max) if cpu_frac_max else None,
        "keeps_up": keeps_up,
        "within_rule": per_fleet_s is not None and per_fleet_s <= RULE_CPU_FRAC,
        "rule": {"nodes": RULE_NODES, "cpu_frac": RULE_CPU_FRAC},
    }


def top_stalls(per_daemon: list[list[str]], n: int = 5) -> list[str]:
    """The ``n`` longest of the daemons' stalls (``own/wall ms@where``), by the loop's own time,
    each prefixed with its daemon's index when there are several."""
    tagged = [(s, k) for k, stalls in enumerate(per_daemon) for s in stalls]

    def own(item: tuple[str, int]) -> float:
        head = item[0].split("/", 1)[0]
        return float(head) if head.replace(".", "", 1).isdigit() else 0.0

    tagged.sort(key=own, reverse=True)
    return [s if len(per_daemon) == 1 else f"d{k}:{s}" for s, k in tagged[:n]]


def _worst(values: Any) -> int | None:
    got = list(values)
    return None if not got or any(v is None for v in got) else max(got)


def _total(values: Any) -> int | None:
    got = list(values)
    return None if any(v is None for v in got) else sum(got)


def _yes(v: bool | None) -> str:
    return "unknown" if v is None else "yes" if v else "NO"


def handle(args: argparse.Namespace) -> int:
    within("sizing", "--nodes", args.nodes, 16, 100_000)
    within("sizing", "--seconds", args.seconds, 5, 3600)
    within("sizing", "--outcomes-per-node", args.outcomes_per_node, 0, 100)
    within("sizing", "--daemons", args.daemons, 1, 8)
    with (
        bench_broker("sizing", args.broker) as broker,
        tempfile.TemporaryDirectory(prefix="fleetloop-sizing-") as tmp,
    ):
        prefix = f"size-{uuid.uuid4().hex[:8]}"
        log_path = daemon_log_path(args, tmp)

        async def main() -> dict[str, Any]:
            await ensure_topics(broker.bootstrap_servers, prefix)
            return await _run(broker.bootstrap_servers, prefix, args, log_path)

        result = asyncio.run(main())
        result["broker"] = args.broker
        if not result["keeps_up"]:
            first_log = log_path if args.daemons == 1 else f"{log_path}.0"
            with open(first_log, "rb") as f:
                result["daemon_log_tail"] = f.read()[-2000:].decode(errors="replace")
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        r = result
        sys.stdout.write(
            f"sizing: {r['nodes']:,} nodes in {r['pools']} pools, {r['events_per_s']:,} events/s, "
            f"{r['partitions']} partitions, {r['daemons']} daemon(s) ({r['broker']}), {r['seconds']:.0f} s:\n"
            f"  ticks decided {r['ticks_decided']:,}/{r['ticks_expected']:,} (published "
            f"{r['ticks_published']:,}, skipped {r['ticks_skipped']}); decision lag after the boundary "
            f"p50 {r['lag_p50_ms']} ms, p99 {r['lag_p99_ms']} ms, max {r['lag_max_ms']} ms\n"
            f"  daemon CPU {r['daemon_cpu_frac']:.2f} of one core in the window (each: "
            f"{r['daemon_cpu_frac_each']}); keeps up in real time: "
            f"{'yes' if r['keeps_up'] else 'NO'}\n"
            f"  cost: {r['cpu_s_per_fleet_s']} CPU-s per fleet-second (window decided "
            f"{r['caught_up_after_s']} s after the load stopped) = about "
            f"{r['nodes_per_core_at_rule_busy'] or 0:,} nodes per core at {RULE_CPU_FRAC:.0%} busy; "
            f"within the rule: {'yes' if r['within_rule'] else 'NO'}\n"
            f"  stability over the run: longest loop stall {r['loop_stall_max_ms']} ms "
            f"({r['loop_stall_own_max_ms']} ms not waiting for a core), longest GC pause "
            f"{r['gc_pause_max_ms']} ms ({r['gc_pause_own_max_ms']} ms), rebalances {r['rebalances']}; "
            f"stable (no rebalance, both within "
            f"{STALL_MAX_MS} ms): {_yes(r['stable'])}; about {r['nodes_per_half_core'] or 0:,} nodes per "
            f"daemon at half a core\n"
            f"  longest stalls (own/wall ms@what ran): "
            f"{', '.join(r['loop_stalls_top']) or 'none over 50 ms'}\n"
        )
    return 0
