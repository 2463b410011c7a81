"""cache-aware's rule: the six scorers, combined and turned into shares, the per-priority shares,
the prefix holders, the spill ranking and the decision (README.md beside this file: "Formula").

The scorers are written once, as array operations over rows of nodes (:func:`load_terms`, the
part that depends on the snapshot alone, then :func:`with_speed`); :func:`decide_pool` is one pool's
tick in any state, and :mod:`fleetloop.policies.routing.cache_aware.batch` decides a batch of pools
with the same operations on the same doubles. ``tests/oracles/cache_aware.py`` states the scorers
node by node. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult, r6, r6_array
from fleetloop.policies.columns import FleetColumns, Floats, fleet_columns, segment_medians
from fleetloop.policies.memory import PoolMemory, median_sorted
from fleetloop.policies.pool_figures import records, row_ids
from fleetloop.policies.routing.cache_aware.params import PICKER, CacheAwareParams
from fleetloop.policies.routing.cache_aware.signals import (
    State,
    pool_max_prompt,
    pool_slo_prompt,
    remember_rows,
)
from fleetloop.schemas.base import MAX_FIGURE, assemble
from fleetloop.schemas.decisions import Picker, RoutingDecision


def load_terms(
    params: CacheAwareParams,
    *,
    queue: Floats,
    running: Floats,
    tokens: Floats,
    batch: Floats,
    kv: Floats,
    hbm: Floats,
    hbm_max: Floats | float,
) -> Floats:
    """``0 + w_queue s_queue + ... + w_hbm s_hbm``: the weighted sum up to the speed scorer, added in
    the formula's order (as Python's ``sum`` adds the six terms). It depends on the snapshot alone
    (not on the pool's memory)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        acc = 0.0 + params.w_queue * (1.0 / (1.0 + np.maximum(queue, 0.0) / params.queue_scale))
        acc = acc + params.w_running * (1.0 / (1.0 + np.maximum(running, 0.0) / params.running_scale))
        acc = acc + params.w_tokens * (1.0 / (1.0 + np.maximum(tokens, 0.0) / np.maximum(batch, 1.0)))
        acc = acc + params.w_kv * np.minimum(1.0, np.maximum(0.0, 1.0 - kv))
        # A node that cannot serve is not in ``hbm_max`` and may overflow here; it scores 0 later.
        hbm_term = np.where(
            hbm_max > 0, params.w_hbm * np.minimum(1.0, np.maximum(0.0, hbm / hbm_max)), params.w_hbm * 1.0
        )
        return acc + hbm_term


def with_speed(
    params: CacheAwareParams,
    acc: Floats,
    *,
    can_serve: npt.NDArray[np.bool_],
    own: Floats,
    tbt_median: Floats | float,
) -> tuple[Floats, Floats]:
    """Add the speed scorer to :func:`load_terms` and divide by the weights' sum: (S_i, s_speed)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        speed = np.where(np.isnan(own) | np.isnan(tbt_median), 1.0, np.minimum(1.0, tbt_median / own))
    total = sum(params.component_weights().values())
    return np.where(can_serve, (acc + params.w_speed * speed) / total, 0.0), speed


@dataclass(frozen=True, slots=True, eq=False)
class FleetLoad:
    """The snapshot-only part of every node's score, for the whole fleet (built once per snapshot
    and params): :func:`load_terms` against each pool's ``hbm_max``, and whether the node can serve."""

    params: CacheAwareParams
    acc: Floats
    can_serve: npt.NDArray[np.bool_]
    live: npt.NDArray[np.bool_]


def fleet_load(snap: FleetSnapshot, cols: FleetColumns, params: CacheAwareParams) -> FleetLoad:
    key = ("cache-aware.load", id(params))
    found: FleetLoad | None = snap.memo.get(key)
    if found is None or found.params is not params:
        live = cols.warm & ~cols.stale
        hbm = cols.floats("hbm_free_gib")
        hbm_max: Floats = np.zeros(0)
        if len(cols):
            per_pool = np.maximum.reduceat(np.where(live, hbm, -np.inf), cols.starts)
            hbm_max = np.where(np.isneginf(per_pool), 0.0, per_pool)[cols.pool_of]
        acc = load_terms(
            params,
            queue=cols.floats("queue_depth"),
            running=cols.floats("running_requests"),
            tokens=cols.floats("queued_prompt_tokens"),
            batch=cols.floats("max_batch_tokens"),
            kv=cols.floats("kv_cache_used_frac"),
            hbm=hbm,
            hbm_max=hbm_max,
        )
        can_serve = live & (cols.ints("age_ms") <= params.silent_after_ms)
        found = snap.memo[key] = FleetLoad(params, acc, can_serve, live)
    return found


def pool_scores(
    snap: FleetSnapshot,
    ids: Sequence[str],
    params: CacheAwareParams,
    memory: PoolMemory,
    *,
    cols: FleetColumns,
    rows: slice,
) -> tuple[dict[str, float], dict[str, float]]:
    """(node id -> combined score S_i, 0 for nodes that cannot serve; node id -> s_speed) from the
    pool's rows ``rows`` of the snapshot's columns: the snapshot-only terms come from
    :func:`fleet_load` (computed once for the whole fleet), the speed scorer from the memory's median
    array."""
    if not ids:
        return {}, {}
    load = fleet_load(snap, cols, params)
    med, ok = memory.median_arrays(1)
    own = np.where(ok[:, 0], med[:, 0], np.nan)
    steps = own[load.live[rows]]
    xs = np.sort(steps[~np.isnan(steps)]).tolist()
    score, speed = with_speed(
        params,
        load.acc[rows],
        can_serve=load.can_serve[rows],
        own=own,
        tbt_median=median_sorted(xs) if xs else np.nan,
    )
    return dict(zip(ids, score.tolist(), strict=True)), dict(zip(ids, speed.tolist(), strict=True))


def shares(scores: Mapping[str, float], alpha: float) -> dict[str, float]:
    """``S_i ** alpha / sum_j S_j ** alpha``, rounded for the wire: the quotients and their rounding
    as array operations (one IEEE division each, :func:`r6_array`, the same doubles as ``r6``); the
    powers and the sum are Python's, in node order."""
    keys = sorted(scores)
    powered = [v**alpha if v > 0 else 0.0 for v in (scores[k] for k in keys)]
    total = sum(powered)
    if not total > 0:
        return dict.fromkeys(keys, 0.0)
    return dict(zip(keys, r6_array(np.array(powered, dtype=np.float64) / total).tolist(), strict=True))


def fleet_headroom(snap: FleetSnapshot, params: CacheAwareParams) -> Mapping[str, float | None]:
    """Pool id -> spill headroom for every pool (mean score over its proven serving nodes, those the
    router completed a call on in the window; None when it has none), from this snapshot alone, once
    per snapshot. A pool's step time here is each node's newest ``tbt_p50_ms`` (one figure, not the
    remembered median, which is the pool's own policy state): spill-over ranks other pools on what
    the snapshot says of them. Over the fleet-wide columns: each scorer one array operation, each
    pool's step-time median one segment median; the means are Python sums over each pool's proven
    nodes in node order (``tests/unit/test_fast_columns.py`` holds it to the per-pool statement)."""
    key = ("cache-aware.fleet_headroom", id(params))
    memo = snap.memo.get(key)
    found: Mapping[str, float | None] | None = memo[1] if memo is not None and memo[0] is params else None
    if found is None:
        cols = fleet_columns(snap)
        out: dict[str, float | None] = dict.fromkeys(sorted(snap.pools))
        if len(cols):
            load = fleet_load(snap, cols, params)
            tbt = cols.floats("tbt_p50_ms")
            with np.errstate(invalid="ignore"):
                step = np.where(load.live & (tbt > 0), tbt, np.nan)
            tbt_median, _ = segment_medians(step, cols.pool_of, len(cols.pool_ids))
            scores, _ = with_speed(
                params, load.acc, can_serve=load.can_serve, own=step, tbt_median=tbt_median[cols.pool_of]
            )
            take = (scores > 0) & (cols.ints("ok_w") > 0)
            # Each pool's sum over all its rows, the others as +0.0: the same double as the sum over
            # the taken ones (adding +0.0 to a sum of values > 0 leaves it as it is).
            values = np.where(take, scores, 0.0).tolist()
            counts = np.add.reduceat(take.astype(np.int64), cols.starts).tolist()
            for pool_id, count in zip(cols.pool_ids, counts, strict=True):
                lo, hi = cols.bounds[pool_id]
                out[pool_id] = sum(values[lo:hi]) / count if count else None
        snap.memo[key] = (params, out)
        found = out
    return found


def spill_targets(snap: FleetSnapshot, params: CacheAwareParams, pool_id: str) -> tuple[str, ...]:
    """The pools ``pool_id`` spills over to: the other pools of its model whose headroom is at least
    ``spill_min_headroom``, by headroom descending (pool id breaks ties), then the pools of every
    other model with that headroom, likewise ranked. The model's ranked candidates are sorted once
    per snapshot and model, and each pool drops itself from them (removing one entry keeps a sorted
    list sorted)."""
    own_pool = snap.pools.get(pool_id)
    model = own_pool.model if own_pool is not None else ""
    if not model:
        return ()
    ranked = _ranked(snap, params, model)
    return tuple(p for p in ranked if p != pool_id) if pool_id in ranked else ranked


def _ranked(snap: FleetSnapshot, params: CacheAwareParams, model: str) -> tuple[str, ...]:
    """The pools of ``model`` with at least ``spill_min_headroom``, by headroom descending (pool id
    breaks ties), then the other models' pools with that headroom, likewise; once per snapshot and
    model."""
    key = ("cache-aware.spill", id(params), model)
    memo = snap.memo.get(key)
    ranked: tuple[str, ...] | None = memo[1] if memo is not None and memo[0] is params else None
    if ranked is None:
        pools = snap.pools
        floor = params.spill_min_headroom
        able = sorted(
            (-h, other) for other, h in fleet_headroom(snap, params).items() if h is not None and h >= floor
        )
        ranked = tuple(p for _, p in able if pools[p].model == model) + tuple(
            p for _, p in able if pools[p].model != model
        )
        snap.memo[key] = (params, ranked)
    return ranked


def spill_targets_of(snap: FleetSnapshot, params: CacheAwareParams) -> Callable[[str], tuple[str, ...]]:
    """:func:`spill_targets` of any pool, each model's ranking sorted once (as there) and each pool's
    own entry dropped by its position instead of a pass over the model's pools per pool."""
    pools = snap.pools
    ranked: dict[str, tuple[tuple[str, ...], dict[str, int]]] = {}

    def of(pool_id: str) -> tuple[str, ...]:
        own_pool = pools.get(pool_id)
        model = own_pool.model if own_pool is not None else ""
        if not model:
            return ()
        found = ranked.get(model)
        if found is None:
            targets = _ranked(snap, params, model)
            found = ranked[model] = (targets, {p: j for j, p in enumerate(targets)})
        targets, at = found
        j = at.get(pool_id)
        return targets if j is None else targets[:j] + targets[j + 1 :]

    return of


_ROUTING_FIELDS = (
    "entity", "reason", "inputs", "kind", "pool_id", "weights", "picker", "by_priority", "prefix_affinity",
    "spill_to", "max_prompt_tokens", "slo_prompt_tokens",
)  # fmt: skip
assert tuple(RoutingDecision.model_fields) == _ROUTING_FIELDS  # ``routing_decision`` lists them in order


def _within(values: Iterable[float], lo: float) -> bool:
    return all(lo <= v <= MAX_FIGURE for v in values)  # False for NaN


def routing_decision(  # noqa: PLR0917 (the decision's fields, in order)
    pool_id: str,
    weights: dict[str, float],
    reason: str,
    inputs: dict[str, float],
    by_priority: dict[str, dict[str, float]],
    affinity: dict[str, tuple[str, ...]],
    spill_to: tuple[str, ...],
    max_prompt_tokens: int | None = None,
    slo_prompt_tokens: dict[str, int] | None = None,
    *,
    picker: Picker = PICKER,
    checked: bool = False,
) -> RoutingDecision:
    """The pool's decision, assembled without validation when every figure is within the schema's
    bounds (ids and digests come from validated telemetry, the tick and the snapshot's pools):
    validating ~50 nodes' weights, classes and prefixes costs more than computing them. Its fields
    are set as validation records them (``max_prompt_tokens`` and ``slo_prompt_tokens`` only when
    known). ``checked``: the caller knows the figures are within bounds (the batch form), so they are
    not checked again. Anything out of bounds goes through validation and fails there."""
    slo_prompt_tokens = slo_prompt_tokens or {}
    values: dict[str, object] = {
        "entity": f"pool/{pool_id}",
        "reason": reason,
        "inputs": inputs,
        "kind": "routing",
        "pool_id": pool_id,
        "weights": weights,
        "picker": picker,
        "by_priority": by_priority,
        "prefix_affinity": affinity,
        "spill_to": spill_to,
        "max_prompt_tokens": max_prompt_tokens,
        "slo_prompt_tokens": slo_prompt_tokens,
    }
    given = _GIVEN_SETS[(max_prompt_tokens is not None, bool(slo_prompt_tokens))]
    if checked or (
        reason
        and _within(inputs.values(), -MAX_FIGURE)
        and _within(weights.values(), 0.0)
        and all(_within(ws.values(), 0.0) for ws in by_priority.values())
    ):
        return assemble(RoutingDecision, values, set(given))
    return RoutingDecision.model_validate({k: values[k] for k in given})


_GIVEN = frozenset(
    (
        "entity",
        "pool_id",
        "weights",
        "reason",
        "inputs",
        "by_priority",
        "prefix_affinity",
        "spill_to",
    )
)
_GIVEN_FIT = _GIVEN | {"max_prompt_tokens"}
_GIVEN_SETS = {
    (False, False): _GIVEN,
    (True, False): _GIVEN_FIT,
    (False, True): _GIVEN | {"slo_prompt_tokens"},
    (True, True): _GIVEN_FIT | {"slo_prompt_tokens"},
}


def decide_pool(
    snap: FleetSnapshot, params: CacheAwareParams, state: PoolMemory | State, ctx: PolicyContext
) -> PolicyResult[PoolMemory]:
    """One pool's tick, whatever its state (what ``CacheAware.decide`` runs)."""
    # The pool's rows of the snapshot's columns; a node's view is read only in the rare case
    # that no node scores (the even split below).
    cols = fleet_columns(snap)
    lo, hi = cols.bounds.get(ctx.pool_id, (0, 0))
    rows = slice(lo, hi)
    ids = tuple(row_ids(snap)[lo:hi])
    memory = remember_rows(state, snap.now_ms, params, ids, cols=cols, rows=rows)
    scores, speeds = pool_scores(snap, ids, params, memory, cols=cols, rows=rows)
    weights = shares(scores, params.alpha)
    best = max(scores.values(), default=0.0)
    reason = "cache-aware"
    if best <= 0:
        # Every warm node is stale (saturated): even shares over them; the engine zeroes stale
        # nodes and fails open, so the router still has somewhere to send calls.
        pool = snap.pool_nodes(ctx.pool_id)
        warm = [n.node_id for n in pool if n.warm]
        weights = {n.node_id: (r6(1.0 / len(warm)) if n.node_id in warm else 0.0) for n in pool}
        reason = "all-stale" if warm else "no-warm-node"

    by_priority: dict[str, dict[str, float]] = {}
    for cls in sorted(set(params.alpha_by_priority) | set(params.min_score_by_priority), key=int):
        floor = params.min_score_by_priority.get(cls, 0.0)
        kept = {k: v for k, v in scores.items() if v >= floor and v > 0}
        if not kept:
            kept = dict(scores)
        cls_weights = shares(kept, params.alpha_by_priority.get(cls, params.alpha))
        if sum(cls_weights.values()) > 0:
            by_priority[cls] = {n: cls_weights.get(n, 0.0) for n in sorted(scores)}

    holders: dict[str, list[str]] = {}
    keep_at = params.affinity_keep_frac * best
    min_speed = params.affinity_min_speed
    # A holder keeps its prefixes' calls while it scores at least keep_at and steps at least
    # min_speed, unless its last call failed (a retry takes the weighted pick, not the same
    # node). Visiting holders best first (score descending, node id) lists every digest's holders
    # in that order already: one sort per pool instead of one per digest.
    streaks = cols.ints("consecutive_failures")[rows].tolist()
    tels = records(cols)
    for _, node_id, r in sorted(
        (-s, node_id, r)
        for r, (node_id, streak) in enumerate(zip(ids, streaks, strict=True))
        if streak <= 0 and (s := scores[node_id]) > 0 and s >= keep_at and speeds[node_id] >= min_speed
    ):
        for digest in tels[lo + r].hot_prefixes:
            holders.setdefault(digest, []).append(node_id)
    affinity = {d: tuple(held) for d, held in sorted(holders.items())}

    # Mean score over the pool's serving nodes (:func:`headroom`, in the pool's node order).
    live_scores = [v for v in scores.values() if v > 0]
    own = sum(live_scores) / len(live_scores) if live_scores else None
    spill_to = spill_targets(snap, params, ctx.pool_id)
    degrees = cols.ints("gpu_count")[rows].tolist()
    fit = pool_max_prompt(snap.pools.get(ctx.pool_id), degrees)
    slo_fit = pool_slo_prompt(snap.pools.get(ctx.pool_id), ctx.pool_id, degrees, ctx.slo)

    stale = cols.stale[rows]
    n_serving = int((cols.warm[rows] & ~stale).sum())
    decision = routing_decision(
        ctx.pool_id,
        weights,
        reason,
        {
            "nodes": float(len(ids)),
            "serving_nodes": float(n_serving),
            "stale_nodes": float(int(stale.sum())),
            "best_score": r6(best),
            "headroom": r6(own) if own is not None else 0.0,
            "hot_prefixes": float(len(affinity)),
            "spill_pools": float(len(spill_to)),
        },
        by_priority,
        affinity,
        spill_to,
        fit,
        slo_fit,
        picker=params.picker,
    )
    diagnostics = {"headroom": r6(own) if own is not None else 0.0, "hot_prefixes": float(len(affinity))}
    return PolicyResult(decisions=(decision,), state=memory, diagnostics=diagnostics)
