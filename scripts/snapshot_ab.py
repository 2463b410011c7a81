"""What the whole-fleet tick reads, without the policies: fold, snapshot and the telemetry block (issue 9,
session 11).

``fleetloop bench decide`` times the fold of one second of records, the snapshot, and the tick
(snapshot + every policy). On a machine shared by several engineers a 10k run takes 10-15 minutes
of wall time, most of it the policies, which this session's columns work does not change. This
folds the same records (``fleetloop.bench.fleetgen``, twins, ``--batches`` batch folds per second
as the daemon folds one per fetch) and takes the tick's snapshot and its first telemetry column read
(``NodeTable.numbers``, which the breaker's columns read first each tick), printing CPU
milliseconds (``time.process_time``) p50 / p99 over ``--seconds`` after ``--warmup``: ``fold``,
``snapshot``, ``numbers`` and ``read`` (snapshot + numbers: the tick's part this touches). Run it
from each tree alternately for an A/B::

    nice -n 10 .venv/bin/python scripts/snapshot_ab.py --nodes 10000 --seconds 20 --warmup 8
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from fleetloop.bench.common import pct
from fleetloop.bench.decide import DAEMON_GEN0
from fleetloop.bench.fleetgen import BASE_TS_MS, make_fleet, outcomes_at, telemetry_at
from fleetloop.core.model.fleet import FleetModel, ModelConfig, snapshot
from fleetloop.daemon.runtime import tune_gc
from fleetloop.policies.columns import NodeTable, fleet_columns
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN


def _cuts(items: list[object], n: int) -> list[list[object]]:
    step = -(-len(items) // n)
    return [items[i : i + step] for i in range(0, len(items), step)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--batches", type=int, default=1, help="batch folds per topic and second")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    tune_gc(DAEMON_GEN0)
    fleet = make_fleet(args.nodes)
    model = FleetModel(ModelConfig())
    clock = time.process_time
    fold: list[float] = []
    snap: list[float] = []
    numbers: list[float] = []
    ts = BASE_TS_MS
    for k in range(args.warmup + args.seconds):
        ts += 1000
        tel = [TELEMETRY_TWIN.of(t) for t in telemetry_at(fleet, ts)]
        out = [OUTCOME_TWIN.of(o) for o in outcomes_at(fleet, ts, workflow_base=k * args.nodes * 2)]
        gc.collect()
        c0 = clock()
        for cut in _cuts(tel, args.batches):
            model.fold_telemetries(cut)  # type: ignore[arg-type]
        for cut in _cuts(out, args.batches):
            model.fold_outcomes(cut)  # type: ignore[arg-type]
        c1 = clock()
        s = snapshot(model, ts)
        c2 = clock()
        table = fleet_columns(s).table
        assert isinstance(table, NodeTable)
        table.numbers()
        c3 = clock()
        if k >= args.warmup:
            fold.append((c1 - c0) * 1e3)
            snap.append((c2 - c1) * 1e3)
            numbers.append((c3 - c2) * 1e3)
    read = [a + b for a, b in zip(snap, numbers, strict=True)]
    row = {"label": args.label, "nodes": args.nodes, "batches": args.batches}
    for name, xs in (("fold", fold), ("snapshot", snap), ("numbers", numbers), ("read", read)):
        row[f"{name}_p50_ms"] = round(pct(xs, 50), 2)
        row[f"{name}_p99_ms"] = round(pct(xs, 99), 2)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
