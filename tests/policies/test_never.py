"""never: every node stays closed."""

from __future__ import annotations

from fleetloop.policies.breaker.never import Never, NeverParams
from tests.policies.snapshots import by_node, ctx, node, snapshot


def test_every_node_closed_whatever_it_does() -> None:
    snap = snapshot(
        [node("a", consecutive_failures=1000, failures_w=1000), node("b"), node("x", pool_id="q")]
    )
    result = Never().decide(snap, NeverParams(), None, ctx(snap))
    decisions = by_node(result)
    assert sorted(decisions) == ["a", "b"]
    assert all((d.state, d.enforced, d.reason) == ("closed", True, "disabled") for d in decisions.values())
    assert result.state is None
