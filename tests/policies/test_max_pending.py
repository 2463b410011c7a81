"""max-pending: one fixed per-node queue limit for every class (Envoy max_pending_requests)."""

from __future__ import annotations

import pytest
from fleetloop.policies.admission.max_pending import MaxPending, MaxPendingParams
from fleetloop.schemas.decisions import AdmissionDecision
from pydantic import ValidationError
from tests.policies.snapshots import ctx, node, snapshot


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, {"0": 1024, "1": 1024, "2": 1024}),
        ({"limit": 8, "classes": 1}, {"0": 8}),
        ({"limit": 1, "classes": 5}, {str(p): 1 for p in range(5)}),
    ],
)
def test_same_limit_for_every_class(params: dict[str, int], expected: dict[str, int]) -> None:
    snap = snapshot([node("a", queue_depth=5000)])
    (d,) = MaxPending().decide(snap, MaxPendingParams(**params), None, ctx(snap)).decisions
    assert isinstance(d, AdmissionDecision)
    assert d.max_queue_depth == expected
    assert d.new_task_max_queue_depth == {}  # blind to workflows
    assert (d.pool_id, d.reason) == ("p", "fixed-limit")


def test_param_bounds() -> None:
    with pytest.raises(ValidationError):
        MaxPendingParams(limit=0)
