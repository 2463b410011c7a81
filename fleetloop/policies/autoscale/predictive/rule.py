"""slo-predictive's rule, pool by pool: the state it keeps, the demand trend, the learned cold start,
capacity and effective TBT, the open-workflow accumulation test, the node need, and the target with
its stabilization (README.md beside this file: "Formula"). Pure arithmetic on figures
:mod:`fleetloop.policies.autoscale.predictive.signals` reads; no I/O, no clock."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain, islice, repeat
from operator import itemgetter, le, mul, sub, truediv
from typing import NamedTuple, TypeVar

import numpy as np

from fleetloop.policies.autoscale.committed import committed
from fleetloop.policies.autoscale.predictive.params import SloPredictiveParams
from fleetloop.policies.autoscale.predictive.signals import Node
from fleetloop.policies.base import PoolView
from fleetloop.policies.pool_figures import SEQUENTIAL_SUM

MIN_LEARN_PRESSURE = 0.05  # below it an idle node says nothing about capacity
# No pool has a million nodes; a larger need is capped so its figure stays within a decision's bound.
MAX_NEED_NODES = 1_000_000.0
SIGNIFICANCE = 2.0  # standard errors a slope must clear to count as a trend
MIN_TREND_SAMPLES = 3.0  # independent windows needed to fit a slope
ACCUMULATION_Z = 2.0  # standard deviations of churn the open-workflow count must rise by
# The longest time from first seen cold to warm taken as a cold start: the bound of the
# ``cold_start_s`` parameter. A node that took longer was stuck, not starting.
MAX_COLD_START_S = 3600.0


@dataclass(frozen=True, slots=True)
class SloPredictiveState:
    demand: tuple[tuple[int, float], ...] = ()  # (event time ms, tokens/s), oldest first
    capacity_tok_s: float | None = None  # learned tokens/s per warm node at P = 1
    cold_start_s: float | None = None  # learned cold -> warm time
    not_warm_since: tuple[tuple[str, int], ...] = ()  # node id -> first seen cold or loading
    recs: tuple[tuple[int, int], ...] = ()  # (event time ms, raw target)
    last_desired: int | None = None
    last_down_ms: int | None = None
    # No longer written or read (the engine's drain list, ``PolicyContext.draining``, says which
    # nodes are leaving); kept so a checkpoint written before still decodes.
    drained: tuple[tuple[str, int], ...] = ()
    tbt_ms: float | None = None  # effective time between tokens, smoothed over a window
    failed_tasks: int = 0  # the pool's count of failed tasks at the last tick
    last_failure_ms: int | None = None  # when a task last failed on this pool
    # (event time ms, open workflows, tasks started so far, tasks ended so far), oldest first
    open_workflows: tuple[tuple[int, int, int, int], ...] = ()


def trend_slope(samples: Sequence[tuple[int, float]], window_ms: int) -> float:
    """A demand trend that holds over the whole span and over its newer half, else 0."""
    if len(samples) < 2:
        return 0.0
    whole = fit_slope(samples, window_ms)
    if not whole > 0:  # no trend over the whole span: the newer half's fit cannot make one
        return 0.0
    mid_ms = (samples[0][0] + samples[-1][0]) / 2.0
    newer = fit_slope([s for s in samples if s[0] >= mid_ms], window_ms)
    return min(whole, newer) if newer > 0 else 0.0


def fit_slope(samples: Sequence[tuple[int, float]], window_ms: int) -> float:
    """The least-squares slope of demand (tokens/s per s) when positive and significant, else 0.

    Samples ``window_ms`` apart are the independent ones (each is a window average), so the
    standard error is inflated by sqrt(n / n_eff) with ``n_eff = span / window``.

    Each sum is ``sum()`` over the terms in sample order, every term the same operations as the
    plain ``sum((t - mt) ** 2 for t in ts)`` (``pow(d, 2)`` is ``d ** 2``; ``y - my - slope * d``
    is ``(y - my) - slope * d``), iterated by ``map`` in C: the same doubles, a fraction of the
    time (a pool's demand over a two-minute lead holds about 120 samples, fitted twice a tick)."""
    n = len(samples)
    if n < 3:
        return 0.0
    t0 = samples[0][0]
    span_ms = samples[-1][0] - t0
    n_eff = span_ms / max(1, window_ms)
    if n_eff < MIN_TREND_SAMPLES:
        return 0.0
    dts, sxx = _time_terms(tuple(map(sub, map(_FIRST, samples), repeat(t0))))
    if sxx <= 0:
        return 0.0
    ys = list(map(_SECOND, samples))
    my = sum(ys) / n
    dys = list(map(sub, ys, repeat(my)))  # y - my
    slope = sum(map(mul, dts, dys)) / sxx
    if slope <= 0:
        return 0.0
    resid = sum(map(pow, map(sub, dys, map(mul, repeat(slope), dts)), repeat(2)))
    var = resid / max(1, n - 2)
    se = math.sqrt(var / sxx) * math.sqrt(n / max(n_eff, 1.0))
    return slope if slope > SIGNIFICANCE * se else 0.0


def trend_slopes(many: Sequence[Sequence[tuple[int, float]] | None], window_ms: int) -> list[float]:
    """``[trend_slope(s, window_ms) if s is not None else 0.0 for s in many]``, the same doubles, for a
    batch's pools at once. On a steady fleet about one pool in twenty has a significant trend; the
    others' fits end at 0.0, and this finds most of those without fitting them one by one.

    Pools whose samples fall at the same times (every pool of a tick that holds a whole lead: each
    tick appends ``now`` to each) share :func:`fit_slope`'s time terms, and its steps are array
    operations over one column per pool: the mean demand, each ``y - my``, each product and
    residual, one IEEE operation each as the ``map`` does them, and each sum added row after row
    below a row of +0.0, every pool's additions its own and in sample order (Python's ``sum`` of
    floats, left to right from 0, where it is that: :data:`SEQUENTIAL_SUM`). So the slope is
    :func:`fit_slope`'s double, and a slope ``<= 0`` is its 0.0 (and :func:`trend_slope`'s).

    The one step not the same operation is the residual's square: ``pow(d, 2)`` there (libm's
    ``pow``, within an ulp of the square but not promised to be the rounded one), ``d * d`` here.
    Each term then differs by at most an ulp and the sums of those non-negative terms, in the same
    order, by a relative ~2n ulps (~1e-12 for an hour of samples), and the standard error by about
    as much. So a pool whose slope is below ``SIGNIFICANCE`` standard errors by more than a relative
    1e-6 (``SCREEN_MARGIN``), with a finite error and a residual well inside the normal doubles
    (above 1e-290: no subnormal terms of any weight), gets :func:`fit_slope`'s 0.0 without the
    exact residual. Every other pool (a significant or nearly significant slope, a NaN or an
    infinity, a demand that is not a float, times no other pool shares, a compensating ``sum``) is
    fitted by :func:`trend_slope` itself. ``tests/unit/test_fast_predictive.py`` holds the two
    equal, bit for bit, trends and near-threshold slopes included."""
    if not SEQUENTIAL_SUM:
        return [trend_slope(s, window_ms) if s is not None else 0.0 for s in many]
    out = [0.0] * len(many)
    by_times: dict[tuple[int, ...], list[tuple[int, Sequence[tuple[int, float]]]]] = {}
    for i, samples in enumerate(many):
        # ``fit_slope``'s early zeros: fewer than three samples or three independent windows.
        if samples is None or len(samples) < 3:
            continue
        if (samples[-1][0] - samples[0][0]) / max(1, window_ms) < MIN_TREND_SAMPLES:
            continue
        by_times.setdefault(tuple(map(_FIRST, samples)), []).append((i, samples))
    for times, members in by_times.items():
        dts, sxx = _time_terms(tuple(map(sub, times, repeat(times[0]))))
        if sxx <= 0:
            continue
        columns = [list(map(_SECOND, samples)) for _, samples in members]
        if len(members) < 2 or set(map(type, chain.from_iterable(columns))) != {float}:
            for i, samples in members:
                out[i] = trend_slope(samples, window_ms)
            continue
        for (i, samples), zero in zip(members, _no_trend(times, dts, sxx, columns, window_ms), strict=True):
            if not zero:
                out[i] = trend_slope(samples, window_ms)
    return out


SCREEN_MARGIN = 1e-6  # :func:`trend_slopes`: how far below significance a slope is taken as none
_SCREEN_MIN_RESID = 1e-290  # and the least residual it judges (no subnormal terms of weight)


def _no_trend(
    times: tuple[int, ...], dts: tuple[float, ...], sxx: float, columns: list[list[float]], window_ms: int
) -> list[bool]:
    """Per column of demand at ``times`` (time terms ``dts``, ``sxx`` > 0): whether :func:`fit_slope`
    returns 0.0 for it, where that is certain (:func:`trend_slopes`); False where it may not be."""
    n = len(times)
    n_eff = (times[-1] - times[0]) / max(1, window_ms)
    grid = np.zeros((n + 1, len(columns)))  # row 0: the 0 Python's ``sum`` starts from
    grid[1:] = np.array(columns).T
    dt = np.asarray(dts)[:, None]
    with np.errstate(all="ignore"):
        my = np.add.accumulate(grid, axis=0)[-1] / n
        dys = grid[1:] - my
        grid[1:] = dt * dys
        slope = np.add.accumulate(grid, axis=0)[-1] / sxx
        r = dys - slope * dt
        grid[1:] = r * r
        resid = np.add.accumulate(grid, axis=0)[-1]
        se = np.sqrt(resid / max(1, n - 2) / sxx) * math.sqrt(n / max(n_eff, 1.0))
        below = (
            np.isfinite(se)
            & (resid > _SCREEN_MIN_RESID)
            & (slope * (1.0 + SCREEN_MARGIN) < SIGNIFICANCE * se)
        )
    zero: list[bool] = ((slope <= 0) | below).tolist()
    return zero


@lru_cache(maxsize=64)
def _time_terms(offsets: tuple[int, ...]) -> tuple[tuple[float, ...], float]:
    """:func:`fit_slope`'s terms of the sample times alone, from their offsets (ms) after the first:
    each ``t - mt`` (``t`` the offset in seconds, ``mt`` their mean) and the sum of their squares.
    A function of the offsets only, so kept for the last few offset patterns met: every pool of a
    tick holds samples at the same tick times, and the next tick's span has the same offsets
    again (a tick every second), so the fit recomputes only the demand's terms."""
    ts = list(map(truediv, offsets, repeat(1000.0)))
    mt = sum(ts) / len(ts)
    dts = tuple(map(sub, ts, repeat(mt)))  # t - mt
    return dts, sum(map(pow, dts, repeat(2)))


def accumulation(samples: Sequence[tuple[int, int, int, int]]) -> tuple[float, float]:
    """(rise, noise) of the open-workflow count over the samples' span: ``rise`` is its net change,
    0 unless the newer half rose too (a step that levelled off is not accumulation); ``noise`` is
    the standard deviation of that change if it were only the churn of a level count, the square
    root of the tasks that started plus those that ended over the span (a birth-death count's
    change is their difference; for Poisson starts and ends its variance is their sum)."""
    if len(samples) < 2:
        return 0.0, 0.0
    t_old, open_old, started_old, ended_old = samples[0]
    t_new, open_new, started_new, ended_new = samples[-1]
    mid_ms = (t_old + t_new) / 2.0
    open_mid = samples[_first_at(samples, mid_ms)][1]
    rise = float(open_new - open_old) if open_new > open_mid else 0.0
    return rise, math.sqrt(max(1, (started_new - started_old) + (ended_new - ended_old)))


def _first_at(samples: Sequence[tuple[int, int, int, int]], at: float) -> int:
    """``next(i for i, s in enumerate(samples) if s[0] >= at)``: found by bisection when the times
    ascend (as every tick appends ``now``), checked (the time found is ``>= at``, none before it is:
    their ``max`` taken in C, unless the times are known not to decrease, :class:`_Ordered`), else
    the plain scan."""
    i = bisect_left(samples, True, key=lambda s: s[0] >= at)
    if (
        i < len(samples)
        and samples[i][0] >= at
        and (i == 0 or _ORDERED.known(samples) or not max(map(_FIRST, samples[:i])) >= at)
    ):
        return i
    return next(i for i, s in enumerate(samples) if s[0] >= at)


_N = TypeVar("_N", bound=Node)


def drain_order(nodes: Sequence[_N]) -> list[_N]:
    """Scale-down victims, best first: cold, then loading (paid for, carrying nothing), then warm
    ones by load (running + queued requests, then KV use), highest node id first on ties."""
    rank = {"cold": 0, "loading": 1}
    by_id = sorted(nodes, key=lambda n: n.node_id, reverse=True)
    return sorted(
        by_id,
        key=lambda n: (
            rank.get(n.weights_state, 2),
            n.running_requests + n.queue_depth,
            n.kv_cache_used_frac,
        ),
    )


_T = TypeVar("_T", bound=tuple)  # type: ignore[type-arg]


def _recent(seq: tuple[_T, ...], now: int, span: float) -> tuple[_T, ...]:
    """``tuple(e for e in seq if now - e[0] <= span)``: the plain filter, here as a slice when the
    kept entries are a suffix (times ascending, as every tick appends ``now``), checked by the
    oldest kept time (the ``min`` of the suffix's times, taken in C; not needed when ``seq``'s times
    are known not to decrease, :func:`_ordered`), else the filter itself."""
    n = len(seq)
    i = 0
    while i < n and not now - seq[i][0] <= span:
        i += 1
    if i == n:
        return ()
    rest = seq[i:]
    if _ordered(seq, now) or now - min(map(_FIRST, rest)) <= span:
        return rest
    return tuple(e for e in seq if now - e[0] <= span)


_ORDERED_MAX = 1 << 16  # tuples listed at one ``now`` before the older generation is let go


class _Ordered:
    """Tuples of ``(event time, ...)`` entries whose times are known not to decrease, by identity.

    What :func:`demand_samples`, :func:`open_workflow_trend` and :func:`target` build each tick (a
    kept suffix of such a tuple, then an entry at ``now``, at least the suffix's last time) is the
    next tick's state, and the suffix checks of :func:`_recent`, :func:`_within` and
    :func:`_first_at` on it (a ``min`` or ``max`` over a lead's ~120 times, five a pool a tick) only
    ever confirm what is then known: entries whose times do not decrease are within a span from the
    first one that is. A tuple not listed (from a checkpoint, another process, a test) is checked
    once as a whole, and listed when it passes; one that does not pass is checked as before. Two
    generations, by the ``now`` they were listed at (this tick's and the last), each tuple held by
    its entry so that its id is not reused while it is listed. Only a shortcut: every result is the
    same without it."""

    __slots__ = ("last", "now", "this")

    def __init__(self) -> None:
        self.now: int | None = None
        self.this: dict[int, tuple[object, ...]] = {}
        self.last: dict[int, tuple[object, ...]] = {}

    def known(self, seq: object) -> bool:
        key = id(seq)
        return self.this.get(key) is seq or self.last.get(key) is seq

    def note(self, seq: tuple[object, ...], now: int) -> None:
        if now != self.now or len(self.this) >= _ORDERED_MAX:
            self.last, self.this, self.now = self.this, {}, now
        self.this[id(seq)] = seq


_ORDERED = _Ordered()


def _ordered(seq: tuple[tuple[object, ...], ...], now: int) -> bool:
    """Whether the times of ``seq``'s entries (their first fields) do not decrease: known
    (:class:`_Ordered`), or checked here in C and then known. Only ``int`` times, whose differences
    with ``now`` are exact (so ``now - t <= span`` holds from the first ``t`` that it holds for);
    False for anything else (a float, NaN, an entry without a time): the caller checks as it did."""
    if _ORDERED.known(seq):
        return True
    try:
        times = list(map(_FIRST, seq))
    except (TypeError, IndexError, KeyError):
        return False
    ok = set(map(type, times)) <= {int} and all(map(le, times, islice(times, 1, None)))
    if ok:
        _ORDERED.note(seq, now)
    return ok


def _then(kept: tuple[_T, ...], entry: _T, now: int, *, ordered: bool) -> tuple[_T, ...]:
    """``(*kept, entry)``, listed as ordered (:class:`_Ordered`) when ``ordered`` (``kept``'s times
    are ints that do not decrease) and ``entry``'s time is an int at least ``kept``'s last."""
    out = (*kept, entry)
    t = entry[0]
    if ordered and type(t) is int and (not kept or kept[-1][0] <= t):
        _ORDERED.note(out, now)
    return out


class Target(NamedTuple):
    """A pool's node target this tick (:func:`target`)."""

    raw: int  # before stabilization
    desired: int
    reason: str
    recs: tuple[tuple[int, int], ...]  # the raw targets stabilization keeps, this one last
    last_down_ms: int | None
    last_failure_ms: int | None
    failed_tasks: int
    # The target fell below the committed size (:func:`committed`) this tick: the nodes to give
    # back are named now, once, not again on every tick the actuator has not yet removed them.
    stepped_down: bool


def target(
    state: SloPredictiveState,
    params: SloPredictiveParams,
    pool: PoolView | None,
    *,
    now: int,
    has_nodes: bool,
    current: int,
    n_warm: int,
    capacity: float | None,
    need: float,
    slope: float,
    sibling_binds: bool,
    accumulating: bool,
    lead_s: float,
    bounds: tuple[int, int],
) -> Target:
    """The raw target and its reason from ``need``, then stabilization (both forms): up at once past
    a short window (``up_window_s``), down only to the highest raw target within the down window
    (the lead, unless ``down_window_s``), held while tasks fail or accumulate, one step of at most
    ``down_step_frac`` per ``down_period_s``, clamped to the pool's bounds. ``has_nodes``: the pool
    has a node row; ``current``: its active nodes; ``n_warm``: those serving.

    Stabilization works from the pool's *committed* size (:func:`committed`): the last target when
    the active nodes are more than it (nodes asked to go back that the actuator has not removed yet,
    or that a floor of its own keeps), else the active nodes. A hold or a rate limit keeps that size;
    it never raises the target to nodes the rule already gave back (README.md: "Committed size")."""
    lo, hi = bounds
    base = committed(state.last_desired, current)
    if not has_nodes and pool is None:
        raw, reason = lo, "no-pool-yet"
    elif current == 0:
        raw, reason = max(lo, math.ceil(need)), "no-active-node"
    elif not n_warm and capacity is None:
        raw, reason = base, "nothing-warm-yet"
    elif abs(need / current - 1.0) <= params.tolerance:
        # The nodes there are enough; above the committed size only for a need above it.
        raw, reason = (current if need > base else base), "within-tolerance"
    else:
        raw = math.ceil(need - 1e-9)
        reason = "scale-up" if raw > base else "scale-down"
    if slope > 0 and raw > base:
        reason = "scale-up-trend"
    if sibling_binds and raw > base:
        reason = "scale-up-sibling-short"

    down_window_ms = (params.down_window_s if params.down_window_s is not None else lead_s) * 1000.0
    up_window_ms = params.up_window_s * 1000.0
    keep_ms = max(down_window_ms, up_window_ms)
    first = () if state.last_desired is not None else ((now, current),)  # as HPA's first sync
    kept = _recent(state.recs, now, keep_ms)
    ordered = _ordered(state.recs, now) and type(now) is int and (not first or not kept or now <= kept[0][0])
    recs = _then((*first, *kept) if first else kept, (now, raw), now, ordered=ordered)
    up_floor = _within(recs, now, up_window_ms, min)
    down_ceiling = _within(recs, now, down_window_ms, max)
    desired = min(max(base, up_floor), down_ceiling)
    if raw > base and up_floor < raw:
        reason = "scale-up-stabilized"
    elif raw < base and down_ceiling > raw:
        reason = "scale-down-stabilized"
    last_down = state.last_down_ms
    last_failure = state.last_failure_ms
    failed_tasks = pool.tasks_failed if pool is not None else state.failed_tasks
    if failed_tasks > state.failed_tasks and state.last_desired is not None:
        last_failure = now
    failing = last_failure is not None and now - last_failure <= down_window_ms
    if desired < base and failing:
        desired, reason = base, "scale-down-held-tasks-failing"
    if desired < base and accumulating:
        desired, reason = base, "scale-down-held-tasks-accumulating"
    if desired < base:
        if last_down is not None and now - last_down < params.down_period_s * 1000.0:
            desired, reason = base, "scale-down-rate-limited"
        else:
            step = max(1, math.floor(params.down_step_frac * base))
            desired = max(desired, base - step)
    if base == 0:
        desired = raw
    clamped = min(max(desired, lo), hi)
    if clamped != desired:
        reason = "at-max-nodes" if clamped < desired else "at-min-nodes"
        desired = clamped
    stepped_down = desired < base
    if stepped_down:
        last_down = now
    return Target(raw, desired, reason, recs, last_down, last_failure, failed_tasks, stepped_down)


def learn_cold_start(cold_start: float | None, now: int, seen_cold_ms: int) -> float | None:
    """The EWMA (weight 1/2) of cold -> warm times, with the sample ``now - seen_cold_ms``. A sample
    outside (0, ``MAX_COLD_START_S``] is no cold start but a clock that jumped (a tick from the far
    future, then back) or a stuck node, and is not learned: a negative one made the lead and the down
    window negative (an empty max(), the pool's tick refused), a huge one a lead of years."""
    sample = (now - seen_cold_ms) / 1000.0
    if not 0.0 < sample <= MAX_COLD_START_S:
        return cold_start
    return sample if cold_start is None else 0.5 * cold_start + 0.5 * sample


def _within(
    recs: tuple[tuple[int, int], ...], now: int, span: float, pick: Callable[[Iterable[int]], int]
) -> int:
    """``pick(r for t, r in recs if now - t <= span)``. When the times ascend (every tick appends
    ``now``), the entries within ``span`` are a suffix: its start is found by bisection, and checked
    (the suffix's oldest time is within ``span``, the newest time before it is not: ``min`` and
    ``max`` taken in C; not needed when the times are known not to decrease, :func:`_ordered`), then
    the suffix is picked in C; else the plain generator."""
    i = bisect_left(recs, True, key=lambda e: now - e[0] <= span)
    rest = recs[i:]
    if _ORDERED.known(recs) or (
        (not rest or now - min(map(_FIRST, rest)) <= span)
        and (i == 0 or not now - max(map(_FIRST, recs[:i])) <= span)
    ):
        return pick(map(_SECOND, rest))
    return pick(r for t, r in recs if now - t <= span)


_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


# -- the rule's steps, pool by pool (the batch form calls them in this order) -----------------------


def cold_starts(
    cold_start: float | None,
    not_warm_since: tuple[tuple[str, int], ...],
    now: int,
    nodes: Iterable[tuple[str, bool, bool]],
) -> tuple[float | None, tuple[tuple[str, int], ...]]:
    """(the learned cold start, the not-warm nodes' first-seen times) after this tick, from the last
    tick's: ``nodes`` are the pool's ``(node id, stale, weights loaded)`` in node order; a node seen
    going from cold or loading to warm is a cold-start sample (:func:`learn_cold_start`). The one
    implementation for every autoscaler that learns its lead (slo-predictive, capacity)."""
    since = dict(not_warm_since)
    live: set[str] = set()
    for node_id, stale, warm in nodes:
        if stale:
            continue
        live.add(node_id)
        if not warm:
            since.setdefault(node_id, now)
        elif node_id in since:
            cold_start = learn_cold_start(cold_start, now, since.pop(node_id))
    return cold_start, tuple(sorted((i, t) for i, t in since.items() if i in live))


class Trend(NamedTuple):
    """The pool's served-token demand over the lead (:func:`demand_samples`, :func:`with_slope`)."""

    samples: tuple[tuple[int, float], ...]  # kept over the horizon, this tick's last
    horizon_ms: float
    full: bool  # a whole horizon seen: a controller that has not does not extrapolate (start-up)
    slope: float  # tokens/s per s, 0 unless a significant trend (:func:`trend_slope`)
    projected: float  # demand one lead ahead


def demand_samples(
    state: SloPredictiveState, now: int, demand: float, lead_s: float, window_ms: int
) -> tuple[tuple[tuple[int, float], ...], float, bool]:
    """The demand's samples kept over the horizon (this tick's last), the horizon, and whether a
    whole one was seen: the trend (:func:`trend_slope`) is fitted only then, a batch's all at once
    (:func:`trend_slopes`)."""
    horizon_ms = max(lead_s * 1000.0, 3.0 * window_ms)
    kept = _recent(state.demand, now, horizon_ms)
    samples = _then(kept, (now, demand), now, ordered=_ordered(state.demand, now))
    return samples, horizon_ms, bool(state.demand) and now - state.demand[0][0] >= horizon_ms


def with_slope(  # noqa: PLR0917 - :func:`demand_samples`' figures, then the slope fitted to them
    samples: tuple[tuple[int, float], ...],
    horizon_ms: float,
    full: bool,
    slope: float,
    demand: float,
    lead_s: float,
) -> Trend:
    """The :class:`Trend` of :func:`demand_samples`' figures and their slope (0.0 unless ``full``)."""
    return Trend(samples, horizon_ms, full, slope, demand + slope * lead_s)


def smoothed_tbt(  # noqa: PLR0917 - the state and params, then the pool's figures
    state: SloPredictiveState,
    params: SloPredictiveParams,
    pool: PoolView | None,
    now: int,
    n_warm: int,
    median_running: float | None,
    tick_s: float,
    window_ms: int,
) -> float | None:
    """The effective time between tokens a running request sees (Little's law: requests in service
    over tokens out per second), smoothed over a window. The median node's concurrency times the
    node count: one slow node piling up requests (a breaker's case, not a capacity one) does not make
    the whole pool look stalled."""
    out_rate = pool.output_tokens_rate_per_s if pool else 0.0
    running = n_warm * (median_running or 0.0)
    started = state.demand[0][0] if state.demand else now
    settled = now - started >= window_ms and pool is not None and pool.requests_w >= params.min_requests
    # Output is counted when a call ends: until a whole window of calls has ended the rate
    # understates the tokens flowing and the ratio would read as a stall.
    tbt_now = 1000.0 * running / out_rate if n_warm and out_rate > 0 and settled else None
    tbt = state.tbt_ms
    if tbt_now is not None:
        beta = 1.0 - 0.5 ** (tick_s * 1000.0 / window_ms)
        tbt = tbt_now if tbt is None else tbt + beta * (tbt_now - tbt)
    elif not n_warm:
        tbt = None
    return tbt


def learned_capacity(  # noqa: PLR0917 - the state and params, then the pool's figures
    state: SloPredictiveState,
    params: SloPredictiveParams,
    pool: PoolView | None,
    n_warm: int,
    p_now: float,
    demand: float,
    tick_s: float,
) -> tuple[float | None, float | None]:
    """(the capacity per warm node at the target, learned from the pressure it is seen at; this
    tick's observation of it, None when the tick teaches nothing)."""
    capacity = state.capacity_tok_s
    learnable = (
        pool is not None
        and n_warm
        and pool.requests_w >= params.min_requests
        and p_now >= MIN_LEARN_PRESSURE
        and demand > 0
    )
    if not learnable:
        return capacity, None
    c_obs = demand / n_warm / p_now
    alpha = 1.0 - 0.5 ** (tick_s / params.capacity_halflife_s)
    return (c_obs if capacity is None else capacity + alpha * (c_obs - capacity)), c_obs


class OpenWorkflows(NamedTuple):
    """The pool's open workflows over the horizon (:func:`open_workflow_trend`)."""

    samples: tuple[tuple[int, int, int, int], ...]  # kept over the horizon, this tick's last
    rise: float
    noise: float
    accumulating: bool


def open_workflow_trend(
    state: SloPredictiveState, pool: PoolView | None, now: int, horizon_ms: float, full: bool
) -> OpenWorkflows:
    """Open workflows: each one will call again (a chain of sequential calls), so while their
    number grows the demand still ahead is not yet in the served tokens."""
    counts = (
        (now, pool.open_workflows, pool.workflows_started, pool.workflows_ended)
        if pool is not None
        else (now, 0, 0, 0)
    )
    kept = _recent(state.open_workflows, now, horizon_ms)
    samples = _then(kept, counts, now, ordered=_ordered(state.open_workflows, now))
    rise, noise = accumulation(samples) if full else (0.0, 0.0)
    return OpenWorkflows(samples, rise, noise, rise > ACCUMULATION_Z * noise)


def need_nodes(  # noqa: PLR0917 - the figures of the formula's ``need``
    params: SloPredictiveParams,
    level: float,
    demand: float,
    backlog: float,
    capacity: float | None,
    projected: float,
    diverted_tok_s: float,
    sibling_short: float,
) -> float:
    """``need`` (README.md, "Formula"): ``level`` is ``n_w * P``."""
    growth = max(1.0, projected / demand) if demand > 0 else 1.0
    by_capacity = (demand + backlog) / capacity if capacity else 0.0
    # Calls the router moved to another model's pool: demand this pool still has to carry.
    diverted = diverted_tok_s / capacity if capacity else 0.0
    need = (max(level, by_capacity) + diverted) * growth + sibling_short
    if need > 0:
        need += params.spare_nodes  # N+k: survive losing k nodes while replacements warm up
    # A hostile figure the schema accepts (a node reporting 10**12 queued prompt tokens) reads
    # as ~1e15 nodes, past a decision's figure bound, and would fail the pool's whole tick
    # (breaker and routing with it). Past MAX_NEED_NODES the figure only says "as many as
    # allowed": max_nodes and the step limit apply after.
    return min(need, MAX_NEED_NODES)
