"""Per-pool figures that several sections read from a pool's nodes, computed for every pool at once
from the snapshot's fleet-wide columns (:mod:`fleetloop.policies.columns`), once per snapshot.

Each section used to walk its pool's :class:`NodeView` objects for a count, a sum or a median (the
retry budget's lost calls and nodes, admission's busiest node, batching's and admission's TBT
median, the engine's silent-pool check). At 10,000 nodes in ~240 pools that is tens of thousands of
attribute reads per tick, and it needs every view built. Here each figure is one segment operation
over the fleet (rows grouped by pool, as the columns are), kept in ``snap.memo`` and read per pool.

The plain per-node forms stay where they were (``ratio.lost_calls``, ``ratio.lost_nodes``,
``tbt_feedback.pool_tbt_ms``, ``engine.pool_is_silent``, ...): they state the rules, and
``tests/unit/test_pool_figures.py`` holds these to them, value for value (ints exactly, the median
bit for bit, signed zeros included), on generated fleets that misbehave. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetloop.policies.base import FleetSnapshot
from fleetloop.policies.columns import Bools, FleetColumns, fleet_columns

_KEY = ("pool_figures",)


@dataclass(frozen=True, slots=True)
class PoolFigures:
    """One pool's figures (a pool with no node has :data:`EMPTY`)."""

    lost_calls: int  # failures_w over nodes stale or not loaded (weights_state != "warm")
    lost_nodes: int  # nodes that failed calls and are stale, or not loaded and not draining
    warm_fresh: int  # nodes warm (loaded, not draining) and not stale
    max_outstanding: int  # max(queue_depth + running_requests), 0 without nodes
    all_stale: bool  # every node stale (False without nodes)
    tbt_upper_median: float | None  # sorted(tbt_p99_ms of warm fresh nodes)[n // 2]


EMPTY = PoolFigures(0, 0, 0, 0, False, None)


def records(cols: FleetColumns) -> Sequence[Any]:
    """Per row, an object with the node's telemetry fields (``weights_state``, ``hot_prefixes``,
    ...): the snapshot table's telemetry records when the snapshot has one, else the views."""
    return cols.table.tels if cols.table is not None else cols.nodes


def row_ids(snap: FleetSnapshot) -> list[str]:
    """Every row's node id (the columns' row order), once per snapshot."""
    key = ("row_ids",)
    found: list[str] | None = snap.memo.get(key)
    if found is None:
        cols = fleet_columns(snap)
        table = cols.table
        found = snap.memo[key] = list(table.ids) if table is not None else [n.node_id for n in cols.nodes]
    return found


def loaded(snap: FleetSnapshot) -> Bools:
    """``weights_state == "warm"`` of every row (draining or not), once per snapshot."""
    key = ("loaded",)
    found: Bools | None = snap.memo.get(key)
    if found is None:
        found = snap.memo[key] = np.array(
            [r.weights_state == "warm" for r in records(fleet_columns(snap))], dtype=np.bool_
        )
    return found


def pool_figures(snap: FleetSnapshot) -> Mapping[str, PoolFigures]:
    """Pool id -> :class:`PoolFigures` for every pool with at least one node (once per snapshot)."""
    found: dict[str, PoolFigures] | None = snap.memo.get(_KEY)
    if found is None:
        cols = fleet_columns(snap)
        found = {}
        if len(cols):
            starts = cols.starts
            stale, warm, draining = cols.stale, cols.warm, cols.draining
            not_loaded = ~loaded(snap)
            failures = cols.ints("failures_w")
            lost_calls = np.add.reduceat(np.where(stale | not_loaded, failures, 0), starts).tolist()
            gone = (failures > 0) & (stale | (not_loaded & ~draining))
            lost_nodes = np.add.reduceat(gone.astype(np.int64), starts).tolist()
            fresh = warm & ~stale
            warm_fresh = np.add.reduceat(fresh.astype(np.int64), starts).tolist()
            busy = cols.ints("queue_depth") + cols.ints("running_requests")
            max_out = np.maximum.reduceat(busy, starts).tolist()
            all_stale = np.logical_and.reduceat(stale, starts).tolist()
            medians = _upper_medians(cols, fresh)
            for i, pool_id in enumerate(cols.pool_ids):
                found[pool_id] = PoolFigures(
                    lost_calls[i], lost_nodes[i], warm_fresh[i], max_out[i], all_stale[i], medians[i]
                )
        snap.memo[_KEY] = found
    return found


def figures_of(snap: FleetSnapshot, pool_id: str) -> PoolFigures:
    return pool_figures(snap).get(pool_id, EMPTY)


def _upper_medians(cols: FleetColumns, fresh: Bools) -> list[float | None]:
    """Per pool: ``sorted(xs)[len(xs) // 2]`` of the ``tbt_p99_ms`` of its warm fresh nodes that
    report one (None without). The sort is stable, as ``list.sort`` is, so between 0.0 and -0.0 the
    node order decides, as it does there."""
    values = cols.floats("tbt_p99_ms")
    take = fresh & ~np.isnan(values)
    n_pools = len(cols.pool_ids)
    out: list[float | None] = [None] * n_pools
    if not take.any():
        return out
    rows = np.flatnonzero(take)
    pools = cols.pool_of[rows]
    order = rows[np.lexsort((values[rows], pools))]  # by pool, then value; ties keep row order
    count = np.bincount(pools, minlength=n_pools)
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    has = np.flatnonzero(count > 0)
    picked = values[order[first[has] + count[has] // 2]].tolist()
    for i, v in zip(has.tolist(), picked, strict=True):
        out[i] = v
    return out
