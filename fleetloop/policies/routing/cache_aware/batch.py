"""cache-aware for a batch of pools: :func:`decide_pools` is ``rule.decide_pool`` for every pool of
the batch, with segment operations over the whole fleet's columns instead of a few dozen small numpy
calls and a few hundred dict entries per pool.

The steady state takes the batch path: a pool whose memory holds exactly its current nodes (in at
least one slot), whose scores are finite and not all 0. Its memory is advanced together with every
other such pool's of the same slot count (one array for all of them; each pool's state is its rows
of it; a memory that grows, as :meth:`PoolMemory.advance` grows it, is its rows of that array
widened). Its medians, scores, shares and per-priority shares are fleet-wide array operations, in
``decide_pool``'s order, on the same doubles (the powers and the sums stay Python's, in node order,
as there); its prefix holders are grouped by C-level iteration, visiting nodes in the order
``decide_pool`` visits them. Any other pool (new or departed nodes, a memory without slots, an
older checkpoint's form, no node that scores, a score that is not finite) is decided by
``decide_pool`` itself. ``tests/policies/test_cache_aware_batch.py`` holds the two equal, tick after
tick. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import numpy.typing as npt

from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult, r6_array
from fleetloop.policies.columns import Floats, Ints, fleet_columns, segment_medians
from fleetloop.policies.memory import PoolMemory, kept_slots
from fleetloop.policies.pool_figures import row_ids
from fleetloop.policies.routing.cache_aware.params import CacheAwareParams
from fleetloop.policies.routing.cache_aware.rule import (
    decide_pool,
    fleet_load,
    routing_decision,
    spill_targets_of,
    with_speed,
)
from fleetloop.policies.routing.cache_aware.signals import (
    State,
    hot_prefixes,
    pool_index,
    pool_max_prompt,
    slo_fit,
)

Bools = npt.NDArray[np.bool_]


def decide_pools(
    snap: FleetSnapshot,
    params: CacheAwareParams,
    states: Sequence[PoolMemory | State],
    ctxs: Sequence[PolicyContext],
) -> list[PolicyResult[PoolMemory]]:
    """Equal, element for element and bit for bit (decisions, state, diagnostics), to
    ``[decide_pool(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``."""
    if len(states) != len(ctxs):
        raise ValueError(f"decide_pools: {len(states)} states for {len(ctxs)} pools")
    fast, groups = _fit(snap, states, ctxs)
    if not fast:
        return [decide_pool(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]
    cols = fleet_columns(snap)
    # The memories and their medians, every pool of a slot count at once.
    tbt = cols.floats("tbt_p50_ms")
    with np.errstate(invalid="ignore"):
        writes = (tbt > 0) & cols.warm & ~cols.stale
    own = np.full(len(cols), np.nan)
    held: dict[int, tuple[Ints, Floats, int, int]] = {}
    for slots, members in groups.items():
        held.update(_advance(snap.now_ms, params.speed_memory_ms, slots, members, tbt, writes, own))
    b = _Batch.of(snap, params, ctxs, fast, held, own)
    by_priority = _by_priority(b, params)
    holders = _holders(snap, b, params)
    out: list[PolicyResult[PoolMemory] | None] = [None] * len(ctxs)
    pools = snap.pools
    spill_of = spill_targets_of(snap, params)
    fits: dict[tuple[str, str, int] | None, int | None] = {}  # pool_max_prompt by model, GPU, degree
    slo_fits: dict[tuple[str, str, int, str], dict[str, int]] = {}  # pool_slo_prompt, remembered
    for i, pool_id, ids, k, lo, hi in b.items:
        affinity = holders(k, ids)
        spill_to = spill_of(pool_id)
        if b.g_lo[k] == b.g_hi[k]:
            view = pools.get(pool_id)
            fit_key = (view.model, view.gpu_type, b.g_lo[k]) if view is not None else None
            if fit_key in fits:
                fit = fits[fit_key]
            else:
                fit = fits[fit_key] = pool_max_prompt(view, (b.g_lo[k],))
        else:
            fit = pool_max_prompt(pools.get(pool_id), b.gpus[lo:hi].tolist())
        own_h = b.headroom[k]
        decision = routing_decision(
            pool_id,
            dict(zip(ids, b.weights[lo:hi], strict=False)),
            "cache-aware",
            {
                "nodes": b.sizes_f[k],
                "serving_nodes": b.serving[k],
                "stale_nodes": b.stale[k],
                "best_score": b.best_r[k],
                "headroom": own_h,
                "hot_prefixes": float(len(affinity)),
                "spill_pools": float(len(spill_to)),
            },
            by_priority[i],
            affinity,
            spill_to,
            fit,
            slo_fit(slo_fits, pools.get(pool_id), pool_id, b.g_lo[k], ctxs[i].slo),
            picker=params.picker,
            checked=True,
        )
        ts, vals, a, z = held[i]
        out[i] = PolicyResult(
            (decision,),
            PoolMemory(ids, ts[a:z], vals[a:z]),
            {"headroom": own_h, "hot_prefixes": float(len(affinity))},
        )
    return [
        found if found is not None else decide_pool(snap, params, s, c)
        for found, s, c in zip(out, states, ctxs, strict=True)
    ]


def _fit(
    snap: FleetSnapshot, states: Sequence[PoolMemory | State], ctxs: Sequence[PolicyContext]
) -> tuple[dict[int, tuple[str, ...]], dict[int, list[tuple[int, int, PoolMemory]]]]:
    """The pools that fit the batch's form: (batch index -> its node ids; slot count -> its pools as
    (batch index, first row, memory))."""
    cols = fleet_columns(snap)
    bounds = cols.bounds
    ids_all = row_ids(snap)
    # A snapshot table's rows are in node-id order within each pool (the order ``decide_pool``'s
    # dicts take by sorting); a snapshot of views lists them as its pools do, so that is checked.
    ordered = cols.table is not None
    fast: dict[int, tuple[str, ...]] = {}
    groups: dict[int, list[tuple[int, int, PoolMemory]]] = {}
    seen: set[str] = set()
    for i, (state, ctx) in enumerate(zip(states, ctxs, strict=True)):
        pool_id = ctx.pool_id
        b = bounds.get(pool_id)
        if b is None or pool_id in seen or not isinstance(state, PoolMemory):
            continue
        seen.add(pool_id)
        ids = tuple(ids_all[b[0] : b[1]])
        ts, vals = state.ts, state.vals
        slots = ts.shape[1] if ts.ndim == 2 else 0
        if (
            slots == 0
            or ts.dtype != np.int64
            or vals.dtype != np.float64
            or vals.shape != (len(ids), slots, 1)
            or state.node_ids != ids
            or (not ordered and list(ids) != sorted(ids))
        ):
            continue
        fast[i] = ids
        groups.setdefault(slots, []).append((i, b[0], state))
    return fast, groups


@dataclass(frozen=True, slots=True, eq=False)
class _Batch:
    """The batch's pools that fit, in the columns' order, and their rows: every array covers those
    rows only (the daemon decides a shard's pools 64 at a time; each call works on its own pools'
    rows, not the whole fleet's). ``k`` is a pool's place among them; its rows there ``lo:hi``."""

    # (batch index, pool id, node ids, k, lo, hi) of each pool decided here
    items: list[tuple[int, str, tuple[str, ...], int, int, int]]
    n_sub: int
    sel: Ints  # the rows' places in the snapshot's columns
    pool_of: Ints
    starts: Ints
    sums: _SumLayout
    score: Floats
    speed: Floats
    pos: Bools  # score > 0
    best: Floats
    pw: Floats  # score ** alpha where pos, else 0.0
    weights: list[float]
    headroom: list[float]
    serving: list[float]
    stale: list[float]
    gpus: Ints
    g_lo: list[int]
    g_hi: list[int]
    sizes_f: list[float]
    best_r: list[float]

    @classmethod
    def of(  # noqa: PLR0917 - the snapshot and params, then what the memories gave
        cls,
        snap: FleetSnapshot,
        params: CacheAwareParams,
        ctxs: Sequence[PolicyContext],
        fast: dict[int, tuple[str, ...]],
        held: dict[int, tuple[Ints, Floats, int, int]],
        own: Floats,
    ) -> _Batch:
        cols = fleet_columns(snap)
        bounds = cols.bounds
        index = pool_index(snap, cols)
        chosen = sorted(
            (index[ctxs[i].pool_id], i)
            for i in held
            if bounds[ctxs[i].pool_id][1] > bounds[ctxs[i].pool_id][0]
        )
        n_sub = len(chosen)
        firsts = np.array([bounds[ctxs[i].pool_id][0] for _, i in chosen], dtype=np.int64)
        sizes = np.array([len(fast[i]) for _, i in chosen], dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        pool_of = np.repeat(np.arange(n_sub, dtype=np.int64), sizes)
        sel = np.repeat(firsts - starts, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
        sums = _SumLayout(pool_of, starts, sizes)

        # The scores (:func:`pool_scores` for every row; each pool's step median one segment median).
        load = fleet_load(snap, cols, params)
        live = load.live[sel]
        own_s = own[sel]
        step = np.where(live, own_s, np.nan)
        tbt_median, _ = segment_medians(step, pool_of, n_sub)
        score, speed = with_speed(
            params, load.acc[sel], can_serve=load.can_serve[sel], own=own_s, tbt_median=tbt_median[pool_of]
        )
        pos = score > 0
        best = np.maximum.reduceat(score, starts) if n_sub else np.zeros(0)
        # Left to ``decide_pool``: a score that is not finite, no node that scores (the even split), a
        # step time of 0 (``decide_pool``'s unstable sort orders it among -0.0 as it likes).
        odd = (
            (np.logical_or.reduceat(~np.isfinite(score) | (step == 0), starts) | ~(best > 0)).tolist()
            if n_sub
            else []
        )
        pw = _powered(score, pos, params.alpha)
        total = sums(pw)
        good = (total > 0).tolist()
        items = [
            (i, ctxs[i].pool_id, fast[i], j, lo, lo + size)
            for (_, i), j, lo, size in zip(chosen, range(n_sub), starts.tolist(), sizes.tolist(), strict=True)
            if good[j] and not odd[j]
        ]
        with np.errstate(divide="ignore", invalid="ignore"):
            weights = r6_array(pw / total[pool_of]).tolist()
        # Per pool: the mean score over its serving nodes (``sum(live) / len(live)``, the live ones
        # those > 0, the others adding +0.0), the counts, the tensor-parallel degrees.
        gpus = cols.ints("gpu_count")[sel]
        headroom: list[float] = []
        serving: list[float] = []
        stale: list[float] = []
        g_lo: list[int] = []
        g_hi: list[int] = []
        if n_sub:
            with np.errstate(divide="ignore", invalid="ignore"):
                headroom = r6_array(sums(score) / np.add.reduceat(pos.astype(np.int64), starts)).tolist()
            serving = np.add.reduceat(live.astype(np.float64), starts).tolist()
            stale = np.add.reduceat(cols.stale[sel].astype(np.float64), starts).tolist()
            g_lo = np.minimum.reduceat(gpus, starts).tolist()
            g_hi = np.maximum.reduceat(gpus, starts).tolist()
        return cls(
            items, n_sub, sel, pool_of, starts, sums, score, speed, pos, best, pw, weights, headroom,
            serving, stale, gpus, g_lo, g_hi, sizes.astype(np.float64).tolist(), r6_array(best).tolist(),
        )  # fmt: skip


def _by_priority(b: _Batch, params: CacheAwareParams) -> dict[int, dict[str, dict[str, float]]]:
    """Per pool decided here, per priority class: shares over the rows at or above the class's floor
    (every row if none)."""
    by_priority: dict[int, dict[str, dict[str, float]]] = {i: {} for i, *_ in b.items}
    alpha = params.alpha
    starts, pool_of, score, pos = b.starts, b.pool_of, b.score, b.pos
    for cls in sorted(set(params.alpha_by_priority) | set(params.min_score_by_priority), key=int):
        if not b.items:
            break
        keep = (score >= params.min_score_by_priority.get(cls, 0.0)) & pos
        mask = keep | ~np.logical_or.reduceat(keep, starts)[pool_of]
        a_cls = params.alpha_by_priority.get(cls, alpha)
        pw_cls = np.where(mask, b.pw if a_cls == alpha else _powered(score, pos & mask, a_cls), 0.0)
        t_cls = b.sums(pw_cls)
        with np.errstate(divide="ignore", invalid="ignore"):
            cls_w = r6_array(pw_cls / t_cls[pool_of])
        # ``shares``' zeros when its total is not > 0; a class only where its weights' sum is > 0.
        has = ((t_cls > 0) & (b.sums(cls_w) > 0)).tolist()
        cls_l = cls_w.tolist()
        for i, _, ids, k, lo, hi in b.items:
            if has[k]:
                by_priority[i][cls] = dict(zip(ids, cls_l[lo:hi], strict=False))
    return by_priority


def _holders(snap: FleetSnapshot, b: _Batch, params: CacheAwareParams) -> _HoldersOf:
    """Prefix holders: each pool's eligible rows by score descending, ties in row (node-id) order."""
    cols = fleet_columns(snap)
    pool_of, score = b.pool_of, b.score
    with np.errstate(invalid="ignore"):
        eligible = (
            (cols.ints("consecutive_failures")[b.sel] <= 0)
            & b.pos
            & (score >= params.affinity_keep_frac * b.best[pool_of])
            & (b.speed >= params.affinity_min_speed)
        )
    er = np.flatnonzero(eligible)
    order = b.sel[er[np.lexsort((-score[er], pool_of[er]))]].tolist()  # the columns' rows
    cut = np.concatenate([[0], np.cumsum(np.bincount(pool_of[er], minlength=b.n_sub))]).tolist()
    return _HoldersOf(order, cut, row_ids(snap), hot_prefixes(snap, cols))


@dataclass(frozen=True, slots=True)
class _HoldersOf:
    """A pool's prefix map: digest -> its holders, best first."""

    order: list[int]
    cut: list[int]
    ids_all: list[str]
    prefixes: list[tuple[str, ...]]

    def __call__(self, k: int, ids: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        # ``decide_pool``'s loop over holders, best first, each appended to its digests' lists. A
        # plain loop: on 3.11 its specialized bytecode (a ``get``, an ``append``) costs less per entry
        # than the same grouping as chained C iterators (``map(list.append, map(defaultdict.__getitem__,
        # ...))``): 5-6 against 10-11 ms for ~30,000 entries at 10,000 nodes.
        rows = self.order[self.cut[k] : self.cut[k + 1]]
        holders: dict[str, list[str]] = {}
        held_by = holders.get
        for node_id, hot in zip(
            map(self.ids_all.__getitem__, rows), map(self.prefixes.__getitem__, rows), strict=True
        ):
            for digest in hot:
                listed = held_by(digest)
                if listed is None:
                    holders[digest] = [node_id]
                else:
                    listed.append(node_id)
        digests = sorted(holders)
        return dict(zip(digests, map(tuple, map(holders.__getitem__, digests)), strict=False))


def _advance(  # noqa: PLR0917
    now: int,
    memory_ms: int,
    slots: int,
    members: list[tuple[int, int, PoolMemory]],
    tbt: Floats,
    writes: Bools,
    own: Floats,
) -> list[tuple[int, tuple[Ints, Floats, int, int]]]:
    """:func:`fleetloop.policies.routing.cache_aware.signals.remember_rows` then ``median_arrays(1)``
    for pools whose memories have ``slots`` (> 0) slots and hold exactly their pools' nodes
    (``members``: batch index, first row, memory): one array for them all. Each pool's median step
    time goes to ``own`` (NaN without figures, as ``pool_scores`` has it); per pool, its rows of the
    new arrays.

    :meth:`PoolMemory.advance`'s operations on the concatenated rows (rows are independent; only
    whether to grow is a per-pool decision), written in place into the concatenation (a new array),
    so a state handed out is never written. A pool with a row to write and no free slot grows as
    ``advance`` grows it: ``slots`` more empty slots after its own, the figure in the first free one.
    When any pool of the group grows, the whole group's arrays are widened (a tick in a run's first
    twenty, or when the memory needs more slots): a pool that does not grow writes within its first
    ``slots`` slots (it has a free one there, the first free one) and keeps those, a view; the
    medians are the same over the wider rows (the added slots are empty: NaN, sorted last)."""
    sizes = [m.ts.shape[0] for _, _, m in members]
    first = np.cumsum(sizes) - sizes
    rows = np.repeat(np.array([lo for _, lo, _ in members], dtype=np.int64) - first, sizes) + np.arange(
        int(first[-1]) + sizes[-1]
    )
    ts = np.concatenate([m.ts for _, _, m in members])
    vals = np.concatenate([m.vals for _, _, m in members])
    v = vals[:, :, 0]  # a view: writing it writes ``vals``
    gone = ~kept_slots(ts, now, memory_ms)
    np.putmask(ts, gone, -1)
    np.putmask(v, gone, np.nan)
    write = writes[rows]
    grows = np.logical_or.reduceat(write & ~gone.any(axis=1), first)  # a row to write, no free slot
    width = slots
    if grows.any():
        width = 2 * slots  # ``advance`` adds max(1, slots) slots; slots > 0 here
        ts = np.concatenate([ts, np.full((len(rows), slots), -1, dtype=np.int64)], axis=1)
        vals = np.concatenate([vals, np.full((len(rows), slots, 1), np.nan)], axis=1)
        v = vals[:, :, 0]
        gone = ts < 0  # the slots not kept are -1 now (a kept one is >= 0), and the new ones
    at = np.flatnonzero(write)
    if len(at):
        slot = np.argmax(gone[at], axis=1)
        ts[at, slot] = now
        v[at, slot] = tbt[rows[at]]
    srt = np.sort(v, axis=1, kind="stable") if (v == 0).any() else np.sort(v, axis=1)
    count = width - np.isnan(v).sum(axis=1)
    r = np.arange(len(rows))
    upper = srt[r, np.minimum(count // 2, width - 1)]
    lower = srt[r, np.maximum(count - 1, 0) // 2]
    with np.errstate(over="ignore"):
        own[rows] = np.where(count >= 1, np.where(count % 2 == 1, upper, (lower + upper) / 2), np.nan)
    narrow_ts, narrow_vals = (ts[:, :slots], vals[:, :slots]) if width != slots else (ts, vals)
    return [
        (i, (ts, vals, a, a + size) if grown else (narrow_ts, narrow_vals, a, a + size))
        for (i, _, _), grown, a, size in zip(members, grows.tolist(), first.tolist(), sizes, strict=True)
    ]


class _SumLayout:
    """Per pool, Python's ``sum`` of its rows' values in row order: ``0.0 + v0 + v1 + ...``, one
    addition at a time (``np.add.reduceat`` adds pairwise, which may round differently). A running
    sum along each row of the pools laid out one per row, padded with +0.0 (which changes no sum of
    values that are not -0.0, and no other sum either: ``x + 0.0`` is ``x`` but for ``x = -0.0``;
    and the running sum, from +0.0, is never -0.0). Rows grouped by pool: ``pool_of`` of each row,
    ``starts`` and ``sizes`` of each pool."""

    __slots__ = ("at", "n", "pool_of", "width")

    def __init__(self, pool_of: Ints, starts: Ints, sizes: Ints) -> None:
        self.pool_of = pool_of
        self.n = len(starts)
        self.at = np.arange(len(pool_of)) - starts[pool_of] + 1  # column 0 holds the leading 0.0
        self.width = int(sizes.max(initial=0)) + 1

    def __call__(self, values: Floats) -> Floats:
        pad = np.zeros((self.n, self.width))
        pad[self.pool_of, self.at] = values
        return np.cumsum(pad, axis=1)[:, -1]


def _powered(score: Floats, pos: Bools, alpha: float) -> Floats:
    """``v ** alpha`` where ``pos`` (else 0.0), the powers Python's (``pow`` of two floats is ``**``),
    as :func:`fleetloop.policies.routing.cache_aware.rule.shares` takes them: numpy's ``power`` may
    use another implementation (SIMD)."""
    out = np.zeros(len(score))
    out[pos] = list(map(pow, score[pos].tolist(), repeat(alpha)))
    return out
