"""On the stack bench's fleet (llama-70b on four L40S, an idle step of ~68 ms against a 50 ms TBT
target) the default policy sizes its pool as `llm-d` does, not to its maximum: slo-predictive does
not read a TBT target no node count reaches (fleetloop/policies/autoscale/predictive/README.md,
"TBT"; docs/decisions/slo-predictive.md, "Shipped: a TBT target below an idle node's step is not
read"). Before, the reading ran this pool to 48 nodes for the same TBT p99."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetloop.sim.table import DEFAULT_POLICY, run_one

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["degraded-gpu", "burst-cold"])
def test_the_default_sizes_the_stack_pool_near_llm_d_and_keeps_its_tasks(name: str) -> None:
    scenario = str(ROOT / "scenarios" / "stack" / f"{name}.yaml")
    default = run_one((scenario, "default", str(DEFAULT_POLICY), 1))
    llm_d = run_one((scenario, "llm-d", "baseline:llm-d", 1))
    assert default["total_usd"] <= 1.15 * llm_d["total_usd"]  # the nodes it paid for
    assert default["tasks_succeeded"] >= llm_d["tasks_succeeded"] - 1
    assert default["per_successful_task_usd"] <= 1.15 * llm_d["per_successful_task_usd"]
