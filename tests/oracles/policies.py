"""The policies' statements: the rules as first written, value by value and node by node, which the
tests hold the array and batch forms to (bit for bit). Not production code: the policies compute
each rule once, in the fast form; these are the oracles.

- :func:`shares_plain`, :func:`fleet_headroom_plain`, :func:`spill_targets_plain`: cache-aware's
  shares, fleet-wide headroom and spill-over ranking (``tests/unit/test_r6_array.py``,
  ``test_fast_columns.py``, ``tests/policies/test_cache_aware_batch.py``).
- :func:`pool_tbt_ms_plain`: tbt-feedback's pool figure (``tests/unit/test_pool_figures.py``).
- :func:`latency_outlier_plain`: the latency-outlier breaker over the pool's node views
  (``tests/unit/test_fast_breaker.py``).
- :func:`predictive_plain`: slo-predictive reading the nodes' views instead of their figures
  (``tests/unit/test_fast_predictive.py``, ``tests/policies/test_slo_predictive.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetloop.policies.autoscale.predictive import SloPredictive, SloPredictiveParams, SloPredictiveState
from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult, r6
from fleetloop.policies.breaker.consecutive_errors import step
from fleetloop.policies.breaker.emission import change_only
from fleetloop.policies.breaker.latency_outlier import (
    SIGNALS,
    LatencyOutlier,
    LatencyOutlierParams,
    NodeState,
    Verdict,
    _eject_within_cap,
    _judge,
    _latency_step,
    _with,
    advance,
    failing_with_pool,
    held_open,
    limits,
    pool_failure_frac,
    reference,
    serving,
)
from fleetloop.policies.breaker.latency_outlier import State as LatencyState
from fleetloop.policies.routing import cache_aware
from fleetloop.policies.routing.cache_aware import CacheAwareParams, proven
from fleetloop.policies.routing.cache_aware import serving as serving_for_cache
from fleetloop.schemas.decisions import BreakerDecision


def shares_plain(scores: Mapping[str, float], alpha: float) -> dict[str, float]:
    """``S_i ** alpha / sum_j S_j ** alpha``, rounded for the wire (the rule; ``cache_aware.shares``
    is it)."""
    powered = {k: (v**alpha if v > 0 else 0.0) for k, v in sorted(scores.items())}
    total = sum(powered.values())
    return {k: (r6(v / total) if total > 0 else 0.0) for k, v in powered.items()}


def fleet_headroom_plain(snap: FleetSnapshot, params: CacheAwareParams) -> Mapping[str, float | None]:
    """Pool id -> spill headroom for every pool (mean score over its proven serving nodes; None when
    it has none), from this snapshot alone, computed once per snapshot.

    A pool's step time here is each node's newest ``tbt_p50_ms`` (one figure, not the remembered
    median, which is the pool's own policy state): spill-over ranks other pools on what the
    snapshot says of them, so every pool's tick shares one pass over the fleet.

    The plain per-pool form of ``cache_aware.fleet_headroom`` (the tests hold the fleet-wide one to it)."""
    # Keyed by identity (params hold dicts, so they do not hash); the params object is kept in the
    # memo beside the figures, so its id cannot be reused for another while the snapshot lives.
    key = ("oracle.fleet_headroom_plain", id(params))
    memo = snap.memo.get(key)
    found: Mapping[str, float | None] | None = memo[1] if memo is not None and memo[0] is params else None
    if found is None:
        out: dict[str, float | None] = {}
        for pool_id in sorted(snap.pools):
            pool = snap.pool_nodes(pool_id)
            steps = {
                n.node_id: float(n.tbt_p50_ms)
                if serving_for_cache(n) and n.tbt_p50_ms is not None and n.tbt_p50_ms > 0
                else None
                for n in pool
            }
            scores = cache_aware._scored_columns(pool, params, steps)[0]
            live = [scores[n.node_id] for n in pool if scores[n.node_id] > 0 and proven(n)]
            out[pool_id] = sum(live) / len(live) if live else None
        snap.memo[key] = (params, out)
        found = out
    return found


def spill_targets_plain(snap: FleetSnapshot, params: CacheAwareParams, pool_id: str) -> tuple[str, ...]:
    """The pools ``pool_id`` spills over to: the other pools of its model whose headroom is at least
    ``spill_min_headroom``, by headroom descending (pool id breaks ties), then the pools of every
    other model with that headroom, likewise ranked. The rule's statement, which
    ``cache_aware.spill_targets`` computes once per snapshot and model (the tests hold them equal)."""
    own_pool = snap.pools.get(pool_id)
    model = own_pool.model if own_pool is not None else ""
    spill: list[tuple[float, str]] = []
    other_models: list[tuple[float, str]] = []
    for other, h in cache_aware.fleet_headroom(snap, params).items():
        if other == pool_id or not model:
            continue
        if h is not None and h >= params.spill_min_headroom:
            (spill if snap.pools[other].model == model else other_models).append((-h, other))
    return tuple(p for _, p in sorted(spill)) + tuple(p for _, p in sorted(other_models))


def pool_tbt_ms_plain(snap: FleetSnapshot, ctx: PolicyContext) -> float | None:
    """``tbt_feedback.pool_tbt_ms`` node by node (the rule's statement)."""
    values: list[float] = []
    for n in snap.pool_nodes(ctx.pool_id):
        if not n.warm or n.stale or n.tbt_p99_ms is None:
            continue
        b = ctx.breakers.get(n.node_id)
        if b is not None and b.enforced and b.state == "open":
            continue
        values.append(n.tbt_p99_ms)
    if not values:
        return None
    values.sort()
    return values[len(values) // 2]


def latency_outlier_plain(
    snap: FleetSnapshot, params: LatencyOutlierParams, state: LatencyState, ctx: PolicyContext
) -> PolicyResult[LatencyState]:
    """``LatencyOutlier.decide`` node by node: the per-node form of
    :func:`fleetloop.policies.breaker.latency_outlier.decide_columns`, which the tests hold to it."""
    now = ctx.now_ms
    pool = snap.pool_nodes(ctx.pool_id)
    err_params = params.errors()
    remembered: dict[str, NodeState] = {}
    aggs: dict[str, dict[str, float]] = {}
    memory_ms, min_samples = params.memory_ms, params.min_samples
    known = state.nodes
    memory = advance(state.memory, pool, now, memory_ms)
    meds, oks = memory.medians(min_samples)
    for n, med, ok in zip(pool, meds, oks, strict=True):
        prev = known.get(n.node_id)
        remembered[n.node_id] = prev if prev is not None else NodeState(was_warm=n.warm and not state.started)
        aggs[n.node_id] = {s: m for s, m, y in zip(SIGNALS, med, ok, strict=True) if y} if serving(n) else {}
    refs = {s: reference([a[s] for a in aggs.values() if s in a], params.min_hosts) for s in SIGNALS}
    slo = ctx.pool_slo(snap)
    lims = limits(refs, params)
    tbt_floor = params.tbt_floor_frac * slo.tbt_ms
    ttft_floor = params.ttft_floor_frac * slo.ttft_ms

    stepped: dict[str, NodeState] = {}
    reasons: dict[str, str] = {}
    verdicts: dict[str, Verdict] = {}
    wants: list[tuple[float, str]] = []
    started = state.started
    for n in pool:
        ns = remembered[n.node_id]
        err, err_reason = step(ns.err, n.consecutive_failures, now, err_params)
        # weights just loaded: slow start
        warm = n.warm
        ramp = now if started and warm and not ns.was_warm else ns.ramp_from_ms
        if err is not ns.err or ramp != ns.ramp_from_ms or warm != ns.was_warm:
            ns = _with(ns, err=err, ramp_from_ms=ramp, was_warm=warm)
        v = (
            _judge(n, aggs[n.node_id], lims, tbt_floor, ttft_floor)
            if serving(n)
            else Verdict("nodata", "nodata", 0.0)
        )
        verdicts[n.node_id] = v
        ns, lat_reason, want = _latency_step(ns, v, now, params)
        if want:
            wants.append((-v.severity, n.node_id))
        stepped[n.node_id] = ns
        reasons[n.node_id] = err_reason if err.state != "closed" or err_reason != "healthy" else lat_reason

    open_now = sum(1 for ns in stepped.values() if ns.lat == "open" or ns.err.state == "open")
    over_cap = _eject_within_cap(
        params, len(pool), wants=wants, stepped=stepped, reasons=reasons, open_now=open_now, now=now
    )

    # Panic threshold: too few healthy nodes left means the slowness is the pool's, not a node's.
    live = [n.node_id for n in pool if serving(n)]
    healthy = [
        i
        for i in live
        if stepped[i].lat != "open"
        and stepped[i].err.state != "open"
        and i not in over_cap
        and not verdicts[i].outlier
    ]
    panic = bool(live) and len(healthy) < params.panic_threshold * len(live)
    share = 1.0 / max(1, len(live))
    pool_failing = pool_failure_frac(pool, params.error_threshold)

    decisions: list[BreakerDecision] = []
    new_nodes: dict[str, NodeState] = {}
    for n in pool:
        ns = stepped[n.node_id]
        if ns.ramp_from_ms is not None and now - ns.ramp_from_ms >= params.slow_start_ms:
            ns = _with(ns, ramp_from_ms=None)
        new_nodes[n.node_id] = ns
        decisions.append(
            LatencyOutlier._decision(
                n, ns, verdicts[n.node_id], reasons[n.node_id], params,
                now=now, share=share, over_cap=n.node_id in over_cap, panic=panic, pool_id=ctx.pool_id,
                shared=failing_with_pool(n, pool_failing),
                held=held_open(state.emitted.get(n.node_id), now),
            )
        )  # fmt: skip
    diagnostics = {
        "latency_open": float(sum(1 for ns in new_nodes.values() if ns.lat == "open")),
        "error_open": float(sum(1 for ns in new_nodes.values() if ns.err.state == "open")),
        "outliers": float(sum(1 for v in verdicts.values() if v.outlier)),
        "panic": float(panic),
        "pool_failure_frac": r6(pool_failing),
    }
    # Nodes of other pools keep their state (the engine keys state by pool, so there are none).
    emitted, fields = change_only(decisions, state.emitted, ctx.tick_id)
    return PolicyResult(
        decisions=emitted,
        state=LatencyState(started=True, nodes=new_nodes, memory=memory, emitted=fields),
        diagnostics=diagnostics,
    )


def predictive_plain(
    snap: FleetSnapshot,
    params: SloPredictiveParams,
    state: SloPredictiveState,
    ctx: PolicyContext,
) -> PolicyResult[SloPredictiveState]:
    """``SloPredictive.decide`` reading the nodes' views (``snap.pool_nodes``) instead of the
    figures from the snapshot's columns: the same decisions, state and diagnostics."""
    return SloPredictive()._decide(snap, params, state, ctx, lambda s, pool_id: s.pool_nodes(pool_id))
