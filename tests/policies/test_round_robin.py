"""round-robin: equal shares over warm nodes, routers take them in turn."""

from __future__ import annotations

from fleetloop.policies.routing.round_robin import RoundRobin, RoundRobinParams
from fleetloop.schemas.decisions import RoutingDecision
from tests.policies.snapshots import ctx, node, snapshot


def test_equal_shares_over_warm_nodes_in_turn() -> None:
    snap = snapshot(
        [
            node("a", queue_depth=90),
            node("b"),
            node("c", weights_state="loading"),
            node("d", draining=True),
            node("e", consecutive_failures=40),
        ]
    )
    (d,) = RoundRobin().decide(snap, RoundRobinParams(), None, ctx(snap)).decisions
    assert isinstance(d, RoutingDecision)
    assert d.picker == "round-robin"
    # blind to load and health: a, b and e share equally
    assert d.weights == {"a": 0.333333, "b": 0.333333, "c": 0.0, "d": 0.0, "e": 0.333333}
    assert d.inputs == {"warm_nodes": 3.0}


def test_no_warm_node() -> None:
    snap = snapshot([node("a", weights_state="cold")])
    (d,) = RoundRobin().decide(snap, RoundRobinParams(), None, ctx(snap)).decisions
    assert isinstance(d, RoutingDecision)
    assert d.weights == {"a": 0.0}
