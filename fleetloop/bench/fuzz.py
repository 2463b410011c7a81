"""``fleetloop bench fuzz``: hostile records against a live daemon, compared with a clean run.

Two runs on fresh topics of the same broker, each with a daemon in this process and the same
small real fleet (``--pools`` pools of ``--nodes`` nodes, one node failing from tick 5 so breakers
move), tick by tick. The second run interleaves garbage with the real records on the same
partitions:

- ``--records`` mixed hostile records: malformed bytes, wrong types, NaN and infinities, 1e308
  and 10**400, negative values, event time in seconds / a day old / an hour or 75 years ahead,
  records of ~1 MB, forged ticks (far future for a real pool; unknown pools);
- floods of valid records: ``--flood-nodes`` node ids in one invented pool and ``--flood-pools``
  invented pools (valid by the schema, so the model's caps, not the schema, must hold them);
- forged policies on ``control.policy``: version 10**15, a version beyond the schema, junk, 1 MB.

Every hostile record aimed at a real pool is one the door must refuse, so the real pools'
decisions must be the same bytes as in the clean run (input offsets aside: the garbage shifts
them). Figures: records sent, dead letters per reason, crashes, ticks missed, decisions differing,
takeover attempts (future event time, forged future ticks, forged policy versions) refused, the
model's refusals and evictions, RSS before and after.

The daemon runs with the production door except a one-hour past window (``-1 h / +30 s``), so the
clean and garbage runs can share event times however long the clean run takes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaProducer
from rich.table import Table

from fleetloop import clock, term
from fleetloop.bench.live import (
    BrokerInfo,
    RunningDaemon,
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
from fleetloop.daemon.observe.decode import Door
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.kafka_security import bootstrap_arg
from fleetloop.policies.registry import CompiledPolicy, builtin_policy
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.topics import POLICY, REQUESTS, TELEMETRY, TICKS, topic_name

YEAR_2100_MS = 4_102_444_800_000
FLOOD_NODES_POOL = "flood-nodes"
INVENTED_MODEL = "invented-model"
# Takeover attempts by category, and the reason kind of the dead letter that refuses each: the door
# refuses an event time far ahead (telemetry or a forged tick), the policy follower a forged version.
TAKEOVER = {
    "ts-future": "event-time-too-new",
    "tick-future": "event-time-too-new",
    "policy-version-jump": "policy-version-jump",
}


def register(sub: Any) -> None:
    p = sub.add_parser("fuzz", help="hostile records against a live daemon; compare with a clean run")
    p.add_argument(
        "--records", type=int, default=20_000, metavar="N", help="mixed hostile records (default 20000)"
    )
    p.add_argument(
        "--flood-nodes", type=int, default=100_000, metavar="N", help="node ids in one invented pool"
    )
    p.add_argument("--flood-pools", type=int, default=1_000, metavar="N", help="invented pool ids")
    p.add_argument("--ticks", type=int, default=20, metavar="N", help="ticks per run (default 20)")
    p.add_argument("--pools", type=int, default=3, metavar="N", help="real pools (default 3)")
    p.add_argument("--nodes", type=int, default=8, metavar="N", help="nodes per real pool (default 8)")
    p.add_argument("--seed", type=int, default=7)
    bootstrap_arg(p, required=False)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    p.set_defaults(handler=cmd_fuzz)


def cmd_fuzz(args: argparse.Namespace) -> int:
    for name in ("records", "flood_nodes", "flood_pools"):
        if not 0 <= getattr(args, name) <= 10_000_000:
            raise UsageError(
                f"fleetloop bench fuzz: --{name.replace('_', '-')} must be between 0 and 10000000"
            )
    if not 6 <= args.ticks <= 1000:
        raise UsageError("fleetloop bench fuzz: --ticks must be between 6 and 1000")
    if not 1 <= args.pools <= 50 or not 2 <= args.nodes <= 500:
        raise UsageError("fleetloop bench fuzz: --pools must be 1..50 and --nodes 2..500")
    result = run_live(args, "fuzz", fuzz, _print)
    ok = result["crashes"] == 0 and result["ticks"]["missed"] == 0 and result["decisions"]["differing"] == 0
    return 0 if ok else 1


# -- the records -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hostile:
    category: str
    logical: str
    key: bytes
    value: bytes


def _real_pools(n: int) -> list[str]:
    return [f"real-{i}" for i in range(n)]


def mixed(n: int, pools: Sequence[str], t0: int, rng: np.random.Generator) -> list[Hostile]:
    """``n`` hostile records aimed at the real pools (every one must be refused at the door)."""
    good = orjson.loads(telemetry_bytes(pools[0], f"{pools[0]}/0", t0))
    good_o = orjson.loads(outcome_bytes(pools[0], f"{pools[0]}/0", t0, "r", "w"))

    def tel(**fields: Any) -> bytes:
        return json.dumps({**good, **fields}).encode()  # the stdlib writes NaN, 1e308 and 10**400

    def out(**fields: Any) -> bytes:
        return json.dumps({**good_o, **fields}).encode()

    makers: list[tuple[str, str, Any]] = [
        (
            "malformed",
            TELEMETRY,
            lambda i: bytes(rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8)),
        ),
        ("malformed", REQUESTS, lambda i: out()[: int(rng.integers(1, 100))]),
        ("wrong-type", TELEMETRY, lambda i: tel(queue_depth="many")),
        ("wrong-type", TELEMETRY, lambda i: tel(node_id=[1, 2], weights_state="hot")),
        ("wrong-type", REQUESTS, lambda i: out(outcome=7, priority="gold")),
        ("non-finite", TELEMETRY, lambda i: tel(hbm_free_gib=float("nan"))),
        ("non-finite", TELEMETRY, lambda i: tel(ttft_p99_ms=float("inf"))),
        ("non-finite", REQUESTS, lambda i: out(e2e_ms=float("-inf"))),
        ("huge-number", TELEMETRY, lambda i: tel(cost_rate_usd_per_h=1e308)),
        ("huge-number", REQUESTS, lambda i: out(cost_usd=1e308)),
        ("huge-number", REQUESTS, lambda i: out(prompt_tokens=10**400)),
        ("huge-number", TELEMETRY, lambda i: tel(queue_depth=10**400)),
        ("negative", TELEMETRY, lambda i: tel(queue_depth=-1)),
        ("negative", REQUESTS, lambda i: out(cost_usd=-0.5)),
        ("ts-seconds", TELEMETRY, lambda i: tel(ts_ms=t0 // 1000, node_id=f"secs-{i}")),
        ("ts-far-past", REQUESTS, lambda i: out(ts_ms=t0 - 86_400_000, request_id=f"old-{i}")),
        ("ts-future", TELEMETRY, lambda i: tel(ts_ms=YEAR_2100_MS, node_id=f"evil-{i}", queue_depth=0)),
        ("ts-future", TELEMETRY, lambda i: tel(ts_ms=t0 + 3_600_000, node_id=f"soon-{i}", queue_depth=0)),
        (
            "tick-future",
            TICKS,
            lambda i: orjson.dumps({"ts_ms": YEAR_2100_MS, "tick_id": i, "pool_id": pools[0]}),
        ),
        ("tick-malformed", TICKS, lambda i: orjson.dumps({"ts_ms": t0, "tick_id": -1, "pool_id": "?"})),
    ]
    out_list: list[Hostile] = []
    oversized = min(5, max(1, n // 5_000)) if n else 0
    for i in range(n - oversized):
        category, logical, make = makers[i % len(makers)]
        pool = pools[i % len(pools)]
        out_list.append(Hostile(category, logical, pool.encode(), make(i)))
    big = b"{" + b" " * 1_000_000 + b"}"
    out_list.extend(
        Hostile("oversized", TELEMETRY, pools[i % len(pools)].encode(), big) for i in range(oversized)
    )
    return out_list


def floods(flood_nodes: int, flood_pools: int, t0: int) -> list[Hostile]:
    """Valid records for invented node ids and pools: only the model's caps hold them."""
    out = [
        Hostile(
            "flood-nodes",
            TELEMETRY,
            FLOOD_NODES_POOL.encode(),
            telemetry_bytes(FLOOD_NODES_POOL, f"fn/{i}", t0),
        )
        for i in range(flood_nodes)
    ]
    out += [
        Hostile("flood-pools", TELEMETRY, f"fp-{i}".encode(), telemetry_bytes(f"fp-{i}", f"fp-{i}/0", t0))
        for i in range(flood_pools)
    ]
    out += [  # ticks for invented pools: decided if the pool made it into the model, else no data
        Hostile(
            "tick-unknown-pool",
            TICKS,
            f"fp-{i}".encode(),
            orjson.dumps({"ts_ms": t0 + 500, "tick_id": 1, "pool_id": f"fp-{i}"}),
        )
        for i in range(min(flood_pools, 50))
    ]
    return out


def forged_policies(policy: CompiledPolicy) -> list[Hostile]:
    doc = policy.document.model_dump(mode="json")
    jump = {**doc, "metadata": {**doc["metadata"], "version": 10**15}}
    beyond = {**doc, "metadata": {**doc["metadata"], "version": 2**60}}
    key = policy.stamp.name.encode()
    return [
        Hostile("policy-version-jump", POLICY, key, orjson.dumps(jump)),
        Hostile("policy-malformed", POLICY, key, orjson.dumps(beyond)),
        Hostile("policy-malformed", POLICY, key, b"\x00\x01 not a policy"),
        Hostile("policy-malformed", POLICY, key, b"{" + b" " * 1_000_000 + b"}"),
    ]


def real_records(pools: Sequence[str], nodes: int, k: int, t0: int) -> list[tuple[str, bytes, bytes]]:
    """One tick of a real fleet: telemetry and outcomes per node; pool 0's node 0 fails from tick 5."""
    now = t0 + k * 1000
    recs: list[tuple[str, bytes, bytes]] = []
    for pool in pools:
        for j in range(nodes):
            node = f"{pool}/{j}"
            failing = pool == pools[0] and j == 0 and k >= 5
            recs.append(
                (
                    TELEMETRY,
                    pool.encode(),
                    telemetry_bytes(pool, node, now, queue_depth=(k + j) % 4, errors=3 if failing else 0),
                )
            )
            recs.extend(
                (
                    REQUESTS,
                    pool.encode(),
                    outcome_bytes(
                        pool,
                        node,
                        now + 10 + r,
                        f"{pool}-{k}-{j}-{r}",
                        f"{pool}-w{k}-{j}",
                        outcome="error" if failing else "ok",
                        task_outcome="succeeded" if r == 2 and not failing else None,
                    ),
                )
                for r in range(3)
            )
    return recs


# -- one run -----------------------------------------------------------------------------------------


def _canonical(d: Decision) -> bytes:
    data = d.model_dump(mode="json")
    data.pop("input_offsets", None)  # the garbage shifts offsets; everything else must match
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)


async def _send_all(
    producer: AIOKafkaProducer, prefix: str, records: Sequence[tuple[str, bytes, bytes]]
) -> None:
    futures = [
        await producer.send(topic_name(prefix, logical), value=value, key=key)
        for logical, key, value in records
    ]
    if futures:
        results = await asyncio.gather(*futures, return_exceptions=True)
        if any(isinstance(r, BaseException) for r in results):
            failed = [r for r in results if isinstance(r, BaseException)]
            progress(
                f"  {len(failed)} records were refused by the broker (first: {type(failed[0]).__name__})"
            )


class _Seen:
    """The real pools' decisions as the daemon publishes them: each one's canonical bytes by (tick,
    key), and which (pool, tick) have been decided."""

    def __init__(self, pools: Sequence[str]) -> None:
        self.pools = pools
        self.decided: dict[tuple[int, str], bytes] = {}
        self.ticks_done: set[tuple[str, int]] = set()

    def record(self, ds: Sequence[Decision]) -> None:
        for d in ds:
            pool = getattr(d.body, "pool_id", "")
            if pool in self.pools:
                self.decided[(d.tick_id, d.key)] = _canonical(d)
                self.ticks_done.add((pool, d.tick_id))

    def missed(self, k: int) -> int:
        """The real pools whose tick ``k`` has not been decided."""
        return sum(1 for p in self.pools if (p, k) not in self.ticks_done)


async def one_run(
    args: argparse.Namespace,
    info: BrokerInfo,
    policy: CompiledPolicy,
    t0: int,
    *,
    garbage: Sequence[Hostile],
    label: str,
) -> dict[str, Any]:
    prefix, idempotent = await fresh_prefix(info, "fuzz")
    seen = _Seen(_real_pools(args.pools))
    config = DaemonConfig(
        bootstrap_servers=info.bootstrap_servers,
        policy=policy,
        prefix=prefix,
        group_id=f"{prefix}-fleetloop",
        run_ticker=False,
        idempotence=idempotent,
        door=Door(max_past_ms=3_600_000),
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=info.bootstrap_servers, acks="all", linger_ms=5, max_request_size=2_000_000
    )
    rss_before = rss_mib()
    start_s = clock.monotonic_s()
    try:
        await producer.start()
        async with running_daemon(config, seen.record) as running:
            missed = await _tick_by_tick(
                args, producer, prefix, running, seen=seen, t0=t0, garbage=garbage, label=label
            )
            daemon = running.daemon
            # Let the policy follower see the forged policies before reading its counters.
            await _policies_refused(running, sum(1 for h in garbage if h.logical == POLICY))
            crashed = running.crashed
    finally:
        await producer.stop()
    elapsed = clock.monotonic_s() - start_s
    result = {
        "prefix": prefix,
        "seconds": round(elapsed, 1),
        "crashed": f"{type(crashed).__name__}: {crashed}" if crashed is not None else None,
        "ticks_expected": args.ticks * len(seen.pools),
        "ticks_missed": missed,
        **_daemon_figures(daemon),
        "rss_mib": {"before": round(rss_before, 1), "after": round(rss_mib(), 1)},
        "decisions": seen.decided,
    }
    await drop_topics(info, prefix)
    return result


async def _tick_by_tick(
    args: argparse.Namespace,
    producer: AIOKafkaProducer,
    prefix: str,
    running: RunningDaemon,
    *,
    seen: _Seen,
    t0: int,
    garbage: Sequence[Hostile],
    label: str,
) -> int:
    """``args.ticks`` ticks: each sends its share of the garbage (the forged policies all at tick 2)
    and the real fleet's records, then the real pools' ticks, and waits until every real pool has
    decided it (at most 60 s). The ticks missed (every one left when the daemon crashed)."""
    pools = seen.pools
    chunks = [list(garbage[i :: args.ticks]) for i in range(args.ticks)]
    sent_policies = [h for h in garbage if h.logical == POLICY]
    missed = 0
    for k in range(1, args.ticks + 1):
        chunk = [(h.logical, h.key, h.value) for h in chunks[k - 1] if h.logical != POLICY]
        if k == 2 and sent_policies:
            chunk += [(h.logical, h.key, h.value) for h in sent_policies]
        await _send_all(producer, prefix, chunk + real_records(pools, args.nodes, k, t0))
        ticks = [
            (TICKS, p.encode(), orjson.dumps({"ts_ms": t0 + k * 1000 + 500, "tick_id": k, "pool_id": p}))
            for p in pools
        ]
        await _send_all(producer, prefix, ticks)
        await _until_decided(running, seen, k, label)
        missed += seen.missed(k)
        if running.crashed is not None:
            missed += len(pools) * (args.ticks - k)
            break
        if k % 5 == 0 or k == args.ticks:
            s = running.daemon.stats
            progress(
                f"  {label}: tick {k}/{args.ticks}  records in {s.events_in:,}  "
                f"dead letters {s.dead_letters:,}  RSS {rss_mib():.0f} MiB"
            )
    return missed


async def _until_decided(running: RunningDaemon, seen: _Seen, k: int, label: str) -> None:
    """Until every real pool has decided tick ``k``, the daemon crashed, or 60 s passed (said)."""
    waited_s = clock.monotonic_s()
    while seen.missed(k) and running.crashed is None:
        await asyncio.sleep(0.02)
        if clock.monotonic_s() - waited_s > 60:
            progress(f"  {label}: tick {k} not decided for every pool within 60 s")
            break


async def _policies_refused(running: RunningDaemon, forged: int) -> None:
    """Until the policy follower has refused ``forged`` documents (or the daemon crashed); at most
    30 s (TimeoutError)."""
    if forged:
        async with asyncio.timeout(30):
            while running.daemon.stats.policies_refused < forged and running.crashed is None:
                await asyncio.sleep(0.05)


def _daemon_figures(daemon: Daemon) -> dict[str, Any]:
    """The daemon's counters after a run, and its models' sizes, refusals and evictions summed over
    its shards (one model per input partition)."""
    stats = daemon.stats
    models = [shard.model for shard in daemon.shards.values()]
    return {
        "ticks_forced": stats.ticks_forced,
        "ticks_failed": stats.ticks_failed,
        "fold_errors": sum(shard.fold_errors for shard in daemon.shards.values()),
        "events_in": stats.events_in,
        "dead_letters": stats.dead_letters,
        "dead_letters_lost": stats.dead_letters_lost,
        "dead_by_reason": dict(sorted(stats.dead_by_reason.items())),
        "policies_refused": stats.policies_refused,
        "policies_applied": stats.policies_applied,
        "model": {  # summed over the daemon's shards (one model per input partition)
            "pools": sum(len(m.pools) for m in models),
            "nodes": sum(len(m.nodes) for m in models),
            "refused": {k: sum(m.refused[k] for m in models) for k in sorted(models[0].refused)}
            if models
            else {},
            "evicted": {k: sum(m.evicted[k] for m in models) for k in sorted(models[0].evicted)}
            if models
            else {},
        },
    }


def takeover_tally(sent: Mapping[str, int], dead_by_reason: Mapping[str, int]) -> dict[str, Any]:
    """The takeover attempts ``sent`` (records by category) and how many were refused: per reason
    kind that refuses them (:data:`TAKEOVER`), the daemon's dead letters of that kind, at most the
    attempts it answers. An attempt the daemon did not dead-letter (taken, or ignored) is not
    counted as refused."""
    by_kind: Counter[str] = Counter()
    for category, kind in TAKEOVER.items():
        by_kind[kind] += sent.get(category, 0)
    refused = {kind: min(n, dead_by_reason.get(kind, 0)) for kind, n in sorted(by_kind.items()) if n}
    return {"sent": sum(by_kind.values()), "refused": sum(refused.values()), "refused_by_reason": refused}


async def fuzz(args: argparse.Namespace, info: BrokerInfo) -> dict[str, Any]:
    policy = builtin_policy("default")
    rng = np.random.default_rng(args.seed)
    t0 = (clock.wall_ms() // 1000) * 1000
    pools = _real_pools(args.pools)
    garbage = [
        *mixed(args.records, pools, t0, rng),
        *floods(args.flood_nodes, args.flood_pools, t0),
        *forged_policies(policy),
    ]
    by_category = Counter(h.category for h in garbage)
    progress(
        f"fleetloop bench fuzz: clean run ({args.ticks} ticks, {args.pools} pools x {args.nodes} nodes) ..."
    )
    clean = await one_run(args, info, policy, t0, garbage=[], label="clean")
    progress(f"fleetloop bench fuzz: the same with {len(garbage):,} hostile records ...")
    dirty = await one_run(args, info, policy, t0, garbage=garbage, label="hostile")
    a, b = clean.pop("decisions"), dirty.pop("decisions")
    missing = sorted(set(a) - set(b))
    extra = sorted(set(b) - set(a))
    different = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    reasons: dict[str, int] = dirty["dead_by_reason"]
    real_sent = args.ticks * args.pools * args.nodes * 4 + args.ticks * args.pools
    first_difference = None
    if different or missing or extra:
        key = (different or missing or extra)[0]
        first_difference = {
            "tick_id": key[0],
            "key": key[1],
            "clean": a.get(key, b"").decode(),
            "hostile": b.get(key, b"").decode(),
        }
    return {
        "broker": info.kind,
        "records": {
            "hostile": len(garbage),
            "real": real_sent,
            "sent": len(garbage) + real_sent,
            "by_category": dict(sorted(by_category.items())),
        },
        "dead_letters": {
            "total": dirty["dead_letters"],
            "by_reason": reasons,
            "lost": dirty["dead_letters_lost"],
        },
        "crashes": int(dirty["crashed"] is not None) + int(clean["crashed"] is not None),
        "crash": dirty["crashed"] or clean["crashed"],
        "ticks": {
            "expected": dirty["ticks_expected"],
            "missed": dirty["ticks_missed"],
            "missed_clean": clean["ticks_missed"],
            "forced": dirty["ticks_forced"],
            "failed": dirty["ticks_failed"],
        },
        "decisions": {
            "clean": len(a),
            "hostile": len(b),
            "differing": len(missing) + len(extra) + len(different),
            "missing": len(missing),
            "extra": len(extra),
            "different": len(different),
            "first_difference": first_difference,
        },
        "takeover_attempts": takeover_tally(by_category, reasons),
        "policies": {
            "forged": by_category["policy-version-jump"] + by_category["policy-malformed"],
            "refused": dirty["policies_refused"],
            "applied": dirty["policies_applied"],
        },
        "fold_errors": dirty["fold_errors"],
        "model": dirty["model"],
        "rss_mib": {
            "before": clean["rss_mib"]["before"],
            "after_clean": clean["rss_mib"]["after"],
            "after_hostile": dirty["rss_mib"]["after"],
        },
        "seconds": {"clean": clean["seconds"], "hostile": dirty["seconds"]},
    }


def _print(r: dict[str, Any]) -> None:
    t = Table(title=f"fleetloop bench fuzz — {r['broker']}", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    rec = r["records"]
    t.add_row("records sent", f"{rec['sent']:,} ({rec['hostile']:,} hostile, {rec['real']:,} real)")
    for cat, n in rec["by_category"].items():
        t.add_row(f"  hostile: {cat}", f"{n:,}")
    t.add_row("dead letters", f"{r['dead_letters']['total']:,} (lost {r['dead_letters']['lost']})")
    for reason, n in r["dead_letters"]["by_reason"].items():
        t.add_row(f"  reason: {reason}", f"{n:,}")
    t.add_row("crashes", str(r["crashes"]))
    t.add_row(
        "ticks missed",
        "{missed} of {expected} (forced {forced}, failed {failed})".format(**r["ticks"]),
    )
    d = r["decisions"]
    t.add_row("decisions differing from the clean run", f"{d['differing']} of {d['clean']}")
    ta = r["takeover_attempts"]
    t.add_row("takeover attempts refused", f"{ta['refused']:,} of {ta['sent']:,}")
    t.add_row(
        "forged policies refused",
        f"{r['policies']['refused']} of {r['policies']['forged']} (applied {r['policies']['applied']})",
    )
    m = r["model"]
    t.add_row("model: pools / nodes held", f"{m['pools']:,} / {m['nodes']:,}")
    t.add_row("model: refused", ", ".join(f"{k} {v:,}" for k, v in m["refused"].items() if v) or "none")
    t.add_row(
        "RSS MiB: before / after clean / after hostile",
        "{before} / {after_clean} / {after_hostile}".format(**r["rss_mib"]),
    )
    t.add_row("seconds: clean / hostile", f"{r['seconds']['clean']} / {r['seconds']['hostile']}")
    term.console().print(t)
    if d["first_difference"]:
        term.console(stderr=True).print(f"first difference: {d['first_difference']}")
