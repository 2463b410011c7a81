"""ratio: retries capped at a share of a pool's requests over the window (Finagle RetryBudget)."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.policies.retry_budget.ratio import Ratio, RatioParams, allowed
from fleetloop.schemas.base import updated
from fleetloop.schemas.decisions import RetryBudgetDecision
from tests.policies.snapshots import ctx, nodes, snapshot, tenant


@pytest.mark.parametrize(
    ("window_s", "requests", "retries", "expected"),
    [
        (10.0, 0, 0, 100),  # a quiet pool may still retry: 10/s x 10 s
        (10.0, 1000, 0, 300),  # 100 + 20% of 1000
        (10.0, 1000, 250, 50),
        (10.0, 1000, 400, 0),  # overspent: clamped at 0
        (1.0, 7, 0, 11),  # floor(10 + 1.4)
    ],
)
def test_allowed_formula(window_s: float, requests: int, retries: int, expected: int) -> None:
    assert allowed(RatioParams(), window_s, requests, retries) == expected


def budgets(**params: Any) -> list[RetryBudgetDecision]:
    snap = snapshot(
        pool_fields={"p": {"requests_w": 500, "retries_w": 30}},
        tenants=[
            tenant("gold", 0, requests_w=400, retries_w=10),
            tenant("free", 2, requests_w=100, retries_w=90),
            tenant("idle", 1),
        ],
    )
    out = list(Ratio().decide(snap, RatioParams(**params), None, ctx(snap)).decisions)
    assert all(isinstance(d, RetryBudgetDecision) for d in out)
    return [d for d in out if isinstance(d, RetryBudgetDecision)]


def test_pool_budget_and_one_per_tenant_seen_in_the_window() -> None:
    pool, *tenants = budgets()
    assert (pool.entity, pool.tenant_id, pool.retries_allowed_now) == ("pool/p", None, 100 + 100 - 30)
    assert (pool.retry_ratio, pool.min_retries_per_s) == (0.2, 10.0)
    # tenants in sorted order, each with its own counts; "idle" sent nothing and gets none
    assert [(t.entity, t.tenant_id, t.retries_allowed_now) for t in tenants] == [
        ("pool/p/tenant/free", "free", 100 + 20 - 90),
        ("pool/p/tenant/gold", "gold", 100 + 80 - 10),
    ]


def test_per_tenant_off_publishes_the_pool_budget_only() -> None:
    assert [d.entity for d in budgets(per_tenant=False)] == ["pool/p"]


def test_tenant_decisions_of_a_batch_share_parts_no_copy_can_change() -> None:
    # The batch form hands the tenant decisions of one key (tenant, lost share, added ratio) one
    # inputs dict and every tenant decision one fields set: a copy of one with an update (the
    # envelope's ``updated``, pydantic's ``model_copy``) must leave the others as they were.
    snap = snapshot(
        nodes(2, "p", prefix="p") + nodes(2, "q", prefix="q"),
        pool_fields={"p": {"requests_w": 500, "retries_w": 30}, "q": {"requests_w": 200, "retries_w": 5}},
        tenants=[tenant("gold", 0, requests_w=400, retries_w=10), tenant("free", 2, requests_w=100)],
    )
    params = RatioParams()
    ctxs = [ctx(snap, pool_id="p"), ctx(snap, pool_id="q")]
    batch = [r.decisions for r in Ratio().decide_pools(snap, params, [None, None], ctxs)]
    alone = [Ratio().decide(snap, params, None, c).decisions for c in ctxs]
    assert [[d.model_dump_json() for d in ds] for ds in batch] == [
        [d.model_dump_json() for d in ds] for ds in alone
    ]
    gold_p, gold_q = batch[0][2], batch[1][2]
    assert isinstance(gold_p, RetryBudgetDecision)
    assert isinstance(gold_q, RetryBudgetDecision)
    assert gold_p.inputs is gold_q.inputs  # what the batch form shares (else this test tests nothing)
    assert gold_p.__pydantic_fields_set__ is gold_q.__pydantic_fields_set__
    before = (gold_q.model_dump_json(), set(gold_q.model_fields_set), dict(gold_q.inputs))
    updated(gold_p, {"retries_allowed_now": 0, "reason": "x"})
    gold_p.model_copy(update={"retries_allowed_now": 1, "tenant_id": "other"})
    assert (gold_q.model_dump_json(), set(gold_q.model_fields_set), dict(gold_q.inputs)) == before
    assert gold_p.model_fields_set == gold_q.model_fields_set == set(alone[1][2].model_fields_set)
