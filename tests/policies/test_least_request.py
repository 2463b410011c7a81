"""least-request-p2c: Envoy LEAST_REQUEST as a control-plane decision (equal shares, router's P2C)."""

from __future__ import annotations

import pytest
from fleetloop.policies.base import NodeView
from fleetloop.policies.routing.least_request import LeastRequest, LeastRequestParams
from fleetloop.schemas.decisions import RoutingDecision
from hypothesis import given
from hypothesis import strategies as st
from tests.policies.snapshots import ctx, node, snapshot

ALGO = LeastRequest()


def decide(*views: NodeView) -> RoutingDecision:
    snap = snapshot(views)
    (d,) = ALGO.decide(snap, LeastRequestParams(), None, ctx(snap)).decisions
    assert isinstance(d, RoutingDecision)
    return d


@pytest.mark.parametrize(
    ("views", "expected"),
    [
        # every healthy node gets the same share, whatever its load: the router's P2C handles load
        ([node("a", queue_depth=0), node("b", queue_depth=50)], {"a": 0.5, "b": 0.5}),
        ([node("a"), node("b"), node("c")], {"a": 0.333333, "b": 0.333333, "c": 0.333333}),
        # not warm (weights cold or loading) = not ready = not in the endpoint set
        (
            [node("a"), node("b", weights_state="loading"), node("c", weights_state="cold")],
            {"a": 1.0, "b": 0.0, "c": 0.0},
        ),
        # draining nodes take no new calls
        ([node("a"), node("b", draining=True)], {"a": 1.0, "b": 0.0}),
        # nothing healthy: all zero (the engine fails open)
        ([node("a", weights_state="cold"), node("b", draining=True)], {"a": 0.0, "b": 0.0}),
    ],
)
def test_decision_table(views: list[NodeView], expected: dict[str, float]) -> None:
    d = decide(*views)
    assert d.weights == expected
    assert d.picker == "least-request-p2c"


def test_picker_is_least_request_and_reason_says_no_warm_node() -> None:
    assert decide(node("a")).reason == "least-request-p2c"
    assert decide(node("a", weights_state="loading")).reason == "no-warm-node"
    assert decide(node("a")).inputs == {"nodes": 1.0, "healthy_nodes": 1.0}


def test_only_the_ticks_pool() -> None:
    snap = snapshot([node("a", pool_id="p"), node("x", pool_id="q")])
    (d,) = ALGO.decide(snap, LeastRequestParams(), None, ctx(snap, pool_id="q")).decisions
    assert isinstance(d, RoutingDecision)
    assert d.pool_id == "q"
    assert d.weights == {"x": 1.0}


def test_blind_to_health_and_latency_the_engine_applies_breakers() -> None:
    # A failing node keeps its share here; ejection is the breaker's and the engine's job.
    d = decide(node("a", consecutive_failures=50, failures_w=50, ttft_p99_ms=90_000.0), node("b"))
    assert d.weights == {"a": 0.5, "b": 0.5}


@given(
    st.lists(st.tuples(st.sampled_from(["cold", "loading", "warm"]), st.booleans()), min_size=1, max_size=40)
)
def test_weights_equal_over_healthy_and_sum_to_one(spec: list[tuple[str, bool]]) -> None:
    views = [node(f"n{i:02d}", weights_state=ws, draining=dr) for i, (ws, dr) in enumerate(spec)]
    d = decide(*views)
    healthy = [v.node_id for v in views if v.warm]
    positive = sorted(k for k, w in d.weights.items() if w > 0)
    assert positive == healthy
    assert len({d.weights[k] for k in healthy}) <= 1
    assert sum(d.weights.values()) == pytest.approx(1.0 if healthy else 0.0, abs=1e-5)
