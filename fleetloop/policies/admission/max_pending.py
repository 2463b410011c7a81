"""max-pending: a fixed per-node queue limit and nothing else (``max_pending`` in Envoy's terms).

Formula: ``max_queue_depth[p] = limit`` for every class. Inputs: none. Parameters: ``limit``
1024 (Envoy's default ``max_pending_requests``), ``classes`` 3.
Trade-offs: the baselines' admission; blind to priority, workflow and SLO.
Failure mode: queues grow to ``limit`` before anything is rejected, far past any TTFT SLO.
"""

from __future__ import annotations

from pydantic import Field

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult
from fleetloop.schemas.decisions import AdmissionDecision


class MaxPendingParams(Params):
    limit: int = Field(default=1024, ge=1, le=10_000_000)
    classes: int = Field(default=3, ge=1, le=10)


class MaxPending:
    name = "max-pending"
    section = "admission"
    Params = MaxPendingParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: MaxPendingParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        limits = {str(p): params.limit for p in range(params.classes)}
        decision = AdmissionDecision(
            entity=f"pool/{ctx.pool_id}", pool_id=ctx.pool_id, max_queue_depth=limits, reason="fixed-limit"
        )
        return PolicyResult(decisions=(decision,), state=None)
