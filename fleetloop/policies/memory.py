"""A pool's remembered per-node figures as arrays: what a policy keeps of the last ``memory_ms``.

Two algorithms remember recent figures per node and take medians of them every tick (the
latency-outlier breaker, four latency figures; cache-aware routing, the step time). Kept as one
tuple per node, that is four sorts and a few tuples per node per tick, which at 10,000 nodes is a
large part of a whole-fleet tick. :class:`PoolMemory` holds a whole pool in two arrays instead:
``ts[r, k]`` is the event time of the tick remembered in slot ``k`` of node ``r`` (-1 for an empty
slot) and ``vals[r, k, j]`` its figure ``j`` (NaN when the node had none).

Contract (checked against the plain per-node form in ``tests/policies/test_fast_paths.py``, tick by
tick, bit for bit): after :meth:`PoolMemory.advance` a row holds exactly the figures with
``0 < now - ts < memory_ms`` that it held before plus this tick's (so a tick decided again replaces
its own figures, and a tick earlier than the last forgets what came after it); a node that left the
pool is forgotten and a new one starts empty. :meth:`PoolMemory.medians` gives per row and figure
the median of the figures present, computed as :func:`median_sorted` computes it (the middle value,
or ``(a + b) / 2`` of the two middle ones), so the same doubles. Slots are reused, so a row is not in
time order; :meth:`PoolMemory.figures` lists them in time order. Arrays are never written after the
tick that built them, so a state handed out stays as it was. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


def median_sorted(xs: Sequence[float]) -> float:
    """``statistics.median`` of an already sorted, non-empty list (same arithmetic, less overhead)."""
    n = len(xs)
    mid = n // 2
    return xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2


def kept_slots(ts: Ints, now: int, memory_ms: int) -> npt.NDArray[np.bool_]:
    """The slots :meth:`PoolMemory.advance` keeps at ``now``: ``(ts >= 0) & (now - ts < memory_ms) &
    (ts < now)``. For ``ts >= 0`` and ``now >= 0``, ``now - ts`` does not overflow and is below
    ``memory_ms`` exactly when ``ts > now - memory_ms``, which, when that is at least -1, already
    implies ``ts >= 0``: then two comparisons instead of five operations (the same mask)."""
    if now >= 0 and now - memory_ms >= -1:
        return (ts > now - memory_ms) & (ts < now)
    return (ts >= 0) & (now - ts < memory_ms) & (ts < now)


@dataclass(frozen=True, slots=True, eq=False)
class PoolMemory:
    """One row per node (``node_ids``, in the pool's order), one slot per remembered tick."""

    node_ids: tuple[str, ...]
    ts: Ints  # (rows, slots), -1 = empty
    vals: Floats  # (rows, slots, width), NaN = no figure

    @classmethod
    def empty(cls, width: int) -> PoolMemory:
        return cls((), np.empty((0, 0), dtype=np.int64), np.empty((0, 0, width), dtype=np.float64))

    @property
    def width(self) -> int:
        return int(self.vals.shape[2])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PoolMemory):
            return NotImplemented
        return (
            self.node_ids == other.node_ids
            and np.array_equal(self.ts, other.ts)
            and np.array_equal(self.vals, other.vals, equal_nan=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def advance(
        self,
        ids: tuple[str, ...],
        now: int,
        memory_ms: int,
        rows: Sequence[int] | Ints,
        figs: Sequence[tuple[float | None, ...]] | Floats,
    ) -> PoolMemory:
        """The memory after a tick at ``now`` for the pool's nodes ``ids``: figures older than
        ``memory_ms`` or not before ``now`` forgotten, then ``figs[i]`` remembered for the node in
        row ``rows[i]`` (a ``None`` figure is stored as missing; ``rows`` and ``figs`` may also be
        arrays, ``figs`` of shape (len(rows), width) with NaN for a missing figure)."""
        width = self.width
        ts, vals = self.ts, self.vals
        if ids != self.node_ids:
            where = {node_id: r for r, node_id in enumerate(self.node_ids)}
            src = np.array([where.get(i, -1) for i in ids], dtype=np.int64)
            has = src >= 0
            moved_ts = np.full((len(ids), ts.shape[1]), -1, dtype=np.int64)
            moved_vals = np.full((len(ids), ts.shape[1], width), np.nan)
            if has.any():
                moved_ts[has] = ts[src[has]]
                moved_vals[has] = vals[src[has]]
            ts, vals = moved_ts, moved_vals
        kept = kept_slots(ts, now, memory_ms)
        ts = np.where(kept, ts, -1)
        vals = np.where(kept[:, :, None], vals, np.nan)
        if len(rows):
            at = np.asarray(rows, dtype=np.int64)
            free = ~kept[at]
            if ts.shape[1] == 0 or not free.any(axis=1).all():
                grow = max(1, ts.shape[1])
                ts = np.concatenate([ts, np.full((len(ids), grow), -1, dtype=np.int64)], axis=1)
                vals = np.concatenate([vals, np.full((len(ids), grow, width), np.nan)], axis=1)
                free = ts[at] < 0
            slot = np.argmax(free, axis=1)
            ts[at, slot] = now
            vals[at, slot] = np.array(figs, dtype=np.float64).reshape(len(rows), width)  # None -> NaN
        return PoolMemory(ids, ts, vals)

    def medians(self, min_samples: int = 1) -> tuple[list[list[float]], list[list[bool]]]:
        """Per row and figure: the median of the figures present, and whether there are at least
        ``min_samples`` (at least one) of them (the median is meaningless where there are not)."""
        med, ok = self.median_arrays(min_samples)
        return med.tolist(), ok.tolist()

    def median_arrays(self, min_samples: int = 1) -> tuple[Floats, npt.NDArray[np.bool_]]:
        """:meth:`medians` as arrays of shape (rows, width)."""
        n, slots = self.ts.shape
        width = self.width
        if n == 0 or slots == 0:
            return np.zeros((n, width)), np.zeros((n, width), dtype=np.bool_)
        vals = self.vals
        # NaN last. Equal doubles sort alike whatever the algorithm, except 0.0 and -0.0: only then
        # does the order among equals (stable, as ``sorted``) decide which one is the middle value.
        # (Checked as "any zero", which is cheaper and only ever picks the stable sort more often.)
        ordered = np.sort(vals, axis=1, kind="stable") if (vals == 0).any() else np.sort(vals, axis=1)
        count = slots - np.isnan(vals).sum(axis=1)
        row = np.arange(n)[:, None]
        col = np.arange(width)[None, :]
        upper = ordered[row, np.minimum(count // 2, slots - 1), col]
        lower = ordered[row, np.maximum(count - 1, 0) // 2, col]
        med = np.where(count % 2 == 1, upper, (lower + upper) / 2)
        return med, count >= max(1, min_samples)

    def figures(self) -> dict[str, tuple[tuple[int | float | None, ...], ...]]:
        """Node id -> its remembered ``(ts, figure, ...)`` in ascending time (nodes with any)."""
        out: dict[str, tuple[tuple[int | float | None, ...], ...]] = {}
        for r, node_id in enumerate(self.node_ids):
            slots = sorted((t, k) for k, t in enumerate(self.ts[r].tolist()) if t >= 0)
            vals = self.vals[r].tolist()
            obs = tuple((t, *(None if math.isnan(v) else v for v in vals[k])) for t, k in slots)
            if obs:
                out[node_id] = obs
        return out
