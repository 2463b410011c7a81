"""llm-d-epp routing and keda-epp autoscaling: the ``llm-d`` baseline's two algorithms.

- Routing publishes an equal share per warm node (every ready pod is a candidate of llm-d's
  InferencePool) and names the ``llm-d-epp`` picker; the per-call scoring is the router's
  (tests/router/test_epp.py).
- keda-epp: llm-d's KEDA ScaledObject (guides/workload-autoscaling/keda-epp, the k8s-queue leaf):
  ``epp-queue-size`` AverageValue 1 and ``epp-running-requests`` AverageValue 16, the larger count
  wins (HPA ``computeReplicasForMetrics``), each ``ceil(total / target)`` unless within the 0.1
  tolerance (``GetExternalPerPodMetricReplicas``). The flow-control queue is read as what an engine
  queues beyond the saturation detector's 5 waiting, the running requests as the rest.
"""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.policies.autoscale.hpa import HpaState
from fleetloop.policies.autoscale.keda_epp import KedaEpp, KedaEppParams, epp_replicas
from fleetloop.policies.base import NodeView
from fleetloop.policies.registry import builtin_policy
from fleetloop.policies.routing.llm_d import LlmDEpp, LlmDParams
from fleetloop.schemas.decisions import AutoscaleDecision, RoutingDecision
from tests.policies.snapshots import NOW_MS, ctx, node, snapshot


def route(*views: NodeView) -> RoutingDecision:
    snap = snapshot(views)
    (d,) = LlmDEpp().decide(snap, LlmDParams(), None, ctx(snap)).decisions
    assert isinstance(d, RoutingDecision)
    return d


@pytest.mark.parametrize(
    ("views", "expected"),
    [
        ([node("a", queue_depth=0), node("b", queue_depth=50)], {"a": 0.5, "b": 0.5}),
        (
            [node("a"), node("b", weights_state="loading"), node("c", draining=True)],
            {"a": 1.0, "b": 0.0, "c": 0.0},
        ),
        ([node("a", weights_state="cold")], {"a": 0.0}),
    ],
)
def test_routing_decision_table(views: list[NodeView], expected: dict[str, float]) -> None:
    d = route(*views)
    assert d.weights == expected
    assert d.picker == "llm-d-epp"
    assert not d.prefix_affinity  # the EPP keeps its own index
    assert not d.spill_to
    assert not d.by_priority


def test_routing_reason() -> None:
    assert route(node("a")).reason == "llm-d-epp"
    assert route(node("a", weights_state="loading")).reason == "no-warm-node"


def _nodes(waiting: list[int], running: list[int], **fields: Any) -> list[NodeView]:
    return [
        node(f"n{i}", queue_depth=q, running_requests=r, **fields)
        for i, (q, r) in enumerate(zip(waiting, running, strict=True))
    ]


@pytest.mark.parametrize(
    ("waiting", "running", "current", "expected", "why"),
    [
        ([0, 0, 0, 0], [0, 0, 0, 0], 4, 0, "idle: both triggers propose 0 (the minimum applies later)"),
        ([0, 0, 0, 0], [16, 16, 16, 16], 4, 4, "64 running = 16 x 4: on target, keep"),
        ([0, 0, 0, 0], [20, 20, 20, 20], 4, 5, "80 running / 16 = 5 (ratio 1.25)"),
        ([5, 5, 5, 5], [11, 11, 11, 11], 4, 4, "waiting up to 5 counts as running: 64 / 16 = 4, on target"),
        ([5, 5, 5, 5], [14, 14, 14, 14], 4, 5, "76 running / 16 -> 5; nothing held"),
        ([9, 5, 5, 5], [0, 0, 0, 0], 4, 4, "4 held -> 4 replicas; 20 running -> 2; max 4"),
        ([30, 0, 0, 0], [16, 0, 0, 0], 4, 25, "25 held beyond the engine's 5: 25 replicas by queue"),
        ([6, 6, 6, 6], [16, 16, 16, 16], 4, 6, "4 held -> 4 (ratio 1: keep 4); 84 running -> 6"),
        ([1, 0, 0, 0], [0, 0, 0, 0], 1, 1, "1 running: ceil(1 / 16) = 1"),
    ],
)
def test_epp_replicas_table(
    waiting: list[int], running: list[int], current: int, expected: int, why: str
) -> None:
    got, inputs = epp_replicas(_nodes(waiting, running), current, KedaEppParams())
    assert got == expected, why
    assert inputs["epp_queue"] == sum(max(0, q - 5) for q in waiting)
    assert inputs["epp_running"] == sum(r + min(q, 5) for q, r in zip(waiting, running, strict=True))


def test_cold_stale_and_draining_nodes_report_no_metrics() -> None:
    ns = [
        node("a", queue_depth=10, running_requests=16),
        node("b", queue_depth=100, weights_state="loading"),
        node("c", queue_depth=100, stale=True),
        node("d", queue_depth=100, draining=True),
    ]
    got, inputs = epp_replicas(ns, 3, KedaEppParams())
    assert inputs["ready_nodes"] == 1
    assert got == 5  # 5 held -> 5; 21 running -> 2
    assert epp_replicas([ns[1], ns[2]], 3, KedaEppParams())[0] is None  # no ready node: keep


def _decide(ns: list[NodeView], state: HpaState, now_ms: int) -> tuple[AutoscaleDecision, HpaState]:
    policy = builtin_policy("llm-d").sections["autoscale"]
    assert isinstance(policy.params, KedaEppParams)
    snap = snapshot(ns, now_ms=now_ms)
    result = KedaEpp().decide(snap, policy.params, state, ctx(snap, now_ms=now_ms))
    (d,) = result.decisions
    assert isinstance(d, AutoscaleDecision)
    return d, result.state


def test_llm_d_behavior_doubles_at_most_every_15_s_and_holds_300_s_before_scaling_down() -> None:
    hot = _nodes([25, 25], [16, 16])  # 40 held -> 40
    d, state = _decide(hot, HpaState(), NOW_MS)
    assert d.desired_nodes == 4  # Percent 100 per 15 s, no Pods 4 policy: 2 -> 4
    d, state = _decide(_nodes([25] * 4, [16] * 4), state, NOW_MS + 15_000)
    assert d.desired_nodes == 8
    idle = _nodes([0] * 8, [0] * 8)
    t = NOW_MS + 15_000
    for _ in range(19):  # 285 s of idle syncs: the 300 s scale-down window holds 8
        t += 15_000
        d, state = _decide(idle, state, t)
        assert d.desired_nodes == 8, t - NOW_MS
    t += 30_000
    d, state = _decide(idle, state, t)
    assert d.desired_nodes == 1  # Percent 100 per 15 s lets every surplus pod go at once, to min 1


def test_llm_d_baseline_differs_from_modern_in_routing_breaker_and_autoscale_only() -> None:
    llm_d = builtin_policy("llm-d").document.model_dump(mode="json")["spec"]
    modern = builtin_policy("modern").document.model_dump(mode="json")["spec"]
    assert llm_d["routing"] == {"type": "llm-d-epp", "params": {}, "mode": None}
    assert llm_d["autoscale"]["type"] == "keda-epp"
    assert llm_d["breaker"]["type"] == "never"
    for section in ("admission", "retry_budget", "batching"):
        assert llm_d[section] == modern[section], section
    assert llm_d["envelope"] == modern["envelope"]
