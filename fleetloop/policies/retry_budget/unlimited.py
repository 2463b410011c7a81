"""unlimited: no retry budget; clients retry as often as they are configured to (the baselines).

Formula: ``retry_ratio = 1``, ``retries_allowed_now`` = a very large number. Inputs: none.
Parameters: none.
Failure mode: a slow node turns client timeouts into retries into more load: the retry storm.
"""

from __future__ import annotations

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult
from fleetloop.schemas.decisions import RetryBudgetDecision

UNLIMITED = 1_000_000_000


class UnlimitedParams(Params):
    pass


class Unlimited:
    name = "unlimited"
    section = "retry_budget"
    Params = UnlimitedParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: UnlimitedParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        decision = RetryBudgetDecision(
            entity=f"pool/{ctx.pool_id}",
            pool_id=ctx.pool_id,
            retry_ratio=1.0,
            min_retries_per_s=0.0,
            retries_allowed_now=UNLIMITED,
            reason="unlimited",
        )
        return PolicyResult(decisions=(decision,), state=None)
