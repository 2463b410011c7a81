"""The figures cache-aware's README quotes for its ``least-outstanding`` picker on the stack bench's
fleet, made again: ``fleetloop sim --scenario scenarios/stack/<name>.yaml --compare
default,<default with picker least-outstanding>,llm-d --seed N`` over seeds 1-3 (TTFT p50 the median
of the seeds, tasks summed, cost per successful task the geometric mean). The runs are
deterministic, so the README's rounded figures must come out exactly."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest
from fleetloop.policies.registry import CompiledPolicy, builtin_policy, load_policy
from fleetloop.sim import runner
from fleetloop.sim.scenario import load_scenario
from fleetloop.sim.table import DEFAULT_POLICY
from tests.sim.variants import ROUTING, default_with

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "fleetloop" / "policies" / "routing" / "cache_aware" / "README.md"
SEEDS = (1, 2, 3)


def _figures(scenario: str, policy: CompiledPolicy) -> tuple[float, int, float]:
    runs = [
        runner.run(load_scenario(ROOT / "scenarios" / "stack" / f"{scenario}.yaml"), policy, seed=s).to_json()
        for s in SEEDS
    ]
    return (
        statistics.median(r["latency"]["ttft_p50_ms"] for r in runs),
        sum(r["tasks"]["succeeded"] for r in runs),
        statistics.geometric_mean(r["cost"]["per_successful_task_usd"] for r in runs),
    )


def test_the_least_outstanding_figures_are_the_simulators(tmp_path: Path) -> None:
    least = "routing:      {type: cache-aware, params: {picker: least-outstanding}}"
    picked = default_with(tmp_path, ROUTING, least, "least-outstanding.yaml")
    arms = {
        "default": load_policy(Path(DEFAULT_POLICY)),
        "lo": load_policy(picked),
        "llm-d": builtin_policy("llm-d"),
    }
    body = re.sub(r"\s+", " ", README.read_text(encoding="utf-8"))
    ratios: list[float] = []
    llmd: list[str] = []
    for scenario in ("burst-cold", "degraded-gpu", "prefix-heavy"):
        got = {name: _figures(scenario, policy) for name, policy in arms.items()}
        (ttft, tasks, cost), (ttft_lo, tasks_lo, cost_lo) = got["default"], got["lo"]
        fewer = round(100.0 * (ttft - ttft_lo) / ttft)
        delta = tasks_lo - tasks
        said = "the same tasks" if delta == 0 else f"{delta:+d} tasks"
        claim = f"{fewer}% on {scenario} ({round(ttft_lo):,} against {round(ttft):,} ms, {said})"
        assert claim in body, claim
        ratios.append(cost_lo / cost)
        llmd.append(f"{round(got['llm-d'][0]):,}")
    span = f"at {round(100.0 * (min(ratios) - 1.0)):+d}% to {round(100.0 * (max(ratios) - 1.0)):+d}% cost"
    assert span in body, span
    assert f"`llm-d` stays ahead on TTFT ({llmd[0]}, {llmd[1]} and {llmd[2]} ms)" in body
