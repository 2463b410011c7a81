"""The background load of ``fleetloop bench latency``, cheap enough for 10,000 nodes: its own process.

Every node reports telemetry once a second, each on its own phase (the second is cut in
``SLICES`` slices; node ``i`` reports in slice ``i % SLICES``) with a queue depth drawn each time
(Poisson(1), plus ``LoadSpec.min_queue``), and routers report about
``per_node`` ok calls per node per second, spread the same way, on every node: the trial targets
too, which serve ok traffic like the rest until their trial takes them over (``LoadProcess.take``:
from then on the bench itself reports the calls a router sends them, failing, and the generator
none). Records are stamped with the wall time of their slice.

Why a module and a process of its own: one ``await producer.send`` per record plus one
``orjson.dumps`` of a 30-field dict cost ~15-20 us a record in the bench's own event loop; at
10,000 nodes (15,000 records a second) that loop, which also reads ``control.state`` and times the
trials, fell 90-198 s behind in a 20-trial run. Here each node's record is encoded
once: the bytes that change every second (the time stamp and the queue depth of a telemetry
record; the time stamp, request id, workflow id and step of an outcome) are written in front of
the node's pre-encoded tail, and each record is appended to a record batch per topic partition
(the partition the client's own murmur2 partitioner picks for the pool id, as ``send`` would),
about 2 us a record. A slice's batches are handed to the client together; the previous slice's
acks are awaited before the next slice is sent, so a broker that cannot keep up shows as lag.

The parent reads the generator's figures through shared memory while it runs (``LoadStats``):
records sent, the current and the largest lag behind the schedule, the process's CPU seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import multiprocessing.synchronize
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from multiprocessing.sharedctypes import SynchronizedArray
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from fleetloop import clock
from fleetloop.bench.fleetgen import Fleet, make_fleet, telemetry_at
from fleetloop.daemon.children import die_with_parent
from fleetloop.daemon.cli_common import quiet_client_logs

SLICES = 20  # the load goes out in 50 ms slices, stamped with the wall time of each
FLEET_SEED = 11
_TELEMETRY_HEAD = b'{"ts_ms":%d,"queue_depth":%d,'
_OUTCOME_HEAD = b'{"ts_ms":%d,"request_id":"bg-%d","workflow_id":"bg-%d","step_index":%d,'

# Shared figures, one float each (index into LoadStats.values).
SENT, LAG_NOW_S, LAG_MAX_S, CPU_S, WALL_S, SLICES_LATE, ACK_MAX_S = range(7)


def bench_fleet(n_nodes: int) -> Fleet:
    """The fleet the latency bench plays: no degraded node (the trial targets are the failures)."""
    return make_fleet(n_nodes, seed=FLEET_SEED, degraded_per_1000=0.0)


def add_overload_arg(p: Any) -> None:
    """The benches' ``--overload-max-ticks``, passed on to each ``fleetloop run`` they start."""
    p.add_argument(
        "--overload-max-ticks",
        type=int,
        default=None,
        metavar="N",
        help="passed to each fleetloop run (its default, 2, when not given; 0: decide every boundary "
        "however late)",
    )


def add_daemon_log_arg(p: Any) -> None:
    """The benches' ``--daemon-log PATH``: keep the daemons' logs (a temporary file otherwise)."""
    p.add_argument(
        "--daemon-log",
        default=None,
        metavar="PATH",
        help="write the daemon's log to PATH (bench latency: PATH.0, PATH.1, ... one per daemon) "
        "instead of a temporary file removed at the end",
    )


def daemon_log_path(args: Any, tmp: str) -> str:
    """Where the benches write the daemon's log: ``--daemon-log``, or ``daemon.log`` in ``tmp``
    (read with getattr: an args namespace built without the flag runs as without it)."""
    kept = getattr(args, "daemon_log", None)
    return str(kept) if kept else f"{tmp}/daemon.log"


def loop_shares(log_path: str) -> dict[str, Any] | None:
    """A daemon's consumer loop over its run, from its "loop" log lines (``runtime.LoopTimes``):
    the shares of wall time it ran (``cpu``), was runnable but not run (``runq``) and waited
    (``waiting``), and each phase's share of wall time, largest first. None: no such line."""
    totals: dict[str, float] = {}
    phases: dict[str, float] = {}
    gc_max = 0.0
    with contextlib.suppress(OSError), open(log_path, "rb") as f:
        for line in f:
            if b" loop " not in line or b"window_s=" not in line:
                continue
            for key, value in re.findall(rb"(\w+)=(\S+)", line):
                k = key.decode()
                if k in ("window_s", "cpu_s", "runq_s", "waiting_s", "gc_s", "gc_full"):
                    totals[k] = totals.get(k, 0.0) + float(value)
                elif k == "gc_max_s":
                    gc_max = max(gc_max, float(value))
                elif b"/" in value:
                    phases[k] = phases.get(k, 0.0) + float(value.split(b"/")[0])
    window = totals.get("window_s", 0.0)
    if not window:
        return None
    return {
        "window_s": round(window, 1),
        "cpu": round(totals.get("cpu_s", 0.0) / window, 3),
        "runq": round(totals.get("runq_s", 0.0) / window, 3),
        "waiting": round(totals.get("waiting_s", 0.0) / window, 3),
        "phases": {k: round(v / window, 3) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])},
        # The cyclic collector's pauses (the loop waits through each): share of wall time, the
        # longest, and how many full collections.
        "gc": round(totals.get("gc_s", 0.0) / window, 4),
        "gc_max_s": round(gc_max, 3),
        "gc_full": int(totals.get("gc_full", 0.0)),
    }


def overload_args(args: Any) -> list[str]:
    """``fleetloop run`` flags for the benches' ``--overload-max-ticks`` (none: the daemon's default)."""
    n = getattr(args, "overload_max_ticks", None)
    return [] if n is None else ["--overload-max-ticks", str(int(n))]


def overload_skipped(log_path: str) -> int | None:
    """Boundaries a daemon published as skipped for overload (``ticks_overload`` on its "daemon
    stopped" line; None: the line is not there, e.g. a daemon killed, or a tree without the rule)."""
    return stopped_figure(log_path, "ticks_overload")


def stopped_figure(log_path: str, name: str) -> int | None:
    """A figure of a daemon's "daemon stopped" line (``DaemonStats.summary``), the last such line's;
    None: no such line, or a daemon that did not report that figure."""
    found = None
    pattern = re.compile(re.escape(name.encode()) + rb"[\"=: ]+(\d+)")
    with contextlib.suppress(OSError), open(log_path, "rb") as f:
        for line in f:
            if b"daemon stopped" in line:
                m = pattern.search(line)
                found = int(m.group(1)) if m else found
    return found


def stability(log_path: str) -> dict[str, int | None]:
    """A daemon's stability over its run, from its "daemon stopped" line: the longest event-loop
    stall and collector pause (ms; ``_own_``: without the time its thread waited for a core), and
    its partition assignments (1: never rebalanced)."""
    names = (
        "loop_stall_max_ms",
        "gc_pause_max_ms",
        "loop_stall_own_max_ms",
        "gc_pause_own_max_ms",
        "assignments",
    )
    return {k: stopped_figure(log_path, k) for k in names}


def stopped_stalls(log_path: str) -> list[str]:
    """A daemon's longest loop stalls from its "daemon stopped" line (``DaemonStats.stalls_shown``):
    each ``own/wall ms@where``, longest first (empty: none noted, or not reported)."""
    found: list[str] = []
    pattern = re.compile(rb"stalls[\"=: ]+\"?([^\s\"]+)")
    with contextlib.suppress(OSError), open(log_path, "rb") as f:
        for line in f:
            if b"daemon stopped" in line:
                m = pattern.search(line)
                if m:
                    shown = m.group(1).decode(errors="replace")
                    found = [] if shown == "none" else shown.split(";")
    return found


def rebalances_beyond_start(assignments: list[int | None]) -> int | None:
    """The assignments of N daemons of one group beyond what their start-up explains: each daemon
    that joins hands every member already there (and itself) one assignment, so N daemons starting
    in any order get at most N(N+1)/2 between them; the rest are rebalances of a running group.
    None when a daemon's figure is not known."""
    if any(a is None for a in assignments):
        return None
    n = len(assignments)
    return max(0, sum(a or 0 for a in assignments) - n * (n + 1) // 2)


def trial_targets(fleet: Fleet, trials: int) -> list[tuple[int, str]]:
    """The nodes to trip, one per trial, spread over the pools: (pool index, node id). Pools are
    stepped through by 7, or the next stride that shares no factor with the pool count, so
    consecutive trials land in distinct pools (trials run side by side, one per pool at a time)."""
    pools = fleet.pools
    stride = next(s for s in range(7, 7 + len(pools) + 1) if math.gcd(s, len(pools)) == 1)
    out = []
    for k in range(trials):
        i = (k * stride) % len(pools)
        out.append((i, pools[i].node_ids[k % len(pools[i].node_ids)]))
    return out


def _tail(row: dict[str, Any], drop: Sequence[str]) -> bytes:
    """The record's JSON without the fields in ``drop`` and without its opening brace."""
    encoded = orjson.dumps({k: v for k, v in row.items() if k not in drop})
    assert encoded.startswith(b"{")
    return encoded[1:]


@dataclass(slots=True)
class Templates:
    """Per node: its telemetry tail, its topic partition, and (for callable nodes) its outcome tail."""

    telemetry: list[bytes]
    keys: list[bytes]  # the pool id of each node: the record key
    part: list[int]  # the partition of each node's pool on the input topics
    callable: list[int]  # nodes the background load calls (every node)
    outcome: dict[int, bytes]
    targets: list[int]  # the trial targets' rows, in trial order


def templates(fleet: Fleet, targets: Sequence[str], partitions: int) -> Templates:
    """Pre-encode every node's records (the constant part), once; ``targets`` are the trial
    targets' node ids, in trial order."""
    partitioner = DefaultPartitioner()
    parts = list(range(partitions))
    rows = [t.model_dump(mode="json") for t in telemetry_at(fleet, 0)]
    tel = [_tail(r, ("ts_ms", "queue_depth")) for r in rows]
    keys = [r["pool_id"].encode() for r in rows]
    by_pool = {k: int(partitioner(k, parts, parts)) for k in set(keys)}
    callable_ = list(range(len(rows)))
    row_of = {r["node_id"]: i for i, r in enumerate(rows)}
    outcome = {
        i: _tail(
            {
                "tenant_id": "background",
                "priority": 1,
                "latency_budget_ms": 30_000,
                "pool_id": rows[i]["pool_id"],
                "node_id": rows[i]["node_id"],
                "model": rows[i]["model"],
                "prompt_tokens": 1500,
                "output_tokens": 150,
                "ttft_ms": 300.0,
                "e2e_ms": 3000.0,
                "outcome": "ok",
            },
            (),
        )
        for i in callable_
    }
    return Templates(tel, keys, [by_pool[k] for k in keys], callable_, outcome, [row_of[n] for n in targets])


class Slices:
    """Builds the records of one slice: (topic index, partition, key, value); topic 0 is
    telemetry, 1 is outcomes."""

    def __init__(self, fleet: Fleet, tpl: Templates, per_node: float, min_queue: int = 0) -> None:
        self.fleet = fleet
        self.tpl = tpl
        self.per_node = per_node
        self.min_queue = min_queue
        self.calls = 0

    def records(self, k: int, ts_ms: int, taken: Collection[int] = ()) -> list[tuple[int, int, bytes, bytes]]:
        """Slice ``k``'s records; no call on the rows in ``taken`` (targets whose trial runs)."""
        tpl = self.tpl
        rng = self.fleet.rng
        n = len(tpl.telemetry)
        nodes = range(k, n, SLICES)
        queue = (rng.poisson(1.0, len(nodes)) + self.min_queue).tolist()
        out = [
            (0, tpl.part[i], tpl.keys[i], (_TELEMETRY_HEAD % (ts_ms, q)) + tpl.telemetry[i])
            for i, q in zip(nodes, queue, strict=True)
        ]
        n_calls = int(n * self.per_node / SLICES)
        if n_calls and tpl.callable:
            picks = rng.integers(0, len(tpl.callable), n_calls).tolist()
            calls = self.calls
            for j in picks:
                i = tpl.callable[j]
                if i in taken:
                    continue
                calls += 1
                head = _OUTCOME_HEAD % (ts_ms, calls, calls // 4, calls % 4)
                out.append((1, tpl.part[i], tpl.keys[i], head + tpl.outcome[i]))
            self.calls = calls
        return out


class LoadStats:
    """Figures shared by the generator process with the parent (lock-free floats)."""

    def __init__(self, ctx: Any) -> None:
        self.values: SynchronizedArray[float] = ctx.Array("d", 7, lock=False)

    def get(self, i: int) -> float:
        return float(self.values[i])


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What to play: where, on which topics (telemetry, outcomes), how many nodes and calls."""

    bootstrap: str
    topics: tuple[str, str]
    n_nodes: int
    per_node: float
    trials: int  # the first ``trials`` targets of trial_targets(): ``LoadProcess.take`` names them
    # Every node's queue depth is at least this (and a Poisson(1) draw above it): with 1, every
    # pool is loaded, no node idle (bench latency's common case: no spare capacity anywhere).
    min_queue: int = 0


async def play(
    spec: LoadSpec,
    stop: multiprocessing.synchronize.Event,
    ready: multiprocessing.synchronize.Event,
    stats: LoadStats,
    taken: Any = (),
) -> None:
    """Produce the load in real time until ``stop`` is set; no call on a target while its flag in
    ``taken`` (one per trial target, shared with the parent) is set."""
    fleet = bench_fleet(spec.n_nodes)
    targets = [node for _, node in trial_targets(fleet, spec.trials)]
    topics = spec.topics
    producer = AIOKafkaProducer(bootstrap_servers=spec.bootstrap, acks="all", max_batch_size=1_048_576)
    await producer.start()
    try:
        partitions = len(await producer.partitions_for(topics[0]))
        if len(await producer.partitions_for(topics[1])) != partitions:
            raise RuntimeError("the telemetry and outcome topics must have as many partitions")
        slices = Slices(fleet, templates(fleet, targets, partitions), spec.per_node, spec.min_queue)
        rows = slices.tpl.targets
        ready.set()
        v = stats.values
        cpu0, wall0 = clock.cpu_s(), clock.monotonic_s()
        next_s = wall0
        k = 0
        pending: list[asyncio.Future[Any]] = []
        while not stop.is_set():
            ts = clock.wall_ms()
            builders: dict[tuple[int, int], Any] = {}
            full: list[tuple[int, int, Any]] = []
            records = slices.records(k % SLICES, ts, {rows[t] for t in range(len(rows)) if taken[t]})
            for t, p, key, value in records:
                b = builders.get((t, p))
                if b is None:
                    b = builders[(t, p)] = producer.create_batch()
                if b.append(timestamp=None, key=key, value=value) is None:
                    full.append((t, p, b))
                    b = builders[(t, p)] = producer.create_batch()
                    b.append(timestamp=None, key=key, value=value)
            if pending:  # the previous slice's acks: a broker that falls behind shows as lag
                waited = clock.monotonic_s()
                await asyncio.gather(*pending)
                v[ACK_MAX_S] = max(v[ACK_MAX_S], clock.monotonic_s() - waited)
            pending = []
            for t, p, b in [*full, *((t, p, b) for (t, p), b in builders.items())]:
                b.close()
                pending.append(await producer.send_batch(b, topics[t], partition=p))
            v[SENT] += len(records)
            k += 1
            next_s += 1.0 / SLICES
            lag = max(0.0, clock.monotonic_s() - next_s)
            v[LAG_NOW_S] = lag
            v[LAG_MAX_S] = max(v[LAG_MAX_S], lag)
            v[SLICES_LATE] += 1.0 if lag > 1.0 / SLICES else 0.0
            v[CPU_S] = clock.cpu_s() - cpu0
            v[WALL_S] = clock.monotonic_s() - wall0
            await asyncio.sleep(max(0.0, next_s - clock.monotonic_s()))
        with contextlib.suppress(Exception):
            await asyncio.gather(*pending)
    finally:
        await producer.stop()


def _main(
    spec: LoadSpec,
    stop: multiprocessing.synchronize.Event,
    ready: multiprocessing.synchronize.Event,
    stats: LoadStats,
    taken: Any,
) -> None:
    # A SIGKILLed bench must not leave its generator producing: the kernel stops it with the
    # parent (and if the parent is already gone, there is nothing to produce for).
    die_with_parent()
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():
        return
    quiet_client_logs()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(play(spec, stop, ready, stats, taken))


class LoadProcess:
    """The generator in a process of its own (``spawn``: nothing of the parent's loop is shared)."""

    def __init__(self, spec: LoadSpec) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stats = LoadStats(ctx)
        self._taken: SynchronizedArray[int] = ctx.Array("b", max(1, spec.trials), lock=False)
        self._stop = ctx.Event()
        self._ready = ctx.Event()
        self._proc = ctx.Process(
            target=_main,
            args=(spec, self._stop, self._ready, self.stats, self._taken),
            name="fleetloop-bench-load",
            daemon=True,
        )

    def start(self) -> None:
        self._proc.start()

    async def wait_ready(self, timeout_s: float) -> bool:
        """True once the generator is producing; False if it died or did not start in time."""
        deadline = clock.monotonic_s() + timeout_s
        while clock.monotonic_s() < deadline:
            if self._ready.is_set():
                return True
            if not self._proc.is_alive():
                return False
            await asyncio.sleep(0.05)
        return False

    def take(self, trial: int, taken: bool = True) -> None:
        """Stop (or, ``taken=False``, resume) the background calls on trial ``trial``'s target: from
        the next slice the generator builds, it reports no call there (one in flight may still land)."""
        self._taken[trial] = 1 if taken else 0

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stop.set()
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5.0)
