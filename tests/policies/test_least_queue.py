"""least-queue: weight by 1 / (1 + load / queue_scale) ** alpha over warm nodes."""

from __future__ import annotations

import itertools

import pytest
from fleetloop.policies.base import NodeView
from fleetloop.policies.routing.least_queue import LeastQueue, LeastQueueParams
from fleetloop.schemas.decisions import RoutingDecision
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.policies.snapshots import ctx, node, snapshot


def decide(views: list[NodeView], **params: float) -> RoutingDecision:
    snap = snapshot(views)
    (d,) = LeastQueue().decide(snap, LeastQueueParams(**params), None, ctx(snap)).decisions
    assert isinstance(d, RoutingDecision)
    return d


@pytest.mark.parametrize(
    ("views", "params", "expected"),
    [
        # equal queues, equal shares
        ([node("a", queue_depth=3), node("b", queue_depth=3)], {}, {"a": 0.5, "b": 0.5}),
        # queue 4 with queue_scale 4 and alpha 2: score (1 / 2) ** 2 = 0.25 against 1
        ([node("a", queue_depth=0), node("b", queue_depth=4)], {}, {"a": 0.8, "b": 0.2}),
        # alpha 1: score 0.5 against 1
        (
            [node("a", queue_depth=0), node("b", queue_depth=4)],
            {"alpha": 1.0},
            {"a": 0.666667, "b": 0.333333},
        ),
        # running requests count a quarter: 16 running = 4 queued
        ([node("a"), node("b", running_requests=16)], {}, {"a": 0.8, "b": 0.2}),
        ([node("a"), node("b", running_requests=16)], {"running_weight": 0.0}, {"a": 0.5, "b": 0.5}),
        # not warm or draining: zero
        (
            [node("a", queue_depth=100), node("b", weights_state="loading"), node("c", draining=True)],
            {},
            {"a": 1.0, "b": 0.0, "c": 0.0},
        ),
    ],
)
def test_decision_table(views: list[NodeView], params: dict[str, float], expected: dict[str, float]) -> None:
    d = decide(views, **params)
    assert d.weights == expected
    assert d.picker == "weighted-random"
    assert d.reason == "least-queue"


def test_no_warm_node_gives_zero_weights() -> None:
    d = decide([node("a", weights_state="cold"), node("b", draining=True)])
    assert d.weights == {"a": 0.0, "b": 0.0}
    assert d.reason == "no-warm-node"
    assert d.inputs == {"nodes": 2.0, "warm_nodes": 0.0}


def test_param_bounds() -> None:
    with pytest.raises(ValidationError):
        LeastQueueParams(alpha=0.0)
    with pytest.raises(ValidationError):
        LeastQueueParams(queue_scale=0.0)


@given(st.lists(st.integers(min_value=0, max_value=500), min_size=2, max_size=20))
def test_a_longer_queue_never_gets_more(queues: list[int]) -> None:
    d = decide([node(f"n{i:02d}", queue_depth=q) for i, q in enumerate(queues)])
    pairs = sorted((q, d.weights[f"n{i:02d}"]) for i, q in enumerate(queues))
    for (q1, w1), (q2, w2) in itertools.pairwise(pairs):
        if q1 < q2:
            assert w1 >= w2
    assert sum(d.weights.values()) == pytest.approx(1.0, abs=1e-5)
