"""round-robin: every warm node of the pool gets the same share; routers take them in turn.

Formula: ``weight_i = 1 / n_warm`` for warm, non-draining nodes, 0 otherwise; ``picker`` round-robin.
Inputs: ``weights_state`` and ``draining`` per node. Parameters: none.
Trade-offs: the "no control plane" baseline (``--baseline none``): blind to load, cache and health.
Failure mode: keeps sending a slow or failing node its full share (that is the point of a baseline).
"""

from __future__ import annotations

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult, r6
from fleetloop.schemas.decisions import RoutingDecision


class RoundRobinParams(Params):
    pass


class RoundRobin:
    name = "round-robin"
    section = "routing"
    Params = RoundRobinParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: RoundRobinParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        nodes = snap.pool_nodes(ctx.pool_id)
        warm = [n.node_id for n in nodes if n.warm]
        weights = {n.node_id: (r6(1.0 / len(warm)) if n.node_id in warm else 0.0) for n in nodes}
        decision = RoutingDecision(
            entity=f"pool/{ctx.pool_id}",
            pool_id=ctx.pool_id,
            weights=weights,
            picker="round-robin",
            reason="round-robin",
            inputs={"warm_nodes": float(len(warm))},
        )
        return PolicyResult(decisions=(decision,), state=None)
