"""latency-outlier over a batch of pools at once: :func:`decide_pools`, the batch protocol's form of
:func:`fleetloop.policies.breaker.latency_outlier.decide_columns` (which stays the rule's statement,
with the per-node form ``tests.oracles.policies.latency_outlier_plain`` above it).

Equal, element for element and bit for bit (decisions, state, diagnostics), to
``[decide_columns(snap, params, s, c) for s, c in zip(states, ctxs)]``. What changes is where the work
is done, not what is computed:

- every pool's remembered figures are advanced and their medians taken in one array operation over
  the batch's rows (each pool's :class:`PoolMemory` laid side by side, padded with empty slots; a
  pool's slots, its growth and the slot each figure lands in are what ``PoolMemory.advance`` picks
  for it), and each pool gets back its own rows and slots as a view;
- the pools' references (median and MAD per signal) come from one sort of a (pools, nodes, signals)
  array, the verdicts from the per-pool formulas with each row reading its pool's limits;
- the state machines are stepped, and decisions built, only for the rows that need it: a row whose
  node is quiet (:func:`quiet`: both machines closed, no streak, no ejection, no ramp), does not fail,
  did not change warmth and is no outlier has nothing to step; if its last record was ``HEALTHY``, it
  is not its keyframe and that record is not too old, it is not emitted either
  (:mod:`fleetloop.policies.breaker.emission`), and the row costs no Python at all. What a row needs
  of the per-node dicts is kept as arrays beside the state (:class:`RowCache`, derived data, keyed
  by the state's identity, so the state itself is exactly what ``decide`` makes, to the pickle byte).

A pool that does not fit the fast form is decided by ``decide_columns`` itself: one whose nodes are
not those of its state's cache (a node joined or left, a state without a cache: the first tick, a
checkpoint, a state from ``decide``), an empty pool, or a pool with a figure outside the schema's
bounds (its ``decide`` raises, as it does alone). ``tests/unit/test_breaker_batch.py`` holds the two
forms equal, tick after tick, on the bench fleet, on perturbed fleets with hostile values, and on odd
fleets, and fails under mutations of this file. Pure: no I/O, no clock.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult, r6, r6_array
from fleetloop.policies.breaker.consecutive_errors import step
from fleetloop.policies.breaker.emission import (
    KEYFRAME_TICKS,
    Emitted,
    Fields,
    emits,
    fields_of,
    keyframe_residue,
)
from fleetloop.policies.breaker.latency_outlier import (
    _CLEAR,
    _CLOSED_FIELDS,
    _FLAGGED,
    _NODATA,
    _STATUS,
    HEALTHY,
    MAD_SCALE,
    Bools,
    Ints,
    LatencyOutlier,
    LatencyOutlierParams,
    NodeState,
    RowCache,
    State,
    Verdict,
    _eject_within_cap,
    _latency_step,
    _with,
    decide_columns,
    failing_with_pool,
    fleet_figures,
    held_open,
    quiet,
    row_cache,
)
from fleetloop.policies.columns import Floats, fleet_columns, segment_medians
from fleetloop.policies.memory import PoolMemory
from fleetloop.policies.pool_figures import row_ids
from fleetloop.schemas.base import MAX_COUNT, MAX_FIGURE, assemble
from fleetloop.schemas.decisions import BreakerDecision

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
    """``decide_columns`` for one pool, its state given the cache the next batch reads."""
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
    """See the module docstring."""
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
    cols = fleet_columns(snap)
    fleet = fleet_figures(snap, cols)
    now = ctxs[0].now_ms
    tick_id = ctxs[0].tick_id
    n_pools = len(fast)
    sizes = np.array([hi - lo for lo, hi in spans], dtype=np.int64)
    n_rows = int(sizes.sum())
    # The batch's rows: local row r is the columns' row idx[r]; pools side by side in batch order.
    first_local = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    pool_of: Ints = np.repeat(np.arange(n_pools, dtype=np.int64), sizes)
    if spans[0][0] + n_rows == spans[-1][1] and all(
        spans[k][1] == spans[k + 1][0] for k in range(n_pools - 1)
    ):
        take: slice | Ints = slice(spans[0][0], spans[-1][1])
    else:
        take = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in spans])
    figures = fleet.figures[take]
    timed_out = fleet.timed_out[take]
    streak = fleet.streak[take]
    warm = cols.warm[take]
    serve = warm & ~cols.stale[take]
    has = serve & ~np.isnan(figures).all(axis=1)

    # -- memory: PoolMemory.advance of every pool at once (ids unchanged: no rows move) -----------
    # Laid out as lanes, (rows, signals, slots), so the medians sort contiguous rows; each pool's
    # PoolMemory gets the (rows, slots, signals) view of its part.
    mems = tuple(states[j].memory for j in fast)
    caches = tuple(rows_of(states[j]) for j in fast)
    slots = np.array([m.ts.shape[1] for m in mems], dtype=np.int64)
    n_sig = figures.shape[1]
    last = _LAST[0] if _LAST else None
    if (
        last is not None
        and len(last.mems) == len(mems)
        and all(x is y for x, y in zip(last.mems, mems, strict=True))
        and all(x is y for x, y in zip(last.caches, caches, strict=True))
    ):
        # The views the previous batch handed out, in the same order: its arrays, whole (read, not
        # written: the states of the last tick keep their views).
        ts, lanes = last.ts, last.lanes
        quiet_a, was_warm_a, steady_a, since_a, phase_a = last.flags
    else:
        width0 = int(slots.max())
        ts = np.full((n_rows, width0), -1, dtype=np.int64)
        lanes = np.full((n_rows, n_sig, width0), np.nan)
        for k, mem in enumerate(mems):
            s = mem.ts.shape[1]
            if s:
                a = int(first_local[k])
                b = a + mem.ts.shape[0]
                ts[a:b, :s] = mem.ts
                lanes[a:b, :, :s] = mem.vals.transpose(0, 2, 1)
        quiet_a = np.concatenate([c.quiet for c in caches if c is not None])
        was_warm_a = np.concatenate([c.was_warm for c in caches if c is not None])
        steady_a = np.concatenate([c.steady for c in caches if c is not None])
        since_a = np.concatenate([c.since for c in caches if c is not None])
        phase_a = np.concatenate([c.phase for c in caches if c is not None])
    _LAST.clear()
    width0 = ts.shape[1]
    memory_ms = params.memory_ms
    kept = (ts >= 0) & (now - ts < memory_ms) & (ts < now)
    gone = ~kept
    # New arrays with the forgotten slots emptied (one pass each, and no copy first).
    ts = np.where(kept, ts, -1)
    lanes = np.where(kept[:, None, :], lanes, np.nan)
    col = np.arange(width0, dtype=np.int64)
    own = col[None, :] < slots[pool_of][:, None]
    # A pool grows (by its slot count, at least one) when a row it writes has no free slot of its own.
    full_row = has & ~(gone & own).any(axis=1)
    writes = np.bincount(pool_of[has], minlength=n_pools) > 0
    grows = writes & ((slots == 0) | (np.bincount(pool_of[full_row], minlength=n_pools) > 0))
    new_slots = np.where(grows, slots + np.maximum(1, slots), slots)
    width = int(new_slots.max())
    if width > width0:
        ts = np.concatenate([ts, np.full((n_rows, width - width0), -1, dtype=np.int64)], axis=1)
        lanes = np.concatenate([lanes, np.full((n_rows, n_sig, width - width0), np.nan)], axis=2)
        col = np.arange(width, dtype=np.int64)
    else:
        width = width0
    at = np.flatnonzero(has)
    if len(at):
        free = (ts[at] < 0) & (col[None, :] < new_slots[pool_of[at]][:, None])
        slot = np.argmax(free, axis=1)
        ts[at, slot] = now
        lanes[at, :, slot] = figures[at]
    # PoolMemory.median_arrays over every row (empty slots are NaN, sorted last like the pool's own).
    # Slots empty in every row (past the last one any row uses) sort last anyway: left out.
    used = np.flatnonzero((ts >= 0).any(axis=0))
    span = int(used[-1]) + 1 if len(used) else 0
    if span:
        part = lanes[:, :, :span]
        ordered = np.sort(part, axis=2)
        if (part == 0).any():
            # Only a lane holding a zero needs the stable sort (0.0 and -0.0 in slot order, as the
            # pool's own median sorts them); elsewhere equal figures are the same double, so both
            # sorts agree. One hostile -0.0 no longer makes the whole batch's sort the slow one.
            zero = (part == 0).any(axis=2)
            ordered[zero] = np.sort(part[zero], axis=1, kind="stable")
        # NaN sorts last: a lane's count of figures is the place of its first NaN, or ``span``.
        nan_at = np.isnan(ordered)
        count = np.where(nan_at[:, :, -1], nan_at.argmax(axis=2), span)
        row = np.arange(n_rows)[:, None]
        sig = np.arange(n_sig)[None, :]
        upper = ordered[row, sig, np.minimum(count // 2, span - 1)]
        lower = ordered[row, sig, np.maximum(count - 1, 0) // 2]
        with np.errstate(over="ignore"):  # (1e308 + 1e308) / 2 is inf, as in the pool's own median
            med = np.where(count % 2 == 1, upper, (lower + upper) / 2)
        ok = count >= max(1, params.min_samples)
    else:
        med = np.zeros((n_rows, n_sig))
        ok = np.zeros((n_rows, n_sig), dtype=np.bool_)
    agg = np.where(ok & serve[:, None], med, np.nan)

    # -- references: :func:`references` of every pool at once ------------------------------------
    longest = int(sizes.max())
    pos = np.arange(n_rows, dtype=np.int64) - first_local[pool_of]
    pad = np.full((n_pools, longest, n_sig), np.nan)
    pad[pool_of, pos] = agg
    present = (~np.isnan(pad)).sum(axis=1)  # (pools, signals)
    enough = present >= params.min_hosts
    prow = np.arange(n_pools)[:, None]
    psig = np.arange(n_sig)[None, :]
    mid = np.maximum(present - 1, 0) // 2
    hi_at = np.minimum(present // 2, longest - 1)

    def middle(ordered: Floats) -> Floats:
        up = ordered[prow, hi_at, psig]
        return np.where(present % 2 == 1, up, (ordered[prow, mid, psig] + up) / 2)  # type: ignore[no-any-return]

    with np.errstate(invalid="ignore", over="ignore"):
        # Stable only where a 0.0 and a -0.0 could swap (a zero among the medians); the deviations
        # are absolute values, with no -0.0: equal ones are the same double, any sort will do.
        m = middle(np.sort(pad, axis=1, kind="stable" if (pad == 0).any() else None))
        mad = middle(np.sort(np.abs(pad - m[:, None, :]), axis=1))
        above_ratio = params.ratio * m
        above_mad = m + params.k * MAD_SCALE * mad
    slos = [ctxs[j].pool_slo(snap) for j in fast]
    tbt_floor = np.array([params.tbt_floor_frac * s.tbt_ms for s in slos])[pool_of]
    ttft_floor = np.array([params.ttft_floor_frac * s.ttft_ms for s in slos])[pool_of]
    lim = (enough[pool_of], m[pool_of], above_ratio[pool_of], above_mad[pool_of])

    # -- verdicts: :func:`verdict_columns`, each row with its pool's limits ----------------------
    severity = np.zeros(n_rows)
    tbt, severity = _family_rows(agg, 0, lim, tbt_floor, severity)
    fresh = figures
    recheck = (tbt == _FLAGGED) & ~np.isnan(fresh[:, :2]).all(axis=1)
    if recheck.any():
        status, again = _family_rows(fresh, 0, lim, tbt_floor, severity)
        severity = np.where(recheck, again, severity)
        tbt = np.where(recheck & (status == _CLEAR), _CLEAR, tbt)
    ttft, severity = _family_rows(agg, 2, lim, ttft_floor, severity)
    ttft = np.where((ttft == _NODATA) & timed_out, _FLAGGED, ttft)
    severity = np.minimum(np.where(serve, severity, 0.0), MAX_FIGURE) + 0.0  # capped as in _judge
    tbt = np.where(serve, tbt, _NODATA)
    ttft = np.where(serve, ttft, _NODATA)
    outlier = (tbt == _FLAGGED) & (ttft != _CLEAR)
    # A pool with a figure its decisions cannot carry (|r6(x)| > MAX_FIGURE, NaN) is decided alone.
    # Below MAX_FIGURE / 2, r6 (a move of at most 5e-7) cannot leave the bound: round only the rest.
    bad = ~(streak <= MAX_FIGURE)
    big = np.flatnonzero(~(np.abs(severity) <= MAX_FIGURE / 2))  # NaN too
    if len(big):
        bad[big] |= ~(np.abs(r6_array(severity[big])) <= MAX_FIGURE)
    pool_bad = np.bincount(pool_of[bad], minlength=n_pools) > 0

    # -- which rows need Python -------------------------------------------------------------------
    threshold = params.errors().threshold
    trivial = quiet_a & (streak < threshold) & (warm == was_warm_a) & ~outlier
    age = tick_id - since_a
    silent = trivial & steady_a & (phase_a != keyframe_residue(tick_id)) & (age >= 0) & (age < KEYFRAME_TICKS)
    handle = np.flatnonzero(~silent)
    cut = [*np.searchsorted(handle, first_local).tolist(), len(handle)]
    live_n = np.bincount(pool_of[serve], minlength=n_pools).tolist()
    stepping = (np.bincount(pool_of[~trivial], minlength=n_pools) > 0).tolist()
    healthy_quiet = np.bincount(pool_of[serve & trivial], minlength=n_pools).tolist()
    outliers_n = np.bincount(pool_of[outlier], minlength=n_pools).tolist()
    # :func:`pool_failure_columns` of every pool.
    took = serve & fleet.took[take]
    pick = took & (streak < params.error_threshold)
    any_pick = np.bincount(pool_of[pick], minlength=n_pools) > 0
    pick = np.where(any_pick[pool_of], pick, took)
    fail_med, fail_n = segment_medians(np.where(pick, fleet.share[take], np.nan), pool_of, n_pools)
    pool_failing_l = np.where(fail_n > 0, fail_med, 0.0).tolist()

    # Lists for the rows handled (indexing a list is cheaper than an array, per element).
    h_l = handle.tolist()
    g = handle if isinstance(take, slice) else take[handle]
    g_l = (g + (take.start if isinstance(take, slice) else 0)).tolist()
    triv_l = trivial[handle].tolist()
    warm_l = warm[handle].tolist()
    serve_l = serve[handle].tolist()
    streak_l = streak[handle].tolist()
    streak_f = streak[handle].astype(np.float64).tolist()
    tbt_l = tbt[handle].tolist()
    ttft_l = ttft[handle].tolist()
    sev_l = severity[handle].tolist()
    sev_rl = r6_array(severity[handle]).tolist()
    outlier_l = outlier[handle].tolist()
    first_l = first_local.tolist()
    new_slots_l = new_slots.tolist()
    quiet_n = quiet_a.copy()
    was_warm_n = was_warm_a.copy()
    steady_n = steady_a.copy()
    since_n = since_a.copy()
    err_params = params.errors()
    slow_start_ms = params.slow_start_ms
    residue = keyframe_residue(tick_id)
    closed_fields = _CLOSED_FIELDS
    nodes_view = cols.nodes
    pool_bad_l = pool_bad.tolist()
    phase_l = phase_a[handle].tolist()
    handed: list[PoolMemory] = []
    handed_rows: list[RowCache] = []
    for k, j in enumerate(fast):
        st = states[j]
        ctx = ctxs[j]
        if pool_bad_l[k]:
            out[j] = _alone(snap, params, st, ctx)
            continue
        cache = caches[k]
        assert cache is not None
        ids = cache.ids
        pool_id = ctx.pool_id
        a = first_l[k]
        known = st.nodes
        before = st.emitted
        mine = range(cut[k], cut[k + 1])
        stepped: dict[str, NodeState] = {}
        reasons: dict[str, str] = {}
        wants: list[tuple[float, str]] = []
        open_now = 0
        for q in mine if stepping[k] else ():
            if triv_l[q]:
                continue
            node_id = ids[h_l[q] - a]
            w = warm_l[q]
            ns = known[node_id]
            e = ns.err
            err, err_reason = step(e, streak_l[q], now, err_params)
            ramp = now if w and not ns.was_warm else ns.ramp_from_ms  # started
            if err is not e or ramp != ns.ramp_from_ms or w != ns.was_warm:
                ns = _with(ns, err=err, ramp_from_ms=ramp, was_warm=w)
            v = Verdict(_STATUS[tbt_l[q]], _STATUS[ttft_l[q]], sev_l[q])
            ns, lat_reason, want = _latency_step(ns, v, now, params)
            if want:
                wants.append((-v.severity, node_id))
            stepped[node_id] = ns
            reasons[node_id] = err_reason if err.state != "closed" or err_reason != "healthy" else lat_reason
            if ns.lat == "open" or ns.err.state == "open":
                open_now += 1
        over_cap = (
            _eject_within_cap(
                params, len(ids), wants=wants, stepped=stepped, reasons=reasons, open_now=open_now, now=now
            )
            if wants
            else set()
        )
        live = live_n[k]
        healthy = healthy_quiet[k]
        for q in mine if stepping[k] else ():
            if serve_l[q] and not triv_l[q]:
                node_id = ids[h_l[q] - a]
                ns = stepped[node_id]
                if (
                    ns.lat != "open"
                    and ns.err.state != "open"
                    and node_id not in over_cap
                    and not outlier_l[q]
                ):
                    healthy += 1
        panic = bool(live) and healthy < params.panic_threshold * live
        share = 1.0 / max(1, live)
        pool_failing = pool_failing_l[k]

        decisions: list[BreakerDecision] = []
        new_nodes: dict[str, NodeState] | None = None  # copied on the first change
        emitted: dict[str, Emitted] | None = None
        latency_open = error_open = 0
        for q in mine:
            r = h_l[q]
            node_id = ids[r - a]
            if triv_l[q]:
                ns = known[node_id]
                reason = "healthy"
            else:
                ns = stepped[node_id]
                reason = reasons[node_id]
                ramp_from = ns.ramp_from_ms
                if ramp_from is not None and now - ramp_from >= slow_start_ms:
                    ns = _with(ns, ramp_from_ms=None)
                if ns is not known[node_id]:
                    if new_nodes is None:
                        new_nodes = dict(known)
                    new_nodes[node_id] = ns
                quiet_n[r] = quiet(ns)
                was_warm_n[r] = ns.was_warm
            ramp_from = ns.ramp_from_ms
            lat, e = ns.lat, ns.err
            if lat == "closed" and e.state == "closed":
                ejections = ns.lat_ejections + e.ejections
                if (
                    (ramp_from is None or not warm_l[q])
                    and node_id not in over_cap
                    and 0 <= ejections <= MAX_COUNT
                    and reason
                ):
                    f: Fields = ("closed", True, 0.0, None, reason, ejections)
                    b = before.get(node_id)
                    if (
                        b is not None
                        and b[0] == f
                        and phase_l[q] != residue
                        and 0 <= tick_id - b[1] < KEYFRAME_TICKS
                    ):
                        continue
                    if emitted is None:
                        emitted = dict(before)
                    emitted[node_id] = (f, tick_id)
                    steady_n[r] = f == HEALTHY
                    since_n[r] = tick_id
                    decisions.append(
                        assemble(
                            BreakerDecision,
                            {
                                "entity": f"node/{node_id}",
                                "reason": reason,
                                "inputs": {
                                    "consecutive_failures": streak_f[q],
                                    "severity": sev_rl[q],
                                    "latency_ejections": float(ns.lat_ejections),
                                },
                                "kind": "breaker",
                                "pool_id": pool_id,
                                "node_id": node_id,
                                "state": "closed",
                                "enforced": True,
                                "probe_frac": 0.0,
                                "until_ms": None,
                                "ejections": ejections,
                            },
                            set(closed_fields),
                        )
                    )
                    continue
            else:
                latency_open += lat == "open"
                error_open += e.state == "open"
            n = nodes_view[g_l[q]]
            d = LatencyOutlier._decision(
                n, ns, Verdict(_STATUS[tbt_l[q]], _STATUS[ttft_l[q]], sev_l[q]), reason, params,
                now=now, share=share, over_cap=node_id in over_cap, panic=panic, pool_id=pool_id,
                shared=failing_with_pool(n, pool_failing), held=held_open(before.get(node_id), now),
            )  # fmt: skip
            fd = fields_of(d)
            b = before.get(node_id)
            if b is None or emits(node_id, fd, b, tick_id):
                decisions.append(d)
                if emitted is None:
                    emitted = dict(before)
                emitted[node_id] = (fd, tick_id)
                steady_n[r] = fd == HEALTHY
                since_n[r] = tick_id
        lo = a
        hi = a + len(ids)
        s = new_slots_l[k]
        memory = PoolMemory(ids, _c_order(ts[lo:hi, :s]), _c_order(lanes[lo:hi, :, :s].transpose(0, 2, 1)))
        rows = RowCache(
            ids, quiet_n[lo:hi], was_warm_n[lo:hi], steady_n[lo:hi], since_n[lo:hi], phase_a[lo:hi]
        )
        handed.append(memory)
        handed_rows.append(rows)
        new_state = State(
            started=True,
            nodes=known if new_nodes is None else new_nodes,
            memory=memory,
            emitted=before if emitted is None else emitted,
        )
        _remember(new_state, rows)
        out[j] = PolicyResult(
            decisions=tuple(decisions),
            state=new_state,
            diagnostics={
                "latency_open": float(latency_open),
                "error_open": float(error_open),
                "outliers": float(outliers_n[k]),
                "panic": float(panic),
                "pool_failure_frac": r6(pool_failing),
            },
        )
    if len(handed) == len(fast):  # every pool got its view: the next batch may start from these arrays
        flags = (quiet_n, was_warm_n, steady_n, since_n, phase_a)
        _LAST.append(_Batch(tuple(handed), tuple(handed_rows), ts, lanes, flags))


def _c_order(a: _A) -> _A:
    """``a``, or a C-ordered copy when it is laid out in Fortran order only (a one-node pool's view
    can be): numpy pickles such an array in that order, and the state must pickle as ``decide``'s."""
    return np.ascontiguousarray(a) if a.flags.f_contiguous and not a.flags.c_contiguous else a


def _family_rows(
    x: Floats,
    at: int,
    lim: tuple[Bools, Floats, Floats, Floats],
    floor: Floats,
    severity: Floats,
) -> tuple[Ints, Floats]:
    """:func:`_family_columns` for the family of signals ``at``, ``at + 1``, each row against its
    pool's limits (``lim``: has a limit, median, ratio bound, MAD bound, per row and signal)."""
    has_lim, m, above_ratio, above_mad = lim
    status = np.zeros(len(x), dtype=np.int64)
    done = np.zeros(len(x), dtype=np.bool_)
    for j in (at, at + 1):
        xj = x[:, j]
        mj = m[:, j]
        seen = ~done & ~np.isnan(xj) & has_lim[:, j]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            severity = np.where(seen & (mj > 0), np.maximum(severity, xj / mj), severity)
            flagged = seen & (xj >= above_ratio[:, j]) & (xj >= above_mad[:, j]) & (xj - mj >= floor)
        status = np.where(flagged, _FLAGGED, np.where(seen, _CLEAR, status))
        done |= flagged
    return status, severity
