"""never: no circuit breaking; every node stays closed (``--baseline none``).

Formula: ``state_i = closed``. Inputs: none. Parameters: none.
Failure mode: a failing node keeps its share of traffic until it leaves the pool.
"""

from __future__ import annotations

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult
from fleetloop.policies.registry import register
from fleetloop.schemas.decisions import BreakerDecision


class NeverParams(Params):
    pass


@register("breaker", "never")
class Never:
    Params = NeverParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: NeverParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        decisions = tuple(
            BreakerDecision(
                entity=f"node/{n.node_id}",
                pool_id=ctx.pool_id,
                node_id=n.node_id,
                state="closed",
                reason="disabled",
            )
            for n in snap.pool_nodes(ctx.pool_id)
        )
        return PolicyResult(decisions=decisions, state=None)
