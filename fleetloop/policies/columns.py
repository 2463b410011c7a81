"""One snapshot's nodes as fleet-wide columns, pool by pool: what a policy reads instead of a Python
object per node when it judges every node of every pool each tick.

A whole-fleet tick at 10,000 nodes in ~240 pools of 16-64 nodes has ~3 us per decision for
everything. A numpy call costs 1-5 us whatever its length, so per-pool arrays spend most of their
time in call overhead; a figure computed for every node of the fleet at once (one array per field,
rows grouped by pool) pays that overhead once per tick. :func:`fleet_columns` builds the columns
once per snapshot (kept in ``snap.memo``, like the pools' node tuples) and hands them to every pool's
tick:

- ``nodes``: every pool's nodes, pool by pool in pool-id order, each pool's in node-id order
  (exactly ``snap.pool_nodes(pool)`` for each pool, concatenated), so row ``r`` is ``nodes[r]``;
- ``bounds[pool_id] = (start, end)``: the pool's rows; ``pool_of[r]``: the index of row ``r``'s pool
  in ``pool_ids``; ``starts``: each pool's first row (for ``np.ufunc.reduceat``);
- ``floats(field)`` / ``ints(field)``: one node field as an array (a missing figure is NaN),
  ``warm`` / ``stale`` / ``draining``: the flags, each built on first use and kept.

:func:`segment_medians` gives each pool's median of a column with the arithmetic of
:func:`fleetloop.policies.memory.median_sorted` (the middle value, or ``(a + b) / 2`` of the two
middle ones), so the same doubles as a sorted list per pool. The columns hold the views' own values
(``tests/unit/test_fast_columns.py`` checks them against the views on generated fleets with nodes
joining and leaving). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fleetloop.policies.base import FleetSnapshot, NodeView

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

_KEY = ("fleet_columns",)


@dataclass(frozen=True, slots=True, eq=False)
class FleetColumns:
    pool_ids: tuple[str, ...]  # pools with at least one node, sorted
    nodes: tuple[NodeView, ...]
    bounds: Mapping[str, tuple[int, int]]
    pool_of: Ints
    starts: Ints
    _memo: dict[str, npt.NDArray[np.generic]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.nodes)

    def floats(self, name: str) -> Floats:
        """The field ``name`` of every row as doubles; a missing figure (None) is NaN."""
        found = self._memo.get(name)
        if found is None:
            nan = np.nan
            found = self._memo[name] = np.array(
                [nan if (v := getattr(n, name)) is None else v for n in self.nodes], dtype=np.float64
            )
        return found  # type: ignore[return-value]

    def ints(self, name: str) -> Ints:
        key = f"int:{name}"
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = np.array([getattr(n, name) for n in self.nodes], dtype=np.int64)
        return found  # type: ignore[return-value]

    def _flag(self, name: str) -> Bools:
        found = self._memo.get(name)
        if found is None:
            nodes = self.nodes
            if name == "warm":
                values = [n.weights_state == "warm" and not n.draining for n in nodes]
            else:
                values = [bool(getattr(n, name)) for n in nodes]
            found = self._memo[name] = np.array(values, dtype=np.bool_)
        return found  # type: ignore[return-value]

    @property
    def warm(self) -> Bools:
        """``NodeView.warm``: weights loaded and not draining."""
        return self._flag("warm")

    @property
    def stale(self) -> Bools:
        return self._flag("stale")

    @property
    def draining(self) -> Bools:
        return self._flag("draining")


def fleet_columns(snap: FleetSnapshot) -> FleetColumns:
    """The snapshot's nodes as columns, pool by pool (built once per snapshot)."""
    found: FleetColumns | None = snap.memo.get(_KEY)
    if found is None:
        nodes: list[NodeView] = []
        pool_ids: list[str] = []
        bounds: dict[str, tuple[int, int]] = {}
        sizes: list[int] = []
        for pool_id in sorted(snap.pools):
            pool = snap.pool_nodes(pool_id)
            if pool:
                bounds[pool_id] = (len(nodes), len(nodes) + len(pool))
                pool_ids.append(pool_id)
                sizes.append(len(pool))
                nodes.extend(pool)
        counts = np.array(sizes, dtype=np.int64)
        found = snap.memo[_KEY] = FleetColumns(
            tuple(pool_ids),
            tuple(nodes),
            bounds,
            np.repeat(np.arange(len(pool_ids), dtype=np.int64), counts),
            np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if sizes else counts,
        )
    return found


def segment_medians(values: Floats, pool_of: Ints, n_pools: int) -> tuple[Floats, Ints]:
    """Per pool: the median of its rows' values that are not NaN (NaN where it has none), and how
    many there are. The same doubles as ``median_sorted(sorted(xs))`` over each pool's values."""
    present = ~np.isnan(values)
    count = np.bincount(pool_of[present], minlength=n_pools).astype(np.int64)
    med = np.full(n_pools, np.nan)
    if not present.any():
        return med, count
    order = np.lexsort((values, pool_of))  # by pool, then value; NaN after every number
    ordered = values[order]
    first = np.searchsorted(pool_of[order], np.arange(n_pools, dtype=np.int64))
    has = count > 0
    upper = ordered[(first + count // 2)[has]]
    lower = ordered[(first + np.maximum(count - 1, 0) // 2)[has]]
    med[has] = np.where(count[has] % 2 == 1, upper, (lower + upper) / 2)
    return med, count
