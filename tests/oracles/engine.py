"""The engine's statements: one pool's tick decided section by section with each algorithm's
``decide`` and each decision shaped on its own (:func:`decide_plain`), routing shaping for one
decision, admission flooring, the ejection cap over the pool's views and a pool's silence node by
node. ``tests/unit/test_decide_many.py``, ``test_shape_many.py``, ``test_engine.py``,
``test_pool_figures.py`` and ``tests/policies/test_limits.py`` hold the production forms to them."""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np
from fleetloop.core.decide.engine import (
    _DECISION_FIELDS,
    _OFFSETS,
    ORDER,
    EngineState,
    TickResult,
    _drain_fields,
    envelope_of,
)
from fleetloop.core.decide.shaping import (
    NO_DRAINS,
    NO_NODE,
    _choose,
    _ok_share,
    _shaped,
    _unenforce,
    _unscaled,
    cap_ejections,
    hold,
    hold_drains,
    keep_held,
    pool_is_silent,
    settle_autoscale,
    share_cap,
)
from fleetloop.policies.base import FleetSnapshot, NodeView, PolicyContext, r6, r6_array
from fleetloop.policies.columns import fleet_columns
from fleetloop.policies.envelope import Envelope
from fleetloop.policies.pool_figures import row_ids
from fleetloop.policies.registry import CompiledPolicy
from fleetloop.schemas.base import assemble
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    AutoscaleDecision,
    BreakerDecision,
    Decision,
    DecisionBody,
    PolicyStamp,
    RoutingDecision,
)


def decide_plain(
    snap: FleetSnapshot,
    policy: CompiledPolicy,
    state: EngineState,
    tick: Tick,
    input_offsets: Mapping[str, int] | None = None,
) -> TickResult:
    """One pool's tick, section by section, each algorithm's ``decide`` alone and each decision
    shaped on its own: what ``engine.decide_many`` is held to, bit for bit."""
    env = envelope_of(policy)
    pool_id = tick.pool_id
    seed = (tick.tick_id, zlib.crc32(pool_id.encode()))
    new_states = dict(state.algorithms)
    held = dict(state.autoscale_held)
    ejected = dict(state.ejections_held)
    drains = state.pool_drains()
    listed = state.drains_held.get(pool_id, ())
    bodies: list[tuple[str, DecisionBody]] = []
    breakers: dict[str, BreakerDecision] = {}
    diagnostics: dict[str, float] = {}
    for section in ORDER:
        sec = policy.sections[section]
        key = (section, sec.algorithm.name, pool_id)
        algo_state = state.algorithms.get(key)
        if algo_state is None:
            algo_state = sec.algorithm.initial_state()
        ctx = PolicyContext(
            now_ms=snap.now_ms,
            tick_id=tick.tick_id,
            tick_ms=policy.tick_ms,
            pool_id=pool_id,
            seed=seed,
            breakers=breakers,
            slo=policy.slo,
            draining=listed,
        )
        result = sec.algorithm.decide(snap, sec.params, algo_state, ctx)
        new_states[key] = result.state
        for k, v in result.diagnostics.items():
            diagnostics[f"{section}.{k}"] = float(v)
        produced = list(result.decisions)
        if section == "breaker":
            shaped = [d for d in produced if isinstance(d, BreakerDecision)]
            if sec.mode == "shadow":
                shaped = [
                    d.model_copy(update={"enforced": False}) if d.state != "closed" else d for d in shaped
                ]
            if sec.mode != "shadow":
                shaped = keep_held(shaped, snap, pool_id, ejected.get(pool_id))
            shaped = cap_ejections(shaped, snap, pool_id, env, ejected.get(pool_id))
            hold(ejected, pool_id, shaped)
            breakers.update({d.node_id: d for d in shaped})
            produced = list(shaped)
        elif section == "routing":
            routed: list[DecisionBody | None] = [
                shape_routing_plain(d, snap, breakers, env) if isinstance(d, RoutingDecision) else d
                for d in produced
            ]
            produced = [d for d in routed if d is not None]
        elif section == "admission":
            produced = [
                shape_admission_plain(d, env) if isinstance(d, AdmissionDecision) else d for d in produced
            ]
        elif section == "autoscale":
            silent = pool_is_silent(snap, pool_id)
            shaped_as: list[DecisionBody] = []
            for d in produced:
                if isinstance(d, AutoscaleDecision):
                    # Frozen (silent), held (unknown) or nothing, its drain list held: settle_autoscale.
                    settled = settle_autoscale(
                        d, snap, env, held.get(d.pool_id), silent, drains.get(d.pool_id, NO_DRAINS)
                    )
                    if settled is None:
                        continue
                    d, kept_drains = settled
                    if sec.mode == "enforce":
                        held[d.pool_id] = d.desired_nodes
                        hold_drains(drains, d.pool_id, kept_drains)
                shaped_as.append(d)
            produced = shaped_as
        bodies.extend((sec.mode, d) for d in produced)
    offsets = dict(sorted((input_offsets or {}).items()))
    # Every part of the envelope is validated once per tick (the stamps, the offsets) or already was
    # (the tick, each body), so the per-decision wrapper is assembled without validating it again.
    stamps = {
        mode: PolicyStamp(
            name=policy.stamp.name, version=policy.stamp.version, hash=policy.stamp.hash, mode=mode
        )
        for mode in sorted({mode for mode, _ in bodies})
    }
    offsets = _OFFSETS.validate_python(offsets)
    ts_ms, tick_id = tick.ts_ms, tick.tick_id
    decisions = tuple(
        assemble(
            Decision,
            {
                "ts_ms": ts_ms,
                "tick_id": tick_id,
                "policy": stamps[mode],
                "input_offsets": offsets,
                "body": body,
            },
            set(_DECISION_FIELDS),
        )
        for mode, body in bodies
    )
    # Keep only states of this policy's algorithms (other pools' states are kept as they were).
    live = {(s, policy.sections[s].algorithm.name) for s in ORDER}
    kept = {k: v for k, v in new_states.items() if (k[0], k[1]) in live}
    diagnostics["decisions"] = float(len(decisions))
    return TickResult(
        decisions=decisions,
        state=EngineState(kept, held, ejected, *_drain_fields(drains)),
        diagnostics=diagnostics,
    )


def cap_ejections_plain(
    decisions: list[BreakerDecision],
    snap: FleetSnapshot,
    pool_id: str,
    env: Envelope,
    held: Mapping[str, int | None] | None = None,
) -> list[BreakerDecision]:
    """``shaping.cap_ejections`` (the rule is stated there) over the pool's node views."""
    open_ = [d for d in decisions if d.state == "open" and d.enforced]
    if not open_:
        return decisions
    nodes = {n.node_id: n for n in snap.pool_nodes(pool_id)}
    cap = share_cap(env.max_ejected_frac, len(nodes))

    def severity(d: BreakerDecision) -> tuple[float, str]:
        node = nodes.get(d.node_id)
        return (-(node.consecutive_failures if node else 0.0), d.node_id)

    serving = {i: n for i, n in nodes.items() if n.warm and not n.stale}
    steps = sorted(n.tbt_p50_ms for n in serving.values() if n.tbt_p50_ms is not None and n.tbt_p50_ms > 0)
    ref = steps[len(steps) // 2] if steps else None
    candidates = {d.node_id for d in open_}
    others = [n for i, n in serving.items() if i not in candidates]
    took = sum(n.requests_w for n in others)
    pool_ok = sum(n.ok_w for n in others) / took if took > 0 else None

    def speed(n: NodeView) -> float:
        return min(1.0, ref / n.tbt_p50_ms) if ref is not None and n.tbt_p50_ms else 1.0

    def busy(n: NodeView) -> float:
        return 1.0 if n.queue_depth > 0 else min(1.0, max(0.0, n.kv_cache_used_frac))

    def useful(n: NodeView) -> float:
        return speed(n) * busy(n) * _ok_share(n.consecutive_failures, n.ok_w, n.requests_w, pool_ok)

    def moves(node_id: str) -> float | None:
        node = serving.get(node_id)
        return useful(node) if node is not None else None

    spare = sum(speed(n) * (1.0 - busy(n)) for n in others)
    ordered = sorted(open_, key=severity)
    return _unenforce(
        decisions, _choose(ordered, held or {}, now_ms=snap.now_ms, cap=cap, spare=spare, moves=moves)
    )


def shape_routing_plain(
    d: RoutingDecision, snap: FleetSnapshot, breakers: Mapping[str, BreakerDecision], env: Envelope
) -> RoutingDecision | None:
    """Zero stale and ejected nodes, give probing nodes their probe share, fail open if all zero;
    None when no node is left to route to even then (``NO_NODE``): ``shaping.shape_routing`` for
    one decision, its weights scaled and renormalized on their own."""
    cols = fleet_columns(snap)
    lo, hi = cols.bounds.get(d.pool_id, (0, 0))
    weights, probes, zeroed, total, reason = _unscaled(
        d,
        breakers,
        row_ids(snap)[lo:hi],
        stale=cols.stale[lo:hi].tolist(),
        warm=cols.warm[lo:hi].tolist(),
        draining=lambda: cols.draining[lo:hi].tolist(),  # noqa: PLW0108 (read only on fail-open)
    )
    if reason == NO_NODE:
        return None
    # Probing nodes share at most half of the traffic, however many are half-open at once.
    asked = sum(probes.values())
    probe_scale = min(1.0, 0.5 / asked) if asked > 0 else 0.0
    probe_total = asked * probe_scale
    scale = (1.0 - probe_total) / total if total > 0 else 0.0
    out = _scaled(weights, scale)
    for n, p in probes.items():
        out[n] = r6(p * probe_scale)
    inputs = dict(d.inputs)
    inputs["stale_nodes"] = float(zeroed)
    inputs["probing_nodes"] = float(len(probes))
    by_priority = {
        cls: _renormalize({n: w for n, w in ws.items() if out.get(n, 0.0) > 0})
        for cls, ws in d.by_priority.items()
    }
    return _shaped(d, env, weights=out, reason=reason, inputs=inputs, by_priority=by_priority)


def _renormalize(ws: Mapping[str, float]) -> dict[str, float]:
    total = sum(ws.values())
    if not total > 0:
        return {}
    keys = sorted(ws)
    if len(keys) < _ARRAY_FROM:
        return {n: r6(ws[n] / total) for n in keys}
    values = np.array([ws[n] for n in keys], dtype=np.float64) / total
    return dict(zip(keys, r6_array(values).tolist(), strict=True))


# Below this many weights a loop of ``r6`` costs less than the array calls (either gives the same
# doubles: one IEEE product or quotient each, rounded by ``r6`` or the bit-identical ``r6_array``).
_ARRAY_FROM = 8


def _scaled(weights: dict[str, float], scale: float) -> dict[str, float]:
    """``{n: r6(w * scale)}`` in the weights' order."""
    if len(weights) < _ARRAY_FROM:
        return {n: r6(w * scale) for n, w in weights.items()}
    values = np.array(list(weights.values()), dtype=np.float64) * scale
    return dict(zip(weights, r6_array(values).tolist(), strict=True))


def shape_admission_plain(d: AdmissionDecision, env: Envelope) -> AdmissionDecision:
    def floor(table: Mapping[str, int]) -> dict[str, int]:
        return {
            p: (max(v, env.min_queue_threshold) if int(p) <= env.protected_priority else max(v, 0))
            for p, v in sorted(table.items(), key=lambda kv: int(kv[0]))
        }

    return d.model_copy(
        update={
            "max_queue_depth": floor(d.max_queue_depth),
            "new_task_max_queue_depth": floor(d.new_task_max_queue_depth),
            "max_outstanding": floor(d.max_outstanding),
            "new_task_max_outstanding": floor(d.new_task_max_outstanding),
            "budget_protected_priority": env.protected_priority,
        }
    )


def pool_is_silent_plain(snap: FleetSnapshot, pool_id: str) -> bool:
    nodes = snap.pool_nodes(pool_id)
    if not nodes:
        pool = snap.pools.get(pool_id)
        return pool is None or pool.requests_w == 0
    return all(n.stale for n in nodes)
