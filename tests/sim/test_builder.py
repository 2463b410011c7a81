"""The scenario builder the demo and the test fixtures share (fleetloop.sim.builder)."""

from __future__ import annotations

from fleetloop.sim.builder import CHATBOT, COPILOT, pool, two_tenant_scenario
from fleetloop.sim.scenario import parse_scenario


def test_a_built_scenario_parses_with_only_the_named_fields_changed() -> None:
    doc = two_tenant_scenario(
        "x",
        seed=1,
        duration_s=30,
        slo={"ttft_ms": 1000, "tbt_ms": 80},
        pools=[pool("p", "llama-8b", "L40S", 2, cold_start_s=10, max_nodes=4)],
        copilot={"rate_per_s": 0.1},
    )
    s = parse_scenario(doc, "<test>")
    assert [(p.id, p.nodes, p.min_nodes, p.max_nodes) for p in s.pools] == [("p", 2, 2, 4)]
    copilot, chatbot = doc["workload"]
    assert copilot == {**COPILOT, "rate_per_s": 0.1}
    assert chatbot == CHATBOT
    assert "description" not in doc


def test_each_document_is_fresh_so_a_caller_may_change_it() -> None:
    first = two_tenant_scenario("x", seed=1, duration_s=30, slo={"ttft_ms": 1000}, pools=[])
    first["workload"][0]["prompt_tokens"]["max"] = 1
    first["tenants"][0]["priority"] = 5
    second = two_tenant_scenario("x", seed=1, duration_s=30, slo={"ttft_ms": 1000}, pools=[])
    assert second["workload"][0]["prompt_tokens"] == {"median": 1500, "max": 12000}
    assert COPILOT["prompt_tokens"] == {"median": 1500, "max": 12000}
    assert second["tenants"][0] == {"id": "gold", "priority": 0}
