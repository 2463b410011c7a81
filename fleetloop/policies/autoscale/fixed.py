"""fixed: a fixed fleet; the target is always the pool's current node count.

Formula: ``desired_nodes = current_nodes`` (nodes seen in the pool, warm or not).
Inputs: the pool's node list. Parameters: none.
Trade-offs: no scaling cost, no scaling benefit (``--baseline none`` and the demo's fixed fleet).
Failure mode: a load spike beyond the fleet's capacity is queued or shed, never absorbed.
"""

from __future__ import annotations

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult
from fleetloop.schemas.decisions import AutoscaleDecision


class FixedParams(Params):
    pass


class Fixed:
    name = "fixed"
    section = "autoscale"
    Params = FixedParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: FixedParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        n = len(snap.pool_nodes(ctx.pool_id))
        decision = AutoscaleDecision(
            entity=f"pool/{ctx.pool_id}",
            pool_id=ctx.pool_id,
            current_nodes=n,
            desired_nodes=n,
            reason="fixed-fleet",
        )
        return PolicyResult(decisions=(decision,), state=None)
