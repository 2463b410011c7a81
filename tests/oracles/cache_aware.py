"""cache-aware stated node by node: the test oracle of :mod:`fleetloop.policies.routing.cache_aware`,
whose scorers are array operations over rows of nodes. The six scorers and their weighted mean per
node (:func:`components`, :func:`combine`), the remembered step times per node (:func:`remember`), the
shares, and the spill headroom pool by pool: the same operations on the same doubles in the same
order, so the tests hold the product to them bit for bit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fleetloop.policies.base import FleetSnapshot, NodeView, r6
from fleetloop.policies.memory import PoolMemory, median_sorted
from fleetloop.policies.routing.cache_aware import (
    COMPONENTS,
    CacheAwareParams,
    State,
    as_memory,
    fleet_headroom,
)
from tests.oracles.window import kept


def remember_pool(
    state: PoolMemory | State, now: int, params: CacheAwareParams, pool: tuple[NodeView, ...]
) -> PoolMemory:
    """:func:`remember` for one pool, as arrays (what the algorithm keeps)."""
    rows: list[int] = []
    figs: list[tuple[float | None, ...]] = []
    for r, n in enumerate(pool):
        tbt = n.tbt_p50_ms
        if tbt is not None and tbt > 0 and n.weights_state == "warm" and not n.draining and not n.stale:
            rows.append(r)
            figs.append((float(tbt),))
    ids = tuple(n.node_id for n in pool)
    return as_memory(state).advance(ids, now, params.speed_memory_ms, rows, figs)


def pool_steps(memory: PoolMemory) -> dict[str, float | None]:
    """Node id -> :func:`step_ms` (the median remembered step time, or None), for the whole pool."""
    meds, oks = memory.medians(1)
    return {i: (m[0] if ok[0] else None) for i, m, ok in zip(memory.node_ids, meds, oks, strict=True)}


def serving(node: NodeView, silent_after_ms: int | None = None) -> bool:
    """Warm, not draining, not stale and, given ``silent_after_ms``, heard from within it."""
    fresh = silent_after_ms is None or node.age_ms <= silent_after_ms
    return node.warm and not node.stale and fresh


def remember(
    state: State, snap: FleetSnapshot, params: CacheAwareParams, pool: tuple[NodeView, ...] | None = None
) -> dict[str, tuple[tuple[int, float], ...]]:
    """Every serving node's step-time figures within ``speed_memory_ms`` (a node reports one only
    when an iteration ends in the interval, and a long decode run is one iteration to the books).

    With ``pool`` (as the algorithm calls it) only that pool's nodes are remembered: a pool's state
    holds its own nodes, never the whole fleet's."""
    now = snap.now_ms
    memory_ms = params.speed_memory_ms
    out: dict[str, tuple[tuple[int, float], ...]] = {}
    for n in pool if pool is not None else snap.nodes.values():
        within = kept(state.get(n.node_id, ()), now, memory_ms)
        tbt = n.tbt_p50_ms
        if tbt is not None and tbt > 0 and n.weights_state == "warm" and not n.draining and not n.stale:
            within = (*within, (now, float(tbt)))
        if within:
            out[n.node_id] = within
    return out


def step_ms(memory: State, node_id: str) -> float | None:
    """The median remembered step time of a node, or None."""
    xs = sorted([v for _, v in memory.get(node_id, ())])
    return median_sorted(xs) if xs else None


@dataclass(frozen=True, slots=True)
class _PoolFigures:
    """What every node's scorers share within one pool and tick: computed once, not per node."""

    hbm_max: float
    tbt_median: float | None
    steps: Mapping[str, float | None]


def _pool_figures(pool: tuple[NodeView, ...], steps: Mapping[str, float | None]) -> _PoolFigures:
    live = [n for n in pool if serving(n)]
    hbm_max = max((n.hbm_free_gib for n in live), default=0.0)
    tbts = sorted([t for n in live if (t := steps.get(n.node_id)) is not None])
    return _PoolFigures(hbm_max, median_sorted(tbts) if tbts else None, steps)


def _components(node: NodeView, fig: _PoolFigures, params: CacheAwareParams) -> dict[str, float]:
    own = fig.steps.get(node.node_id)
    tbt_median = fig.tbt_median
    speed = min(1.0, tbt_median / own) if tbt_median is not None and own is not None else 1.0
    batch = max(1, node.max_batch_tokens)
    hbm_max = fig.hbm_max
    return {
        "queue": 1.0 / (1.0 + max(0, node.queue_depth) / params.queue_scale),
        "running": 1.0 / (1.0 + max(0, node.running_requests) / params.running_scale),
        "tokens": 1.0 / (1.0 + max(0, node.queued_prompt_tokens) / batch),
        "kv": min(1.0, max(0.0, 1.0 - node.kv_cache_used_frac)),
        "hbm": min(1.0, max(0.0, node.hbm_free_gib / hbm_max)) if hbm_max > 0 else 1.0,
        "speed": speed,
    }


def components(
    node: NodeView, pool: tuple[NodeView, ...], params: CacheAwareParams, memory: State | None = None
) -> dict[str, float]:
    """The six normalized scorers of one node, each in [0, 1] (1 = best), against its pool."""
    memory = memory or {}
    steps = {n.node_id: step_ms(memory, n.node_id) for n in (*pool, node)}
    return _components(node, _pool_figures(pool, steps), params)


def combine(parts: Mapping[str, float], params: CacheAwareParams) -> float:
    """The weighted mean of the scorers: in [0, 1] when every scorer is."""
    weights = params.component_weights()
    total = sum(weights.values())
    return sum(weights[k] * parts[k] for k in COMPONENTS) / total


def scored(
    pool: tuple[NodeView, ...], params: CacheAwareParams, steps: Mapping[str, float | None]
) -> tuple[dict[str, float], dict[str, float]]:
    """(node id -> combined score S_i, 0 for nodes that cannot serve; node id -> s_speed)."""
    fig = _pool_figures(pool, steps)
    scores: dict[str, float] = {}
    speeds: dict[str, float] = {}
    for n in pool:
        parts = _components(n, fig, params)
        speeds[n.node_id] = parts["speed"]
        scores[n.node_id] = combine(parts, params) if serving(n, params.silent_after_ms) else 0.0
    return scores, speeds


def shares_plain(scores: Mapping[str, float], alpha: float) -> dict[str, float]:
    """``S_i ** alpha / sum_j S_j ** alpha``, rounded for the wire (the rule; :func:`shares` is it)."""
    powered = {k: (v**alpha if v > 0 else 0.0) for k, v in sorted(scores.items())}
    total = sum(powered.values())
    return {k: (r6(v / total) if total > 0 else 0.0) for k, v in powered.items()}


def proven(node: NodeView) -> bool:
    """The router completed at least one call on this node in the window: it exists beyond its
    own telemetry."""
    return node.ok_w > 0


def fleet_headroom_plain(snap: FleetSnapshot, params: CacheAwareParams) -> Mapping[str, float | None]:
    """Pool id -> spill headroom for every pool (mean score over its proven serving nodes; None when
    it has none), from this snapshot alone, computed once per snapshot.

    A pool's step time here is each node's newest ``tbt_p50_ms`` (one figure, not the remembered
    median, which is the pool's own policy state): spill-over ranks other pools on what the
    snapshot says of them, so every pool's tick shares one pass over the fleet."""
    # Keyed by identity (params hold dicts, so they do not hash); the params object is kept in the
    # memo beside the figures, so its id cannot be reused for another while the snapshot lives.
    key = ("cache-aware.fleet_headroom_plain", id(params))
    memo = snap.memo.get(key)
    found: Mapping[str, float | None] | None = memo[1] if memo is not None and memo[0] is params else None
    if found is None:
        out: dict[str, float | None] = {}
        for pool_id in sorted(snap.pools):
            pool = snap.pool_nodes(pool_id)
            steps = {
                n.node_id: float(n.tbt_p50_ms)
                if serving(n) and n.tbt_p50_ms is not None and n.tbt_p50_ms > 0
                else None
                for n in pool
            }
            scores = scored(pool, params, steps)[0]
            live = [scores[n.node_id] for n in pool if scores[n.node_id] > 0 and proven(n)]
            out[pool_id] = sum(live) / len(live) if live else None
        snap.memo[key] = (params, out)
        found = out
    return found


def spill_targets_plain(snap: FleetSnapshot, params: CacheAwareParams, pool_id: str) -> tuple[str, ...]:
    """The pools ``pool_id`` spills over to: the other pools of its model whose headroom is at least
    ``spill_min_headroom``, by headroom descending (pool id breaks ties), then the pools of every
    other model with that headroom, likewise ranked. The rule's statement, which
    :func:`spill_targets` computes once per snapshot and model (the tests hold them equal)."""
    own_pool = snap.pools.get(pool_id)
    model = own_pool.model if own_pool is not None else ""
    spill: list[tuple[float, str]] = []
    other_models: list[tuple[float, str]] = []
    for other, h in fleet_headroom(snap, params).items():
        if other == pool_id or not model:
            continue
        if h is not None and h >= params.spill_min_headroom:
            (spill if snap.pools[other].model == model else other_models).append((-h, other))
    return tuple(p for _, p in sorted(spill)) + tuple(p for _, p in sorted(other_models))
