"""``fleetloop bench fleet``: how large an emulated fleet holds real-time pace on this machine.

Runs ``fleetloop fleet`` (open loop: no broker) on the demo scenario scaled by each ``--scales``
factor K (4K nodes, K times the demo's arrival rates: the demo's load per node) for ``--seconds``,
each in its own process, one after the other, and prints per size: nodes, calls completed per
second, the node-event lag (how late the nodes' scheduled iterations fired behind real time:
p50, p99, max), the event loop's own lag (a 50 ms sleep's overshoot, p99) and client-side TTFT
p50, with each size's p99 lag as a ratio to the smallest size's, measured in the same run.
A size "holds" when its node-event p99 lag stays under ``--hold-ms`` (default 100 ms: a tenth of a
telemetry interval).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from fleetloop import term
from fleetloop.bench.common import progress
from fleetloop.demo.demo import demo_scenario


def register(sub: Any) -> None:
    p = sub.add_parser("fleet", help="real-time lag of the emulated HTTP fleet at growing sizes")
    p.add_argument("--scales", default="1,4,8", help="demo-scenario scale factors (x4 nodes each)")
    p.add_argument("--seconds", type=int, default=60, help="seconds of load per size (default 60)")
    p.add_argument("--hold-ms", type=float, default=100.0, help="p99 node-event lag a size may have")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_bench_fleet)


def cmd_bench_fleet(args: argparse.Namespace) -> int:
    try:
        scales = [int(x) for x in args.scales.split(",") if x.strip()]
    except ValueError:
        sys.stderr.write(f"fleetloop bench fleet: --scales must be integers, got {args.scales!r}\n")
        return 2
    if not scales or any(not 1 <= k <= 64 for k in scales) or not 10 <= args.seconds <= 3600:
        sys.stderr.write("fleetloop bench fleet: --scales in [1, 64], --seconds in [10, 3600]\n")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="fleetloop-bench-fleet-"))
    scen = tmp / "demo.yaml"
    s = demo_scenario(args.seconds)
    scen.write_text(yaml.safe_dump(s.model_dump(mode="json", exclude_none=True), sort_keys=False))
    rows: list[dict[str, Any]] = []
    for k in scales:
        progress(f"bench fleet: scale {k} ({4 * k} nodes) for {args.seconds} s ...")
        cmd = [sys.executable, "-m", "fleetloop.cli.main", "fleet", "--scenario", str(scen),
               "--scale", str(k), "--seconds", str(args.seconds), "--drain-s", "15", "--json"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(f"fleetloop bench fleet: scale {k} failed: {done.stderr.strip()[-300:]}\n")
            return 1
        r = json.loads(done.stdout)
        lag, ev = r["realtime_lag"]["node_events"], r["realtime_lag"]["event_loop"]
        rows.append(
            {
                "scale": k,
                "nodes": r["nodes"]["provisioned"],
                "calls_ok_per_s": round(r["requests"]["ok"] / max(1e-9, r["wall_s"]), 2),
                "tasks_succeeded": r["tasks"]["succeeded"],
                "tasks_failed": r["tasks"]["failed"],
                "lag_p50_ms": lag["p50_ms"],
                "lag_p99_ms": lag["p99_ms"],
                "lag_max_ms": lag["max_ms"],
                "loop_lag_p99_ms": ev["p99_ms"],
                "ttft_p50_ms": r["latency"]["ttft_p50_ms"],
            }
        )
    base = rows[0]["lag_p99_ms"] or 0.0
    for row in rows:
        p99 = row["lag_p99_ms"]
        row["lag_p99_vs_smallest"] = round(p99 / base, 2) if base and p99 else None
        row["holds"] = p99 is not None and p99 <= args.hold_ms
    holds = [r["nodes"] for r in rows if r["holds"]]
    result = {
        "seconds": args.seconds,
        "hold_ms": args.hold_ms,
        "sizes": rows,
        "largest_holding": max(holds, default=None),
    }
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    t = Table(title=f"fleetloop bench fleet — demo scenario, {args.seconds} s per size")
    cols = ["nodes", "calls ok/s", "tasks ok/failed", "lag p50", "lag p99", "lag max", "loop lag p99"]
    cols += ["p99 vs smallest", "TTFT p50", "holds"]
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(
            str(r["nodes"]),
            str(r["calls_ok_per_s"]),
            f"{r['tasks_succeeded']}/{r['tasks_failed']}",
            f"{r['lag_p50_ms']} ms",
            f"{r['lag_p99_ms']} ms",
            f"{r['lag_max_ms']} ms",
            f"{r['loop_lag_p99_ms']} ms",
            str(r["lag_p99_vs_smallest"]),
            f"{r['ttft_p50_ms']} ms",
            "yes" if r["holds"] else "no",
        )
    term.console().print(t)
    return 0
