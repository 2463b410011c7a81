from __future__ import annotations

from typing import Any

import pytest
from fleetloop.sim.builder import pool, two_tenant_scenario
from fleetloop.sim.scenario import Scenario, parse_scenario


def small_scenario_dict() -> dict[str, Any]:
    """A tiny two-pool scenario with every fault kind: seconds of wall time under any policy."""
    return two_tenant_scenario(
        "tiny",
        seed=11,
        duration_s=90,
        slo={"ttft_ms": 1000, "tbt_ms": 80},
        pools=[
            pool("big", "llama-70b", "H200", 3, min_nodes=2, max_nodes=5, cold_start_s=30),
            pool("small", "llama-8b", "L40S", 3, min_nodes=2, max_nodes=6, cold_start_s=20),
        ],
        copilot={
            "rate_per_s": 0.3,
            "prompt_tokens": {"median": 1500, "max": 8000},
            "output_tokens": {"median": 150, "max": 1000},
            "models": ["llama-70b", "llama-8b"],
            "deadline_s": 90,
            "client": {"timeout_s": 10, "max_retries": 2},
        },
        chatbot={
            "rate_per_s": 3.0,
            "prompt_tokens": {"median": 500, "max": 4000},
            "output_tokens": {"median": 150, "max": 1000},
            "deadline_s": 45,
        },
        faults=[
            {"at_s": 20, "kind": "degrade", "node": "small/1", "factor": 6.0, "duration_s": 30},
            {"at_s": 40, "kind": "crash", "pool": "big", "count": 1},
            {"at_s": 50, "kind": "preempt", "pool": "small", "count": 1},
            {"at_s": 60, "kind": "load_spike", "factor": 2.0, "duration_s": 15},
        ],
    )


@pytest.fixture
def tiny() -> Scenario:
    return parse_scenario(small_scenario_dict(), "tiny")
