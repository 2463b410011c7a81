"""What the benchmarks share: progress lines, percentiles, RSS, the exponent of a log-log fit."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import numpy as np


def progress(msg: str) -> None:
    sys.stderr.write(f"{msg}\n")
    sys.stderr.flush()


def pct(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0..100) by the nearest-rank rule: an observed value, never an interpolation."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100.0 * len(s)) - 1)]


def rss_mib() -> float:
    """The process's resident set size now (Linux /proc), MiB."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return math.nan


def growth_exponent(sizes: Sequence[float], values: Sequence[float]) -> float | None:
    """The slope of log(value) against log(size): 1.0 is linear, 2.0 quadratic."""
    pts = [(s, v) for s, v in zip(sizes, values, strict=True) if s > 0 and v > 0]
    if len(pts) < 2:
        return None
    xs = np.log([p[0] for p in pts])
    ys = np.log([p[1] for p in pts])
    return float(np.polyfit(xs, ys, 1)[0])
