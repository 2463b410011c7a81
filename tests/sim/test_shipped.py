"""Every shipped scenario runs under every available policy (full runs: the slow part of the suite)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetloop.policies.registry import PolicyError, builtin_policy
from fleetloop.sim.runner import run
from fleetloop.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def _policies() -> list[str]:
    out = ["none"]
    for name in ("classic", "modern"):
        try:
            builtin_policy(name)
            out.append(name)
        except PolicyError:
            pass
    return [*out, "default"]


@pytest.mark.system
@pytest.mark.parametrize("policy", _policies())
def test_a_shipped_scenario_runs_to_completion(policy: str) -> None:
    sc = load_scenario(ROOT / "scenarios" / "host-loss-mid-decode.yaml")
    result = run(sc, builtin_policy(policy))
    s = result.report.summary
    assert s["tasks"]["started"] == s["tasks"]["succeeded"] + s["tasks"]["failed"]
    assert result.report.virtual_s >= sc.duration_s
    assert result.wall_s < 60.0
    assert len(s["faults"]) == 2
