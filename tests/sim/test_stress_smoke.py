"""CI smoke subset of the stress suite: two stress scenarios, one seed, the suite's own
target check. The full suite is ``python -m fleetloop.sim.table --suite stress`` (5 seeds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetloop.sim.suite import suite_jobs, suite_markdown, suite_targets
from fleetloop.sim.table import DEFAULT_POLICY, run_one

STRESS = Path(__file__).resolve().parents[2] / "scenarios" / "stress"
pytestmark = pytest.mark.system

# The idle pool that long prompts used to grow to its maximum, and a fast-error black hole.
SMOKE = ("long-prompt-light-load", "black-hole-node")


def test_stress_smoke_subset_meets_the_targets() -> None:
    files = [STRESS / f"{name}.yaml" for name in SMOKE]
    jobs = suite_jobs(files, 1, [("classic", "baseline:classic"), ("default", str(DEFAULT_POLICY))])
    rows = [run_one(job) for job in jobs]
    checks, met = suite_targets(rows)
    assert len(checks) == len(SMOKE)
    assert met, suite_markdown("stress-smoke", rows, 1)
