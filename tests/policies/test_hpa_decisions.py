"""hpa (the Kubernetes Horizontal Pod Autoscaler on GPU utilization, 70% target): the decision
tables in event time, the properties, and the rate-limit cases PORTED from kubernetes/kubernetes
``pkg/controller/podautoscaler/horizontal_test.go``, each naming its original. The replica
calculator's and the controller's other ported cases, and how a Kubernetes pod is translated to a
node, are in ``test_hpa.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.policies.autoscale.hpa import (
    Hpa,
    HpaParams,
    HpaState,
    ScalingPolicy,
    ScalingRules,
    calculate_replicas,
    replicas_change_per_period,
    scale_down_limit,
    scale_up_limit,
)
from fleetloop.policies.base import NodeView
from fleetloop.schemas.decisions import AutoscaleDecision
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.policies.snapshots import NOW_MS, ctx, node, snapshot

# The two ported limit cases' behavior: 2 pods or 50% a minute, whichever allows less.
MIN_OF_TWO = ScalingRules(
    stabilization_window_s=300,
    select_policy="Min",
    policies=(
        ScalingPolicy(type="Pods", value=2, period_s=60),
        ScalingPolicy(type="Percent", value=50, period_s=60),
    ),
)


def test_calculate_scale_up_limit_with_scaling_rules() -> None:
    # Ported: TestCalculateScaleUpLimitWithScalingRules (select policy Min: the smaller allowance).
    assert scale_up_limit(1, (), (), MIN_OF_TWO, NOW_MS) == 2


def test_calculate_scale_down_limit_with_behaviors() -> None:
    # Ported: TestCalculateScaleDownLimitWithBehaviors (select policy Min).
    assert scale_down_limit(5, (), (), MIN_OF_TWO, NOW_MS) == 3


@pytest.mark.parametrize(
    ("name", "events", "expected"),
    [
        ("empty entries", [], 0),
        ("one outdated entry", [(7, -61)], 0),
        ("one actual entry", [(7, -58)], 7),
        ("two entries, one of them outdated", [(7, -61), (6, -59)], 6),
        (
            "replace one entry, use policies with different periods",
            [(8, -29), (6, -59), (7, -61), (9, -61)],
            14,
        ),
        ("two entries, both actual", [(7, -58), (6, -59)], 13),
    ],
)
def test_store_scale_events_replica_change(name: str, events: list[tuple[int, int]], expected: int) -> None:
    # Ported: TestStoreScaleEvents, its getReplicasChangePerPeriod(60, ...) expectations.
    history = tuple((NOW_MS + age_s * 1000, change) for change, age_s in events)
    assert replicas_change_per_period(60, history, NOW_MS) == expected, name


# --- decision tables: the controller in event time ---------------------------------------------------

PARAMS = HpaParams(min_replicas=1, max_replicas=20)


def run(
    series: list[tuple[int, list[NodeView]]], params: HpaParams = PARAMS, state: HpaState | None = None
) -> list[AutoscaleDecision]:
    """Decide at each (second, nodes) in order, carrying the state; returns the decisions."""
    algo = Hpa()
    st_ = state or algo.initial_state()
    out = []
    for second, views in series:
        snap = snapshot(views, now_ms=NOW_MS + second * 1000)
        result = algo.decide(snap, params, st_, ctx(snap, tick_id=second))
        st_ = result.state
        (d,) = result.decisions
        assert isinstance(d, AutoscaleDecision)
        out.append(d)
    return out


def warm(count: int, util: float, start: int = 0) -> list[NodeView]:
    return [node(f"n{i:02d}", gpu_util_frac=util) for i in range(start, start + count)]


def test_acts_only_every_sync_period_of_event_time() -> None:
    series = [(s, warm(4, 0.7 if s < 5 else 1.0)) for s in range(0, 31)]
    out = run(series)
    assert out[0].reason == "steady"
    assert all(d.reason == "between-syncs" and d.desired_nodes == 4 for d in out[1:15])
    # 100% / 70% of 4 nodes -> ceil(5.71) = 6, within max(100%, 4 pods) per 15 s.
    assert (out[15].desired_nodes, out[15].reason) == (6, "scale-up")
    assert all(d.desired_nodes == 6 for d in out[16:30])
    assert out[30].reason != "between-syncs"


def test_within_tolerance_keeps_the_size() -> None:
    # 0.76 / 0.70 = 1.085 and 0.64 / 0.70 = 0.914: inside 0.1.
    assert run([(0, warm(10, 0.76))])[0].desired_nodes == 10
    assert run([(0, warm(10, 0.64))], state=HpaState(recommendations=()))[0].desired_nodes == 10
    assert run([(0, warm(10, 0.78))])[0].desired_nodes == 12  # 78 / 70 = 1.114 -> ceil(11.14)


def test_scale_up_is_immediate_and_capped_at_max_of_double_or_plus_four() -> None:
    assert (
        run([(0, warm(2, 1.0))], params=HpaParams(target_utilization_pct=10, max_replicas=100))[
            0
        ].desired_nodes
        == 6
    )
    assert (
        run([(0, warm(10, 1.0))], params=HpaParams(target_utilization_pct=10, max_replicas=100))[
            0
        ].desired_nodes
        == 20
    )


def test_scale_down_waits_for_the_300_s_stabilization_window() -> None:
    high = [(s, warm(10, 0.7)) for s in range(0, 61, 15)]
    low = [(s, warm(10, 0.14)) for s in range(75, 421, 15)]
    out = run(high + low)
    sizes = {s: d.desired_nodes for (s, _), d in zip(high + low, out, strict=True)}
    # The last recommendation of 10 (t=60) holds the size while it is less than 300 s old ...
    assert all(sizes[s] == 10 for s in range(0, 346, 15))
    # ... at t=360 it is exactly 300 s old, out of the window (Go: timestamp.After(cutoff)):
    assert sizes[360] == 2  # 14% / 70% of 10 = 2


def test_min_and_max_replicas_and_per_pool_bounds() -> None:
    params = HpaParams(min_replicas=3, max_replicas=8, pools={"p": {"min_replicas": 4, "max_replicas": 6}})
    assert params.bounds("p") == (4, 6)
    assert params.bounds("q") == (3, 8)
    assert run([(0, warm(5, 1.0))], params=params)[0].desired_nodes == 6
    assert run([(0, warm(5, 0.01))], params=params, state=HpaState(recommendations=()))[0].desired_nodes == 4
    with pytest.raises(ValueError, match="min_replicas"):
        HpaParams(min_replicas=9, max_replicas=8)


def test_new_nodes_count_as_unready_zero_during_cold_start() -> None:
    # 4 warm nodes at 100% and 4 still loading weights: scale-up counts the loading ones at 0%,
    # 100 * 4 / 8 = 50% < 70%: a change of direction, so keep 8 (no runaway while nodes warm up).
    views = warm(4, 1.0) + [node(f"n{i:02d}", weights_state="loading") for i in range(4, 8)]
    d = run([(0, views)], state=HpaState(last_desired=8))[0]
    assert (d.desired_nodes, d.inputs["unready_nodes"]) == (8, 4.0)


def test_unready_nodes_weigh_by_their_request_on_scale_up() -> None:
    # With equal requests, counting unready pods at 0% gives the same answer as scaling the ready
    # ones alone; with unequal ones it does not. Two 1-GPU nodes at 100% and a loading 4-GPU node,
    # target 50%: alone, 100 / 50 = 2 -> ceil(2 x 2) = 4; with the loading node at 0%,
    # 2000 / 6000 = 33% < 50% flips the direction: keep 3.
    views = [
        node("a", gpu_util_frac=1.0),
        node("b", gpu_util_frac=1.0),
        node("c", weights_state="loading", gpu_count=4),
    ]
    assert calculate_replicas(views, 3, 50, 0.1).replicas == 3


def test_missing_metrics_are_conservative() -> None:
    # A stale warm node counts 100% on the way down, 0% on the way up.
    down = [*warm(3, 0.1), node("n09", stale=True)]
    assert run([(0, down)], state=HpaState(recommendations=()))[0].desired_nodes == 2
    # Up: 100% / 70% over the 3 reporting nodes would ask ceil(4.29) = 5; with the missing one at
    # 0%, 300 / 4 = 75% / 70% = 1.07 is within tolerance: keep 4.
    up = [*warm(3, 1.0), node("n09", stale=True)]
    assert run([(0, up)])[0].desired_nodes == 4


def test_scale_down_drains_unready_then_newest_first() -> None:
    views = [
        node("a", gpu_util_frac=0.05),
        node("b", gpu_util_frac=0.05),
        node("c", gpu_util_frac=0.05),
        node("d", weights_state="loading"),
        node("e", weights_state="cold"),
    ]
    d = run([(0, views)], state=HpaState(recommendations=()))[0]
    assert d.desired_nodes == 1
    assert d.drain == ("e", "d", "c", "b")
    assert d.current_nodes == 5


def test_no_node_and_draining_nodes() -> None:
    assert run([(0, [])], state=HpaState(last_desired=0))[0].desired_nodes == 0
    # A pool that has reported no node yet is not synced (0 as spec.replicas would disable the HPA):
    # the first sync happens when nodes appear.
    out = run([(0, []), (1, warm(4, 1.0))])
    assert [(d.desired_nodes, d.reason) for d in out] == [(0, "no-nodes-yet"), (6, "scale-up")]
    views = [*warm(2, 0.7), node("z", draining=True)]
    d = run([(0, views)])[0]
    assert (d.current_nodes, d.desired_nodes, d.drain) == (2, 2, ())


def test_state_is_immutable_values() -> None:
    out_state = (
        Hpa().decide(snapshot(warm(3, 0.9)), PARAMS, Hpa().initial_state(), ctx(snapshot(warm(3, 0.9)))).state
    )
    assert isinstance(out_state.recommendations, tuple)
    assert all(isinstance(r, tuple) for r in out_state.recommendations)
    assert isinstance(out_state.scale_up_events, tuple)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=30),
    st.integers(min_value=0, max_value=10),
    st.integers(min_value=1, max_value=40),
    st.integers(min_value=0, max_value=40),
)
def test_targets_stay_within_min_max(utils: list[float], lo: int, span: int, spec: int) -> None:
    params = HpaParams(min_replicas=lo, max_replicas=lo + span)
    views = [node(f"n{i:02d}", gpu_util_frac=u) for i, u in enumerate(utils)]
    d = run([(0, views)], params=params, state=HpaState(last_desired=spec or None))[0]
    current = spec or len(views)
    if current == 0 and lo > 0:
        assert d.desired_nodes == 0
    else:
        assert lo <= d.desired_nodes <= lo + span


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=20),
    st.floats(min_value=1.0, max_value=2.0),
    st.booleans(),
)
def test_monotonic_in_load(utils: list[float], factor: float, initialized: bool) -> None:
    params = HpaParams(min_replicas=0, max_replicas=1000)
    state = HpaState(recommendations=() if initialized else None)
    lighter = [node(f"n{i:02d}", gpu_util_frac=u) for i, u in enumerate(utils)]
    heavier = [node(f"n{i:02d}", gpu_util_frac=min(1.0, u * factor)) for i, u in enumerate(utils)]
    assert (
        run([(0, lighter)], params, state)[0].desired_nodes
        <= run([(0, heavier)], params, state)[0].desired_nodes
    )


_policies = st.builds(
    ScalingPolicy,
    type=st.sampled_from(["Pods", "Percent"]),
    value=st.integers(1, 400),
    period_s=st.integers(1, 120),
)
_events = st.lists(st.tuples(st.integers(NOW_MS - 200_000, NOW_MS), st.integers(1, 50)), max_size=6)


@settings(max_examples=400, deadline=None)
@given(
    st.integers(0, 500),
    _events,
    _events,
    st.sampled_from(["Max", "Min", "Disabled"]),
    st.lists(_policies, max_size=4),
)
def test_both_directions_rate_limits_are_kubernetes_two_functions(
    current: int, up: list[Any], down: list[Any], select: Any, policies: list[ScalingPolicy]
) -> None:
    """One function of the direction gives what Kubernetes' two functions give, for every select
    policy, policy type, period and history (``tests/oracles/hpa.py`` states the two)."""
    from tests.oracles import hpa as oracle

    rules = ScalingRules(stabilization_window_s=0, select_policy=select, policies=tuple(policies))
    assert scale_up_limit(current, up, down, rules, NOW_MS) == oracle.scale_up_limit(
        current, up, down, rules, NOW_MS
    )
    assert scale_down_limit(current, up, down, rules, NOW_MS) == oracle.scale_down_limit(
        current, up, down, rules, NOW_MS
    )
