"""``fleetloop bench decide``: how long one whole-fleet decision tick takes, and what it holds.

``fleetloop bench decide [--nodes 1000,10000,100000] [--ticks 20] [--policy FILE] [--workflows N]
[--profile FILE] [--gc daemon|python] [--records twin|model] [--json]``

For each fleet size it generates a fleet (:mod:`fleetloop.bench.fleetgen`: pools of 16-64 nodes,
five GPU types, four models, four regions, a few degraded nodes), folds one telemetry report per node
and about one router outcome per node every second through the real model, and times one whole-fleet
tick the way the daemon runs it: one snapshot at the tick's event time, shared by every pool, then
the engine's decision for every pool in order. ``--warmup`` seconds run first (untimed) so the
policies' memories are as full as in a running daemon. It prints p50/p99 per size, the growth
exponent of p50 against N (a log-log fit: 1 is linear), the time to fold one second of input, the
RSS the model and policy state added, and the shared snapshot's own CPU time (a part of the tick).
With ``--workflows N`` it then opens N workflows in the
ledger at the largest size of at most 10,000 nodes and measures RSS and ticks again (the ledger's
worst case: every task still open). The garbage collector runs with the daemon's settings
(``--gc daemon``, what ``fleetloop run`` sets at start: a tick allocates tens of thousands of
objects, and with Python's default thresholds full collections over the whole model land inside
ticks; as its loop does between batches, what survives a collection is frozen; and, as the daemon
decides a boundary, the collector is held over the fold and the tick, and a young collection that
came due meanwhile runs after the fold or after the tick: a pause of its own, reported beside the
tick's figures with the other collections of its second); ``--gc python`` measures
with Python's defaults. The records folded are what the daemon
folds (``--records twin``, the default: the msgspec twins its shard decodes, one batch fold per
topic and second); ``--records model`` folds the wire models one call per record.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import sys
from collections.abc import Iterable
from dataclasses import fields
from itertools import islice
from typing import Any

import orjson
from rich.table import Table

from fleetloop import clock, term
from fleetloop.bench.common import growth_exponent, pct, progress, rss_mib
from fleetloop.bench.fleetgen import BASE_TS_MS, make_fleet, outcomes_at, telemetry_at
from fleetloop.core.decide.engine import Engine, envelope_of
from fleetloop.core.model.fleet import FleetModel, ModelConfig, snapshot
from fleetloop.daemon.cli_common import UsageError, policy_from
from fleetloop.daemon.runtime import DaemonConfig, tune_gc
from fleetloop.daemon.runtime.telemetry import CollectorHold, freeze_survivors
from fleetloop.policies.registry import CompiledPolicy
from fleetloop.schemas.control import Tick
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN

TARGET_P99_MS_AT_10K = 50.0
TARGET_RSS_MIB = 1024.0
# What `fleetloop run` sets at start (``DaemonConfig.gc_gen0_threshold``'s default).
DAEMON_GEN0: int = next(f.default for f in fields(DaemonConfig) if f.name == "gc_gen0_threshold")  # type: ignore[assignment]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "decide",
        help="time one whole-fleet decision tick at several fleet sizes",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument(
        "--nodes", default="1000,10000", metavar="N,N,...", help="fleet sizes (default 1000,10000)"
    )
    p.add_argument("--ticks", type=int, default=20, help="timed ticks per size (>= 20 for a p99; default 20)")
    # The policies' memories fill over a lead: slo-predictive's demand trend and open-workflow
    # samples span the cold start (120 s by default). Timed earlier, a tick costs what a daemon's
    # first two minutes cost (slo-predictive about 10 ms at 10,000 nodes, against about 30-45 ms
    # with a full lead of history), not what it costs from then on.
    p.add_argument(
        "--warmup", type=int, default=150, help="untimed seconds first (default 150: a full lead of history)"
    )
    p.add_argument("--policy", metavar="FILE", help="policy document (default: policies/default.yaml)")
    p.add_argument(
        "--workflows",
        type=int,
        default=0,
        metavar="N",
        help="then open N workflows at the size nearest 10,000 and measure again (e.g. 1000000)",
    )
    p.add_argument("--profile", metavar="FILE", help="write a cProfile summary of the largest size's ticks")
    p.add_argument(
        "--gc",
        choices=("daemon", "python"),
        default="daemon",
        help="garbage collector settings: the daemon's (gc.freeze at start, young generation every"
        f" {DAEMON_GEN0:,} allocations, held over the fold and the tick, what came due collected"
        " after them; default) or Python's defaults",
    )
    # Twins by default: the daemon's shard decodes msgspec twins and folds them in one batch per
    # topic, and the snapshot reads their attributes; the wire models cost the fold and the
    # snapshot's column reads 1.4-2x more, so folding them would overstate both.
    p.add_argument(
        "--records",
        choices=("model", "twin"),
        default="twin",
        help="what is folded: the msgspec twins in one batch fold per topic and second, as the"
        " daemon's shard decodes and folds them (default), or the wire models, one fold call per"
        " record",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=handle)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"fleetloop bench decide: --nodes: not a list of integers: {text!r}") from None
    if not sizes or any(n < 16 or n > 1_000_000 for n in sizes):
        raise UsageError("fleetloop bench decide: --nodes: each size must be within 16..1000000")
    return sorted(set(sizes))


class GcClock:
    """The cyclic collector's own CPU time, by generation, read from ``gc.callbacks``: installed
    for the bench's run, read between phases (:meth:`take`). A collection's time is part of
    whatever phase it lands in (the tick's CPU time includes it); this says how much and which
    generation."""

    def __init__(self) -> None:
        self.ms = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._t0 = 0.0
        self.freeze_due = False  # a collection ended since survivors were last frozen
        self.longest_ms = 0.0  # the longest single collection since the bench last reset it

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = clock.cpu_s()
        else:
            g = info["generation"]
            took = (clock.cpu_s() - self._t0) * 1000.0
            self.ms[g] += took
            self.longest_ms = max(self.longest_ms, took)
            self.count[g] += 1
            self.freeze_due = True

    def take(self) -> tuple[list[float], list[int]]:
        """What was collected since the last take: (ms per generation, collections per generation)."""
        out = (self.ms, self.count)
        self.ms, self.count = [0.0, 0.0, 0.0], [0, 0, 0]
        return out

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def fleet_tick(
    model: FleetModel,
    engine: Engine,
    ts_ms: int,
    pools: list[str],
    snapshot_cpu_ms: list[float] | None = None,
) -> int:
    """One tick for every pool, as the daemon decides a boundary's ticks: one shared snapshot (its
    CPU time appended to ``snapshot_cpu_ms`` when given), every pool in one ``decide_many``."""
    policy = engine.policy
    env = envelope_of(policy)
    c0 = clock.cpu_s()
    snap = snapshot(model, ts_ms, window_ms=env.window_ms, stale_after_ms=env.stale_after_ms)
    if snapshot_cpu_ms is not None:
        snapshot_cpu_ms.append((clock.cpu_s() - c0) * 1000.0)
    tick_id = ts_ms // policy.tick_ms
    results = engine.tick_many(snap, [Tick(ts_ms=ts_ms, tick_id=tick_id, pool_id=pool) for pool in pools])
    return sum(len(r.decisions) for r in results)


def run_size(
    n_nodes: int,
    *,
    policy: CompiledPolicy,
    ticks: int,
    warmup: int,
    workflows: int = 0,
    profile: cProfile.Profile | None = None,
    records: str = "twin",
    tuned_gc: bool = False,
) -> dict[str, Any]:
    """One size's ticks; ``tuned_gc``: the collector runs as the daemon's (survivors frozen between
    the fold and the tick, as its loop does between batches; held over the fold and the tick and
    its young collection run after the tick, as the daemon's decide holds it, :class:`CollectorHold`)."""
    gc.collect()
    rss0 = rss_mib()
    fleet = make_fleet(n_nodes)
    pools = sorted(fleet.pool_ids)
    # The workflow phase measures one model holding all ``workflows`` open at once (the worst case
    # for one daemon), so the open-workflow cap is raised to hold them instead of letting the
    # earliest go.
    cap = max(ModelConfig().max_open_workflows, workflows)
    model = FleetModel(ModelConfig(max_open_workflows=cap))
    engine = Engine(policy)
    ts = BASE_TS_MS
    tick_ms: list[float] = []
    tick_cpu_ms: list[float] = []
    fold_ms: list[float] = []
    snap_ms: list[float] = []
    decisions = 0
    twins = records == "twin"
    gc_tick_ms: list[float] = []  # the collector's CPU time inside each timed tick
    gc_ticks = [0, 0, 0]  # collections inside the timed ticks, by generation
    gc_folds = [0, 0, 0]  # and inside their folds
    # The rest of each timed tick's second: its records' decoding, between its fold and its
    # decide, and after it (the collection the hold put off): collections by generation, their CPU
    # per tick, and the longest single collection anywhere in the timed seconds.
    gc_outside = [0, 0, 0]
    gc_outside_ms: list[float] = []
    gc_longest_ms = 0.0
    hold = CollectorHold(DAEMON_GEN0 if tuned_gc else 0)
    with GcClock() as gc_clock:
        for k in range(warmup + ticks):
            timed = k >= warmup
            gc_clock.take()
            gc_clock.longest_ms = 0.0
            ts += policy.tick_ms
            tel: list[Any]
            out: list[Any]
            if twins:  # record by record, as the daemon decodes them: a second's wire models
                # held at once were 8 young collections a second of the bench's own
                tel = [TELEMETRY_TWIN.of(t) for t in telemetry_at(fleet, ts)]
                out = [OUTCOME_TWIN.of(o) for o in outcomes_at(fleet, ts, workflow_base=k * n_nodes * 2)]
            else:
                tel = list(telemetry_at(fleet, ts))
                out = list(outcomes_at(fleet, ts, workflow_base=k * n_nodes * 2))
            decode_ms, in_decode = gc_clock.take()
            freeze_survivors(gc_clock, tuned_gc)
            hold.hold()  # as the daemon decides a boundary: its fold and its decide
            c0 = clock.cpu_s()
            if twins:  # as the shard folds what it decoded: one batch per topic
                model.fold_telemetries(tel)
                model.fold_outcomes(out)
            else:
                for t in tel:
                    model.fold_telemetry(t)
                for o in out:
                    model.fold_outcome(o)
            c_fold = clock.cpu_s()
            _, in_fold = gc_clock.take()
            hold.relieve()  # the decider's turn after its fold steps
            between_ms, between = gc_clock.take()
            freeze_survivors(gc_clock, tuned_gc)
            c1, t1 = clock.cpu_s(), clock.monotonic_s()
            if timed and profile is not None:
                profile.enable()
            snap_cpu: list[float] = []
            decisions = fleet_tick(model, engine, ts, pools, snap_cpu)
            c2, t2 = clock.cpu_s(), clock.monotonic_s()
            gc_ms, in_tick = gc_clock.take()
            if timed and profile is not None:
                profile.disable()
            hold.release()  # the decisions are out: the collection the hold put off, when due
            after_ms, after = gc_clock.take()
            if timed:
                fold_ms.append((c_fold - c0) * 1000.0)
                tick_ms.append((t2 - t1) * 1000.0)
                tick_cpu_ms.append((c2 - c1) * 1000.0)
                snap_ms.extend(snap_cpu)
                gc_tick_ms.append(sum(gc_ms))
                gc_outside_ms.append(sum(decode_ms) + sum(between_ms) + sum(after_ms))
                gc_longest_ms = max(gc_longest_ms, gc_clock.longest_ms)
                for g in range(3):
                    gc_ticks[g] += in_tick[g]
                    gc_folds[g] += in_fold[g]
                    gc_outside[g] += in_decode[g] + between[g] + after[g]
            if k % 5 == 0 or timed:
                progress(f"  {n_nodes:,} nodes: tick {k + 1}/{warmup + ticks} ({(t2 - t1) * 1000.0:,.1f} ms)")
    del tel, out
    gc.collect()
    row: dict[str, Any] = {
        "nodes": n_nodes,
        "pools": len(pools),
        "ticks": ticks,
        "tick_p50_ms": round(pct(tick_ms, 50), 2),
        "tick_p99_ms": round(pct(tick_ms, 99), 2),
        "tick_cpu_p50_ms": round(pct(tick_cpu_ms, 50), 2),
        "tick_cpu_p99_ms": round(pct(tick_cpu_ms, 99), 2),
        "per_pool_cpu_p50_ms": round(pct(tick_cpu_ms, 50) / len(pools), 3),
        # The shared snapshot alone (part of the tick above): the model frozen as columns.
        "snapshot_cpu_p50_ms": round(pct(snap_ms, 50), 2),
        "snapshot_cpu_p99_ms": round(pct(snap_ms, 99), 2),
        "fold_1s_cpu_p50_ms": round(pct(fold_ms, 50), 2),
        "decisions_per_tick": decisions,
        # The cyclic collector inside the timed ticks (part of their CPU time): its CPU per tick,
        # and how many collections of each generation landed in the ticks and in the folds.
        "gc_in_tick_cpu_p50_ms": round(pct(gc_tick_ms, 50), 2),
        "gc_in_tick_cpu_max_ms": round(max(gc_tick_ms, default=0.0), 2),
        "gc_collections_in_ticks": gc_ticks,
        "gc_collections_in_folds": gc_folds,
        # And in the rest of each timed tick's second (its records' decoding, between its fold and
        # its tick, after the tick: with the daemon's settings the collector is held over the fold
        # and the tick, and what came due runs after it), each a pause of the loop of its own; their
        # CPU per tick, and the longest single collection in the timed seconds.
        "gc_collections_outside_ticks": gc_outside,
        "gc_outside_tick_cpu_p50_ms": round(pct(gc_outside_ms, 50), 2),
        "gc_outside_tick_cpu_max_ms": round(max(gc_outside_ms, default=0.0), 2),
        "gc_longest_cpu_ms": round(gc_longest_ms, 2),
        "rss_added_mib": round(rss_mib() - rss0, 1),
    }
    if workflows:
        row["workflows"] = _with_workflows(
            fleet, model, engine, pools, ts=ts, n=workflows, ticks=ticks, twins=twins
        )
    return row


FOLD_BATCH = 5_000  # records per batch fold in the workflow phase: about one fetch's worth


def _fold(model: FleetModel, tel: Iterable[Any], out: Iterable[Any], *, twins: bool) -> int:
    """Fold one second's records as they are generated; returns the outcomes folded. Twins as the
    shard folds them (batch folds, at most ``FOLD_BATCH`` records each, as the daemon folds a
    fetch: a second of 100,000 outcomes converted at once left the process ~200 MiB larger after
    it was freed), wire models one call per record."""
    n = 0
    if twins:
        tels = iter(tel)
        while tel_batch := [TELEMETRY_TWIN.of(t) for t in islice(tels, FOLD_BATCH)]:
            model.fold_telemetries(tel_batch)
        outs = iter(out)
        while out_batch := [OUTCOME_TWIN.of(o) for o in islice(outs, FOLD_BATCH)]:
            model.fold_outcomes(out_batch)
            n += len(out_batch)
        return n
    for t in tel:
        model.fold_telemetry(t)
    for o in out:
        model.fold_outcome(o)
        n += 1
    return n


def _with_workflows(
    fleet: Any,
    model: FleetModel,
    engine: Engine,
    pools: list[str],
    *,
    ts: int,
    n: int,
    ticks: int,
    twins: bool = False,
) -> dict[str, Any]:
    """Open ``n`` workflows (one call each, none finished), then tick again and measure RSS. The
    records are folded as the size's other phases fold them (``twins``). When the ledger is then
    full (its cap is ``n``, or lower), one more second of new tasks is folded, each letting go of
    the earliest open one, and its CPU per outcome is reported beside the opening's (a fold that
    let go in O(open tasks) would be several times slower there)."""
    gc.collect()
    rss0 = rss_mib()
    opened = 0
    sent = 0  # workflow ids used so far: each outcome opens a new one
    per_s = max(1, n // 10)
    open_cpu = 0.0

    def new_tasks(ts: int, count: int) -> tuple[int, float]:
        """Fold a second's telemetry, then ``count`` outcomes of new tasks; (outcomes, their CPU s)."""
        _fold(model, telemetry_at(fleet, ts), (), twins=twins)
        out = outcomes_at(fleet, ts, count / fleet.n_nodes, workflow_base=10**9 + sent, open_only=True)
        c0 = clock.cpu_s()
        k = _fold(model, (), out, twins=twins)
        return k, clock.cpu_s() - c0

    while opened < n:
        chunk = min(per_s, n - opened)
        ts += engine.policy.tick_ms
        if chunk / fleet.n_nodes < 1e-9:
            break
        k, cpu_s = new_tasks(ts, chunk)
        sent += k
        open_cpu += cpu_s
        before, opened = opened, len(model.ledger.active)
        progress(f"  {fleet.n_nodes:,} nodes: {opened:,} open workflows")
        if opened <= before:
            break  # the model holds no more (a cap): measure what it holds
    at_cap: dict[str, Any] = {}
    if sent and len(model.ledger.active) >= model.config.max_open_workflows:
        ts += engine.policy.tick_ms
        handed0, opening = model.ledger.tasks_handed_off, sent
        k, cpu_s = new_tasks(ts, per_s)
        sent += k
        below = open_cpu / opening * 1e6
        full = cpu_s / max(1, k) * 1e6
        at_cap = {
            "new_task_us_below_cap": round(below, 2),
            "new_task_us_at_cap": round(full, 2),
            "at_cap_ratio": round(full / below, 2) if below > 0 else None,
            "handed_off_at_cap": model.ledger.tasks_handed_off - handed0,
        }
    gc.collect()
    times: list[float] = []
    cpu: list[float] = []
    for _ in range(ticks):
        ts += engine.policy.tick_ms
        _fold(model, telemetry_at(fleet, ts), (), twins=twins)
        c0, t0 = clock.cpu_s(), clock.monotonic_s()
        fleet_tick(model, engine, ts, pools)
        times.append((clock.monotonic_s() - t0) * 1000.0)
        cpu.append((clock.cpu_s() - c0) * 1000.0)
    return {
        "open_workflows": len(model.ledger.active),
        "rss_added_mib": round(rss_mib() - rss0, 1),
        "rss_total_mib": round(rss_mib(), 1),
        "tick_p50_ms": round(pct(times, 50), 2),
        "tick_p99_ms": round(pct(times, 99), 2),
        "tick_cpu_p50_ms": round(pct(cpu, 50), 2),
        "tick_cpu_p99_ms": round(pct(cpu, 99), 2),
        **at_cap,
    }


def handle(args: argparse.Namespace) -> int:
    sizes = _sizes(args.nodes)
    if args.ticks < 1 or args.warmup < 0:
        raise UsageError("fleetloop bench decide: --ticks must be >= 1 and --warmup >= 0")
    if args.workflows < 0 or args.workflows > 10_000_000:
        raise UsageError("fleetloop bench decide: --workflows must be within 0..10000000")
    policy = policy_from(args.policy)
    wf_size = max((n for n in sizes if n <= 10_000), default=sizes[0]) if args.workflows else None
    rows: list[dict[str, Any]] = []
    profile = cProfile.Profile() if args.profile else None
    threshold = gc.get_threshold()
    if args.gc == "daemon":  # as `fleetloop run` starts (DaemonConfig.gc_gen0_threshold)
        tune_gc(DAEMON_GEN0)
    try:
        for n in sizes:
            progress(f"fleetloop bench decide: {n:,} nodes")
            rows.append(
                run_size(
                    n,
                    policy=policy,
                    ticks=args.ticks,
                    warmup=args.warmup,
                    workflows=args.workflows if n == wf_size else 0,
                    profile=profile if n == sizes[-1] else None,
                    records=args.records,
                    tuned_gc=args.gc == "daemon",
                )
            )
    finally:
        if args.gc == "daemon":
            gc.enable()  # held over a tick that raised
            gc.unfreeze()
            gc.set_threshold(*threshold)
    exponent = growth_exponent([r["nodes"] for r in rows], [r["tick_cpu_p50_ms"] for r in rows])
    at10k = next((r for r in rows if r["nodes"] == 10_000), None)
    wf = next((r["workflows"] for r in rows if "workflows" in r), None)
    result: dict[str, Any] = {
        "bench": "decide",
        "policy": f"{policy.stamp.name} v{policy.stamp.version}",
        "python": sys.version.split()[0],
        "gc": args.gc,
        "records": args.records,
        "sizes": rows,
        "growth_exponent": round(exponent, 3) if exponent is not None else None,
        "targets": {
            "p99_ms_at_10k": TARGET_P99_MS_AT_10K,
            # Judged on CPU time: on a shared machine wall time also counts other processes' turns.
            "p99_at_10k_met": at10k["tick_cpu_p99_ms"] < TARGET_P99_MS_AT_10K if at10k else None,
            "growth_at_most_linear": exponent <= 1.15 if exponent is not None else None,
            "rss_mib_10k_1m_workflows": TARGET_RSS_MIB,
            "rss_met": wf["rss_total_mib"] < TARGET_RSS_MIB if wf else None,
        },
    }
    if profile is not None:
        buf = io.StringIO()
        stats = pstats.Stats(profile, stream=buf)
        stats.sort_stats("cumulative").print_stats(30)
        stats.sort_stats("tottime").print_stats(30)
        with open(args.profile, "w", encoding="utf-8") as f:
            f.write(buf.getvalue())
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print(result)
    return 0


def _print(result: dict[str, Any]) -> None:
    t = Table(title=f"whole-fleet decision tick, ms ({result['policy']})")
    cols = (
        "nodes",
        "pools",
        "wall p50",
        "wall p99",
        "CPU p50",
        "CPU p99",
        "CPU/pool",
        "snapshot p50",
        "fold 1 s",
        "RSS +MiB",
    )
    for col in cols:
        t.add_column(col, justify="right")
    for r in result["sizes"]:
        t.add_row(
            f"{r['nodes']:,}",
            str(r["pools"]),
            f"{r['tick_p50_ms']:,.1f}",
            f"{r['tick_p99_ms']:,.1f}",
            f"{r['tick_cpu_p50_ms']:,.1f}",
            f"{r['tick_cpu_p99_ms']:,.1f}",
            f"{r['per_pool_cpu_p50_ms']:.3f}",
            f"{r['snapshot_cpu_p50_ms']:,.1f}",
            f"{r['fold_1s_cpu_p50_ms']:,.1f}",
            f"{r['rss_added_mib']:,.0f}",
        )
    console = term.console()
    console.print(t)
    console.print(f"growth exponent of p50 against nodes (log-log): {result['growth_exponent']}")
    console.print(f"garbage collector: {result['gc']} settings")
    for r in result["sizes"]:
        console.print(
            f"{r['nodes']:,} nodes: collector CPU inside the ticks p50 {r['gc_in_tick_cpu_p50_ms']} ms"
            f" (collections {r['gc_collections_in_ticks']}), in the rest of their seconds p50"
            f" {r['gc_outside_tick_cpu_p50_ms']} ms, at most {r['gc_outside_tick_cpu_max_ms']} ms"
            f" (collections {r['gc_collections_outside_ticks']}); the longest collection"
            f" {r['gc_longest_cpu_ms']} ms"
        )
    for r in result["sizes"]:
        if "workflows" in r:
            w = r["workflows"]
            console.print(
                f"{r['nodes']:,} nodes + {w['open_workflows']:,} open workflows: tick CPU p50"
                f" {w['tick_cpu_p50_ms']} ms, p99 {w['tick_cpu_p99_ms']} ms,"
                f" RSS {w['rss_total_mib']:,.0f} MiB"
                f" (+{w['rss_added_mib']:,.0f} MiB for the workflows)"
            )
            if "new_task_us_at_cap" in w:
                console.print(
                    f"  the ledger full: a new task's outcome folds in {w['new_task_us_at_cap']} us"
                    f" CPU, {w['new_task_us_below_cap']} us below the cap (x{w['at_cap_ratio']};"
                    f" {w['handed_off_at_cap']:,} earliest tasks let go)"
                )
    console.print(f"targets: {result['targets']}")
