"""What latency-outlier reads of the snapshot, and its verdicts: every node's figures as fleet-wide
arrays (once per snapshot), the pools' references (median and MAD per signal), each node's verdict
against its pool's limits, and the pools' failure levels (README.md beside this file: "Formula").

Array operations over rows of the snapshot's columns, for any number of pools at once: a pool's rows
are a contiguous run, ``pool_of[r]`` the pool of row ``r`` (0 for a single pool). The same doubles
as the per-node statement (``tests/oracles/latency_outlier.py``), which the tests hold them to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from fleetloop.policies.base import FleetSnapshot
from fleetloop.policies.breaker.latency_outlier.params import MAD_SCALE, SIGNALS, LatencyOutlierParams
from fleetloop.policies.columns import FleetColumns, Floats, segment_medians
from fleetloop.schemas.base import MAX_FIGURE

Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]
# A signal family's status, per row: the codes index ``STATUS``.
NODATA, CLEAR, FLAGGED = 0, 1, 2
STATUS = ("nodata", "clear", "flagged")


@dataclass(frozen=True, slots=True, eq=False)
class FleetFigures:
    """Per row of the snapshot's columns, what the breaker reads (built once per snapshot)."""

    figures: Floats  # (rows, 4): the signals, NaN for none (or a value not finite or negative)
    timed_out: Bools  # no first token in the window, but calls timed out (the TTFT no-data rule)
    share: Floats  # failures_w / requests_w, 0 without requests
    took: Bools  # requests_w > 0
    streak: Ints  # consecutive_failures


def fleet_figures(snap: FleetSnapshot, cols: FleetColumns) -> FleetFigures:
    """The breaker's per-node figures for every row of the snapshot's columns, once per snapshot."""
    key = ("latency-outlier.figures",)
    found: FleetFigures | None = snap.memo.get(key)
    if found is None:
        raw = (
            np.stack([cols.floats(s) for s in SIGNALS], axis=1) if len(cols) else np.zeros((0, len(SIGNALS)))
        )
        with np.errstate(invalid="ignore"):
            figures = np.where(np.isfinite(raw) & (raw >= 0), raw, np.nan)
        timed_out = np.isnan(cols.floats("ttft_mean_ms_w")) & (cols.ints("node_timeouts_w") > 0)
        requests = cols.ints("requests_w")
        took = requests > 0
        # int / int in Python is the correctly rounded quotient, as is float64 / float64 of ints
        # below 2**53: the same doubles.
        share = np.zeros(len(cols))
        np.divide(cols.ints("failures_w"), requests, out=share, where=took)
        found = snap.memo[key] = FleetFigures(
            figures, timed_out, share, took, cols.ints("consecutive_failures")
        )
    return found


class Limits(NamedTuple):
    """Per row and signal, its pool's bounds: whether the pool has a reference for the signal, its
    median ``m``, ``ratio * m`` and ``m + k * 1.4826 * MAD``."""

    has: Bools
    m: Floats
    above_ratio: Floats
    above_mad: Floats


def limits_rows(agg: Floats, pool_of: Ints, first_row: Ints, params: LatencyOutlierParams) -> Limits:
    """Each pool's reference (median and MAD of its rows' ``agg``, NaN: no value; a signal needs
    ``min_hosts`` values) and the limits it sets, handed to each of its rows. ``first_row[p]`` is pool
    ``p``'s first row; pools are contiguous runs of rows."""
    n_rows, n_sig = agg.shape
    n_pools = len(first_row)
    if n_rows == 0:
        nothing = np.zeros((0, n_sig))
        return Limits(np.zeros((0, n_sig), dtype=np.bool_), nothing, nothing, nothing)
    sizes = np.bincount(pool_of, minlength=n_pools)
    longest = int(sizes.max())
    pos = np.arange(n_rows, dtype=np.int64) - first_row[pool_of]
    pad = np.full((n_pools, longest, n_sig), np.nan)
    pad[pool_of, pos] = agg
    present = (~np.isnan(pad)).sum(axis=1)  # (pools, signals)
    enough = present >= params.min_hosts
    prow = np.arange(n_pools)[:, None]
    psig = np.arange(n_sig)[None, :]
    mid = np.maximum(present - 1, 0) // 2
    hi_at = np.minimum(present // 2, longest - 1)

    def middle(ordered: Floats) -> Floats:
        """Per pool and signal: the median of its ``present`` values, sorted first (NaN last)."""
        up = ordered[prow, hi_at, psig]
        return np.where(present % 2 == 1, up, (ordered[prow, mid, psig] + up) / 2)  # type: ignore[no-any-return]

    with np.errstate(invalid="ignore", over="ignore"):
        # Stable only where a 0.0 and a -0.0 could swap (a zero among the medians); the deviations
        # are absolute values, with no -0.0: equal ones are the same double, any sort will do.
        m = middle(np.sort(pad, axis=1, kind="stable" if (pad == 0).any() else None))
        mad = middle(np.sort(np.abs(pad - m[:, None, :]), axis=1))
        above_ratio = params.ratio * m
        above_mad = m + params.k * MAD_SCALE * mad
    return Limits(enough[pool_of], m[pool_of], above_ratio[pool_of], above_mad[pool_of])


def family_rows(
    x: Floats, at: int, lim: Limits, floor: Floats | float, severity: Floats
) -> tuple[Ints, Floats]:
    """A signal family's status per row (flagged, clear or nodata) and the severity seen so far:
    the signals ``at``, ``at + 1`` of ``x`` (NaN: none), each row against its pool's limits. A family
    stops at its first flagged signal, so a later signal's ratio does not enter the severity."""
    status = np.zeros(len(x), dtype=np.int64)
    done = np.zeros(len(x), dtype=np.bool_)
    for j in (at, at + 1):
        xj = x[:, j]
        mj = lim.m[:, j]
        seen = ~done & ~np.isnan(xj) & lim.has[:, j]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            severity = np.where(seen & (mj > 0), np.maximum(severity, xj / mj), severity)
            flagged = seen & (xj >= lim.above_ratio[:, j]) & (xj >= lim.above_mad[:, j]) & (xj - mj >= floor)
        status = np.where(flagged, FLAGGED, np.where(seen, CLEAR, status))
        done |= flagged
    return status, severity


class Verdicts(NamedTuple):
    """Per row: each family's status (codes index :data:`STATUS`), the severity (the largest ratio
    of a signal to its pool median, 0 without data) and whether the node is an outlier."""

    tbt: Ints
    ttft: Ints
    severity: Floats
    outlier: Bools


def verdict_rows(  # noqa: PLR0917 - the figures, the rows' state, then the limits and floors
    agg: Floats,
    figures: Floats,
    serve: Bools,
    timed_out: Bools,
    lim: Limits,
    tbt_floor: Floats | float,
    ttft_floor: Floats | float,
) -> Verdicts:
    """Every row's verdict: ``agg`` its remembered medians, ``figures`` this tick's (a fresh step time
    that is fine clears the TBT family at once: the remembered median outlives the episode that
    raised it); TTFT also counts as flagged when the node has no first token in the window but timed
    calls out. A row not serving gets no verdict (nodata, nodata, 0.0)."""
    severity = np.zeros(len(agg))
    tbt, severity = family_rows(agg, 0, lim, tbt_floor, severity)
    recheck = (tbt == FLAGGED) & ~np.isnan(figures[:, :2]).all(axis=1)
    if recheck.any():
        status, again = family_rows(figures, 0, lim, tbt_floor, severity)
        severity = np.where(recheck, again, severity)
        tbt = np.where(recheck & (status == CLEAR), CLEAR, tbt)
    ttft, severity = family_rows(agg, 2, lim, ttft_floor, severity)
    ttft = np.where((ttft == NODATA) & timed_out, FLAGGED, ttft)
    # Capped at MAX_FIGURE: a node reporting a step time of 1e308 (the schema accepts it) made its
    # severity leave the decision's bounds and refused the pool's whole breaker tick. Only the order
    # among such nodes (then by node id) and the published figure change. A -0.0 becomes 0.0 (+ 0.0).
    severity = np.minimum(np.where(serve, severity, 0.0), MAX_FIGURE) + 0.0
    tbt = np.where(serve, tbt, NODATA)
    ttft = np.where(serve, ttft, NODATA)
    return Verdicts(tbt, ttft, severity, (tbt == FLAGGED) & (ttft != CLEAR))


def failure_levels(  # noqa: PLR0917 - the rows' figures, then the pools
    share: Floats, took: Bools, streak: Ints, serve: Bools, pool_of: Ints, n_pools: int, threshold: int
) -> list[float]:
    """Each pool's failure level: the median failure share over its serving nodes that took calls in
    the window and are not in a failure streak themselves (``streak < threshold``, the error
    machine's threshold); over every serving node that took calls when all are; 0 with none."""
    took = serve & took
    pick = took & (streak < threshold)
    any_pick = np.bincount(pool_of[pick], minlength=n_pools) > 0
    pick = np.where(any_pick[pool_of], pick, took)
    med, count = segment_medians(np.where(pick, share, np.nan), pool_of, n_pools)
    return np.where(count > 0, med, 0.0).tolist()  # type: ignore[no-any-return]
