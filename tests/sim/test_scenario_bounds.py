"""An HPA-based autoscaler in the simulator takes each pool's ``min_nodes``/``max_nodes`` as its
replica bounds (``fleetloop.sim.runner.under_scenario_bounds``): a Kubernetes HPA's bounds are its
scale target's only ones, so it never names a floor node to drain. Named anyway (a file's own
``min_replicas`` below the floor), the simulator kept the node and the router kept it out of
rotation: ``modern`` served on fewer nodes than it paid for."""

from __future__ import annotations

from typing import Any

from fleetloop.policies.autoscale.hpa.params import ReplicaBounds
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.decisions import AutoscaleDecision, Decision
from fleetloop.sim.command import resolve_policy
from fleetloop.sim.runner import run, under_scenario_bounds
from fleetloop.sim.scenario import Scenario, parse_scenario
from tests.sim.conftest import small_scenario_dict


def _calm() -> Scenario:
    """Two pools held at a floor of 3, light load, no faults: an HPA left at 1 wants fewer."""
    d: dict[str, Any] = small_scenario_dict()
    d["duration_s"] = 420  # past the HPA's 300 s scale-down stabilization window
    d["faults"] = []
    for p in d["pools"]:
        p["min_nodes"] = p["nodes"] = 3
    for w in d["workload"]:
        w["rate_per_s"] = w["rate_per_s"] / 4
    return parse_scenario(d, "calm")


def test_an_hpa_baseline_never_names_a_floor_node() -> None:
    scenario = _calm()
    named: list[tuple[str, tuple[str, ...]]] = []

    def on_tick(_: int, decisions: list[Decision]) -> None:
        named.extend(
            (d.body.pool_id, d.body.drain)
            for d in decisions
            if isinstance(d.body, AutoscaleDecision) and d.body.drain
        )

    for name in ("modern", "llm-d", "classic"):
        run(scenario, resolve_policy(None, name), on_tick=on_tick)
        assert named == [], f"{name} named floor nodes: {named[:3]}"


def test_the_scenario_bounds_an_hpa_unless_its_file_bounds_the_pool() -> None:
    scenario = _calm()
    modern = resolve_policy(None, "modern")
    bounded = under_scenario_bounds(modern, scenario)
    params = bounded.sections["autoscale"].params
    assert isinstance(params, ReplicaBounds)
    assert {p: (b.min_replicas, b.max_replicas) for p, b in params.pools.items()} == {
        "big": (3, 5),
        "small": (3, 6),
    }
    # A pool the file bounds keeps the file's bounds.
    data = modern.document.model_dump(mode="json")
    data["spec"]["autoscale"]["params"]["pools"] = {"big": {"min_replicas": 1, "max_replicas": 2}}
    from fleetloop.policies.registry import compile_policy
    from fleetloop.schemas.policy import PolicyDocument

    own = under_scenario_bounds(compile_policy(PolicyDocument.model_validate(data)), scenario)
    pools = own.sections["autoscale"].params.pools  # type: ignore[attr-defined]
    assert (pools["big"].min_replicas, pools["big"].max_replicas) == (1, 2)
    assert (pools["small"].min_replicas, pools["small"].max_replicas) == (3, 6)


def test_other_autoscalers_do_not_learn_the_floor() -> None:
    """slo-predictive runs beside an orchestrator whose floor it may not know: unchanged."""
    default = builtin_policy("default")
    assert under_scenario_bounds(default, _calm()) is default
