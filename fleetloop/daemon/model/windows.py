"""Event-time windows: counters in fixed buckets keyed by ``ts_ms // bucket_ms``.

Folding a record adds into its bucket, so the state after a set of records does not depend on the
order they arrived in (the property a replay from offsets relies on). Reading a window sums the
buckets in ``(now - window, now]``. Buckets older than the retention behind the newest one seen are
dropped; a record that late is counted in ``late_dropped`` and otherwise ignored (Quix Streams'
"closed window" rule).
"""

from __future__ import annotations

import math
from bisect import bisect_right

BUCKET_MS = 1000

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


class Window:
    """Per-bucket vectors of ``width`` floats."""

    __slots__ = ("buckets", "width")

    def __init__(self, width: int) -> None:
        self.width = width
        self.buckets: dict[int, list[float]] = {}

    def add(self, bucket: int, values: tuple[float, ...]) -> None:
        row = self.buckets.get(bucket)
        if row is None:
            self.buckets[bucket] = list(values)
        else:
            for i, v in enumerate(values):
                row[i] += v

    def add_at(self, bucket: int, index: int, value: float) -> None:
        row = self.buckets.get(bucket)
        if row is None:
            row = self.buckets[bucket] = [0.0] * self.width
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
        """Drop buckets before ``bucket``; returns how many are left."""
        for b in [b for b in self.buckets if b < bucket]:
            del self.buckets[b]
        return len(self.buckets)


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
