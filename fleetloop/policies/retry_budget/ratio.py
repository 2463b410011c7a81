"""ratio: retries capped at a share of a pool's requests (Finagle's RetryBudget, gRPC retry throttling).

Formula, over the engine's window ``W`` (seconds)::

    counted = max(0, retries_w - shed_w - lost_w)      (retries_w when exempt_shed_and_lost is off)
    allowed = max(0, floor(min_retries_per_s * W + retry_ratio * requests_w) - counted)
    exempt_retries_of = (error, shed)                   (empty when exempt_shed_and_lost is off)

published per pool (and per tenant seen in the window, with the tenant's own counts; the pool's
``lost_w`` is shared out by the tenant's share of requests), so a router drops a retry once the
window's budget is spent. ``requests_w`` counts every attempt routed to the pool, ``retries_w``
those with ``attempt > 0``, ``shed_w`` the calls our own admission turned away, ``lost_w`` the
calls that failed on nodes that left service (stale: crashed; not warm: reclaimed and reloading).

A retry budget exists to break one feedback loop: failures caused by load, whose retries add load
(the storm). Two kinds of failed call are not in that loop:

- **a shed call** never ran: it cost no GPU time, and its retry is admitted or shed again by the
  same admission thresholds. Refusing it as well turns one shed first call into a lost task while
  the budget's own job (keeping retries from loading the GPUs) is already done by admission.
- **a call lost with its node** (a crash, a preemption, a rack): every call in flight there fails
  at the same moment whatever the load. That is a correlated mass failure, not a storm: the
  retries are bounded by the calls that were in flight (they do not feed themselves: the node is
  gone, the retry goes elsewhere), and refusing them loses tasks that a surviving node can serve.

They are told apart where the retry happens: the decision lists ``exempt_retries_of = (error,
shed)`` and the router lets such a retry through without spending the count (a mass failure's
retries come within a backoff of the failure, before any window that counts them could reach a
tick). An ``error`` is a call its node dropped (connection refused, node lost); a slow call is a
``timeout`` and stays budgeted. The window's own count leaves those exempt retries out (about one
per shed or lost call), so they do not shrink the budget left for the others either.

Inputs: the pool's and tenants' request, retry and shed counts over the window; the pool's nodes
(``failures_w``, ``stale``, ``weights_state``). Parameters (defaults, bounds): ``retry_ratio`` 0.2
(0-1; Finagle's default percentCanRetry), ``min_retries_per_s`` 10 (0-10 000; Finagle's
minRetriesPerSec), ``per_tenant`` true, ``exempt_shed_and_lost`` true (false: Finagle's plain
budget, which counts every retry the same).
Trade-offs: bounds storm retry load at 1 + ratio of offered load, which breaks the retry-storm
feedback loop; a burst of real transient errors on serving nodes beyond the ratio is not retried.
A shed call's retry is granted by the budget but can be shed again: shedding, not the budget,
decides whether the overload turns into lost tasks.
Failure mode: the counts are a window behind; a sudden storm can overspend one window's budget.
A node that keeps reporting warm while it fails every call fast (a black hole) is not "lost": its
failures count as a storm until the breaker ejects it. A router whose shed calls are retried by a
client that ignores backoff can spend the shed grant on those retries within one window (bounded
by the shed count).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import Field

from fleetloop.policies.base import FleetSnapshot, NodeView, Params, PolicyContext, PolicyResult
from fleetloop.policies.registry import register
from fleetloop.schemas.decisions import RetryBudgetDecision, RetryExempt


class RatioParams(Params):
    retry_ratio: float = Field(default=0.2, ge=0.0, le=1.0)
    min_retries_per_s: float = Field(default=10.0, ge=0.0, le=10_000.0)
    per_tenant: bool = True
    exempt_shed_and_lost: bool = True


def allowed(params: RatioParams, window_s: float, requests: int, retries: int, exempt: int = 0) -> int:
    """The window's budget for retries the router counts; ``exempt`` estimates the retries of shed
    and lost calls among ``retries`` (the router lets those through uncounted)."""
    counted = max(0, retries - max(0, exempt)) if params.exempt_shed_and_lost else retries
    return max(0, math.floor(params.min_retries_per_s * window_s + params.retry_ratio * requests) - counted)


def lost_calls(nodes: Iterable[NodeView]) -> int:
    """Calls that failed on nodes no longer serving: crashed (stale) or reclaimed (not warm)."""
    return sum(n.failures_w for n in nodes if n.stale or n.weights_state != "warm")


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
        shed = pool.shed_w if pool else 0
        lost = lost_calls(snap.pool_nodes(ctx.pool_id))
        inputs = {
            "requests_w": float(requests),
            "retries_w": float(retries),
            "shed_w": float(shed),
            "lost_w": float(lost),
        }
        exempt: tuple[RetryExempt, ...] = ("error", "shed") if params.exempt_shed_and_lost else ()
        decisions = [
            RetryBudgetDecision(
                entity=f"pool/{ctx.pool_id}",
                pool_id=ctx.pool_id,
                retry_ratio=params.retry_ratio,
                min_retries_per_s=params.min_retries_per_s,
                retries_allowed_now=allowed(params, window_s, requests, retries, shed + lost),
                exempt_retries_of=exempt,
                reason="budget"
                if shed + lost == 0 or not params.exempt_shed_and_lost
                else "budget+shed-lost",
                inputs=inputs,
            )
        ]
        if params.per_tenant:
            for t in snap.tenants.values():
                if t.requests_w == 0:
                    continue
                # The tenant's share of the calls lost with their nodes (the view is not per node).
                lost_t = math.floor(lost * min(1.0, t.requests_w / requests)) if requests > 0 else 0
                decisions.append(
                    RetryBudgetDecision(
                        entity=f"pool/{ctx.pool_id}/tenant/{t.tenant_id}",
                        pool_id=ctx.pool_id,
                        tenant_id=t.tenant_id,
                        retry_ratio=params.retry_ratio,
                        min_retries_per_s=params.min_retries_per_s,
                        retries_allowed_now=allowed(
                            params, window_s, t.requests_w, t.retries_w, t.shed_w + lost_t
                        ),
                        exempt_retries_of=exempt,
                        reason="tenant-budget",
                        inputs={
                            "requests_w": float(t.requests_w),
                            "retries_w": float(t.retries_w),
                            "shed_w": float(t.shed_w),
                            "lost_w": float(lost_t),
                        },
                    )
                )
        return PolicyResult(decisions=tuple(decisions), state=None)
