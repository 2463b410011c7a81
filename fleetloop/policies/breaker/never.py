"""never: no circuit breaking; every node stays closed (``--baseline none``).

Formula: ``state_i = closed``. Inputs: none. Parameters: none. Records are change-only
(:mod:`fleetloop.policies.breaker.emission`): a node's record on its first tick in the pool and on its
keyframe ticks; state: per node, its last record's state fields and tick.
Failure mode: a failing node keeps its share of traffic until it leaves the pool.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult
from fleetloop.policies.breaker.emission import Emitted, change_only
from fleetloop.schemas.decisions import BreakerDecision


class NeverParams(Params):
    pass


class Never:
    name = "never"
    section = "breaker"
    Params = NeverParams

    def initial_state(self) -> Mapping[str, Emitted]:
        return {}

    def decide(
        self,
        snap: FleetSnapshot,
        params: NeverParams,
        state: Mapping[str, Emitted] | None,
        ctx: PolicyContext,
    ) -> PolicyResult[Mapping[str, Emitted]]:
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
        # None: a checkpoint from before change-only records.
        emitted, remembered = change_only(decisions, state or {}, ctx.tick_id)
        return PolicyResult(decisions=emitted, state=remembered)
