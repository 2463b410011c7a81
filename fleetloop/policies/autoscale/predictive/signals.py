"""What slo-predictive reads of the snapshot: the pool's nodes (as :class:`NodeFigures`, or segment
figures over the fleet's columns for a whole batch of pools), the pressure they are under, the
predicted prefill time, and the siblings' shortfall (README.md beside this file: "Formula")."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple, Protocol

import numpy as np

from fleetloop.policies.autoscale.predictive.params import SloPredictiveParams
from fleetloop.policies.base import FleetSnapshot, PolicyContext, PoolView
from fleetloop.policies.columns import Bools, fleet_columns, segment_medians
from fleetloop.policies.pool_figures import (
    ejected_by,
    loaded,
    mark_rows,
    pool_index,
    pool_owners,
    records,
    row_ids,
    segment_counts,
    segment_sums,
    segment_whole_sums,
)
from fleetloop.policies.prefill import decode_floor_ms, prefill_ms
from fleetloop.policies.slo import DEFAULT_BOOK, Slo


class Node(Protocol):
    """What this algorithm reads of a node: a :class:`NodeView` or its :class:`NodeFigures`."""

    @property
    def node_id(self) -> str: ...
    @property
    def draining(self) -> bool: ...
    @property
    def stale(self) -> bool: ...
    @property
    def weights_state(self) -> str: ...
    @property
    def queued_prompt_tokens(self) -> int: ...
    @property
    def running_requests(self) -> int: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def kv_cache_used_frac(self) -> float: ...
    @property
    def prefix_cache_hit_frac(self) -> float: ...
    @property
    def model(self) -> str: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def gpu_count(self) -> int: ...


class NodeFigures(NamedTuple):
    """The :class:`NodeView` fields this algorithm reads, the same values, without building a view
    per node (a view costs several times a tuple; at 10,000 nodes this algorithm, reading its own
    pool and every sibling, was what built them all)."""

    node_id: str
    draining: bool
    stale: bool
    weights_state: str
    queued_prompt_tokens: int
    running_requests: int
    queue_depth: int
    kv_cache_used_frac: float
    prefix_cache_hit_frac: float
    model: str
    gpu_type: str
    gpu_count: int


def node_figures(snap: FleetSnapshot, pool_id: str) -> tuple[NodeFigures, ...]:
    """``snap.pool_nodes(pool_id)`` as :class:`NodeFigures`, read from the snapshot's columns (the
    numbers and flags as the columns hold them, the three strings from the node's telemetry record),
    every pool's once per snapshot."""
    key = ("slo-predictive.node_figures",)
    found: dict[str, tuple[NodeFigures, ...]] | None = snap.memo.get(key)
    if found is None:
        cols = fleet_columns(snap)
        recs = records(cols)

        def strings(name: str) -> list[str]:
            return list(map(attrgetter(name), recs))

        def ints(name: str) -> list[int]:
            return cols.ints(name).tolist()  # type: ignore[no-any-return]

        def floats(name: str) -> list[float]:
            return cols.floats(name).tolist()  # type: ignore[no-any-return]

        rows = list(
            map(
                NodeFigures._make,
                zip(
                    row_ids(snap), cols.draining.tolist(), cols.stale.tolist(), strings("weights_state"),
                    ints("queued_prompt_tokens"), ints("running_requests"), ints("queue_depth"),
                    floats("kv_cache_used_frac"), floats("prefix_cache_hit_frac"), strings("model"),
                    strings("gpu_type"), ints("gpu_count"), strict=True,
                ),
            )
        )  # fmt: skip
        found = snap.memo[key] = {p: tuple(rows[a:b]) for p, (a, b) in cols.bounds.items()}
    return found.get(pool_id, ())


NodesOf = Callable[[FleetSnapshot, str], Sequence[Node]]


@dataclass(frozen=True, slots=True)
class Pressure:
    kv: float
    ttft: float | None
    tbt: float | None
    queue: float
    # The idle node's step when it is at or above the TBT target and the reading is set aside
    # (:func:`tbt_target`); None otherwise.
    tbt_floor: float | None = None

    @property
    def value(self) -> float:
        return max(self.kv, self.ttft or 0.0, self.tbt or 0.0, self.queue)


def pressure_of(  # noqa: PLR0917 - the warm nodes' sums, then the signals, the SLO and the physics
    n_warm: int,
    kv_sum: float,
    waiting: float,
    running: float,
    ttft: float | None,
    tbt: float | None,
    params: SloPredictiveParams,
    slo: Slo = DEFAULT_BOOK.default,
    prefill: float = 0.0,
    floor: float = 0.0,
) -> Pressure:
    """How hard the warm nodes press against the SLO targets; 1.0 = at target. ``n_warm`` warm nodes
    whose KV use sums to ``kv_sum``, with ``waiting`` requests queued and ``running`` in service;
    ``ttft`` is the pool's windowed TTFT p50, ``tbt`` the smoothed effective time between tokens,
    ``prefill`` the predicted compute time of a prefill (subtracted from ``ttft``: capacity cannot
    remove it), ``floor`` the predicted time between tokens of an idle node (:func:`tbt_target`)."""
    kv = kv_sum / n_warm / params.kv_target if n_warm else 0.0
    queue = (running + waiting) / max(running, 1) if n_warm and waiting >= n_warm else 0.0
    tbt_at = tbt_target(params, slo, floor)
    return Pressure(
        queue=queue,
        kv=kv,
        ttft=max(0.0, ttft - prefill) / (params.headroom * slo.ttft_ms) if ttft is not None else None,
        tbt=tbt / tbt_at if tbt is not None and tbt_at is not None else None,
        tbt_floor=floor if tbt is not None and tbt_at is None else None,
    )


def tbt_target(params: SloPredictiveParams, slo: Slo, floor: float) -> float | None:
    """The effective time between tokens the pool is sized to, ``headroom x tbt_ms``; None when an
    idle node's own step (``floor``, :func:`idle_tbt_ms`) is already at or above it: no node count
    reaches that target, and read as pressure it would ask for more nodes at any load, up to the
    pool's maximum (README.md, "TBT"). KV, TTFT and queue then size the pool."""
    target = params.headroom * slo.tbt_ms
    return None if floor >= target else target


def pressure(  # noqa: PLR0917 - the signals, then the SLO and the prefill that shift them
    warm: Sequence[Node],
    ttft: float | None,
    tbt: float | None,
    params: SloPredictiveParams,
    slo: Slo = DEFAULT_BOOK.default,
    prefill: float = 0.0,
    floor: float = 0.0,
) -> Pressure:
    """:func:`pressure_of` of a list of warm nodes."""
    return pressure_of(
        len(warm),
        sum(n.kv_cache_used_frac for n in warm),
        sum(n.queue_depth for n in warm),
        sum(n.running_requests for n in warm),
        ttft,
        tbt,
        params,
        slo,
        prefill,
        floor,
    )


def prefill_of(
    pool: PoolView | None,
    n_warm: int,
    hit_sum: float,
    params: SloPredictiveParams,
    reference: Callable[[], tuple[str, str, int]],
) -> float:
    """The compute time of the pool's mean uncached prompt on one of its warm nodes (0 unknown):
    ``n_warm`` warm nodes whose prefix-cache hit shares sum to ``hit_sum``; ``reference()`` is the
    first warm node's (model, GPU type, GPU count)."""
    if pool is None or not n_warm or pool.request_rate_per_s <= 0:
        return 0.0
    hit = hit_sum / n_warm
    tokens = pool.prompt_tokens_rate_per_s / pool.request_rate_per_s * (1.0 - min(max(hit, 0.0), 1.0))
    model, gpu_type, gpu_count = reference()
    ms = prefill_ms(model, gpu_type, gpu_count, tokens, params.prefill_efficiency)
    return ms if ms is not None else 0.0


def predicted_prefill_ms(pool: PoolView | None, warm: Sequence[Node], params: SloPredictiveParams) -> float:
    """:func:`prefill_of` of a list of warm nodes."""
    return prefill_of(
        pool,
        len(warm),
        sum(n.prefix_cache_hit_frac for n in warm),
        params,
        lambda: (warm[0].model, warm[0].gpu_type, warm[0].gpu_count),
    )


def prefill_at_row(  # noqa: PLR0917 - the pool, its warm nodes' figures, the params
    snap: FleetSnapshot,
    pool: PoolView | None,
    n_warm: int,
    hit_sum: float,
    first: int,
    params: SloPredictiveParams,
) -> float:
    """:func:`prefill_of` from the warm nodes' hit sum and the first warm row of the columns."""
    return prefill_of(pool, n_warm, hit_sum, params, lambda: row_shape(snap, first))


def row_shape(snap: FleetSnapshot, row: int) -> tuple[str, str, int]:
    """The (model, GPU type, GPU count) of row ``row`` of the snapshot's columns: what the prefill
    prediction and the idle step are read for (the pool's first warm row)."""
    cols = fleet_columns(snap)
    rec = records(cols)[row]
    return rec.model, rec.gpu_type, int(cols.ints("gpu_count")[row])


def idle_tbt_ms(n_warm: int, reference: Callable[[], tuple[str, str, int]]) -> float:
    """The time between tokens of one of the pool's warm nodes at no load
    (:func:`fleetloop.policies.prefill.decode_floor_ms`; 0.0 when there is no warm node or the
    model or GPU is unknown: every millisecond then counts against the target, today's reading);
    ``reference()`` is the first warm node's (model, GPU type, GPU count)."""
    if not n_warm:
        return 0.0
    floor = decode_floor_ms(*reference())
    return floor if floor is not None else 0.0


def idle_tbt_of(warm: Sequence[Node]) -> float:
    """:func:`idle_tbt_ms` of a list of warm nodes."""
    return idle_tbt_ms(len(warm), lambda: (warm[0].model, warm[0].gpu_type, warm[0].gpu_count))


def idle_tbt_at_row(snap: FleetSnapshot, n_warm: int, first: int) -> float:
    """:func:`idle_tbt_ms` from the first warm row of the columns."""
    return idle_tbt_ms(n_warm, lambda: row_shape(snap, first))


# -- siblings: the other pools of the pool's model -------------------------------------------------


def sibling_excess(
    snap: FleetSnapshot,
    ctx: PolicyContext,
    params: SloPredictiveParams,
    pool: PoolView | None,
    n_warm: int,
    *,
    nodes_of: NodesOf = node_figures,
) -> tuple[float, float]:
    """(the pressure of the model's other pool that is short the most nodes, the nodes this pool
    needs to carry what that pool cannot), (0, 0) when no sibling is short.

    A router splits a model's calls among its pools by their routable capacity, so this pool's
    share grows with its nodes. A sibling ``s`` with ``n_s`` warm nodes at pressure ``P_s`` needs
    ``P_s * n_s`` nodes; when its own node count (warm plus arriving, ``a_s``) stays below that,
    it could not get them (its ``max_nodes``, or its provider's step limit; the policy does not see
    those bounds) and ``short = P_s * n_s - a_s`` nodes of the model's demand are unserved. Sized
    for the model's demand with the sibling's nodes counted as they are, this pool needs
    ``n * P + short`` (equal per-node capacity and pressure linear in load, as for ``need``). A
    sibling that can grow asks for its nodes within a tick and is not short for long; the up
    window (``up_window_s``) keeps one tick's reading from buying nodes here. The sibling's
    pressure is read without its smoothed TBT (another pool's state): KV, TTFT above its predicted
    prefill, queue, against this pool's SLO."""
    if pool is None or not pool.model:
        return 0.0, 0.0
    ejected = {i for i, b in ctx.breakers.items() if b.enforced and b.state == "open"}
    slo = ctx.pool_slo(snap)
    best_p, best_short = 0.0, 0.0
    siblings = [(sid, sib) for sid, sib in model_pools(snap, pool.model) if sid != ctx.pool_id]
    if ejected and any(not ejected.isdisjoint(sib.node_ids) for _, sib in siblings):
        # The breakers are this pool's, so in the engine they name none of a sibling's nodes; when
        # they do, the sibling is read here with those nodes left out.
        for sid, sib in siblings:
            found = _sibling(snap, sid, sib, params, slo=slo, ejected=ejected, nodes_of=nodes_of)
            if found is not None and found[1] > best_short:
                best_p, best_short = found
        return best_p, best_short
    # Otherwise the siblings' figures are the snapshot's alone: the model's pools that are short
    # are found once per snapshot and SLO (not once per pool and sibling, which costs a model's
    # pools squared), in pool order; only a shortfall > 0 can ever be picked.
    for sid, p, short in _model_shortfalls(snap, pool.model, params, slo, nodes_of):
        if sid != ctx.pool_id and short > best_short:
            best_p, best_short = p, short
    return best_p, best_short


def model_pools(snap: FleetSnapshot, model: str) -> list[tuple[str, PoolView]]:
    """The snapshot's pools serving ``model``, in pool order (grouped once per snapshot)."""
    key = ("slo-predictive.model_pools",)
    found: dict[str, list[tuple[str, PoolView]]] | None = snap.memo.get(key)
    if found is None:
        found = snap.memo[key] = {}
        for sid, sib in snap.pools.items():
            found.setdefault(sib.model, []).append((sid, sib))
    return found.get(model, [])


def _model_shortfalls(
    snap: FleetSnapshot, model: str, params: SloPredictiveParams, slo: Slo, nodes_of: NodesOf = node_figures
) -> tuple[tuple[str, float, float], ...]:
    """``(pool, P_s, shortfall)`` of the model's pools short of nodes (shortfall > 0), in pool
    order, read against ``slo`` with no node left out; once per snapshot, model, params and SLO."""
    key = ("slo-predictive.shortfalls", model, id(params), slo, nodes_of)
    memo = snap.memo.get(key)
    if memo is None or memo[0] is not params:
        out: list[tuple[str, float, float]] = []
        for sid, sib in model_pools(snap, model):
            found = _sibling(snap, sid, sib, params, slo=slo, ejected=frozenset(), nodes_of=nodes_of)
            if found is not None and found[1] > 0:
                out.append((sid, *found))
        memo = snap.memo[key] = (params, tuple(out))
    return memo[1]


def _sibling(
    snap: FleetSnapshot,
    sid: str,
    sib: PoolView,
    params: SloPredictiveParams,
    *,
    slo: Slo,
    ejected: Collection[str],
    nodes_of: NodesOf = node_figures,
) -> tuple[float, float] | None:
    """A sibling's ``(P_s, P_s * n_s - a_s)``, None without a warm node (:func:`sibling_excess`)."""
    active = [n for n in nodes_of(snap, sid) if not n.draining and not n.stale]
    warm = [n for n in active if n.weights_state == "warm" and n.node_id not in ejected]
    if not warm:
        return None
    prefill = predicted_prefill_ms(sib, warm, params)
    p = pressure(warm, sib.ttft_p50_ms_w, None, params, slo, prefill).value
    return p, p * len(warm) - len(active)


# -- a batch of pools: segment figures over the fleet's columns ------------------------------------
#
# The node figures each pool's tick reads (counts, sums and medians over its active, warm and
# arriving nodes, and its siblings') are segment operations over the snapshot's columns
# (:mod:`fleetloop.policies.pool_figures`), one numpy pass each for the whole batch, the same doubles
# as Python's arithmetic over the pool's nodes in node order.


class Sides(NamedTuple):
    """Per pool of the columns: the figures of a set of its nodes (``warm``) within ``active``."""

    active: list[int]
    warm: list[int]
    kv: list[float]  # sum of kv_cache_used_frac over warm
    hit: list[float]  # sum of prefix_cache_hit_frac over warm
    waiting: list[float]  # sum of queue_depth over warm (the exact integer, as a double)
    running: list[float]  # sum of running_requests over warm (likewise)
    first: list[int]  # the first warm row (-1 without)


def sides(snap: FleetSnapshot, active: Bools, warm: Bools) -> Sides:
    cols = fleet_columns(snap)
    n_warm = segment_counts(cols, warm)
    rows = np.flatnonzero(warm)
    at = np.searchsorted(cols.pool_of[rows], np.arange(len(cols.pool_ids), dtype=np.int64))
    first = np.where(n_warm > 0, rows[np.minimum(at, max(len(rows) - 1, 0))] if len(rows) else -1, -1)
    return Sides(
        segment_counts(cols, active).tolist(),
        n_warm.tolist(),
        segment_sums(cols, cols.floats("kv_cache_used_frac"), warm).tolist(),
        segment_sums(cols, cols.floats("prefix_cache_hit_frac"), warm).tolist(),
        segment_whole_sums(cols, "queue_depth", warm).tolist(),
        segment_whole_sums(cols, "running_requests", warm).tolist(),
        first.tolist(),
    )


class Siblings:
    """The model's pools as a sibling reads them (every active node, nothing left out): each pool's
    predicted prefill, and each model's pools short of nodes per SLO, computed once per batch."""

    def __init__(self, snap: FleetSnapshot, params: SloPredictiveParams, sib: Sides) -> None:
        self.snap, self.params, self.sib = snap, params, sib
        self._prefill: list[float | None] = [None] * len(sib.active)
        self._short: dict[tuple[str, Slo], list[tuple[str, float, float]]] = {}
        self._best: dict[tuple[str, Slo], tuple[tuple[str, float, float], tuple[float, float]]] = {}

    def prefill(self, j: int) -> float:
        """The predicted prefill of the pool at column index ``j``, from its warm nodes."""
        found = self._prefill[j]
        if found is None:
            snap, sib = self.snap, self.sib
            pool = snap.pools.get(fleet_columns(snap).pool_ids[j])
            found = self._prefill[j] = prefill_at_row(
                snap, pool, sib.warm[j], sib.hit[j], sib.first[j], self.params
            )
        return found

    def most_short(self, model: str, slo: Slo, pool_id: str) -> tuple[float, float]:
        """``(P_s, short)`` of the model's pool other than ``pool_id`` short the most (the first in
        pool order on a tie), (0, 0) when none is: the scan of :meth:`shortfalls` that skips
        ``pool_id``, from the list's first greatest entry and the first greatest of the others
        (found once per model and SLO; a scan per pool cost the model's pools squared). Skipping
        a pool other than the first greatest leaves it the pick; skipping it leaves the runner-up."""
        found = self._best.get((model, slo))
        if found is None:
            best, second = ("", 0.0, 0.0), (0.0, 0.0)
            for sid, p_s, short in self.shortfalls(model, slo):
                if short > best[2]:
                    # The old best is the first greatest of the others so far (it precedes a tie).
                    second = best[1:] if best[2] >= second[1] else second
                    best = (sid, p_s, short)
                elif short > second[1]:
                    second = (p_s, short)
            found = self._best[(model, slo)] = (best, second)
        best, second = found
        return second if best[0] == pool_id else best[1:]

    def shortfalls(self, model: str, slo: Slo) -> list[tuple[str, float, float]]:
        """A sibling's ``(pool, P_s, P_s * n_s - a_s)`` read against ``slo``, for the model's pools
        short (> 0), in pool order (:func:`sibling_excess`)."""
        found = self._short.get((model, slo))
        if found is not None:
            return found
        found = self._short[(model, slo)] = []
        snap, sib, params = self.snap, self.sib, self.params
        index = pool_index(snap)
        for sid, sview in model_pools(snap, model):
            j = index.get(sid)
            if j is None or not sib.warm[j]:
                continue
            n = sib.warm[j]
            prefill_s = (
                self.prefill(j)
                if sview is snap.pools.get(sid)
                else prefill_at_row(snap, sview, n, sib.hit[j], sib.first[j], params)
            )
            p_s = pressure_of(
                n,
                sib.kv[j],
                sib.waiting[j],
                sib.running[j],
                sview.ttft_p50_ms_w,
                None,
                params,
                slo,
                prefill_s,
            ).value
            short = p_s * n - sib.active[j]
            if short > 0:
                found.append((sid, p_s, short))
        return found


@dataclass(frozen=True, slots=True)
class BatchFigures:
    """What a batch of pools reads of the snapshot, per pool of the columns (index ``j``), and per
    pool of the batch (``drained`` and ``ejected``, index ``k``)."""

    index: Mapping[str, int]  # pool id -> column index
    is_warm: Bools  # weights loaded, every row
    drained: list[tuple[str, ...]]  # per pool of the batch: its drain list as the engine holds it
    ejected: list[set[str]]  # per pool of the batch: nodes its open, enforced breakers name
    own: Sides  # the pools' own active and warm nodes (drained and ejected ones left out)
    sib: Sides  # every pool as a sibling reads it (nothing left out)
    arriving: list[int]  # active nodes not yet warm
    medians: list[float]  # median running_requests over the own warm nodes
    not_warm: list[int]  # fresh nodes not warm (the cold-start learner's cue)
    backlog: list[float]  # queued prompt tokens over the active nodes
    siblings: Siblings


def read_batch(
    snap: FleetSnapshot, params: SloPredictiveParams, ctxs: Sequence[PolicyContext]
) -> BatchFigures:
    """The batch's figures. A pool's nodes on its drain list as the engine holds it
    (``PolicyContext.draining``: asked on an earlier tick, not gone, not taken back) are leaving:
    not counted, whatever their own telemetry says yet."""
    cols = fleet_columns(snap)
    stale = cols.stale
    is_warm = loaded(snap)
    base = ~cols.draining & ~stale  # a sibling's active nodes: nothing left out
    active = base
    ejected_rows: Bools | None = None
    drained_of: list[tuple[str, ...]] = []
    ejected_of: list[set[str]] = []
    for ctx in ctxs:
        drained = ctx.draining
        drained_of.append(drained)
        if drained:
            if active is base:
                active = base.copy()
            mark_rows(snap, active, ctx.pool_id, drained, value=False)
        ejected = ejected_by(snap, ctx.breakers)
        ejected_of.append(ejected)
        if ejected:
            if ejected_rows is None:
                ejected_rows = np.zeros(len(cols), dtype=np.bool_)
            mark_rows(snap, ejected_rows, ctx.pool_id, ejected)
    sib = sides(snap, base, base & is_warm)
    if active is base and ejected_rows is None:
        own = sib
    else:
        warm_rows = active & is_warm
        if ejected_rows is not None:
            warm_rows &= ~ejected_rows
        own = sides(snap, active, warm_rows)
    running_w = np.where(active & is_warm, cols.floats("running_requests"), np.nan)  # ints, exact
    if ejected_rows is not None:
        running_w[ejected_rows] = np.nan
    return BatchFigures(
        index=pool_index(snap),
        is_warm=is_warm,
        drained=drained_of,
        ejected=ejected_of,
        own=own,
        sib=sib,
        arriving=segment_counts(cols, active & ~is_warm).tolist(),
        medians=segment_medians(running_w, cols.pool_of, len(cols.pool_ids))[0].tolist(),
        not_warm=segment_counts(cols, ~stale & ~is_warm).tolist(),
        backlog=segment_whole_sums(cols, "queued_prompt_tokens", active).tolist(),
        siblings=Siblings(snap, params, sib),
    )


def own_pressure(  # noqa: PLR0917 - the batch's figures, the pool, then its signals
    snap: FleetSnapshot,
    fig: BatchFigures,
    params: SloPredictiveParams,
    pool: PoolView | None,
    j: int,
    tbt: float | None,
    slo: Slo,
) -> tuple[float, Pressure]:
    """(the predicted prefill, the pressure) of the pool at column index ``j`` (-1: it has no node)
    from its own warm nodes."""
    ttft = pool.ttft_p50_ms_w if pool else None
    if j < 0:
        prefill = prefill_at_row(snap, pool, 0, 0.0, -1, params)
        return prefill, pressure_of(0, 0.0, 0, 0, ttft, tbt, params, slo, prefill)
    own, sib = fig.own, fig.sib
    n_warm = own.warm[j]
    if own is sib or (n_warm == sib.warm[j] and own.hit[j] == sib.hit[j] and own.first[j] == sib.first[j]):
        # The pool's own warm nodes give the siblings' figures (nothing of it drained or ejected):
        # the same prefill, computed once (a signed zero hit sum reads as +0.0).
        prefill = fig.siblings.prefill(j)
    else:
        prefill = prefill_at_row(snap, pool, n_warm, own.hit[j], own.first[j], params)
    floor = idle_tbt_at_row(snap, n_warm, own.first[j])
    p = pressure_of(n_warm, own.kv[j], own.waiting[j], own.running[j], ttft, tbt, params, slo, prefill, floor)
    return prefill, p


def sibling_short(  # noqa: PLR0917 - the batch's figures, then the pool's
    snap: FleetSnapshot,
    fig: BatchFigures,
    ctx: PolicyContext,
    params: SloPredictiveParams,
    pool: PoolView | None,
    n_warm: int,
    ejected: set[str],
    slo: Slo,
) -> tuple[float, float]:
    """:func:`sibling_excess` for a pool of the batch, from the batch's sibling figures unless its
    breakers name a sibling's node (then read as :func:`sibling_excess` reads it)."""
    sib_p, sib_short = 0.0, 0.0
    if pool is None or not pool.model:
        return sib_p, sib_short
    pid = ctx.pool_id
    crossing = False
    if ejected:
        # ``sibling_excess``'s test: does a breaker of this pool name a sibling's node?
        owners = pool_owners(snap)
        model = pool.model
        crossing = any(
            sid != pid and snap.pools[sid].model == model for node_id in ejected for sid in owners(node_id)
        )
    if crossing:
        return sibling_excess(snap, ctx, params, pool, n_warm)
    return fig.siblings.most_short(pool.model, slo, pid)


def pool_rows(
    snap: FleetSnapshot, fig: BatchFigures, pool_id: str
) -> tuple[list[str], list[bool], list[bool]]:
    """The pool's nodes in row order: (ids, stale, weights loaded)."""
    cols = fleet_columns(snap)
    a, b = cols.bounds.get(pool_id, (0, 0))
    return row_ids(snap)[a:b], cols.stale[a:b].tolist(), fig.is_warm[a:b].tolist()
