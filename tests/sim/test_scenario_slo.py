"""The scenario's ``slo`` is the objective the policy runs against, not only the one the
report judges by (one source of truth). The scenario sets the scale, the policy its class shape."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.policies.registry import builtin_policy, load_policy
from fleetloop.policies.slo import restated
from fleetloop.schemas.decisions import AdmissionDecision
from fleetloop.schemas.policy import SloClass, SloSpec, SloTarget
from fleetloop.sim import runner
from fleetloop.sim.fleet import FleetSim
from fleetloop.sim.runner import under_scenario_slo
from fleetloop.sim.scenario import Scenario, parse_scenario
from fleetloop.sim.table import DEFAULT_POLICY
from tests.sim.conftest import small_scenario_dict


def test_restated_takes_the_stated_scale_and_keeps_the_class_shape() -> None:
    spec = SloSpec(
        default=SloTarget(ttft_ms=2000, tbt_ms=100),
        classes=(
            SloClass(priority=0, ttft_ms=2000, tbt_ms=100),
            SloClass(priority=2, ttft_ms=5000, tbt_ms=150),
            SloClass(priority=1, pool="gpu-a", ttft_ms=1000, tbt_ms=50),
        ),
    )
    out = restated(spec, 1000.0, 60.0)
    assert (out.default.ttft_ms, out.default.tbt_ms) == (1000.0, 60.0)
    got = {(c.priority, c.pool): (c.ttft_ms, c.tbt_ms) for c in out.classes}
    assert got == {(0, None): (1000.0, 60.0), (2, None): (2500.0, 90.0), (1, "gpu-a"): (500.0, 30.0)}
    # Clamped into the schema's bounds rather than refused.
    tiny = restated(spec, 60.0, 5.0)
    assert {(c.priority, c.pool): c.ttft_ms for c in tiny.classes}[(1, "gpu-a")] == 50.0


@pytest.mark.parametrize("slo", [{"ttft_ms": 700, "tbt_ms": 40}, {"ttft_ms": 5000, "tbt_ms": 150}])
def test_the_policy_is_compiled_against_the_scenario_slo(slo: dict[str, int]) -> None:
    data = small_scenario_dict()
    data["slo"] = slo
    scenario = parse_scenario(data, "tiny")
    policy = under_scenario_slo(load_policy(DEFAULT_POLICY), scenario)
    assert (policy.slo.default.ttft_ms, policy.slo.default.tbt_ms) == (slo["ttft_ms"], slo["tbt_ms"])
    # default.yaml's priority 2 is 2.5x / 1.5x looser than its default: still so
    p2 = policy.slo.target(2)
    assert (p2.ttft_ms, p2.tbt_ms) == (slo["ttft_ms"] * 2.5, slo["tbt_ms"] * 1.5)
    assert policy.stamp.name == "default"


def test_a_simulated_run_steers_by_the_scenario_slo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the tiny scenario under the default policy and read the SLO every admission decision
    judged latency by: the scenario's (the strictest class served: priority 0's, the default's)."""
    data: dict[str, Any] = small_scenario_dict()
    data["slo"] = {"ttft_ms": 700, "tbt_ms": 40}
    data["duration_s"] = 30
    data["faults"] = []
    scenario: Scenario = parse_scenario(data, "tiny")
    seen: set[tuple[float, float]] = set()
    apply = FleetSim.apply

    def spy(self: FleetSim, decisions: Any) -> None:
        decisions = tuple(decisions)
        for d in decisions:
            if isinstance(d.body, AdmissionDecision) and d.body.pool_id == "big":
                seen.add((d.body.inputs["ttft_slo_ms"], d.body.inputs["tbt_slo_ms"]))
        apply(self, decisions)

    monkeypatch.setattr(FleetSim, "apply", spy)
    runner.run(scenario, load_policy(DEFAULT_POLICY))
    assert seen == {(700.0, 40.0)}  # "big" serves priority 0 calls from the first window on


def test_baselines_without_slo_readers_are_unchanged_but_for_the_stamp() -> None:
    scenario = parse_scenario(small_scenario_dict(), "tiny")
    classic = builtin_policy("classic")
    restated_classic = under_scenario_slo(classic, scenario)
    assert restated_classic.document.spec.routing == classic.document.spec.routing
    assert restated_classic.slo.default.ttft_ms == 1000.0
