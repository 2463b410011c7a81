"""Headline ratios of the default policy against the baselines, pinned loosely (issue 4).

The full table is ``python -m fleetloop.sim.table``; these four scenarios each carry one headline:
cost (steady-chat), priority protection under overload, the prefix cache (TTFT vs none), and the
cascade's timeout-and-retry storm (classic loses about twice the tasks fleetloop does). The
bounds sit well inside today's figures, so a change that loses one of the wins fails here, while
ordinary retuning does not.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
from fleetloop.policies.registry import builtin_policy
from fleetloop.sim.runner import run
from fleetloop.sim.scenario import load_scenario
from fleetloop.sim.table import timed_out

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
pytestmark = pytest.mark.system


@cache
def outcome(scenario: str, policy: str) -> dict[str, Any]:
    return run(load_scenario(SCENARIOS / f"{scenario}.yaml"), builtin_policy(policy)).to_json()


def cost(s: str, p: str) -> float:
    value = outcome(s, p)["cost"]["per_successful_task_usd"]
    assert value is not None
    return float(value)


def test_steady_load_costs_well_below_classic_and_none() -> None:
    # Today about 0.42x classic and 0.79x none: the autoscaler gives back idle capacity. (Before the
    # issue-14 physics, 0.41x and 0.79x.)
    assert cost("steady-chat", "default") <= 0.6 * cost("steady-chat", "classic")
    assert cost("steady-chat", "default") <= 0.8 * cost("steady-chat", "none")
    assert outcome("steady-chat", "default")["tasks"]["success_rate"] >= 0.999


def test_overload_protects_priority_zero_and_keeps_success() -> None:
    # Today about 94% priority-0 success against classic's 61%, and more tasks succeed overall.
    d, c = outcome("overload-mixed-priorities", "default"), outcome("overload-mixed-priorities", "classic")
    assert d["by_priority"]["0"]["success_rate"] >= c["by_priority"]["0"]["success_rate"] + 0.25
    assert d["tasks"]["success_rate"] >= c["tasks"]["success_rate"]


def test_prefix_affinity_cuts_ttft_p99_against_none() -> None:
    # Today about 7.4x (7.0x before the model spill, 7.1x before the per-pool scale-down holds, 6.8x
    # before issue 15's levers;
    # 12x before the issue-14 physics, whose faster FP8-era prefill and per-request costs narrow
    # the gap): round robin recomputes the shared context on every call.
    d, n = outcome("prefix-heavy-copilot", "default"), outcome("prefix-heavy-copilot", "none")
    assert n["latency"]["ttft_p99_ms"] >= 3 * d["latency"]["ttft_p99_ms"]
    assert d["tasks"]["success_rate"] >= outcome("prefix-heavy-copilot", "classic")["tasks"]["success_rate"]


def _lost_to_timeouts(o: dict[str, Any]) -> int:
    return timed_out({"failed_by": o["tasks"]["failed_by"]})


def test_cascade_classic_loses_more_tasks_to_the_storm_than_default() -> None:
    # Today classic loses 321 of ~8,000 tasks to timed-out calls (871 timeouts, each leaving an
    # orphan), default 13 (30 timeouts, 17 orphans); priority-0 success 86% against 100% (128 and
    # 94% before the router's model spill moved priority-0 calls that would queue on the 70B pool
    # to the 8B pool, with the 70B pool sized for them; 152 and 93% before issue 15's levers and
    # the scenario's SLO reaching the policy). Before the issue-14
    # physics it was 245 against 5: with cold starts drawn from published timings (~270 s for a
    # cached 70B TP4 node instead of a fixed 120 s) and decode that slows with batch size, the
    # autoscaler's new nodes arrive after the load spike, so default loses tasks too. Still half of
    # classic's, with a third of its orphans.
    d, c = outcome("cascade-degraded-gpu", "default"), outcome("cascade-degraded-gpu", "classic")
    started = c["tasks"]["started"]
    assert _lost_to_timeouts(c) >= 0.015 * started
    assert _lost_to_timeouts(d) <= 0.6 * _lost_to_timeouts(c)
    assert c["requests"]["orphaned"] >= 2 * max(1, d["requests"]["orphaned"])
    assert d["by_priority"]["0"]["success_rate"] >= c["by_priority"]["0"]["success_rate"] + 0.05


def test_modern_lets_shared_context_pile_up_where_default_does_not() -> None:
    # Today default succeeds on 99.9% of prefix-heavy tasks, modern on 51% (its KEDA/HPA adds
    # nodes only after queues form, least-request ignores where the prefix is cached, and each new
    # 70B node takes a ~270 s cold start), at a lower cost per successful task: 0.83x modern's
    # (0.86x before a first call met its new-task limit only on a node with calls queued; the
    # bound is issue 15's 2% tolerance, which the autoscaler's holds for open workflows once
    # brushed at 1.0003x), though modern pays that for half the tasks.
    d, m = outcome("prefix-heavy-copilot", "default"), outcome("prefix-heavy-copilot", "modern")
    assert d["tasks"]["success_rate"] >= m["tasks"]["success_rate"] + 0.2
    assert cost("prefix-heavy-copilot", "default") <= 1.02 * cost("prefix-heavy-copilot", "modern")
