"""``fleetloop bench checkpoint``: size and cost of a shard checkpoint at fleet scale, and how long
it holds the event loop: encoded in the loop (as the daemon did) against a forked child (as it does),
and decoded at a restore in the loop (as it did) against a thread (as it does).

For each size a shard folds ``--seconds`` of a generated fleet's telemetry and router outcomes
(``fleetgen``) and decides every pool at intervals, so the policy state is populated as in a run.
Then: the compressed size, the JSON documents it is parsed as (their number and the largest: one
``orjson.loads`` call each, the longest a decoding thread keeps the interpreter in one go), the time
to encode and to decode (a restore; the decoded state must encode to the same bytes, or the bench
says so and exits 1), and for each way of encoding and decoding the longest the loop went without
running, measured by a 5 ms heartbeat on a real loop while one checkpoint is taken or restored
(decoded in a thread with the cyclic collector as it was, and held then frozen as the daemon's
restore does now; the decoded state kept, as a restore keeps its shard). The figures are wall
times on this machine, compared within the run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from typing import Any

import orjson
from rich.table import Table

from fleetloop import clock, term
from fleetloop.bench.common import progress, rss_mib, sizes_arg, within
from fleetloop.bench.fleetgen import BASE_TS_MS, make_fleet, outcomes_at, telemetry_at
from fleetloop.core import checkpoint
from fleetloop.core.shard import Row, Shard
from fleetloop.daemon import offload
from fleetloop.daemon.runtime.telemetry import gc_held
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.control import Tick
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.schemas.topics import REQUESTS, TELEMETRY


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "checkpoint",
        help="checkpoint size, encode/decode time and event-loop stall at fleet scale",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument(
        "--nodes", default="1000,10000", metavar="N,N,...", help="fleet sizes (default 1000,10000)"
    )
    p.add_argument("--seconds", type=int, default=30, help="seconds of history folded first (default 30)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=handle)


def build(n_nodes: int, seconds: int) -> Shard:
    """A shard holding ``seconds`` of a generated fleet, every pool decided every 10 s and last."""
    policy = builtin_policy("default")
    fleet = make_fleet(n_nodes)
    shard = Shard(0)
    offsets = {TELEMETRY: 0, REQUESTS: 0}
    ts = BASE_TS_MS
    for k in range(seconds):
        ts += 1000
        rows: dict[str, list[NodeTelemetry | RequestOutcome]] = {
            TELEMETRY: list(telemetry_at(fleet, ts)),
            REQUESTS: list(outcomes_at(fleet, ts, workflow_base=k * n_nodes * 2)),
        }
        for logical, items in rows.items():
            base = offsets[logical]
            shard.add(logical, (Row(base + i, ts, item) for i, item in enumerate(items)))
            offsets[logical] = base + len(items)
        if k % 10 == 9 or k == seconds - 1:
            for pool in fleet.pool_ids:
                shard.decide(Tick(ts_ms=ts, tick_id=ts // 1000, pool_id=pool), dict(offsets), policy)
            progress(f"  {n_nodes:,} nodes: {k + 1}/{seconds} s folded and decided")
    return shard


async def _stall_ms(work: Any) -> float:
    """The longest gap between 5 ms heartbeats of this loop while ``work()`` runs (ms)."""
    worst = 0.0
    done = asyncio.Event()

    async def beat() -> None:
        nonlocal worst
        last = clock.monotonic_s()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = clock.monotonic_s()
            worst = max(worst, now - last)
            last = now

    task = asyncio.create_task(beat())
    await asyncio.sleep(0.05)
    await work()
    done.set()
    await task
    return worst * 1000.0


async def measure(shard: Shard) -> dict[str, Any]:
    value = shard.checkpoint_value()
    t0 = clock.monotonic_s()
    blob = checkpoint.encode(value)
    encode_s = clock.monotonic_s() - t0
    documents = [len(d) for d in checkpoint.documents(blob)]
    t0 = clock.monotonic_s()
    decoded = checkpoint.decode(blob)
    decode_s = clock.monotonic_s() - t0
    exact = checkpoint.encode(decoded) == blob  # a restore gives the very state back
    del decoded

    async def inline() -> None:
        checkpoint.encode(shard.checkpoint_value())

    fork_ms: list[float] = []
    child: list[bytes] = []

    async def forked() -> None:
        t = clock.monotonic_s()
        pending = offload.encode_in_child(checkpoint.encode, shard.checkpoint_value())
        fork_ms.append((clock.monotonic_s() - t) * 1000.0)
        child.append(await pending)

    # A restore keeps what it decoded (the shard it goes on with): each decoded value is kept until
    # its stall is measured, and freed after (freeing a 10,000-node state at once holds the loop
    # ~60 ms, which is a shard dropped, not one restored); then the collector's debt is paid, so the
    # next measurement does not start with a collection of what this one made (40-50 ms in the
    # loop's first beat, before any decoding).
    kept: list[Any] = []

    def settle() -> None:
        kept.clear()
        gc.collect()

    async def decode_inline() -> None:
        kept.append(checkpoint.decode(blob))

    async def decode_thread() -> None:  # as the daemon restored
        kept.append(await asyncio.to_thread(checkpoint.decode, blob))

    async def decode_thread_held() -> None:  # as the daemon restores: the collector held, then frozen
        with gc_held(True):
            kept.append(await asyncio.to_thread(checkpoint.decode, blob))
        gc.unfreeze()  # the bench's next measurement starts as before

    stall_decode_inline = await _stall_ms(decode_inline)
    settle()
    stall_decode_thread = await _stall_ms(decode_thread)
    settle()
    stall_decode_held = await _stall_ms(decode_thread_held)
    settle()
    stall_inline = await _stall_ms(inline)
    rss0 = rss_mib()
    stall_forked = await _stall_ms(forked)
    assert child[0] == blob, "the child encoded another state"
    return {
        "nodes": len(shard.model.nodes),
        "pools": len(shard.model.pools),
        "bytes": len(blob),
        "json_bytes": sum(documents),
        "json_documents": len(documents),
        "largest_json_bytes": max(documents),
        "chunks": len(checkpoint.to_chunks("g", 0, 1, blob)),
        "encode_ms": round(encode_s * 1000.0, 1),
        "decode_ms": round(decode_s * 1000.0, 1),
        "restore_exact": exact,
        "loop_stall_inline_ms": round(stall_inline, 1),
        "loop_stall_forked_ms": round(stall_forked, 1),
        "restore_stall_inline_ms": round(stall_decode_inline, 1),
        "restore_stall_thread_ms": round(stall_decode_thread, 1),
        "restore_stall_thread_gc_held_ms": round(stall_decode_held, 1),
        "fork_ms": round(fork_ms[0], 2),
        "rss_mib": round(rss0, 1),
    }


def handle(args: argparse.Namespace) -> int:
    sizes = sizes_arg("checkpoint", args.nodes, 16, 100_000)
    within("checkpoint", "--seconds", args.seconds, 1, 600)
    rows = []
    for n in sizes:
        progress(f"fleetloop bench checkpoint: {n:,} nodes, {args.seconds} s of history")
        shard = build(n, args.seconds)
        gc.collect()
        rows.append({"seconds": args.seconds, **asyncio.run(measure(shard))})
        del shard
        gc.collect()
    result = {"bench": "checkpoint", "python": sys.version.split()[0], "sizes": rows}
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print(result)
    inexact = [r["nodes"] for r in rows if not r["restore_exact"]]
    if inexact:
        sys.stderr.write(
            f"fleetloop bench checkpoint: a decoded checkpoint encodes to other bytes at {inexact} nodes: "
            "a restore would not be exact\n"
        )
        return 1
    return 0


def _print(result: dict[str, Any]) -> None:
    t = Table(title="shard checkpoint: size, cost (ms), longest event-loop stall (ms) encoding and decoding")
    cols = (
        "nodes",
        "pools",
        "MB",
        "chunks",
        "docs",
        "largest KB",
        "encode",
        "decode",
        "stall enc/loop",
        "enc/fork",
        "fork",
        "dec/loop",
        "dec/thread",
        "dec/thread, gc held",
    )
    for c in cols:
        t.add_column(c, justify="right")
    for r in result["sizes"]:
        t.add_row(
            f"{r['nodes']:,}",
            str(r["pools"]),
            f"{r['bytes'] / 1e6:.2f}",
            str(r["chunks"]),
            str(r["json_documents"]),
            f"{r['largest_json_bytes'] / 1e3:,.0f}",
            f"{r['encode_ms']:,.0f}",
            f"{r['decode_ms']:,.0f}",
            f"{r['loop_stall_inline_ms']:,.0f}",
            f"{r['loop_stall_forked_ms']:,.0f}",
            f"{r['fork_ms']:,.1f}",
            f"{r['restore_stall_inline_ms']:,.0f}",
            f"{r['restore_stall_thread_ms']:,.0f}",
            f"{r['restore_stall_thread_gc_held_ms']:,.0f}",
        )
    term.console().print(t)
