"""Per-pool figures that several sections read from a pool's nodes, computed for every pool at once
from the snapshot's fleet-wide columns (:mod:`fleetloop.policies.columns`), once per snapshot.

Each section used to walk its pool's :class:`NodeView` objects for a count, a sum or a median (the
retry budget's lost calls and nodes, admission's busiest node, batching's and admission's TBT
median, the engine's silent-pool check). At 10,000 nodes in ~240 pools that is tens of thousands of
attribute reads per tick, and it needs every view built. Here each figure is one segment operation
over the fleet (rows grouped by pool, as the columns are), kept in ``snap.memo`` and read per pool.

The plain per-node forms state the rules (``tests/oracles/ratio.py``'s lost calls and nodes,
``tests/oracles/tbt_feedback.py``'s TBT median, ``tests/oracles/engine.py``'s silent-pool check,
...), and ``tests/unit/test_pool_figures.py`` holds these to them, value for value (ints exactly,
the median bit for bit, signed zeros included), on generated fleets that misbehave. Pure: no I/O,
no clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from fleetloop.policies.base import FleetSnapshot
from fleetloop.policies.columns import Bools, FleetColumns, Floats, Ints, fleet_columns
from fleetloop.schemas.base import MAX_FIGURE

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
        # ``warm`` (built for the breaker and routing already) is loaded and not draining: only the
        # draining rows' weights are read here.
        cols = fleet_columns(snap)
        found = cols.warm.copy()
        recs = records(cols)
        for r in np.flatnonzero(cols.draining).tolist():
            found[r] = recs[r].weights_state == "warm"
        snap.memo[key] = found
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
            medians = upper_medians(cols, fresh)
            for i, pool_id in enumerate(cols.pool_ids):
                found[pool_id] = PoolFigures(
                    lost_calls[i], lost_nodes[i], warm_fresh[i], max_out[i], all_stale[i], medians[i]
                )
        snap.memo[_KEY] = found
    return found


def figures_of(snap: FleetSnapshot, pool_id: str) -> PoolFigures:
    return pool_figures(snap).get(pool_id, EMPTY)


def upper_medians(cols: FleetColumns, fresh: Bools) -> list[float | None]:
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
    pools = cols.pool_of[rows]  # ascending: the columns group rows by pool
    count = np.bincount(pools, minlength=n_pools)
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    # Each pool's values laid out as one row of a (pools, longest) array, in row order, padded with
    # +inf (sorted after every value; an inf value ties it with the same bits), then sorted along
    # the rows: many short sorts instead of one sort by (pool, value). Stable when a zero is among
    # them, so that 0.0 and -0.0 keep row order, as in ``list.sort``.
    got = values[rows]
    pad = np.full((n_pools, int(count.max())), np.inf)
    pad[pools, np.arange(len(rows)) - first[pools]] = got
    pad.sort(axis=1, kind="stable" if (got == 0).any() else None)
    has = np.flatnonzero(count > 0)
    picked = pad[has, count[has] // 2].tolist()
    for i, v in zip(has.tolist(), picked, strict=True):
        out[i] = v
    return out


# -- segment operations for the batch forms (``decide_pools``) -------------------------------------
#
# A section's ``decide_pools`` judges every pool of a batch at once over the fleet's columns; these
# are its per-pool reductions, each one numpy pass over the fleet instead of one call per pool, with
# the same doubles as the plain form's Python arithmetic over the pool's nodes in node order.

# Python's ``sum`` of floats adds left to right in 3.11 and compensates (Neumaier) from 3.12 on:
# the segment sums below are the left-to-right ones, so under a compensating ``sum`` they are done
# with ``sum`` itself, pool by pool (slower, the same doubles).
SEQUENTIAL_SUM: bool = sum([1e16, 1.0, -1e16]) == 0.0


def distinct_pools(ctxs: Sequence[Any]) -> bool:
    """The batch protocol's pools are distinct (a batch form's row masks are per pool); a batch
    that is not is decided pool by pool."""
    return len({c.pool_id for c in ctxs}) == len(ctxs)


def pool_index(snap: FleetSnapshot) -> Mapping[str, int]:
    """Pool id -> its index in the columns' ``pool_ids`` (pools with a node), once per snapshot."""
    key = ("pool_index",)
    found: Mapping[str, int] | None = snap.memo.get(key)
    if found is None:
        found = snap.memo[key] = {p: i for i, p in enumerate(fleet_columns(snap).pool_ids)}
    return found


def row_index(snap: FleetSnapshot) -> Mapping[str, int]:
    """Node id -> its row in the columns (once per snapshot)."""
    key = ("row_index",)
    found: Mapping[str, int] | None = snap.memo.get(key)
    if found is None:
        table = fleet_columns(snap).table
        index = getattr(table, "_index", None) if table is not None else None
        found = snap.memo[key] = index if index is not None else {n: r for r, n in enumerate(row_ids(snap))}
    return found


_STATE = attrgetter("state")


def open_enforced(breakers: Mapping[str, Any]) -> set[str]:
    """The node ids of a pool's enforced open breakers (``ctx.breakers``): the nodes it ejects.
    (Most pools have none open: that is found by one pass in C over the states.)"""
    if "open" not in map(_STATE, breakers.values()):
        return set()
    return {i for i, b in breakers.items() if b.state == "open" and b.enforced}


def ejected_by(snap: FleetSnapshot, breakers: Mapping[str, Any]) -> set[str]:
    """:func:`open_enforced` of a pool's ``ctx.breakers``, once per snapshot and breakers mapping:
    the batch forms of admission, autoscale and batching each read it, and the engine hands every
    section of a pool's tick the same mapping, built once after the breaker section and not changed
    after (the memo keeps the mapping itself, so its id is not reused while the snapshot lives, and
    its size: a mapping that grew or shrank since is read again)."""
    if not breakers:
        return set()
    key = ("ejected_by", id(breakers))
    found = snap.memo.get(key)
    if found is None or found[0] is not breakers or found[1] != len(breakers):
        found = snap.memo[key] = (breakers, len(breakers), open_enforced(breakers))
    return found[2]


def r6_fast(x: float) -> float:
    """:func:`fleetloop.policies.base.r6`, the same double: a whole number (signed zeros, and every
    double from 2**52 up) is its own rounding, so only the others go through ``round``."""
    x = float(x)
    return x if x.is_integer() else round(x, 6)


def r6_many(values: Sequence[float]) -> tuple[list[float], list[bool]]:
    """``[r6(x) for x in values]``, the same doubles, in one array pass; and, per value, whether its
    rounding is within the schema's ``Figure`` bounds (not NaN, not infinite).

    ``round(x, 6)`` is the double nearest ``k / 10**6``, ``k`` the integer nearest the exact product
    ``x * 10**6`` (ties to even). ``y = x * 1e6`` is the double nearest that product; below ``2**52``
    every integer and half-integer is a double, so rounding to doubles keeps ``y`` on the product's
    side of each of them, and ``np.rint(y)`` is ``k`` unless ``y`` is itself a half-integer (the
    product may have been just off the tie). ``k / 1e6`` (both exact) is then correctly rounded. A
    whole number (signed zeros, infinities, every double from ``2**52`` up) is its own rounding.
    Every other element (a half-integer ``y``, ``|y| >= 2**52``, NaN) goes through ``round``
    itself. ``tests/unit/test_batch_sections.py`` holds it to ``r6`` on hostile values, near ties
    and at every scale."""
    x = np.array(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x * 1e6
        out = np.rint(y) / 1e6
        whole = x == np.floor(x)
        sure = whole | ((np.abs(y) < 2.0**52) & (y - np.floor(y) != 0.5))
    out = np.where(whole, x, out)
    if not sure.all():
        for i in np.flatnonzero(~sure).tolist():
            out[i] = round(float(x[i]), 6)
    return out.tolist(), (np.abs(out) <= MAX_FIGURE).tolist()


def inputs_ok(values: Sequence[float]) -> bool:
    """:func:`figures_ok` for values the caller made floats (``float``, ``round``): within the
    bounds, and no NaN (a NaN makes the sum NaN)."""
    if not values:
        return True
    total = sum(values)
    return min(values) >= -MAX_FIGURE and max(values) <= MAX_FIGURE and not math.isnan(total)


def pool_owners(snap: FleetSnapshot) -> Callable[[str], Sequence[str]]:
    """Node id -> the pools whose ``PoolView.node_ids`` list it (once per snapshot). When every pool
    view lists exactly its rows of the columns (the daemon's snapshots), that is the row's pool."""
    key = ("pool_owners",)
    found: Callable[[str], Sequence[str]] | None = snap.memo.get(key)
    if found is None:
        cols = fleet_columns(snap)
        ids = row_ids(snap)
        bounds = cols.bounds
        if (
            all(pv.node_ids == tuple(ids[slice(*bounds.get(p, (0, 0)))]) for p, pv in snap.pools.items())
            and all(p in snap.pools for p in cols.pool_ids)
            and len(row_index(snap)) == len(ids)
        ):
            index = row_index(snap)
            pool_ids = cols.pool_ids
            pool_of = cols.pool_of

            def found(node_id: str) -> Sequence[str]:
                r = index.get(node_id)
                return () if r is None else (pool_ids[pool_of[r]],)

        else:
            owners: dict[str, list[str]] = {}
            for p, pv in snap.pools.items():
                for node_id in pv.node_ids:
                    owners.setdefault(node_id, []).append(p)

            def found(node_id: str) -> Sequence[str]:
                return owners.get(node_id, ())

        snap.memo[key] = found
    return found


def mark_rows(snap: FleetSnapshot, mask: Bools, pool_id: str, ids: Iterable[str], value: bool = True) -> None:
    """Set ``mask`` at the rows of ``pool_id`` whose node id is in ``ids`` (ids of other pools'
    nodes, or of no node, are not the pool's rows and are left alone)."""
    lo, hi = fleet_columns(snap).bounds.get(pool_id, (0, 0))
    index = row_index(snap)
    for i in ids:
        r = index.get(i)
        if r is not None and lo <= r < hi:
            mask[r] = value


def segment_counts(cols: FleetColumns, mask: Bools) -> Ints:
    """Per pool of the columns: how many of its rows are set in ``mask``."""
    return np.bincount(cols.pool_of[mask], minlength=len(cols.pool_ids)).astype(np.int64)


def segment_int_sums(cols: FleetColumns, values: Ints, mask: Bools) -> Ints:
    """Per pool: the exact sum of ``values`` over its rows set in ``mask`` (int64; callers keep
    the values where 64 nodes' sum fits, as the schema's bounds do)."""
    if not len(cols):
        return np.zeros(0, dtype=np.int64)
    return np.add.reduceat(np.where(mask, values, 0), cols.starts)


# Below this, the sum of a pool's integer-valued doubles (at most 2**16 nodes) is exact in any order.
_EXACT_PART = float(2**53 // 2**16)


def segment_whole_sums(cols: FleetColumns, name: str, mask: Bools) -> Floats:
    """Per pool: the sum of the integer field ``name`` over its rows set in ``mask``, as doubles
    with the exact integer's value: read from the field's doubles (which other sections build) when
    each is small enough for every sum to be exact, else from its integers."""
    values = cols.floats(name)
    if len(values) and not np.abs(values).max() < _EXACT_PART:
        return segment_int_sums(cols, cols.ints(name), mask).astype(np.float64)
    if not len(cols):
        return np.zeros(0)
    return np.add.reduceat(np.where(mask, values, 0.0), cols.starts)


def segment_sums(cols: FleetColumns, values: Floats, mask: Bools) -> Floats:
    """Per pool: ``sum(values[r] for r in the pool's rows if mask[r])`` as Python adds it (left to
    right from 0, in row order), bit for bit, 0.0 for a pool with none: the selected values are laid
    out one column per pool below a row of +0.0 and added row after row, so each pool's additions
    are its own, in order (0 + -0.0 is +0.0, as in Python; a padding +0.0 after the last value
    leaves the sum as it is, since a sum from +0.0 is never -0.0)."""
    n_pools = len(cols.pool_ids)
    rows = np.flatnonzero(mask)
    if not SEQUENTIAL_SUM:
        picked: dict[int, list[float]] = {}
        for p, v in zip(cols.pool_of[rows].tolist(), values[rows].tolist(), strict=True):
            picked.setdefault(p, []).append(v)
        out = np.zeros(n_pools)
        for p, vs in picked.items():
            out[p] = sum(vs)
        return out
    if not len(rows):
        return np.zeros(n_pools)
    pools = cols.pool_of[rows]
    first = np.searchsorted(pools, np.arange(n_pools, dtype=np.int64))
    rank = np.arange(len(rows), dtype=np.int64) - first[pools]
    grid = np.zeros((int(rank.max()) + 2, n_pools))  # row 0: the 0 Python's sum starts from
    grid[rank + 1, pools] = values[rows]
    with np.errstate(over="ignore", invalid="ignore"):
        return np.add.accumulate(grid, axis=0)[-1]  # type: ignore[no-any-return]


_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@-]*")


def is_ident(s: object) -> bool:
    """Whether ``s`` passes the schema's ``Ident`` (a batch form assembles a body from it without
    validation only when it does)."""
    return type(s) is str and 0 < len(s) <= 200 and _IDENT.fullmatch(s) is not None


def figures_ok(values: Iterable[object]) -> bool:
    """Every value a float within the schema's ``Figure`` bounds (not NaN, not infinite)."""
    return all(type(x) is float and -MAX_FIGURE <= x <= MAX_FIGURE for x in values)
