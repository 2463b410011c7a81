"""The router library honours autoscale's drain list as every actuator does (HAProxy's ``drain``
state, the worker lists): a node on its pool's current list takes no new calls while the routing
decision is fresh, whatever its own ``draining`` flag says; a later decision without it brings it
back; a list naming every weighted node falls back as any decision leaving no node does (plain
round robin, never an empty pool); a stale decision is plain load balancing, the list with it.

The rule is :func:`fleetloop.router.state.rotation`'s: the router's eligible nodes are the ones
the actuators put in rotation."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.router.state import rotation
from fleetloop.schemas.decisions import AutoscaleDecision, Decision
from tests.router.test_pick import World, breaker, env, routing

FOUR = {f"p/{i}": 1.0 for i in range(4)}


def autoscale(pool: str, drain: tuple[str, ...], tick: int = 1, current: int = 4) -> Decision:
    body = AutoscaleDecision(
        entity=f"pool/{pool}",
        reason="r",
        pool_id=pool,
        current_nodes=current,
        desired_nodes=current - len(drain),
        drain=drain,
    )
    return env(body, tick)


def picked(w: World, calls: int = 40, **kw: Any) -> set[str]:
    """Where ``calls`` calls go, none of them finished (so least-outstanding spreads them)."""
    out = set()
    for _ in range(calls):
        where = w.pick(**kw)
        w.router.started(where.split(":", 1)[1])
        out.add(where)
    return out


@pytest.mark.parametrize(
    "picker", ["weighted-random", "round-robin", "least-request-p2c", "least-outstanding"]
)
def test_a_node_on_the_drain_list_takes_no_new_calls(picker: str) -> None:
    w = World({"p": 4})
    w.apply(routing("p", FOUR, picker=picker), autoscale("p", ("p/1", "p/3")))
    assert picked(w) == {"primary:p/0", "primary:p/2"}


def test_the_drain_list_arriving_after_the_routing_decision_takes_effect_at_once() -> None:
    """The eligible set is cached per state version: a changed drain list is a new version."""
    w = World({"p": 2})
    w.apply(routing("p", {"p/0": 1.0, "p/1": 1.0}, picker="round-robin"))
    assert picked(w) == {"primary:p/0", "primary:p/1"}
    w.apply(autoscale("p", ("p/0",), tick=2, current=2))
    assert picked(w) == {"primary:p/1"}


def test_a_node_taken_off_the_list_is_eligible_again() -> None:
    w = World({"p": 2})
    w.apply(routing("p", {"p/0": 1.0, "p/1": 1.0}, picker="round-robin"), autoscale("p", ("p/0",), current=2))
    assert picked(w) == {"primary:p/1"}
    w.apply(autoscale("p", (), tick=2, current=2))
    assert picked(w) == {"primary:p/0", "primary:p/1"}


def test_prefix_affinity_skips_a_node_on_the_drain_list() -> None:
    w = World({"p": 2})
    w.apply(routing("p", {"p/0": 1.0, "p/1": 1.0}, prefix_affinity={"d": ("p/0", "p/1")}))
    assert w.pick(digest="d") == "primary:p/0"
    w.apply(autoscale("p", ("p/0",), tick=2, current=2))
    assert w.pick(digest="d") == "primary:p/1"


def test_a_list_naming_every_weighted_node_falls_back_as_before_never_empty() -> None:
    """Every weighted node drained: the fresh-decision fallback (plain round robin over the live
    members not behind an enforced open breaker), as for a decision whose weights are all 0."""
    w = World({"p": 3})
    w.apply(routing("p", {"p/0": 1.0, "p/1": 1.0}), autoscale("p", ("p/0", "p/1"), current=3))
    assert [w.pick() for _ in range(3)] == ["primary:p/0", "primary:p/1", "primary:p/2"]
    w.apply(breaker("p/1", tick=2))
    assert picked(w) == {"primary:p/0", "primary:p/2"}


def test_a_stale_decision_is_plain_load_balancing_the_drain_list_with_it() -> None:
    w = World({"p": 2})
    w.apply(routing("p", {"p/0": 1.0, "p/1": 1.0}), autoscale("p", ("p/0",), current=2), now=0.0)
    assert picked(w, now=29.0) == {"primary:p/1"}
    assert picked(w, now=31.0) == {"primary:p/0", "primary:p/1"}


def test_the_pools_share_of_calls_leaves_its_drained_nodes_out() -> None:
    w = World({"a": 2, "b": 2})
    w.apply(
        routing("a", {"a/0": 1.0, "a/1": 1.0}),
        routing("b", {"b/0": 1.0, "b/1": 1.0}),
        autoscale("b", ("b/1",), current=2),
    )
    got: dict[str, int] = {}
    for _ in range(3000):
        pool = w.pick(new_task=True).split(":")[1].split("/")[0]
        got[pool] = got.get(pool, 0) + 1
    assert got == {"a": 2000, "b": 1000}


def test_the_router_and_the_actuators_rotation_agree() -> None:
    w = World({"p": 4})
    decisions = [
        routing("p", {"p/0": 1.0, "p/1": 0.5, "p/2": 0.0, "p/3": 2.0}),
        autoscale("p", ("p/3", "p/1")),
    ]
    w.apply(*decisions)
    rot = rotation(w.router.state, "p", sorted(w.eps), 1.0, w.router.fail_static_s)
    assert rot.why["p/3"] == rot.why["p/1"] == "autoscale-drain"
    assert picked(w) == {f"primary:{n}" for n in rot.weights}
