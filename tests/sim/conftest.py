from __future__ import annotations

from typing import Any

import pytest
from fleetloop.sim.scenario import Scenario, parse_scenario


def small_scenario_dict() -> dict[str, Any]:
    """A tiny two-pool scenario with every fault kind: seconds of wall time under any policy."""
    return {
        "name": "tiny",
        "seed": 11,
        "duration_s": 90,
        "slo": {"ttft_ms": 1000, "tbt_ms": 80},
        "pools": [
            {
                "id": "big",
                "model": "llama-70b",
                "gpu": "H200",
                "nodes": 3,
                "min_nodes": 2,
                "max_nodes": 5,
                "cold_start_s": 30,
            },
            {
                "id": "small",
                "model": "llama-8b",
                "gpu": "L40S",
                "nodes": 3,
                "min_nodes": 2,
                "max_nodes": 6,
                "cold_start_s": 20,
            },
        ],
        "tenants": [{"id": "gold", "priority": 0}, {"id": "free", "priority": 2}],
        "workload": [
            {
                "kind": "copilot",
                "tenant": "gold",
                "rate_per_s": 0.3,
                "calls": [3, 6],
                "prompt_tokens": {"median": 1500, "max": 8000},
                "output_tokens": {"median": 150, "max": 1000},
                "shared_prefix_tokens": 1000,
                "models": ["llama-70b", "llama-8b"],
                "deadline_s": 90,
                "client": {"timeout_s": 10, "max_retries": 2},
            },
            {
                "kind": "chatbot",
                "tenant": "free",
                "rate_per_s": 3.0,
                "calls": [1, 1],
                "prompt_tokens": {"median": 500, "max": 4000},
                "output_tokens": {"median": 150, "max": 1000},
                "models": ["llama-8b"],
                "deadline_s": 45,
                "client": {"timeout_s": 8, "max_retries": 2},
            },
        ],
        "faults": [
            {"at_s": 20, "kind": "degrade", "node": "small/1", "factor": 6.0, "duration_s": 30},
            {"at_s": 40, "kind": "crash", "pool": "big", "count": 1},
            {"at_s": 50, "kind": "preempt", "pool": "small", "count": 1},
            {"at_s": 60, "kind": "load_spike", "factor": 2.0, "duration_s": 15},
        ],
    }


@pytest.fixture
def tiny() -> Scenario:
    return parse_scenario(small_scenario_dict(), "tiny")
