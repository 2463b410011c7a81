"""ratio's rule: the window's budget, the pool's decision and each tenant's (README.md beside this
file: "Formula"). :func:`decide_pool` is one pool's tick; :mod:`.batch` decides a batch of pools
with the same parts, each tenant's once per lost share and added ratio. Pure: event time only."""

from __future__ import annotations

import math

from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult, TenantView
from fleetloop.policies.pool_figures import PoolFigures, figures_of
from fleetloop.policies.retry_budget.ratio.params import RatioParams
from fleetloop.policies.retry_budget.ratio.signals import Episode, episode_after
from fleetloop.schemas.base import MAX_COUNT, MAX_FIGURE, assemble
from fleetloop.schemas.decisions import RetryBudgetDecision, RetryExempt


def allowed(
    params: RatioParams,
    window_s: float,
    requests: int,
    retries: int,
    exempt: int = 0,
    *,
    extra: float = 0.0,
) -> int:
    """The window's budget for retries the router counts; ``exempt`` estimates the retries of shed
    and lost calls among ``retries`` (the router lets those through uncounted); ``extra`` is the
    ratio a mass failure adds (``k / warm``)."""
    counted = max(0, retries - max(0, exempt)) if params.exempt_shed_and_lost else retries
    ratio = params.retry_ratio + max(0.0, extra)
    return max(0, math.floor(params.min_retries_per_s * window_s + ratio * requests) - counted)


def exempt_of(params: RatioParams) -> tuple[RetryExempt, ...]:
    """The retries the router lets through uncounted: of calls dropped by their node and of shed
    calls (none when ``exempt_shed_and_lost`` is off)."""
    return ("error", "shed") if params.exempt_shed_and_lost else ()


def pool_budget(
    snap: FleetSnapshot, params: RatioParams, state: Episode | None, pool_id: str, figs: PoolFigures
) -> tuple[RetryBudgetDecision, Episode | None, int, int, float]:
    """The pool's own decision from its counts and figures (:mod:`fleetloop.policies.pool_figures`),
    and what its tenants' decisions read of the pool: (decision, the episode after this tick, the
    calls lost with their nodes, the pool's requests, the ratio a mass failure adds)."""
    pool = snap.pools.get(pool_id)
    requests = pool.requests_w if pool else 0
    retries = pool.retries_w if pool else 0
    shed = pool.shed_w if pool else 0
    lost = figs.lost_calls
    episode, short, warm = episode_after(
        params,
        state,
        figs.warm_fresh,
        lost_now=lambda: figs.lost_nodes,
        now_ms=snap.now_ms,
        window_ms=snap.window_ms,
        failing=max(0, (pool.failures_w if pool else 0) - lost),
    )
    extra = short / max(1, warm) if short else 0.0
    inputs = {
        "requests_w": float(requests),
        "retries_w": float(retries),
        "shed_w": float(shed),
        "lost_w": float(lost),
    }
    if episode is not None:
        inputs["nodes_short"] = float(short)
        inputs["nodes_warm"] = float(warm)
        inputs["ratio_added"] = round(extra, 6)
    if episode is not None:
        reason = "budget+mass-failure"
    elif shed + lost == 0 or not params.exempt_shed_and_lost:
        reason = "budget"
    else:
        reason = "budget+shed-lost"
    decision = budget_decision(
        f"pool/{pool_id}",
        pool_id=pool_id,
        tenant_id=None,
        params=params,
        retries_allowed_now=allowed(
            params, snap.window_ms / 1000.0, requests, retries, shed + lost, extra=extra
        ),
        exempt_retries_of=exempt_of(params),
        reason=reason,
        inputs=inputs,
    )
    return decision, episode, lost, requests, extra


def tenant_lost(lost: int, tenant_requests: int, requests: int) -> int:
    """The tenant's share of the calls lost with their nodes, by its share of the pool's requests
    (the tenant view is not per node)."""
    return math.floor(lost * min(1.0, tenant_requests / requests)) if requests > 0 else 0


def tenant_budget(
    params: RatioParams, window_s: float, t: TenantView, lost_t: int, extra: float
) -> tuple[int, dict[str, float]]:
    """A tenant's budget and the inputs its decision carries, from its own counts, its share of the
    lost calls and the ratio a mass failure adds."""
    n = allowed(params, window_s, t.requests_w, t.retries_w, t.shed_w + lost_t, extra=extra)
    return n, {
        "requests_w": float(t.requests_w),
        "retries_w": float(t.retries_w),
        "shed_w": float(t.shed_w),
        "lost_w": float(lost_t),
    }


def decide_pool(
    snap: FleetSnapshot, params: RatioParams, state: Episode | None, ctx: PolicyContext
) -> PolicyResult[Episode | None]:
    """One pool's tick: its budget, then (``per_tenant``) one per tenant seen in the window."""
    pool_id = ctx.pool_id
    decision, episode, lost, requests, extra = pool_budget(
        snap, params, state, pool_id, figures_of(snap, pool_id)
    )
    decisions = [decision]
    if params.per_tenant:
        window_s = snap.window_ms / 1000.0
        for t in snap.tenants.values():
            if t.requests_w == 0:
                continue
            n, inputs = tenant_budget(params, window_s, t, tenant_lost(lost, t.requests_w, requests), extra)
            decisions.append(
                budget_decision(
                    f"pool/{pool_id}/tenant/{t.tenant_id}",
                    pool_id=pool_id,
                    tenant_id=t.tenant_id,
                    params=params,
                    retries_allowed_now=n,
                    exempt_retries_of=exempt_of(params),
                    reason="tenant-budget",
                    inputs=inputs,
                )
            )
    return PolicyResult(decisions=tuple(decisions), state=episode)


_BUDGET_FIELDS = (
    "entity", "reason", "inputs", "kind", "pool_id", "tenant_id", "retry_ratio", "min_retries_per_s",
    "retries_allowed_now", "exempt_retries_of",
)  # fmt: skip
assert tuple(RetryBudgetDecision.model_fields) == _BUDGET_FIELDS  # ``budget_decision`` lists them in order
_EXEMPT: frozenset[str] = frozenset(("shed", "error"))


def params_in_bounds(params: RatioParams) -> bool:
    """The ratio and floor every decision carries are floats within the schema's bounds."""
    return (
        type(params.retry_ratio) is float
        and 0.0 <= params.retry_ratio <= 1.0
        and type(params.min_retries_per_s) is float
        and 0.0 <= params.min_retries_per_s <= MAX_FIGURE
    )


def budget_decision(
    entity: str,
    *,
    pool_id: str,
    tenant_id: str | None,
    params: RatioParams,
    retries_allowed_now: int,
    exempt_retries_of: tuple[RetryExempt, ...],
    reason: str,
    inputs: dict[str, float],
) -> RetryBudgetDecision:
    """``RetryBudgetDecision(...)`` with these fields (``tenant_id`` only when given), assembled
    without validation when every part is valid by construction: the ids come from validated
    telemetry, outcomes and ticks, the ratio and floor from the validated params, and the count and
    figures are checked here against the schema's bounds. A pool decides one per tenant every tick
    (~4,000 at 10,000 nodes), and validating them cost more than computing them. Anything else goes
    through validation and fails there (``tests/unit/test_fast_bodies.py``)."""
    values: dict[str, object] = {
        "entity": entity,
        "reason": reason,
        "inputs": inputs,
        "kind": "retry_budget",
        "pool_id": pool_id,
        "tenant_id": tenant_id,
        "retry_ratio": params.retry_ratio,
        "min_retries_per_s": params.min_retries_per_s,
        "retries_allowed_now": retries_allowed_now,
        "exempt_retries_of": exempt_retries_of,
    }
    given = GIVEN_TENANT if tenant_id is not None else _GIVEN_POOL
    if (
        entity
        and reason
        and type(retries_allowed_now) is int
        and 0 <= retries_allowed_now <= MAX_COUNT
        and params_in_bounds(params)
        and type(exempt_retries_of) is tuple
        and len(exempt_retries_of) <= 2
        and all(x in _EXEMPT for x in exempt_retries_of)
        and all(type(x) is float and -MAX_FIGURE <= x <= MAX_FIGURE for x in inputs.values())  # not NaN
    ):
        return assemble(RetryBudgetDecision, values, set(given))
    return RetryBudgetDecision.model_validate({k: values[k] for k in _BUDGET_FIELDS if k in given})


_GIVEN_POOL: frozenset[str] = frozenset(
    ("entity", "pool_id", "retry_ratio", "min_retries_per_s", "retries_allowed_now", "exempt_retries_of",
     "reason", "inputs")
)  # fmt: skip
GIVEN_TENANT: frozenset[str] = _GIVEN_POOL | {"tenant_id"}
