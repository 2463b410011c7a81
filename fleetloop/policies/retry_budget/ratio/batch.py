"""ratio for a batch of pools: :func:`decide_pools` is ``rule.decide_pool`` for every pool of the
batch, equal element for element and bit for bit. A tenant's decision reads the pool only through
its share of the lost calls and the ratio a mass failure adds, so its budget and inputs are computed
once per (tenant, share, added ratio) and copied into each pool's decision, assembled without
validation when every part is in bounds (``rule.budget_decision``'s test, made once).
``tests/unit/test_batch_sections.py`` holds it to the loop of ``decide_pool``. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult
from fleetloop.policies.pool_figures import EMPTY, distinct_pools, inputs_ok, is_ident, pool_figures
from fleetloop.policies.retry_budget.ratio.params import RatioParams
from fleetloop.policies.retry_budget.ratio.rule import (
    GIVEN_TENANT,
    budget_decision,
    decide_pool,
    exempt_of,
    params_in_bounds,
    pool_budget,
    tenant_budget,
    tenant_lost,
)
from fleetloop.policies.retry_budget.ratio.signals import Episode
from fleetloop.schemas.base import MAX_COUNT, assemble
from fleetloop.schemas.decisions import RetryBudgetDecision

# One fields set shared by every tenant decision assembled here (a 10,000-node tick makes ~4,000 of
# them): a frozen model never changes its fields set in place (``model_copy`` and ``updated`` copy it
# first), and a set per decision is one more object for the young-generation collection to walk, as
# the engine's decision wrappers share theirs (docs/performance.md, the whole-fleet tick).
_TENANT_FIELDS_SET: set[str] = set(GIVEN_TENANT)


def decide_pools(
    snap: FleetSnapshot, params: RatioParams, states: Sequence[Episode | None], ctxs: Sequence[PolicyContext]
) -> list[PolicyResult[Episode | None]]:
    """``[decide_pool(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``, each
    tenant's part made once per lost share and added ratio."""
    if len(states) != len(ctxs) or not distinct_pools(ctxs):
        return [decide_pool(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]
    window_s = snap.window_ms / 1000.0
    figures = pool_figures(snap)
    exempt = exempt_of(params)
    tenants = [t for t in snap.tenants.values() if t.requests_w != 0] if params.per_tenant else []
    params_ok = params_in_bounds(params)
    tenant_ok = [is_ident(t.tenant_id) for t in tenants]
    tenant_small = [type(t.requests_w) is int and abs(t.requests_w) < 2**53 for t in tenants]
    all_small = all(tenant_small)
    # Each tenant decision's values, in the model's field order: the pool's parts are set per pool.
    templates: list[dict[str, object]] = [
        {
            "entity": "",
            "reason": "tenant-budget",
            "inputs": None,
            "kind": "retry_budget",
            "pool_id": "",
            "tenant_id": t.tenant_id,
            "retry_ratio": params.retry_ratio,
            "min_retries_per_s": params.min_retries_per_s,
            "retries_allowed_now": 0,
            "exempt_retries_of": exempt,
        }
        for t in tenants
    ]
    # (tenant index, its lost share, the added ratio) -> (allowed, inputs, whether both are in bounds)
    made: dict[tuple[int, int, float], tuple[int, dict[str, float], bool]] = {}

    def budget_of(k: int, lost_t: int, extra: float) -> tuple[int, dict[str, float], bool]:
        key = (k, lost_t, extra)
        found = made.get(key)
        if found is None:
            n, t_inputs = tenant_budget(params, window_s, tenants[k], lost_t, extra)
            ok = (
                type(n) is int and 0 <= n <= MAX_COUNT and tenant_ok[k] and inputs_ok(list(t_inputs.values()))
            )
            found = made[key] = (n, t_inputs, ok)
        return found

    # A pool that lost no call with a node and has no mass failure (most pools, most ticks): every
    # tenant's share is 0 and no ratio is added, so each tenant's budget and inputs are the same in
    # all such pools. When every tenant's are in bounds, those pools' tenant decisions are assembled
    # from this one list (tenant id, budget, inputs), made at the first such pool, without the
    # per-tenant steps of the loop below.
    quiet: list[tuple[str, int, dict[str, float]]] | None = None
    quiet_made = False
    ratio, floor = params.retry_ratio, params.min_retries_per_s
    out: list[PolicyResult[Episode | None]] = []
    for state, ctx in zip(states, ctxs, strict=True):
        pid = ctx.pool_id
        decision, episode, lost, requests, extra = pool_budget(
            snap, params, state, pid, figures.get(pid, EMPTY)
        )
        decisions: list[RetryBudgetDecision] = [decision]
        fast = params_ok and is_ident(pid)
        prefix = f"pool/{pid}/tenant/"
        if fast and not lost and not extra and all_small:
            if not quiet_made:
                quiet_made = True
                parts = [budget_of(k, 0, 0.0) for k in range(len(tenants))]
                if all(ok for _, _, ok in parts):
                    quiet = [(t.tenant_id, n, t_in) for t, (n, t_in, _) in zip(tenants, parts, strict=True)]
            if quiet is not None:
                for tid, n, t_inputs in quiet:
                    decisions.append(
                        assemble(
                            RetryBudgetDecision,
                            {
                                "entity": prefix + tid,
                                "reason": "tenant-budget",
                                "inputs": t_inputs,  # shared by the quiet pools' decisions, never written
                                "kind": "retry_budget",
                                "pool_id": pid,
                                "tenant_id": tid,
                                "retry_ratio": ratio,
                                "min_retries_per_s": floor,
                                "retries_allowed_now": n,
                                "exempt_retries_of": exempt,
                            },
                            _TENANT_FIELDS_SET,
                        )
                    )
                out.append(PolicyResult(decisions=tuple(decisions), state=episode))
                continue
        for k, t in enumerate(tenants):
            # No call lost: no share (and the division, which could overflow, is not made).
            lost_t = tenant_lost(lost, t.requests_w, requests) if lost or not tenant_small[k] else 0
            n, t_inputs, ok = budget_of(k, lost_t, extra)
            if fast and ok:
                values = templates[k].copy()
                values["entity"] = prefix + t.tenant_id
                values["inputs"] = t_inputs  # shared by the decisions of one key, never written
                values["pool_id"] = pid
                values["retries_allowed_now"] = n
                decisions.append(assemble(RetryBudgetDecision, values, _TENANT_FIELDS_SET))
            else:
                decisions.append(
                    budget_decision(
                        prefix + t.tenant_id,
                        pool_id=pid,
                        tenant_id=t.tenant_id,
                        params=params,
                        retries_allowed_now=n,
                        exempt_retries_of=exempt,
                        reason="tenant-budget",
                        inputs=dict(t_inputs),
                    )
                )
        out.append(PolicyResult(decisions=tuple(decisions), state=episode))
    return out
