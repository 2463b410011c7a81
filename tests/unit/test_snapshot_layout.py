"""The snapshot's node layout laid out again from the previous one (the old rows' order, then the
arrivals: :class:`fleetloop.core.model.snapshot._NodeRows` with ``before``) is the layout a fresh
model would lay out (no ``before``: every node sorted by pool, then node id), through arrivals that
sort between the old rows, departures, a node that moves pool and one that leaves and comes back:
the same rows, ids, pools and bounds, the same sorted ids and index, the same numbers read and the
same bucket arrays carried."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
from fleetloop.core.model.fleet import FleetModel, ModelConfig, snapshot
from tests.unit.test_fold_batch import T0, out, tel

# ``fleetloop.core.model.snapshot`` the name is the function the package re-exports: the module here.
snapshot_module: Any = importlib.import_module("fleetloop.core.model.snapshot")


def _layout(rows: Any) -> tuple[object, ...]:
    r = rows
    return (
        r.ids,
        [id(n) for n in r.nodes],
        r.row_pools,
        r.pool_ids,
        r.bounds,
        r.sorted_ids,
        r.index,
        [id(w) for w in r.wins],
    )


def _fold(model: FleetModel, ts: int, nodes: dict[str, str], k: int) -> None:
    pairs = sorted(nodes.items())
    model.fold_telemetries([tel(n, p, ts, queue_depth=i % 7) for i, (n, p) in enumerate(pairs)])
    model.fold_outcomes([out(n, p, ts, k * 100 + i) for i, (n, p) in enumerate(pairs)])


def test_a_layout_from_the_last_one_is_the_fresh_layout() -> None:
    model = FleetModel(ModelConfig(forget_node_after_ms=3_000, retention_ms=20_000))
    nodes = {f"n{i:03d}": f"p{i % 4}" for i in range(0, 60, 2)}
    ts = T0
    changes = 0
    for k in range(12):
        ts += 1000
        if k == 3:  # arrivals that sort between the rows already laid out, and a new pool
            nodes.update({f"n{i:03d}": f"p{i % 4}" for i in range(1, 30, 2)})
            nodes.update({f"z{i}": "p-new" for i in range(3)})
        if k == 5:
            nodes["n010"] = "p3"  # a move
        if k == 6:  # silent: forgotten at the next snapshots, then evicted
            for n in ("n000", "n001", "n044"):
                nodes.pop(n)
        if k == 11:
            nodes["n000"] = "p0"  # back after it left
        _fold(model, ts, nodes, k)
        kept = model._snapshots
        before = kept.nodes if kept is not None else None
        snap = snapshot(model, ts)
        rows: Any = model._snapshots.nodes
        assert rows is not None
        fresh = snapshot_module._NodeRows(model)
        assert _layout(rows) == _layout(fresh)
        assert rows.held[:-1] == [n.telemetry for n in rows.nodes]
        read = fresh.numbers_of([n.telemetry for n in fresh.nodes])
        np.testing.assert_array_equal(rows.numbers[:-1], read.T)
        plain = snapshot_module.WindowColumns(fresh.wins, 8)
        np.testing.assert_array_equal(rows.windows.totals(ts, 10_000), plain.totals(ts, 10_000))
        assert list(snap.nodes) == sorted(snap.nodes)  # node-id order
        if rows is not before and before is not None:
            changes += 1
    assert changes >= 3  # laid out again from the last layout, not only from scratch
