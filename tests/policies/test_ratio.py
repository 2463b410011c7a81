"""ratio: retries capped at a share of a pool's requests over the window (Finagle RetryBudget)."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.policies.retry_budget.ratio import Ratio, RatioParams, allowed
from fleetloop.schemas.base import updated
from fleetloop.schemas.decisions import RetryBudgetDecision
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.policies.snapshots import ctx, node, nodes, snapshot, tenant


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


_MOSTLY_FRESH = st.sampled_from((False, False, False, True))  # a node stale one time in four
_POOL_DRAW = st.tuples(
    st.integers(0, 2_000),  # the pool's requests over the window
    # (stale, failures) per node: mostly fresh, so pools with no lost call share their tenants' parts
    st.lists(st.tuples(_MOSTLY_FRESH, st.integers(0, 50)), min_size=1, max_size=4),
)


@settings(max_examples=80, deadline=None)
@given(
    pools=st.lists(_POOL_DRAW, min_size=2, max_size=5),
    tenants=st.lists(st.tuples(st.integers(0, 1_500), st.integers(0, 300)), min_size=1, max_size=4),
    per_tenant=st.sampled_from((True, True, True, False)),
)
def test_batch_equals_the_pools_one_by_one_and_a_copy_changes_no_other(
    pools: list[tuple[int, list[tuple[bool, int]]]], tenants: list[tuple[int, int]], per_tenant: bool
) -> None:
    # Pools with calls lost with their stale nodes (so tenants' lost shares and the ratio a mass
    # failure adds vary), tenants of any size: the batch form's decisions are the pools' own, byte
    # for byte, however many parts they share; then every decision is copied with an update, and
    # every other decision still reads as it did.
    views = [
        node(f"p{i}-n{j}", f"p{i}", stale=stale, failures_w=fails)
        for i, (_, members) in enumerate(pools)
        for j, (stale, fails) in enumerate(members)
    ]
    snap = snapshot(
        views,
        pool_fields={f"p{i}": {"requests_w": requests} for i, (requests, _) in enumerate(pools)},
        tenants=[tenant(f"t{k}", k % 3, requests_w=r, retries_w=x) for k, (r, x) in enumerate(tenants)],
    )
    params = RatioParams(per_tenant=per_tenant)
    ctxs = [ctx(snap, pool_id=f"p{i}") for i in range(len(pools))]
    batch = [d for r in Ratio().decide_pools(snap, params, [None] * len(ctxs), ctxs) for d in r.decisions]
    alone = [d for c in ctxs for d in Ratio().decide(snap, params, None, c).decisions]
    seen = [(d.model_dump_json(), sorted(d.model_fields_set)) for d in batch]
    assert seen == [(d.model_dump_json(), sorted(d.model_fields_set)) for d in alone]
    for d in batch:
        updated(d, {"retries_allowed_now": 0, "reason": "x"})
        d.model_copy(update={"retries_allowed_now": 1, "pool_id": "other"})
    assert [(d.model_dump_json(), sorted(d.model_fields_set)) for d in batch] == seen
