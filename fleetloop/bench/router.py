"""``fleetloop bench router``: how long ``fleetloop.router``'s pick takes per call, by pool size.

For each pool size (default 16, 1,000 and 10,000 nodes) and each picker it times ``Router.pick``
on a pool with every node weighted, ~2 % ejected by breakers, a shed threshold, and prefix
affinity on half the calls, and the same picks with the derived-state cache off (``cache=False``:
the eligible set rebuilt and sorted per call, what the simulator's router did before the library).
It prints microseconds per pick, the ratio uncached / cached, and pick time in units of one bare
numpy draw plus a dict lookup (so a loaded machine reads as such), all measured in the same run, and
the cost of taking in one routing decision (which is when the cache is rebuilt). ``round-robin`` is
one pass over the eligible nodes per call (nginx's smooth weighted round robin), and so is
``least-outstanding`` (the fewest outstanding calls per unit of weight), so they grow with the
pool; ``weighted-random`` and ``least-request-p2c`` do not. Bounded: about ``--seconds`` per cell
(default 0.2).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
import orjson
from rich.table import Table

from fleetloop import clock, term
from fleetloop.daemon.cli_common import UsageError
from fleetloop.router import Endpoint, Router
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    BreakerDecision,
    Decision,
    PolicyStamp,
    RoutingDecision,
)

PICKERS = ("weighted-random", "round-robin", "least-request-p2c", "least-outstanding")
STAMP = PolicyStamp(name="bench", version=1, hash="0" * 16, mode="enforce")


def register(sub: Any) -> None:
    p = sub.add_parser("router", help="microseconds per pick of the router library, by pool size")
    p.add_argument(
        "--nodes", default="16,1000,10000", metavar="N,N,...", help="pool sizes (default 16,1000,10000)"
    )
    p.add_argument("--seconds", type=float, default=0.2, help="time per measurement (default 0.2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=handle)


def _world(n: int, picker: str, *, cache: bool) -> tuple[Router[Endpoint], list[Decision]]:
    eps = [Endpoint(node_id=f"p/{i}", pool_id="p", queue_depth=i % 7) for i in range(n)]
    r: Router[Endpoint] = Router(
        {"m": ("p",)},
        np.random.default_rng(1),
        members={"p": eps},
        nodes={e.node_id: e for e in eps},
        cache=cache,
    )
    weights = {e.node_id: 1.0 + (i % 5) for i, e in enumerate(eps)}
    affinity = {f"d{k}": (f"p/{(k * 7) % n}", f"p/{(k * 13) % n}") for k in range(64)}
    body = RoutingDecision(
        entity="pool/p", reason="bench", pool_id="p", weights=weights, picker=picker, prefix_affinity=affinity
    )
    ds = [Decision(ts_ms=1, tick_id=1, policy=STAMP, body=body)]
    ds.append(
        Decision(
            ts_ms=1,
            tick_id=1,
            policy=STAMP,
            body=AdmissionDecision(
                entity="pool/p", reason="bench", pool_id="p", max_queue_depth={"0": 6, "1": 6}
            ),
        )
    )
    ds.extend(
        Decision(
            ts_ms=1,
            tick_id=1,
            policy=STAMP,
            body=BreakerDecision(entity=f"p/{i}", reason="b", pool_id="p", node_id=f"p/{i}", state="open"),
        )
        for i in range(0, n, 50)
    )
    r.apply(ds, 0.0)
    return r, ds


def _per_call_us(r: Router[Endpoint], seconds: float) -> float:
    digests = [None, "d1", None, "d17", None, "d33", None, "x"]
    models = ("m",)
    calls = 0
    batch = 64
    t0 = clock.monotonic_s()
    while True:
        for k in range(batch):
            r.pick(models, k & 1, digests[k & 7], new_task=bool(k & 2), budget_ms=5000, now_s=1.0)
        calls += batch
        elapsed = clock.monotonic_s() - t0
        if elapsed >= seconds:
            return elapsed / calls * 1e6


def _floor_us(seconds: float) -> float:
    """One bare numpy draw and one dict lookup per call: what a slow or loaded machine costs anything."""
    rng = np.random.default_rng(1)
    d = {"p": 1}
    calls = 0
    t0 = clock.monotonic_s()
    while True:
        for _ in range(256):
            rng.random()
            d.get("p")
        calls += 256
        elapsed = clock.monotonic_s() - t0
        if elapsed >= seconds:
            return elapsed / calls * 1e6


def _apply_us(n: int, seconds: float) -> float:
    r, ds = _world(n, "weighted-random", cache=True)
    routing = ds[0]
    calls = 0
    t0 = clock.monotonic_s()
    tick = 2
    while True:
        d = routing.model_copy(update={"tick_id": tick})
        tick += 1
        r.apply([d], 1.0)
        r.pick(("m",), 0, None, new_task=False, budget_ms=5000, now_s=1.0)  # rebuilds the cache
        calls += 1
        elapsed = clock.monotonic_s() - t0
        if elapsed >= seconds:
            return elapsed / calls * 1e6


def handle(args: argparse.Namespace) -> int:
    try:
        sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"bench router: --nodes wants integers, got {args.nodes!r}") from None
    if not sizes or any(not 2 <= n <= 100_000 for n in sizes):
        raise UsageError("bench router: --nodes: each size must be in [2, 100000]")
    if not 0.01 <= args.seconds <= 30:
        raise UsageError("bench router: --seconds must be in [0.01, 30]")
    rows: list[dict[str, Any]] = []
    floor = _floor_us(args.seconds)
    for n in sizes:
        for picker in PICKERS:
            sys.stderr.write(f"bench router: {n} nodes, {picker} ...\n")
            cached = _per_call_us(_world(n, picker, cache=True)[0], args.seconds)
            uncached = _per_call_us(_world(n, picker, cache=False)[0], min(args.seconds, 0.2 + n / 20_000))
            rows.append(
                {
                    "nodes": n,
                    "picker": picker,
                    "pick_us": round(cached, 3),
                    "uncached_pick_us": round(uncached, 3),
                    "speedup": round(uncached / cached, 1),
                    "x_floor": round(cached / floor, 1),
                }
            )
        rows[-1]["apply_routing_us"] = round(_apply_us(n, args.seconds), 1)
    if args.json:
        out = {"bench": "router", "floor_us": round(floor, 3), "rows": rows}
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
        return 0

    t = Table(
        title="fleetloop.router pick, per call (same-run baselines: cache off; one bare numpy draw "
        f"= {floor:.2f} µs here)"
    )
    for col in ("nodes", "picker", "pick µs", "x draw", "uncached µs", "speedup", "apply+rebuild µs"):
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(
            str(row["nodes"]),
            row["picker"],
            f"{row['pick_us']:.2f}",
            f"{row['x_floor']:.0f}",
            f"{row['uncached_pick_us']:.1f}",
            f"{row['speedup']:.0f}x",
            f"{row['apply_routing_us']:.0f}" if "apply_routing_us" in row else "",
        )
    term.console().print(t)
    return 0
