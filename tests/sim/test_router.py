"""The simulator's router across pools: every pool serving a call's model takes its share."""

from __future__ import annotations

from collections import Counter

import numpy as np
from fleetloop.perf.catalog import node_spec
from fleetloop.schemas.decisions import Decision, PolicyStamp, RoutingDecision
from fleetloop.sim.node import Node
from fleetloop.sim.router import SimRouter, sim_router
from tests.sim.physics import Loop

STAMP = PolicyStamp(name="t", version=1, hash="0" * 16, mode="enforce")
_tick = [0]


def set_routing(r: SimRouter, body: RoutingDecision, now: float) -> None:
    _tick[0] += 1
    r.apply([Decision(ts_ms=1, tick_id=_tick[0], policy=STAMP, body=body)], now)


def _router(pools: dict[str, tuple[str, int]]) -> SimRouter:
    """Pools ``id -> (gpu, nodes)`` all serving llama-8b, every node warm and routable."""
    by_model = {"llama-8b": tuple(sorted(pools))}
    nodes: dict[str, Node] = {}
    all_members: dict[str, list[Node]] = {}
    r = sim_router(by_model, np.random.default_rng(0), all_members, nodes)
    for pool_id, (gpu, n) in sorted(pools.items()):
        members = []
        for i in range(n):
            node = Loop(node_spec("llama-8b", gpu, 1)).node
            node.node_id, node.pool_id = f"{pool_id}/{i}", pool_id
            nodes[node.node_id] = node
            members.append(node)
        all_members[pool_id] = members
        w = 1.0 / n
        set_routing(
            r,
            RoutingDecision(
                entity=f"pool/{pool_id}", pool_id=pool_id, reason="r", weights={m.node_id: w for m in members}
            ),
            0.0,
        )
    return r


def _route(r: SimRouter, calls: int) -> Counter[str]:
    got: Counter[str] = Counter()
    for _ in range(calls):
        route = r.pick(("llama-8b",), 1, None, new_task=True, budget_ms=10_000, now_s=1.0)
        assert route.node is not None
        got[route.pool_id] += 1
    return got


def test_every_pool_of_the_model_takes_calls_by_routable_capacity() -> None:
    # Before: every call went to the first pool by id ("a-a100"); "b-h100" got only spill-over.
    r = _router({"a-a100": ("A100", 2), "b-h100": ("H100", 2)})
    got = _route(r, 10_000)
    bw_a, bw_h = node_spec("llama-8b", "A100", 1).bytes_per_s, node_spec("llama-8b", "H100", 1).bytes_per_s
    expected_h = 10_000 * bw_h / (bw_a + bw_h)
    assert abs(got["b-h100"] - expected_h) <= 1  # smooth weighted round robin: exact shares
    assert got["a-a100"] + got["b-h100"] == 10_000


def test_pool_share_follows_the_published_weights() -> None:
    r = _router({"a": ("H100", 4), "b": ("H100", 4)})
    # Pool b publishes one node only (the other three at weight 0): it takes 1/5 of the calls.
    set_routing(
        r, RoutingDecision(entity="pool/b", pool_id="b", reason="r", weights={"b/0": 1.0, "b/1": 0.0}), 2.0
    )
    got = _route(r, 5_000)
    assert abs(got["b"] - 1_000) <= 1
    assert abs(got["a"] - 4_000) <= 1


def test_a_pool_with_nothing_routable_takes_no_calls() -> None:
    r = _router({"a": ("H100", 2), "b": ("H100", 2)})
    for node in r.members["a"]:
        node.draining = True
    r.fleet_changed()
    got = _route(r, 100)
    assert got == Counter({"b": 100})
