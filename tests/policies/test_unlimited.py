"""unlimited: no retry budget."""

from __future__ import annotations

from fleetloop.policies.retry_budget.unlimited import UNLIMITED, Unlimited, UnlimitedParams
from fleetloop.schemas.decisions import RetryBudgetDecision
from tests.policies.snapshots import ctx, snapshot


def test_everything_allowed_whatever_the_retry_rate() -> None:
    snap = snapshot(pool_fields={"p": {"requests_w": 10, "retries_w": 10_000}})
    (d,) = Unlimited().decide(snap, UnlimitedParams(), None, ctx(snap)).decisions
    assert isinstance(d, RetryBudgetDecision)
    assert (d.retry_ratio, d.min_retries_per_s, d.retries_allowed_now) == (1.0, 0.0, UNLIMITED)
    assert (d.pool_id, d.tenant_id, d.reason) == ("p", None, "unlimited")
