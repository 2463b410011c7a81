"""The ``classic`` baseline document (policies/baselines/classic.yaml) through the real engine:
the anchors' defaults, and the envelope opened so that Envoy's and Kubernetes' own limits bind."""

from __future__ import annotations

from fleetloop.core.decide.engine import EngineState, decide, envelope_of
from fleetloop.policies.autoscale.hpa import DEFAULT_SCALE_DOWN, DEFAULT_SCALE_UP, HpaParams
from fleetloop.policies.base import NodeView
from fleetloop.policies.breaker.envoy_outlier import EnvoyOutlierParams
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import AutoscaleDecision, BreakerDecision, RoutingDecision
from tests.policies.snapshots import NOW_MS, node, nodes, snapshot

CLASSIC = builtin_policy("classic")


def test_sections_and_parameters_are_the_anchors_defaults() -> None:
    names = {section: s.algorithm.name for section, s in CLASSIC.sections.items()}
    assert names == {
        "routing": "least-request-p2c",
        "breaker": "envoy-outlier",
        "admission": "max-pending",
        "retry_budget": "unlimited",
        "autoscale": "hpa",
        "batching": "static-batching",
    }
    assert CLASSIC.sections["breaker"].params == EnvoyOutlierParams()  # spelled out, equal to the defaults
    hpa = CLASSIC.sections["autoscale"].params
    assert isinstance(hpa, HpaParams)
    assert (hpa.target_utilization_pct, hpa.tolerance, hpa.sync_period_ms) == (70, 0.1, 15_000)
    assert (hpa.scale_up, hpa.scale_down) == (DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)
    assert CLASSIC.sections["admission"].params.model_dump() == {"limit": 1024, "classes": 3}
    env = envelope_of(CLASSIC)
    assert env.window_ms == EnvoyOutlierParams().interval_ms  # the window is Envoy's SR bucket
    assert env.max_ejected_frac == 1.0


def tick_all(
    views: list[NodeView], state: EngineState | None = None
) -> tuple[dict[str, object], EngineState]:
    snap = snapshot(views, now_ms=NOW_MS)
    result = decide(snap, CLASSIC, state or EngineState(), Tick(ts_ms=NOW_MS, tick_id=1, pool_id="p"))
    return {d.key: d.body for d in result.decisions}, result.state


def test_envoy_cap_binds_not_the_engines() -> None:
    # 16 nodes, 3 failing: Envoy ejects one (100 * 2 / 16 > 10); the engine demotes nothing.
    views = [node(f"n{i:02d}", consecutive_failures=9 - i, failures_w=9) for i in range(3)] + nodes(
        13, prefix="m"
    )
    bodies, _ = tick_all(views)
    breakers = [b for b in bodies.values() if isinstance(b, BreakerDecision)]
    assert [(b.node_id, b.state, b.enforced, b.reason) for b in breakers if b.state == "open"] == [
        ("n00", "open", True, "consecutive-5xx"),
        ("n01", "open", False, "consecutive-5xx-overflow"),
        ("n02", "open", False, "consecutive-5xx-overflow"),
    ]
    routing = bodies["routing/pool/p"]
    assert isinstance(routing, RoutingDecision)
    assert routing.picker == "least-request-p2c"
    assert routing.weights["n00"] == 0.0
    assert routing.weights["n01"] == routing.weights["m00"] > 0  # detected, not ejected: keeps its share


def test_small_pool_never_ejects() -> None:
    views = [node("n0", consecutive_failures=50, failures_w=50), *nodes(7, prefix="m")]
    bodies, _ = tick_all(views)
    assert not any(
        isinstance(b, BreakerDecision) and b.enforced and b.state == "open" for b in bodies.values()
    )


def test_hpa_rate_policy_binds_not_the_engine_step() -> None:
    # 10 nodes at 100% / 70%: ceil(14.3) = 15, above the engine's default step of 8 but within HPA's
    # max(100%, 4 pods) per 15 s.
    bodies, _ = tick_all(nodes(10, gpu_util_frac=1.0))
    scale = bodies["autoscale/pool/p"]
    assert isinstance(scale, AutoscaleDecision)
    assert (scale.current_nodes, scale.desired_nodes, scale.reason) == (10, 15, "scale-up")
