"""hpa: the Kubernetes Horizontal Pod Autoscaler on GPU utilization (70% target).

Decision tables and properties in our terms, and cases PORTED from kubernetes/kubernetes
``pkg/controller/podautoscaler/replica_calculator_test.go`` and ``horizontal_test.go``, each naming
its original. Translation: a node is a pod; its ``gpu_util_frac`` is the pod's usage over its
request (``gpu_count`` GPUs = the request, so unequal requests are whole multiples); a node not warm
is a pod that is Pending or not Ready; a warm node with stale telemetry is a pod with no metric; a
draining node is a pod being deleted (or Failed). ``specReplicas`` is the HPA state's
``last_desired``; a test's ``recommendations: []`` is an initialized empty history (``()``), ``nil``
is a fresh HPA (``None``), which records the current size first (``recordInitialRecommendation``).

Our utilization is a fraction of the request, so it cannot exceed 100%: cases whose levels go above
the request are ported with the target scaled by the same factor (the ratio, which is all the
algorithm uses, is unchanged) and say so. Cases with fractional unequal requests (0.9, 1.0, 1.1) are
ported with equal requests: the calculator uses only the totals, which are the same. Not ported:
custom, object and external metrics, container metrics, CPU start-up heuristics ("hot CPU"),
superfluous and disjoint metrics (a node with telemetry is always in its pool), events and status
conditions text, and the legacy no-``behavior`` normalization.
"""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.policies.autoscale.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    Calculation,
    Hpa,
    HpaParams,
    HpaState,
    ScalingPolicy,
    ScalingRules,
    calculate_replicas,
    limit_rate,
    stabilize,
)
from fleetloop.policies.base import NodeView
from fleetloop.schemas.decisions import AutoscaleDecision
from tests.policies.snapshots import NOW_MS, ctx, node, snapshot

MIN = 60_000


def pods(
    levels: list[float],
    count: int | None = None,
    *,
    ready: list[bool] | None = None,
    phase: list[str] | None = None,
    deleted: list[bool] | None = None,
    gpus: list[int] | None = None,
) -> list[NodeView]:
    """Kubernetes test pods as nodes: ``levels[i]`` is pod i's usage / request; pods past the
    levels have no metric (stale); ``ready`` False or ``phase`` "Pending" = not warm;
    ``phase`` "Failed" or ``deleted`` = draining."""
    n = count if count is not None else len(levels)
    out = []
    for i in range(n):
        pending = phase is not None and phase[i] == "Pending"
        unready = ready is not None and not ready[i]
        gone = (phase is not None and phase[i] == "Failed") or (deleted is not None and deleted[i])
        out.append(
            node(
                f"pod-{i}",
                gpu_util_frac=levels[i] if i < len(levels) else 0.0,
                stale=i >= len(levels),
                weights_state="cold" if pending else "loading" if unready else "warm",
                draining=gone,
                gpu_count=gpus[i] if gpus else 1,
            )
        )
    return out


def calc(levels: list[float], current: int, target: int, **kw: Any) -> Calculation:
    count = kw.pop("count", None)
    return calculate_replicas(pods(levels, count, **kw), current, target, 0.1)


def controller(
    levels: list[float],
    *,
    spec: int,
    target: int,
    min_replicas: int,
    max_replicas: int,
    recommendations: tuple[tuple[int, int], ...] | None = None,
    count: int | None = None,
    **kw: Any,
) -> AutoscaleDecision:
    """One reconcile of ``HorizontalController`` (testCase.runTest) for a pool of these pods."""
    snap = snapshot(pods(levels, count, **kw))
    params = HpaParams(target_utilization_pct=target, min_replicas=min_replicas, max_replicas=max_replicas)
    state = HpaState(last_desired=spec, recommendations=recommendations)
    (d,) = Hpa().decide(snap, params, state, ctx(snap)).decisions
    assert isinstance(d, AutoscaleDecision)
    return d


# --- ported from kubernetes/kubernetes pkg/controller/podautoscaler/replica_calculator_test.go ------


@pytest.mark.parametrize(
    ("origin", "levels", "current", "target", "kw", "replicas", "utilization"),
    [
        ("TestReplicaCalcScaleUp", [0.3, 0.5, 0.7], 3, 30, {}, 5, 50),
        (
            "TestReplicaCalcScaleUpUnreadyLessScale",
            [0.3, 0.5, 0.7],
            3,
            30,
            {"ready": [False, True, True]},
            4,
            60,
        ),
        (
            "TestReplicaCalcScaleUpUnreadyNoScale",
            [0.4, 0.5, 0.7],
            3,
            30,
            {"ready": [True, False, False]},
            3,
            40,
        ),
        (
            "TestReplicaCalcScaleUpIgnoresFailedPods",
            [0.5, 0.7],
            2,
            30,
            {
                "count": 4,
                "ready": [True, True, False, False],
                "phase": ["Running", "Running", "Failed", "Failed"],
            },
            4,
            60,
        ),
        (
            "TestReplicaCalcScaleUpIgnoresDeletionPods",
            [0.5, 0.7],
            2,
            30,
            {"count": 4, "ready": [True, True, False, False], "deleted": [False, False, True, True]},
            4,
            60,
        ),
        ("TestReplicaCalcScaleDown", [0.1, 0.3, 0.5, 0.25, 0.25], 5, 50, {}, 3, 28),
        (
            "TestReplicaCalcScaleDownExcludeUnreadyPods",
            [0.1, 0.3, 0.5, 0.25, 0.25],
            5,
            50,
            {"ready": [True, True, True, False, False]},
            2,
            30,
        ),
        (
            "TestReplicaCalcScaleDownExcludeUnscheduledPods",
            [0.1],
            5,
            50,
            {"count": 5, "phase": ["Running", "Pending", "Pending", "Pending", "Pending"]},
            1,
            10,
        ),
        (
            "TestReplicaCalcScaleDownIgnoresFailedPods",
            [0.1, 0.3, 0.5, 0.25, 0.25],
            5,
            50,
            {"count": 7, "phase": ["Running"] * 5 + ["Failed"] * 2},
            3,
            28,
        ),
        (
            "TestReplicaCalcScaleDownIgnoresDeletionPods",
            [0.1, 0.3, 0.5, 0.25, 0.25],
            5,
            50,
            {"count": 7, "deleted": [False] * 5 + [True] * 2},
            3,
            28,
        ),
        # Ported with equal requests (0.9/1.0/1.1 sum to the same 3.0) and levels halved with the
        # target (102% of 100 -> 51% of 50): the ratio 1.02 is inside the 0.1 tolerance.
        ("TestReplicaCalcTolerance", [0.505, 0.515, 0.51], 3, 50, {}, 3, 51),
        ("TestReplicaCalcMissingMetrics", [0.4, 0.095], 4, 100, {"count": 4}, 3, 24),
        ("TestReplicaCalcMissingMetricsNoChangeEq", [1.0], 2, 100, {"count": 2}, 2, 100),
        # Ported with the target halved (level 1900 of 1000 -> 0.95 of a 50 target).
        ("TestReplicaCalcMissingMetricsNoChangeGt", [0.95], 2, 50, {"count": 2}, 2, 95),
        ("TestReplicaCalcMissingMetricsNoChangeLt", [0.6], 2, 100, {"count": 2}, 2, 60),
        (
            "TestReplicaCalcMissingMetricsUnreadyChange",
            [0.1, 0.45],
            3,
            50,
            {"count": 3, "ready": [False, True, True]},
            3,
            45,
        ),
        # Ported with the target halved (level 2000 of 1000 -> 1.0 of a 25 target).
        (
            "TestReplicaCalcMissingMetricsUnreadyScaleUp",
            [0.05, 1.0],
            3,
            25,
            {"count": 3, "ready": [False, True, True]},
            4,
            100,
        ),
        (
            "TestReplicaCalcMissingMetricsUnreadyScaleDown",
            [0.1, 0.1, 0.1],
            4,
            50,
            {"count": 4, "ready": [False, True, True, True]},
            3,
            10,
        ),
        # Requests 1.0, 1.0, 2.0, 2.0 are 1, 1, 2, 2 GPUs; level 100 of a 2.0 request is 0.05.
        (
            "TestReplicaCalcMissingMetricsScaleDownTargetOver100",
            [0.2, 0.1, 0.05],
            4,
            300,
            {"count": 4, "ready": [False, True, True, True], "gpus": [1, 1, 2, 2]},
            2,
            6,
        ),
        ("TestReplicaCalcDuringRollingUpdateWithMaxSurge", [0.1, 0.1], 2, 50, {"count": 3}, 2, 10),
    ],
)
def test_replica_calculator_ported(
    origin: str,
    levels: list[float],
    current: int,
    target: int,
    kw: dict[str, Any],
    replicas: int,
    utilization: int,
) -> None:
    result = calc(levels, current, target, **kw)
    assert (result.replicas, result.utilization_pct) == (replicas, utilization), origin


def test_replica_calc_empty_metrics() -> None:
    # Ported: TestReplicaCalcEmptyMetrics: no pod has a metric -> an error, no replica count.
    assert calc([], 4, 100, count=3).replicas is None


def test_replica_calc_computed_tolerance_alg_implementation() -> None:
    # Ported: TestReplicaCalcComputedToleranceAlgImplementation, with equal requests (the totals,
    # 1500 m used of 3000 m requested, are the original's): a target just outside the tolerance
    # scales 10 -> 9, one a hair inside keeps 10.
    levels = [0.5] * 10
    target = int((abs(1 / (2.0 * (1 - 0.1))) + 0.01) * 100)
    final = -(-1500 * 100 * 10 // (3000 * target))  # ceil(resourcesUsedRatio * startPods)
    assert calc(levels, 10, target).replicas == final == 9
    target = int((abs(1 / (2.0 * (1 - 0.1))) + 0.004) * 100)
    assert calc(levels, 10, target).replicas == 10


# --- ported from kubernetes/kubernetes pkg/controller/podautoscaler/horizontal_test.go --------------


@pytest.mark.parametrize(
    ("origin", "levels", "setup", "expected"),
    [
        ("TestScaleUp", [0.3, 0.5, 0.7], {"spec": 3, "target": 30, "min_replicas": 2, "max_replicas": 6}, 5),
        (
            "TestScaleUpUnreadyLessScale",
            [0.3, 0.5, 0.7],
            {"spec": 3, "target": 30, "min_replicas": 2, "max_replicas": 6, "ready": [False, True, True]},
            4,
        ),
        (
            "TestScaleUpUnreadyNoScale",
            [0.4, 0.5, 0.7],
            {"spec": 3, "target": 30, "min_replicas": 2, "max_replicas": 6, "ready": [True, False, False]},
            3,
        ),
        (
            "TestScaleUpIgnoresFailedPods",
            [0.5, 0.7],
            {
                "spec": 2,
                "target": 30,
                "min_replicas": 2,
                "max_replicas": 6,
                "count": 4,
                "ready": [True, True, False, False],
                "phase": ["Running", "Running", "Failed", "Failed"],
            },
            4,
        ),
        (
            "TestScaleUpIgnoresDeletionPods",
            [0.5, 0.7],
            {
                "spec": 2,
                "target": 30,
                "min_replicas": 2,
                "max_replicas": 6,
                "count": 4,
                "ready": [True, True, False, False],
                "deleted": [False, False, True, True],
            },
            4,
        ),
        (
            "TestScaleDown",
            [0.1, 0.3, 0.5, 0.25, 0.25],
            {"spec": 5, "target": 50, "min_replicas": 2, "max_replicas": 6, "recommendations": ()},
            3,
        ),
        (
            "TestScaleDownIncludeUnreadyPods",
            [0.1, 0.3, 0.5, 0.25, 0.25],
            {
                "spec": 5,
                "target": 50,
                "min_replicas": 2,
                "max_replicas": 6,
                "recommendations": (),
                "ready": [True, True, True, False, False],
            },
            2,
        ),
        (
            "TestScaleDownIgnoresFailedPods",
            [0.1, 0.3, 0.5, 0.25, 0.25],
            {
                "spec": 5,
                "target": 50,
                "min_replicas": 2,
                "max_replicas": 6,
                "recommendations": (),
                "count": 7,
                "phase": ["Running"] * 5 + ["Failed"] * 2,
            },
            3,
        ),
        (
            "TestScaleDownIgnoresDeletionPods",
            [0.1, 0.3, 0.5, 0.25, 0.25],
            {
                "spec": 5,
                "target": 50,
                "min_replicas": 2,
                "max_replicas": 6,
                "recommendations": (),
                "count": 7,
                "deleted": [False] * 5 + [True] * 2,
            },
            3,
        ),
        # Ported with equal requests and levels halved with the target (see module docstring).
        (
            "TestTolerance",
            [0.505, 0.515, 0.51],
            {"spec": 3, "target": 50, "min_replicas": 1, "max_replicas": 5},
            3,
        ),
        (
            "TestMinReplicas",
            [0.01, 0.095, 0.01],
            {"spec": 3, "target": 90, "min_replicas": 2, "max_replicas": 5, "recommendations": ()},
            2,
        ),
        (
            "TestZeroMinReplicasDesiredZero",
            [0.0, 0.0, 0.0],
            {"spec": 3, "target": 90, "min_replicas": 0, "max_replicas": 5, "recommendations": ()},
            0,
        ),
        (
            "TestMinReplicasDesiredZero",
            [0.0, 0.0, 0.0],
            {"spec": 3, "target": 90, "min_replicas": 2, "max_replicas": 5, "recommendations": ()},
            2,
        ),
        ("TestZeroReplicas", [], {"spec": 0, "target": 90, "min_replicas": 3, "max_replicas": 5}, 0),
        ("TestTooFewReplicas", [], {"spec": 2, "target": 90, "min_replicas": 3, "max_replicas": 5}, 3),
        ("TestTooManyReplicas", [], {"spec": 10, "target": 90, "min_replicas": 3, "max_replicas": 5}, 5),
        # Ported with the target scaled by 1/9 (levels 8000, 9500, 1000 of 1000 -> 0.8, 0.95, 0.1 of 10).
        (
            "TestMaxReplicas",
            [0.8, 0.95, 0.1],
            {"spec": 3, "target": 10, "min_replicas": 2, "max_replicas": 5},
            5,
        ),
        (
            "TestMissingMetrics",
            [0.4, 0.095],
            {
                "spec": 4,
                "target": 100,
                "min_replicas": 2,
                "max_replicas": 6,
                "recommendations": (),
                "count": 4,
            },
            3,
        ),
        (
            "TestEmptyMetrics",
            [],
            {"spec": 4, "target": 100, "min_replicas": 2, "max_replicas": 6, "count": 4},
            4,
        ),
        # A fresh HPA records the current size as its first recommendation: no scale-down yet.
        (
            "TestScaleDownStabilizeInitialSize",
            [0.1, 0.3, 0.5, 0.25, 0.25],
            {"spec": 5, "target": 50, "min_replicas": 2, "max_replicas": 6, "recommendations": None},
            5,
        ),
    ],
)
def test_horizontal_controller_ported(
    origin: str, levels: list[float], setup: dict[str, Any], expected: int
) -> None:
    assert controller(levels, **setup).desired_nodes == expected, origin


def test_reasons_of_ported_controller_cases() -> None:
    # The status conditions of TestScaleDownStabilizeInitialSize (ScaleDownStabilized),
    # TestMinReplicas (TooFewReplicas), TestMaxReplicas (TooManyReplicas), TestZeroReplicas
    # (ScalingDisabled) and TestEmptyMetrics (FailedGetResourceMetric), as our reason codes.
    base = [0.1, 0.3, 0.5, 0.25, 0.25]
    assert (
        controller(base, spec=5, target=50, min_replicas=2, max_replicas=6).reason == "scale-down-stabilized"
    )
    low = [0.01, 0.095, 0.01]
    assert controller(low, spec=3, target=90, min_replicas=2, max_replicas=5, recommendations=()).reason == (
        "too-few-replicas"
    )
    high = [0.8, 0.95, 0.1]
    assert controller(high, spec=3, target=10, min_replicas=2, max_replicas=5).reason == "too-many-replicas"
    assert controller([], spec=0, target=90, min_replicas=3, max_replicas=5).reason == "scaling-disabled"
    assert controller([], spec=4, target=100, min_replicas=2, max_replicas=6, count=4).reason == "no-metrics"


def _rules(pods: int, pods_period: int, percent: int, percent_period: int, window: int) -> ScalingRules:
    """horizontal_test.go ``generateScalingRules`` (select policy Max)."""
    policies = []
    if pods:
        policies.append(ScalingPolicy(type="Pods", value=pods, period_s=pods_period))
    if percent:
        policies.append(ScalingPolicy(type="Percent", value=percent, period_s=percent_period))
    return ScalingRules(stabilization_window_s=window, select_policy="Max", policies=tuple(policies))


def _uniform(changes: list[int], period_s: int) -> tuple[tuple[int, int], ...]:
    """horizontal_test.go ``generateEventsUniformDistribution``: events centred in equal segments
    of the last ``period_s`` seconds, oldest first."""
    seg = period_s / len(changes)
    return tuple(
        (NOW_MS - int((period_s - seg * (i + 1) + seg / 2) * 1000), change)
        for i, change in enumerate(changes)
    )


E = _uniform([1, 5, 9], 120)


@pytest.mark.parametrize(
    (
        "name",
        "current",
        "desired",
        "lo",
        "hi",
        "up",
        "down",
        "up_events",
        "down_events",
        "expected",
        "condition",
    ),
    [
        (
            "prenormalized desired replicas within range",
            5,
            7,
            3,
            8,
            None,
            None,
            (),
            (),
            7,
            "DesiredWithinRange",
        ),
        ("prenormalized desired replicas < minReplicas", 3, 1, 2, 8, None, None, (), (), 2, "TooFewReplicas"),
        ("within range when minReplicas is 0", 1, 0, 0, 10, None, None, (), (), 0, "DesiredWithinRange"),
        (
            "maxReplicas is the limit because maxReplicas < scaleUpLimit",
            20,
            1000,
            1,
            10,
            None,
            None,
            (),
            (),
            10,
            "TooManyReplicas",
        ),
        (
            "desired replica count is more than the maximum replica count",
            100,
            1000,
            100,
            150,
            None,
            None,
            (),
            (),
            150,
            "TooManyReplicas",
        ),
        (
            "scaleUpLimit < maxReplicas with user policies",
            3,
            1000,
            1,
            2000,
            _rules(0, 0, 1, 60, 0),
            None,
            (),
            (),
            4,
            "ScaleUpLimit",
        ),
        ("scaleUp with default behavior", 10, 50, 1, 1000, None, None, (), (), 20, "ScaleUpLimit"),
        (
            "scaleUp with pods policy larger than percent policy",
            10,
            500,
            1,
            1000,
            _rules(100, 60, 100, 60, 0),
            None,
            (),
            (),
            110,
            "ScaleUpLimit",
        ),
        (
            "scaleUp with percent policy larger than pods policy",
            10,
            500,
            1,
            1000,
            _rules(2, 60, 100, 60, 0),
            None,
            (),
            (),
            20,
            "ScaleUpLimit",
        ),
        (
            "scaleUp with pod policy limitation",
            10,
            50,
            1,
            1000,
            _rules(30, 60, 0, 0, 0),
            None,
            (),
            (),
            40,
            "ScaleUpLimit",
        ),
        (
            "scaleUp with percent policy limitation",
            10,
            50,
            1,
            1000,
            _rules(0, 0, 200, 60, 0),
            None,
            (),
            (),
            30,
            "ScaleUpLimit",
        ),
        (
            "scaleDown with percent policy larger than pod policy",
            100,
            2,
            1,
            1000,
            None,
            _rules(20, 60, 1, 60, 300),
            (),
            (),
            80,
            "ScaleDownLimit",
        ),
        (
            "scaleDown with pod policy larger than percent policy",
            100,
            2,
            1,
            1000,
            None,
            _rules(2, 60, 1, 60, 300),
            (),
            (),
            98,
            "ScaleDownLimit",
        ),
        (
            "scaleDown with spec MinReplicas limitation with large percent policy",
            10,
            2,
            5,
            1000,
            None,
            _rules(0, 0, 100, 60, 300),
            (),
            (),
            5,
            "TooFewReplicas",
        ),
        (
            "scaleDown with pod policy limitation",
            10,
            2,
            1,
            1000,
            None,
            _rules(5, 60, 0, 0, 300),
            (),
            (),
            5,
            "ScaleDownLimit",
        ),
        (
            "scaleUp with spec MaxReplicas limitation with large pod policy and events",
            100,
            500,
            1,
            200,
            _rules(300, 60, 0, 0, 0),
            None,
            E,
            (),
            200,
            "TooManyReplicas",
        ),
        (
            "scaleUp with currentReplicas limitation with rate.PeriodSeconds with a lot of recent scale up"
            " events",
            100,
            500,
            1,
            1000,
            _rules(5, 120, 0, 0, 0),
            None,
            E,
            (),
            100,
            "ScaleUpLimit",
        ),
        (
            "scaleUp with pod policy and previous scale up events",
            100,
            500,
            1,
            1000,
            _rules(150, 120, 0, 0, 0),
            None,
            E,
            (),
            235,
            "ScaleUpLimit",
        ),
        (
            "scaleUp with percent policy and previous scale up events",
            100,
            500,
            1,
            1000,
            _rules(0, 0, 200, 120, 0),
            None,
            E,
            (),
            255,
            "ScaleUpLimit",
        ),
        (
            "scaleDown with default policy and previous events",
            10,
            5,
            1,
            1000,
            None,
            None,
            (),
            E,
            5,
            "DesiredWithinRange",
        ),
        (
            "scaleDown with pod policy limitation and previous events",
            100,
            2,
            1,
            1000,
            None,
            _rules(5, 120, 0, 0, 300),
            (),
            E,
            100,
            "ScaleDownLimit",
        ),
        (
            "scaleDown with percent policy limitation and previous events",
            100,
            0,
            1,
            1000,
            None,
            _rules(0, 0, 50, 120, 300),
            (),
            _uniform([2, 4, 6], 120),
            56,
            "ScaleDownLimit",
        ),
        (
            "scaleDown with previous events preventing further scale down",
            100,
            0,
            1,
            1000,
            None,
            _rules(0, 0, 10, 120, 300),
            (),
            _uniform([10, 10, 10], 120),
            100,
            "ScaleDownLimit",
        ),
        (
            "scaleDown with with previous events still allowing more scale down",
            10,
            5,
            1,
            1000,
            None,
            _rules(0, 0, 1000, 120, 300),
            (),
            _uniform([10, 10, 10], 120),
            5,
            "DesiredWithinRange",
        ),
        (
            "check that events were marked 'outdated' for two different policies in the behavior for up",
            100,
            200,
            1,
            1000,
            _rules(1000, 30, 100, 60, 0),
            None,
            _uniform([8, 12, 9, 11], 120),
            (),
            200,
            "DesiredWithinRange",
        ),
    ],
)
def test_scaling_with_rules(
    name: str,
    current: int,
    desired: int,
    lo: int,
    hi: int,
    up: ScalingRules | None,
    down: ScalingRules | None,
    up_events: tuple[tuple[int, int], ...],
    down_events: tuple[tuple[int, int], ...],
    expected: int,
    condition: str,
) -> None:
    # Ported: TestScalingWithRules (convertDesiredReplicasWithBehaviorRate); a nil rule set is the
    # generated default (GenerateHPAScaleUpRules / GenerateHPAScaleDownRules).
    got = limit_rate(
        current,
        desired,
        min_replicas=lo,
        max_replicas=hi,
        up=up_events,
        down=down_events,
        up_rules=up or DEFAULT_SCALE_UP,
        down_rules=down or DEFAULT_SCALE_DOWN,
        now_ms=NOW_MS,
    )
    assert got == (expected, condition), name


@pytest.mark.parametrize(
    ("name", "recs", "current", "desired", "up_s", "down_s", "expected", "stored"),
    [
        ("empty recommendations for scaling down", [], 100, 5, 0, 0, 5, [5]),
        ("simple scale down stabilization", [(4, -2 * MIN), (5, -1 * MIN)], 100, 3, 0, 180, 5, [4, 5, 3]),
        ("simple scale up stabilization", [(4, -2 * MIN), (5, -1 * MIN)], 1, 7, 300, 0, 4, [4, 5, 7]),
        ("no scale down stabilization", [(1, -2 * MIN), (2, -1 * MIN)], 100, 3, 300, 0, 3, [1, 2, 3]),
        ("no scale up stabilization", [(4, -2 * MIN), (5, -1 * MIN)], 1, 3, 0, 300, 3, [4, 5, 3]),
        (
            "no scale down stabilization, reuse recommendation element",
            [(10, -10 * MIN), (9, -9 * MIN)],
            100,
            3,
            0,
            0,
            3,
            [10, 3],
        ),
        (
            "no scale up stabilization, reuse recommendation element",
            [(10, -10 * MIN), (9, -9 * MIN)],
            1,
            100,
            0,
            0,
            100,
            [10, 100],
        ),
        (
            "scale down stabilization, reuse one of obsolete recommendation element",
            [(10, -10 * MIN), (4, -1 * MIN), (5, -2 * MIN), (9, -9 * MIN)],
            100,
            3,
            0,
            180,
            5,
            [10, 4, 5, 3],
        ),
        (
            "scale up stabilization, reuse one of obsolete recommendation element",
            [(10, -100 * MIN), (6, -1 * MIN), (5, -2 * MIN), (9, -3 * MIN)],
            1,
            100,
            300,
            0,
            5,
            [100, 6, 5, 9],
        ),
    ],
)
def test_normalize_desired_replicas_with_behavior(
    name: str,
    recs: list[tuple[int, int]],
    current: int,
    desired: int,
    up_s: int,
    down_s: int,
    expected: int,
    stored: list[int],
) -> None:
    # Ported: TestNormalizeDesiredReplicasWithBehavior (stabilizeRecommendationWithBehaviors).
    history = tuple((NOW_MS + age, value) for value, age in recs)
    got, new = stabilize(
        history, desired, current, now_ms=NOW_MS, up_window_ms=up_s * 1000, down_window_ms=down_s * 1000
    )
    assert got == expected, name
    assert [value for _, value in new] == stored, name
