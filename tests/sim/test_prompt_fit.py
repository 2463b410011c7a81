"""A prompt longer than a pool's nodes hold in KV cache goes to a pool of its model that holds it.

llama-70b on one MI300X holds ~96k tokens, on two H200s ~344k (``fleetloop.perf.catalog``). Before
the routing decision carried ``max_prompt_tokens``, the router split a model's calls by capacity
whatever their size, so a 100k-token prompt sent to the MI300X pool failed there (an engine error),
and its retries failed the same way whenever the split sent them back (research-long-context lost
tasks to ``retries_exhausted:error``)."""

from __future__ import annotations

from fleetloop.policies.registry import builtin_policy, load_policy
from fleetloop.sim import runner
from fleetloop.sim.scenario import parse_scenario
from fleetloop.sim.table import DEFAULT_POLICY

SCENARIO = {
    "name": "prompt-fit",
    "description": "Long prompts on two llama-70b pools, one whose nodes cannot hold the longest.",
    "seed": 3,
    "duration_s": 240,
    "slo": {"ttft_ms": 5000, "tbt_ms": 100},
    "pools": [
        {
            "id": "deep-mi300x",
            "model": "llama-70b",
            "gpu": "MI300X",
            "nodes": 3,
            "min_nodes": 3,
            "max_nodes": 3,
        },
        {"id": "deep-h200", "model": "llama-70b", "gpu": "H200", "nodes": 2, "min_nodes": 2, "max_nodes": 2},
    ],
    "tenants": [{"id": "analysts", "priority": 0}],
    "workload": [
        {
            "kind": "research",
            "tenant": "analysts",
            "rate_per_s": 0.1,
            "calls": [1, 2],
            "prompt_tokens": {"median": 80_000, "max": 120_000},
            "output_tokens": {"median": 50, "max": 200},
            "models": ["llama-70b"],
            "deadline_s": 900,
            "client": {"timeout_s": 300, "max_retries": 2},
        }
    ],
}


def _errors(spec: str) -> tuple[int, dict[str, int]]:
    scenario = parse_scenario(SCENARIO)
    policy = builtin_policy("classic") if spec == "classic" else load_policy(spec)
    r = runner.run(scenario, policy)
    s = r.report.summary
    return s["requests"]["errors"], s["tasks"]["failed_by"]


def test_long_prompts_go_only_to_the_pool_whose_nodes_hold_them() -> None:
    errors, failed_by = _errors(str(DEFAULT_POLICY))
    assert errors == 0
    assert not any(cause.endswith(":error") for cause in failed_by)


def test_without_the_figure_the_split_sends_them_where_they_fail() -> None:
    # classic's least-request routing publishes no max_prompt_tokens: the same calls error out
    errors, _ = _errors("classic")
    assert errors > 0
