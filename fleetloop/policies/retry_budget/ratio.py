"""ratio: retries capped at a share of a pool's requests (Finagle's RetryBudget, gRPC retry throttling).

Formula, over the engine's window ``W`` (seconds)::

    allowed = floor(min_retries_per_s * W + retry_ratio * requests_w) - retries_w,  clamped at >= 0

published per pool (and per tenant seen in the window, with the tenant's own counts), so a router
drops a retry once the window's budget is spent. ``requests_w`` counts every attempt routed to the
pool, ``retries_w`` those with ``attempt > 0``.

Inputs: the pool's and tenants' request and retry counts over the window. Parameters (defaults,
bounds): ``retry_ratio`` 0.2 (0-1; Finagle's default percentCanRetry), ``min_retries_per_s`` 10
(0-10 000; Finagle's minRetriesPerSec), ``per_tenant`` true.
Trade-offs: bounds retry load at 1 + ratio of offered load, which breaks the retry-storm feedback
loop; a burst of real transient errors beyond the ratio is not retried.
Failure mode: the counts are a window behind; a sudden storm can overspend one window's budget.
"""

from __future__ import annotations

import math

from pydantic import Field

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult
from fleetloop.policies.registry import register
from fleetloop.schemas.decisions import RetryBudgetDecision


class RatioParams(Params):
    retry_ratio: float = Field(default=0.2, ge=0.0, le=1.0)
    min_retries_per_s: float = Field(default=10.0, ge=0.0, le=10_000.0)
    per_tenant: bool = True


def allowed(params: RatioParams, window_s: float, requests: int, retries: int) -> int:
    return max(0, math.floor(params.min_retries_per_s * window_s + params.retry_ratio * requests) - retries)


@register("retry_budget", "ratio")
class Ratio:
    Params = RatioParams

    def initial_state(self) -> None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: RatioParams, state: None, ctx: PolicyContext
    ) -> PolicyResult[None]:
        window_s = snap.window_ms / 1000.0
        pool = snap.pools.get(ctx.pool_id)
        requests = pool.requests_w if pool else 0
        retries = pool.retries_w if pool else 0
        decisions = [
            RetryBudgetDecision(
                entity=f"pool/{ctx.pool_id}",
                pool_id=ctx.pool_id,
                retry_ratio=params.retry_ratio,
                min_retries_per_s=params.min_retries_per_s,
                retries_allowed_now=allowed(params, window_s, requests, retries),
                reason="budget",
                inputs={"requests_w": float(requests), "retries_w": float(retries)},
            )
        ]
        if params.per_tenant:
            for t in snap.tenants.values():
                if t.requests_w == 0:
                    continue
                decisions.append(
                    RetryBudgetDecision(
                        entity=f"pool/{ctx.pool_id}/tenant/{t.tenant_id}",
                        pool_id=ctx.pool_id,
                        tenant_id=t.tenant_id,
                        retry_ratio=params.retry_ratio,
                        min_retries_per_s=params.min_retries_per_s,
                        retries_allowed_now=allowed(params, window_s, t.requests_w, t.retries_w),
                        reason="tenant-budget",
                        inputs={"requests_w": float(t.requests_w), "retries_w": float(t.retries_w)},
                    )
                )
        return PolicyResult(decisions=tuple(decisions), state=None)
