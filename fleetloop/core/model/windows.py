"""Event-time windows: counters in fixed buckets keyed by ``ts_ms // bucket_ms``.

Folding a record adds into its bucket, so the state after a set of records does not depend on the
order they arrived in (the property a replay from offsets relies on). Reading a window sums the
buckets in ``(now - window, now]``. Buckets older than the retention behind the newest one seen are
dropped; a record that late is counted in ``late_dropped`` and otherwise ignored (Quix Streams'
"closed window" rule).

Eviction visits only the buckets it drops. Each window keeps ``low``, a bucket no key of its is
below: whatever makes a bucket lowers it to that bucket (:meth:`Window.add`, :meth:`Window.add_at`,
and the folds' inlined writes, which must do the same), and eviction raises it to its horizon. So
dropping the buckets before ``h`` is popping ``range(low, h)`` (about the ten seconds since the last
eviction, not every one of the ~300 kept): the same buckets a scan of every key finds, so the window
after it is the same. Measured at 10,000 nodes, a scan of every node window in one fold step held
the loop 169 ms. A window decoded from a checkpoint does not know its ``low`` (it is not written:
``_TRANSIENT``), and its first eviction scans every key, as does one whose ``low`` is further back
than it holds keys.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import chain, repeat
from operator import attrgetter
from types import MappingProxyType
from typing import ClassVar

import numpy as np
import numpy.typing as npt

BUCKET_MS = 1000

_NO_KEY = 2**62  # a new window's ``low``: it holds no bucket
_UNKNOWN = -(2**62)  # a decoded window's ``low``: any bucket may be held

# Log-spaced latency bins from 1 ms to ~10 min, ratio 2**(1/4) (about 19% wide): p99 within one bin.
_RATIO = 2**0.25
LAT_EDGES_MS: tuple[float, ...] = tuple(_RATIO**i for i in range(0, 4 * 20))  # 1 .. ~8e5 ms
N_LAT_BINS = len(LAT_EDGES_MS) + 1


def lat_bin(ms: float) -> int:
    return bisect_right(LAT_EDGES_MS, ms)


def lat_value(bin_index: int) -> float:
    """A representative latency for a bin: the geometric middle of its edges."""
    if bin_index <= 0:
        return LAT_EDGES_MS[0]
    if bin_index >= len(LAT_EDGES_MS):
        return LAT_EDGES_MS[-1]
    return math.sqrt(LAT_EDGES_MS[bin_index - 1] * LAT_EDGES_MS[bin_index])


_BUCKETS = attrgetter("buckets")
_DICT_GET = dict.get


class Window:
    """Per-bucket vectors of ``width`` floats; no key of ``buckets`` is below ``low`` (see the
    module's docstring: whoever adds a key lowers ``low`` to it)."""

    __slots__ = ("buckets", "low", "width")
    # Derived from the keys and never checkpointed: a decoded window starts not knowing it.
    _TRANSIENT: ClassVar[Mapping[str, int | None]] = MappingProxyType({"low": _UNKNOWN})

    def __init__(self, width: int) -> None:
        self.width = width
        self.buckets: dict[int, list[float]] = {}
        self.low = _NO_KEY

    def add(self, bucket: int, values: tuple[float, ...]) -> None:
        row = self.buckets.get(bucket)
        if row is None:
            self.buckets[bucket] = list(values)
            if bucket < self.low:  # noqa: PLR1730 (a compare, not a call, per new bucket)
                self.low = bucket
        else:
            for i, v in enumerate(values):
                row[i] += v

    def add_at(self, bucket: int, index: int, value: float) -> None:
        row = self.buckets.get(bucket)
        if row is None:
            row = self.buckets[bucket] = [0.0] * self.width
            if bucket < self.low:  # noqa: PLR1730
                self.low = bucket
        row[index] += value

    def total(self, now_ms: int, window_ms: int) -> list[float]:
        hi = now_ms // BUCKET_MS
        lo = hi - max(1, window_ms // BUCKET_MS)
        out = [0.0] * self.width
        buckets = self.buckets
        # Visit the window's buckets in ascending order (the sum is order-dependent in floating
        # point), looking each up, rather than sorting every retained bucket.
        for b in range(lo + 1, hi + 1) if hi - lo <= len(buckets) else sorted(buckets):
            row = buckets.get(b)
            if row is not None and lo < b <= hi:
                for i, v in enumerate(row):
                    out[i] += v
        return out

    def evict_before(self, bucket: int) -> int:
        """Drop buckets before ``bucket``; returns how many are left. Pops the buckets from ``low``
        up to ``bucket``, or, when that range is longer than the window holds keys (a decoded
        window, one idle for long), scans the keys instead: the same buckets either way."""
        buckets = self.buckets
        low = self.low
        if bucket <= low:
            return len(buckets)
        if bucket - low <= len(buckets):
            pop = buckets.pop
            for b in range(low, bucket):
                pop(b, None)
        else:
            for b in [b for b in buckets if b < bucket]:
                del buckets[b]
        self.low = bucket
        return len(buckets)


class WindowColumns:
    """The totals of many windows of one width at once, as one ``(rows, width)`` array, bit for bit
    :meth:`Window.total` of each row's window.

    Each bucket of the rows' windows is read into one array once (a row without that bucket holds
    zeros) and kept until the model says the bucket was written again (:meth:`forget`); a total adds
    the window's bucket arrays in ascending bucket order starting from zeros. That is
    :meth:`Window.total`'s arithmetic element for element: it adds the same values in the same order
    from 0.0, and the zeros added for a missing bucket change nothing (a running sum that starts at
    +0.0 is never -0.0, and ``x + 0.0 == x`` for every other double). What a snapshot reads per tick
    is the buckets written since the last one (one or two at a tick a second), not every row's
    every bucket.

    The caller keeps the rows fixed (the same windows in the same order) for the life of the object,
    and calls :meth:`forget` with the lowest bucket written and the eviction horizon before reading,
    or, for rows it wrote, :meth:`refresh` right after writing (the model's batch folds do, so a
    tick reads no node bucket whole once the folds keep them).
    """

    __slots__ = ("_dicts", "cols", "made", "n", "width")

    def __init__(self, wins: Sequence[Window], width: int) -> None:
        self.width = width
        self.n = len(wins)
        # The rows' bucket dicts (references, no object made per row: a bound ``get`` per row cost
        # ~0.5 µs and a tracked object each, 10,000 of them at every layout of a 10,000-node fleet).
        self._dicts: list[dict[int, list[float]]] = list(map(_BUCKETS, wins))
        self.cols: dict[int, npt.NDArray[np.float64] | None] = {}
        self.made = 0  # buckets :meth:`refresh` read whole since the last :meth:`totals`

    def forget(self, written_from: int, evicted_below: int) -> None:
        """Drop what a write may have changed: buckets at or after ``written_from`` (the lowest
        bucket folded into since the last read), and buckets before ``evicted_below`` (eviction
        deleted them from some rows)."""
        cols = self.cols
        for b in [b for b in cols if b >= written_from or b < evicted_below]:
            del cols[b]

    def carry(self, old: WindowColumns, rows: Sequence[Window], old_rows: Sequence[Window]) -> None:
        """Take over ``old``'s bucket arrays after the rows changed (a node arrived, left or moved):
        a row whose window ``old`` also held takes its values from there, a new row reads its own
        buckets (``old`` must be up to date: :meth:`forget` called with the current marks)."""
        was = dict(zip(map(id, old_rows), range(len(old_rows)), strict=True))
        take = np.fromiter(map(was.get, map(id, rows), repeat(-1)), dtype=np.int64, count=len(rows))
        new = np.flatnonzero(take < 0).tolist()
        # One gather per bucket (a new row gathers row 0, then holds zeros), not zeros and a masked
        # write: the same values, each bucket array made in one pass.
        safe = np.where(take < 0, 0, take) if new else take
        dicts = self._dicts
        for b, col in old.cols.items():
            if col is None and not new:
                self.cols[b] = None
                continue
            if col is not None and len(col):
                out = col.take(safe, axis=0)
                if new:
                    out[new] = 0.0
            else:
                out = np.zeros((self.n, self.width), dtype=np.float64)
            fresh = [(i, r) for i in new if (r := dicts[i].get(b)) is not None]
            if fresh:
                out[[i for i, _ in fresh]] = [r for _, r in fresh]
            self.cols[b] = out if col is not None or fresh else None

    def _read(self, b: int) -> npt.NDArray[np.float64] | None:
        rows = list(map(_DICT_GET, self._dicts, repeat(b, self.n)))
        missing = rows.count(None)
        if missing == self.n:
            return None
        if 2 * missing <= self.n:  # most rows have the bucket: convert them all at once
            # One flat pass (numpy's conversion of each value, as ``np.array`` of the rows makes:
            # the same doubles) without discovering the nested lists' shape first: ~1/3 cheaper.
            zero = [0.0] * self.width
            flat = chain.from_iterable([zero if r is None else r for r in rows])
            return np.fromiter(flat, dtype=np.float64, count=self.n * self.width).reshape(self.n, self.width)
        out = np.zeros((self.n, self.width), dtype=np.float64)  # few (a bucket still filling)
        present = [i for i, r in enumerate(rows) if r is not None]
        out[present] = [rows[i] for i in present]
        return out

    def refresh(self, b: int, rows: Sequence[int]) -> bool:
        """Re-read ``rows``' bucket ``b`` where its array is kept (the rows' windows were written
        there since it was read): the same doubles :meth:`_read` would give those rows (numpy's
        conversion of each value; a row without the bucket holds zeros). A bucket not kept is read
        whole: here when it is the next second or two after the newest kept, else when a total
        needs it. False, and the bucket's array dropped, when a value cannot be read (the total
        then reads it whole, raising where the read raises)."""
        cols = self.cols
        if b not in cols:
            # The second after the newest kept (the one a tick reads next): read it whole here,
            # once, rather than at the tick; then each batch re-reads the rows it wrote.
            # At most two between totals: a fold catching up on a backlog with no tick between
            # does not keep a bucket array for every second it folds.
            if cols and max(cols) < b <= max(cols) + 2 and self.made < 2:
                try:
                    cols[b] = self._read(b)
                except (TypeError, ValueError, OverflowError):
                    return False
                self.made += 1
            return True
        if not rows:
            return True
        dicts = self._dicts
        present = [dicts[i].get(b) for i in rows]
        col = cols[b]
        if col is None:
            if present.count(None) == len(present):
                return True  # still no row holds it
            col = np.zeros((self.n, self.width), dtype=np.float64)
        zero = [0.0] * self.width  # a row without it (only eviction deletes one, and forgets it)
        try:
            col[rows] = [zero if r is None else r for r in present]
        except (TypeError, ValueError, OverflowError):
            del cols[b]
            return False
        cols[b] = col
        return True

    def totals(self, now_ms: int, window_ms: int) -> npt.NDArray[np.float64]:
        """Every row's ``Window.total(now_ms, window_ms)``."""
        hi = now_ms // BUCKET_MS
        lo = hi - max(1, window_ms // BUCKET_MS)
        acc = np.zeros((self.n, self.width), dtype=np.float64)
        cols = self.cols
        self.made = 0
        for b in range(lo + 1, hi + 1):
            if b in cols:
                col = cols[b]
            else:
                col = cols[b] = self._read(b)
            if col is not None:
                np.add(acc, col, out=acc)
        if len(cols) > hi - lo:  # keep only this window's buckets
            for b in [b for b in cols if not lo < b <= hi]:
                del cols[b]
        return acc


def quantile_from_bins(counts: list[float], q: float) -> float | None:
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    acc = 0.0
    for i, c in enumerate(counts):
        acc += c
        if acc >= rank:
            return lat_value(i)
    return lat_value(len(counts) - 1)
