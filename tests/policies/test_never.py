"""never: every node stays closed."""

from __future__ import annotations

from fleetloop.policies.breaker.emission import KEYFRAME_TICKS, keyframe
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
    fields = ("closed", True, 0.0, None, "disabled", 0)
    assert result.state == {"a": (fields, 1), "b": (fields, 1)}
    # Later ticks publish only the keyframed nodes (nothing changed).
    for tick_id in range(2, 1 + KEYFRAME_TICKS):  # the records of tick 1 are not yet too old
        again = Never().decide(snap, NeverParams(), result.state, ctx(snap, tick_id=tick_id))
        assert sorted(by_node(again)) == [n for n in ("a", "b") if keyframe(n, tick_id)]
