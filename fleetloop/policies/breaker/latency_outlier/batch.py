"""latency-outlier over the snapshot's columns: :func:`decide_columns` (one pool, any state: what
``LatencyOutlier.decide`` runs) and :func:`decide_pools` (a batch of pools at once, what the engine
runs). Both compute the figures, references and verdicts as array operations
(:mod:`fleetloop.policies.breaker.latency_outlier.signals`) and step each pool's nodes with the one
rule (:func:`fleetloop.policies.breaker.latency_outlier.rule.pool_tick`). They differ only in how a
pool's memory is kept and which rows are handled:

- :func:`decide_columns` advances the pool's :class:`PoolMemory` (which moves rows when nodes join or
  leave) and hands every row to the rule;
- :func:`decide_pools` advances every pool's memory in one array operation over the batch's rows
  (each pool's memory laid side by side, padded with empty slots; a pool's slots, its growth and the
  slot each figure lands in are what ``PoolMemory.advance`` picks for it), and each pool gets back its
  own rows and slots as a view. It hands the rule only the rows that need Python: a row whose node is
  quiet (:func:`quiet`: both machines closed, no streak, no ejection, no ramp), does not fail, did not
  change warmth and is no outlier has nothing to step; if its last record was ``HEALTHY``, it is not
  its keyframe and that record is not too old, it is not emitted either
  (:mod:`fleetloop.policies.breaker.emission`), and the row costs no Python at all. A pool whose handled
  rows are all trivial (most pools, most ticks: the rows due a keyframe) is decided by
  :func:`fleetloop.policies.breaker.latency_outlier.rule.quiet_tick`, each row's closed healthy record
  and nothing to step, without the rule's per-row bookkeeping. What a row needs of
  the per-node dicts is kept as arrays beside the state (:class:`RowCache`, derived data, keyed by the
  state's identity, so the state itself is exactly what ``decide`` makes, to the pickle byte).

A pool that does not fit the batch's form is decided by :func:`decide_columns`: one whose nodes are
not those of its state's cache (a node joined or left, a state without a cache: the first tick, a
checkpoint, a state from ``decide``), an empty pool, or a pool with a figure outside the schema's
bounds (its ``decide`` raises, as it does alone). ``tests/unit/test_breaker_batch.py`` holds the two
equal, tick after tick, on the bench fleet, on perturbed fleets with hostile values, and on odd
fleets; ``tests/unit/test_fast_breaker.py`` holds :func:`decide_columns` to the per-node statement
(``tests/oracles/latency_outlier.py``). Pure: no I/O, no clock.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import numpy as np

from fleetloop.policies.base import FleetSnapshot, NodeView, PolicyContext, PolicyResult, r6, r6_array
from fleetloop.policies.breaker.emission import KEYFRAME_TICKS, keyframe_residue
from fleetloop.policies.breaker.latency_outlier.params import LatencyOutlierParams
from fleetloop.policies.breaker.latency_outlier.rule import (
    HEALTHY,
    NodeState,
    PoolOutcome,
    PoolRows,
    RowCache,
    State,
    phases,
    pool_tick,
    quiet,
    quiet_tick,
    row_cache,
)
from fleetloop.policies.breaker.latency_outlier.signals import (
    Bools,
    FleetFigures,
    Ints,
    Verdicts,
    failure_levels,
    fleet_figures,
    limits_rows,
    verdict_rows,
)
from fleetloop.policies.columns import FleetColumns, Floats, fleet_columns
from fleetloop.policies.memory import PoolMemory, kept_slots
from fleetloop.policies.pool_figures import row_ids
from fleetloop.schemas.base import MAX_FIGURE


def decide_columns(
    snap: FleetSnapshot, params: LatencyOutlierParams, state: State, ctx: PolicyContext
) -> PolicyResult[State]:
    """One pool's tick, whatever its state."""
    now = ctx.now_ms
    cols = fleet_columns(snap)
    lo, hi = cols.bounds.get(ctx.pool_id, (0, 0))
    rows = slice(lo, hi)
    fleet = fleet_figures(snap, cols)
    figures = fleet.figures[rows]
    warm = cols.warm[rows]
    serve = warm & ~cols.stale[rows]
    has = serve & ~np.isnan(figures).all(axis=1)
    ids = tuple(row_ids(snap)[lo:hi])
    memory = state.memory.advance(ids, now, params.memory_ms, np.flatnonzero(has), figures[has])
    med, ok = memory.median_arrays(params.min_samples)
    agg = np.where(ok & serve[:, None], med, np.nan)
    pool_of = np.zeros(len(ids), dtype=np.int64)
    slo = ctx.pool_slo(snap)
    lim = limits_rows(agg, pool_of, np.zeros(1, dtype=np.int64), params)
    v = verdict_rows(
        agg, figures, serve, fleet.timed_out[rows], lim, params.tbt_floor_frac * slo.tbt_ms,
        params.ttft_floor_frac * slo.ttft_ms,
    )  # fmt: skip
    streak = fleet.streak[rows]
    sev_r = r6_array(v.severity)
    known: dict[str, NodeState] = {}
    for i, w in zip(ids, warm.tolist(), strict=True):
        ns = state.nodes.get(i)
        known[i] = NodeState(was_warm=w and not state.started) if ns is None else ns
    trivial = (
        np.array([quiet(known[i]) for i in ids], dtype=np.bool_)
        & (streak < params.errors().threshold)
        & (warm == np.array([known[i].was_warm for i in ids], dtype=np.bool_))
        & ~v.outlier
    )
    failing = failure_levels(
        fleet.share[rows], fleet.took[rows], streak, serve, pool_of, 1, params.error_threshold
    )
    pr = PoolRows(
        ctx.pool_id, ids, list(range(len(ids))), list(range(lo, hi)), trivial.tolist(), warm.tolist(),
        serve.tolist(), streak.tolist(), streak.astype(np.float64).tolist(), v.tbt.tolist(), v.ttft.tolist(),
        v.severity.tolist(), sev_r.tolist(), v.outlier.tolist(), phases(ids).tolist(), int(serve.sum()),
        int((serve & trivial).sum()), failing[0],
        # False for NaN
        bool((np.abs(sev_r) <= MAX_FIGURE).all() and (streak <= MAX_FIGURE).all()),
    )  # fmt: skip
    out = pool_tick(
        pr,
        known,
        state.emitted,
        cols.nodes,
        started=state.started,
        now=now,
        tick_id=ctx.tick_id,
        params=params,
    )
    # Every node of the pool, in row order (a node that left the pool is forgotten).
    nodes = {i: out.nodes[i] if i in out.nodes else known[i] for i in ids}
    emitted = {i: out.emitted[i] if i in out.emitted else state.emitted[i] for i in ids}
    return PolicyResult(
        decisions=tuple(out.decisions),
        state=State(started=True, nodes=nodes, memory=memory, emitted=emitted),
        diagnostics=_diagnostics(out, int(v.outlier.sum()), failing[0]),
    )


def _diagnostics(out: PoolOutcome, outliers: int, failing: float) -> dict[str, float]:
    return {
        "latency_open": float(out.latency_open),
        "error_open": float(out.error_open),
        "outliers": float(outliers),
        "panic": float(out.panic),
        "pool_failure_frac": r6(failing),
    }


# State -> its RowCache, beside the state rather than in it, so a state is exactly what ``decide``
# makes (the same pickle and checkpoint bytes). Keyed by identity, dropped when the state is.
_ROWS: dict[int, tuple[weakref.ref[State], RowCache]] = {}


def rows_of(state: State) -> RowCache | None:
    """The cache ``decide_pools`` left beside ``state``, if any (None: read the dicts)."""
    found = _ROWS.get(id(state))
    return found[1] if found is not None and found[0]() is state else None


def _remember(state: State, rows: RowCache) -> None:
    key = id(state)
    _ROWS[key] = (weakref.ref(state, lambda _, key=key: _ROWS.pop(key, None)), rows)  # type: ignore[misc]


def _alone(
    snap: FleetSnapshot, params: LatencyOutlierParams, state: State, ctx: PolicyContext
) -> PolicyResult[State]:
    """:func:`decide_columns` for one pool, its state given the cache the next batch reads."""
    r = decide_columns(snap, params, state, ctx)
    st = r.state
    _remember(st, row_cache(st.memory.node_ids, st.nodes, st.emitted))
    return r


def decide_pools(
    snap: FleetSnapshot,
    params: LatencyOutlierParams,
    states: Sequence[State],
    ctxs: Sequence[PolicyContext],
) -> list[PolicyResult[State]]:
    """Equal, element for element and bit for bit (decisions, state, diagnostics), to
    ``[decide_columns(snap, params, s, c) for s, c in zip(states, ctxs)]`` (see the module docstring)."""
    if len(states) != len(ctxs):
        raise ValueError("decide_pools: one state per context")
    if not ctxs:
        return []
    first = ctxs[0]
    same = all(c.now_ms == first.now_ms and c.tick_id == first.tick_id for c in ctxs)
    cols = fleet_columns(snap)
    ids_all = row_ids(snap)
    out: list[PolicyResult[State] | None] = [None] * len(ctxs)
    fast: list[int] = []  # batch positions decided here
    spans: list[tuple[int, int]] = []  # their rows in the columns
    for j, (st, c) in enumerate(zip(states, ctxs, strict=True)):
        lo, hi = cols.bounds.get(c.pool_id, (0, 0))
        cache = rows_of(st)
        if (
            same
            and hi > lo
            and st.started
            and cache is not None
            and cache.ids is st.memory.node_ids
            and cache.ids == tuple(ids_all[lo:hi])
        ):
            fast.append(j)
            spans.append((lo, hi))
        else:
            out[j] = _alone(snap, params, st, c)
    if fast:
        _decide_fast(snap, params, states, ctxs, fast=fast, spans=spans, out=out)
    return [r for r in out if r is not None]


# -- the batch's form ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class _Batch:
    """The arrays a batch left its pools' states views of, and those states' memories and caches."""

    mems: tuple[PoolMemory, ...]
    caches: tuple[RowCache | None, ...]
    ts: Ints
    lanes: Floats
    flags: tuple[Bools, Bools, Bools, Ints, Ints]


# The last batch's arrays (one batch kept): when the next batch's states hold exactly the views it
# handed out, in the same order, its arrays are copied whole instead of put together pool by pool.
# Only a shortcut: the result is the same either way.
_LAST: list[_Batch] = []
_A = TypeVar("_A", Ints, Floats)


class _Rows(NamedTuple):
    """The batch's rows: local row r is the columns' row ``take[r]``; pools side by side in batch
    order, pool ``k`` from ``first[k]``, ``sizes[k]`` rows."""

    take: slice | Ints
    pool_of: Ints
    first: Ints
    sizes: Ints
    figures: Floats
    timed_out: Bools
    streak: Ints
    warm: Bools
    serve: Bools
    has: Bools  # serving, with a figure this tick


def _rows(cols: FleetColumns, fleet: FleetFigures, spans: list[tuple[int, int]]) -> _Rows:
    n_pools = len(spans)
    sizes = np.array([hi - lo for lo, hi in spans], dtype=np.int64)
    n_rows = int(sizes.sum())
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    pool_of: Ints = np.repeat(np.arange(n_pools, dtype=np.int64), sizes)
    if spans[0][0] + n_rows == spans[-1][1] and all(
        spans[k][1] == spans[k + 1][0] for k in range(n_pools - 1)
    ):
        take: slice | Ints = slice(spans[0][0], spans[-1][1])
    else:
        take = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in spans])
    figures = fleet.figures[take]
    warm = cols.warm[take]
    serve = warm & ~cols.stale[take]
    has = serve & ~np.isnan(figures).all(axis=1)
    return _Rows(
        take, pool_of, first, sizes, figures, fleet.timed_out[take], fleet.streak[take], warm, serve, has
    )


class _Memory(NamedTuple):
    """Every pool's memory after this tick, as lanes (rows, signals, slots), and the row cache's
    arrays it was laid out with."""

    ts: Ints
    lanes: Floats
    slots: Ints  # each pool's slot count after this tick
    flags: tuple[Bools, Bools, Bools, Ints, Ints]  # quiet, was_warm, steady, since, phase


def _lay_out(
    mems: tuple[PoolMemory, ...], caches: tuple[RowCache | None, ...], first: Ints, n_rows: int, n_sig: int
) -> tuple[Ints, Floats, tuple[Bools, Bools, Bools, Ints, Ints]]:
    """The pools' memories side by side as lanes (rows, signals, slots), padded with empty slots, and
    their caches' arrays concatenated: the last batch's arrays when these are the views it handed out
    (read, not written: the states of the last tick keep their views)."""
    last = _LAST[0] if _LAST else None
    if (
        last is not None
        and len(last.mems) == len(mems)
        and all(x is y for x, y in zip(last.mems, mems, strict=True))
        and all(x is y for x, y in zip(last.caches, caches, strict=True))
    ):
        return last.ts, last.lanes, last.flags
    width0 = max(m.ts.shape[1] for m in mems)
    ts = np.full((n_rows, width0), -1, dtype=np.int64)
    lanes = np.full((n_rows, n_sig, width0), np.nan)
    for k, mem in enumerate(mems):
        s = mem.ts.shape[1]
        if s:
            a = int(first[k])
            b = a + mem.ts.shape[0]
            ts[a:b, :s] = mem.ts
            lanes[a:b, :, :s] = mem.vals.transpose(0, 2, 1)
    present = [c for c in caches if c is not None]
    flags = (
        np.concatenate([c.quiet for c in present]),
        np.concatenate([c.was_warm for c in present]),
        np.concatenate([c.steady for c in present]),
        np.concatenate([c.since for c in present]),
        np.concatenate([c.phase for c in present]),
    )
    return ts, lanes, flags


def _advance(
    rows: _Rows, mems: tuple[PoolMemory, ...], caches: tuple[RowCache | None, ...], now: int, memory_ms: int
) -> _Memory:
    """``PoolMemory.advance`` of every pool at once (ids unchanged: no rows move)."""
    n_rows, n_sig = rows.figures.shape
    n_pools = len(mems)
    pool_of, has = rows.pool_of, rows.has
    slots = np.array([m.ts.shape[1] for m in mems], dtype=np.int64)
    ts, lanes, flags = _lay_out(mems, caches, rows.first, n_rows, n_sig)
    _LAST.clear()
    width0 = ts.shape[1]
    kept = kept_slots(ts, now, memory_ms)
    gone = ~kept
    # New arrays with the forgotten slots emptied (one pass each, and no copy first).
    ts = np.where(kept, ts, -1)
    lanes = np.where(kept[:, None, :], lanes, np.nan)
    col = np.arange(width0, dtype=np.int64)
    # A pool grows (by its slot count, at least one) when a row it writes has no free slot of its own
    # (every slot is its own when every pool has the batch's width: the common case, no mask then).
    uniform = bool((slots == width0).all())
    own_gone = gone if uniform else gone & (col[None, :] < slots[pool_of][:, None])
    full_row = has & ~own_gone.any(axis=1)
    writes = np.bincount(pool_of[has], minlength=n_pools) > 0
    grows = writes & ((slots == 0) | (np.bincount(pool_of[full_row], minlength=n_pools) > 0))
    new_slots = np.where(grows, slots + np.maximum(1, slots), slots)
    width = int(new_slots.max())
    if width > width0:
        ts = np.concatenate([ts, np.full((n_rows, width - width0), -1, dtype=np.int64)], axis=1)
        lanes = np.concatenate([lanes, np.full((n_rows, n_sig, width - width0), np.nan)], axis=2)
        col = np.arange(width, dtype=np.int64)
    at = np.flatnonzero(has)
    if len(at):
        # The first free slot of its own (every slot is, when every pool now has ``width`` of them).
        free = ts[at] < 0
        if not (new_slots == width).all():
            free &= col[None, :] < new_slots[pool_of[at]][:, None]
        slot = np.argmax(free, axis=1)
        ts[at, slot] = now
        lanes[at, :, slot] = rows.figures[at]
    return _Memory(ts, lanes, new_slots, flags)


def _medians(mem: _Memory, min_samples: int) -> tuple[Floats, Bools]:
    """``PoolMemory.median_arrays`` over every row (empty slots are NaN, sorted last like the pool's
    own). Slots empty in every row (past the last one any row uses) sort last anyway: left out."""
    ts, lanes = mem.ts, mem.lanes
    n_rows, n_sig, _ = lanes.shape
    used = np.flatnonzero((ts >= 0).any(axis=0))
    span = int(used[-1]) + 1 if len(used) else 0
    if not span:
        return np.zeros((n_rows, n_sig)), np.zeros((n_rows, n_sig), dtype=np.bool_)
    part = lanes[:, :, :span]
    ordered = np.sort(part, axis=2)
    if (part == 0).any():
        # Only a lane holding a zero needs the stable sort (0.0 and -0.0 in slot order, as the
        # pool's own median sorts them); elsewhere equal figures are the same double, so both
        # sorts agree. One hostile -0.0 no longer makes the whole batch's sort the slow one.
        zero = (part == 0).any(axis=2)
        ordered[zero] = np.sort(part[zero], axis=1, kind="stable")
    # NaN sorts last: a lane's count of figures is the place of its first NaN, or ``span`` (most lanes
    # are full: only those ending in a NaN are searched).
    short = np.flatnonzero(np.isnan(ordered[:, :, -1]))
    count = np.full((n_rows, n_sig), span, dtype=np.int64)
    if len(short):
        count.reshape(-1)[short] = np.isnan(ordered.reshape(-1, span)[short]).argmax(axis=1)
    row = np.arange(n_rows)[:, None]
    sig = np.arange(n_sig)[None, :]
    upper = ordered[row, sig, np.minimum(count // 2, span - 1)]
    lower = ordered[row, sig, np.maximum(count - 1, 0) // 2]
    with np.errstate(over="ignore"):  # (1e308 + 1e308) / 2 is inf, as in the pool's own median
        med = np.where(count % 2 == 1, upper, (lower + upper) / 2)
    return med, count >= max(1, min_samples)


def _decide_fast(
    snap: FleetSnapshot,
    params: LatencyOutlierParams,
    states: Sequence[State],
    ctxs: Sequence[PolicyContext],
    *,
    fast: list[int],
    spans: list[tuple[int, int]],
    out: list[PolicyResult[State] | None],
) -> None:
    """The batch's pools that fit its form (see the module docstring): their results into ``out``."""
    cols = fleet_columns(snap)
    fleet = fleet_figures(snap, cols)
    now, tick_id = ctxs[0].now_ms, ctxs[0].tick_id
    rows = _rows(cols, fleet, spans)
    mems = tuple(states[j].memory for j in fast)
    caches = tuple(rows_of(states[j]) for j in fast)
    mem = _advance(rows, mems, caches, now, params.memory_ms)
    med, ok = _medians(mem, params.min_samples)
    agg = np.where(ok & rows.serve[:, None], med, np.nan)
    slos = [ctxs[j].pool_slo(snap) for j in fast]
    pool_of = rows.pool_of
    v = verdict_rows(
        agg, rows.figures, rows.serve, rows.timed_out, limits_rows(agg, pool_of, rows.first, params),
        np.array([params.tbt_floor_frac * s.tbt_ms for s in slos])[pool_of],
        np.array([params.ttft_floor_frac * s.ttft_ms for s in slos])[pool_of],
    )  # fmt: skip
    hand = _Handled.of(rows, mem, v, fleet, params, tick_id)
    flags = (mem.flags[0].copy(), mem.flags[1].copy(), mem.flags[2].copy(), mem.flags[3].copy())
    # A trivial row that is handled is due a record and gets the quiet one (rule.quiet_tick), in any
    # pool: its cache's record fields are set here for all of them at once, not row by row.
    flags[2][hand.due_quiet] = True
    flags[3][hand.due_quiet] = tick_id
    views = cols.nodes
    handed: list[PoolMemory] = []
    handed_rows: list[RowCache] = []
    for k, j in enumerate(fast):
        if hand.pool_bad[k]:
            out[j] = _alone(snap, params, states[j], ctxs[j])
            continue
        state, cache = states[j], caches[k]
        assert cache is not None
        result, rows_k = _pool(views, params, ctxs[j], state, cache, hand, k, flags, mem)
        handed.append(result.state.memory)
        handed_rows.append(rows_k)
        out[j] = result
    if len(handed) == len(fast):  # every pool got its view: the next batch may start from these arrays
        _LAST.append(_Batch(tuple(handed), tuple(handed_rows), mem.ts, mem.lanes, (*flags, mem.flags[4])))


@dataclass(frozen=True, slots=True)
class _Handled:
    """The rows that need Python, and every pool's counts (lists: cheaper per element than arrays)."""

    handle: list[int]  # local rows, ascending
    cut: list[int]  # pool k's handled rows are handle[cut[k]:cut[k + 1]]
    at: list[int]  # per handled row, its row in the snapshot's columns
    trivial: list[bool]
    warm: list[bool]
    serve: list[bool]
    streak: list[int]
    streak_f: list[float]
    tbt: list[int]
    ttft: list[int]
    severity: list[float]
    severity_r: list[float]
    outlier: list[bool]
    phase: list[int]
    first: list[int]
    live: list[int]
    healthy_trivial: list[int]
    outliers: list[int]
    failing: list[float]
    pool_bad: list[bool]
    stirring: list[int]  # per pool, its rows that are not trivial (0: rule.quiet_tick decides it)
    due_quiet: Ints  # the trivial rows handled (local rows): each is due its quiet record

    @classmethod
    def of(  # noqa: PLR0917 - the batch's rows, memory and verdicts, then the params and the tick
        cls,
        rows: _Rows,
        mem: _Memory,
        v: Verdicts,
        fleet: FleetFigures,
        params: LatencyOutlierParams,
        tick_id: int,
    ) -> _Handled:
        pool_of, streak, warm, serve = rows.pool_of, rows.streak, rows.warm, rows.serve
        n_pools = len(rows.sizes)
        quiet_a, was_warm_a, steady_a, since_a, phase_a = mem.flags
        # A pool with a figure its decisions cannot carry (|r6(x)| > MAX_FIGURE, NaN) is decided alone.
        # Below MAX_FIGURE / 2, r6 (a move of at most 5e-7) cannot leave the bound: round only the rest.
        bad = ~(streak <= MAX_FIGURE)
        big = np.flatnonzero(~(np.abs(v.severity) <= MAX_FIGURE / 2))  # NaN too
        if len(big):
            bad[big] |= ~(np.abs(r6_array(v.severity[big])) <= MAX_FIGURE)
        trivial = quiet_a & (streak < params.errors().threshold) & (warm == was_warm_a) & ~v.outlier
        age = tick_id - since_a
        silent = (
            trivial & steady_a & (phase_a != keyframe_residue(tick_id)) & (age >= 0) & (age < KEYFRAME_TICKS)
        )
        handle = np.flatnonzero(~silent)
        take = rows.take
        g = handle if isinstance(take, slice) else take[handle]
        share, took = fleet.share[take], fleet.took[take]

        def per_pool(mask: Bools) -> list[int]:
            return np.bincount(pool_of[mask], minlength=n_pools).tolist()  # type: ignore[no-any-return]

        return cls(
            handle.tolist(),
            [*np.searchsorted(handle, rows.first).tolist(), len(handle)],
            (g + (take.start if isinstance(take, slice) else 0)).tolist(),
            trivial[handle].tolist(), warm[handle].tolist(), serve[handle].tolist(), streak[handle].tolist(),
            streak[handle].astype(np.float64).tolist(), v.tbt[handle].tolist(), v.ttft[handle].tolist(),
            v.severity[handle].tolist(), r6_array(v.severity[handle]).tolist(), v.outlier[handle].tolist(),
            phase_a[handle].tolist(), rows.first.tolist(), per_pool(serve), per_pool(serve & trivial),
            per_pool(v.outlier),
            failure_levels(share, took, streak, serve, pool_of, n_pools, params.error_threshold),
            (np.bincount(pool_of[bad], minlength=n_pools) > 0).tolist(), per_pool(~trivial),
            handle[trivial[handle]],
        )  # fmt: skip


def _pool(  # noqa: PLR0917 - the batch's figures, then the pool's
    views: Sequence[NodeView],
    params: LatencyOutlierParams,
    ctx: PolicyContext,
    state: State,
    cache: RowCache,
    hand: _Handled,
    k: int,
    flags: tuple[Bools, Bools, Bools, Ints],
    mem: _Memory,
) -> tuple[PolicyResult[State], RowCache]:
    """Pool ``k`` of the batch: the rule over its handled rows (:func:`quiet_tick` when none of them
    has anything to step), its state as views of the batch's arrays, and its row cache (``flags``'
    rows of it updated for the rows handled; the trivial ones' already are)."""
    ids = cache.ids
    a = hand.first[k]
    part = slice(hand.cut[k], hand.cut[k + 1])
    local = [r - a for r in hand.handle[part]]
    known, before = state.nodes, state.emitted
    if not hand.stirring[k]:
        out = quiet_tick(
            ctx.pool_id, ids, local, hand.streak_f[part], hand.severity_r[part], hand.live[k],
            hand.healthy_trivial[k], ctx.tick_id, params,
        )  # fmt: skip
    else:
        pr = PoolRows(
            ctx.pool_id, ids, local, hand.at[part], hand.trivial[part], hand.warm[part], hand.serve[part],
            hand.streak[part], hand.streak_f[part], hand.tbt[part], hand.ttft[part], hand.severity[part],
            hand.severity_r[part], hand.outlier[part], hand.phase[part], hand.live[k],
            hand.healthy_trivial[k], hand.failing[k], True,
        )  # fmt: skip
        out = pool_tick(
            pr, known, before, views, started=True, now=ctx.now_ms, tick_id=ctx.tick_id, params=params
        )
        quiet_n, was_warm_n, steady_n, since_n = flags
        for q, r in enumerate(local):
            if pr.trivial[q]:
                continue
            node_id = ids[r]
            ns = out.nodes.get(node_id, known[node_id])
            quiet_n[a + r] = quiet(ns)
            was_warm_n[a + r] = ns.was_warm
            e = out.emitted.get(node_id)
            if e is not None:
                steady_n[a + r] = e[0] == HEALTHY
                since_n[a + r] = ctx.tick_id
    lo, hi = a, a + len(ids)
    s = int(mem.slots[k])
    memory = PoolMemory(
        ids, _c_order(mem.ts[lo:hi, :s]), _c_order(mem.lanes[lo:hi, :, :s].transpose(0, 2, 1))
    )
    rows = RowCache(
        ids, flags[0][lo:hi], flags[1][lo:hi], flags[2][lo:hi], flags[3][lo:hi], mem.flags[4][lo:hi]
    )
    new_state = State(
        started=True,
        nodes={**known, **out.nodes} if out.nodes else known,
        memory=memory,
        emitted={**before, **out.emitted} if out.emitted else before,
    )
    _remember(new_state, rows)
    return PolicyResult(
        decisions=tuple(out.decisions),
        state=new_state,
        diagnostics=_diagnostics(out, hand.outliers[k], hand.failing[k]),
    ), rows


def _c_order(a: _A) -> _A:
    """``a``, or a C-ordered copy when it is laid out in Fortran order only (a one-node pool's view
    can be): numpy pickles such an array in that order, and the state must pickle as ``decide``'s."""
    return np.ascontiguousarray(a) if a.flags.f_contiguous and not a.flags.c_contiguous else a
