"""The ``llm-d`` baseline in the simulator: it runs from the CLI, and its endpoint picker sends a
task's calls to where its prefix was sent before (the router's approximate prefix index), which
``modern``'s least-request P2C does not: on a prefix-heavy pool its median TTFT is far lower."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleetloop.cli.main import main
from fleetloop.sim.fleet import FleetSim
from fleetloop.sim.runner import EPOCH_MS
from fleetloop.sim.scenario import Scenario

PREFIX_HEAVY: dict[str, Any] = {
    "name": "prefix-tiny",
    "seed": 5,
    "duration_s": 120,
    "slo": {"ttft_ms": 1000, "tbt_ms": 80},
    "pools": [
        {
            "id": "p",
            "model": "llama-70b",
            "gpu": "H100",
            "nodes": 4,
            "min_nodes": 4,
            "max_nodes": 4,
            "cold_start_s": 30,
        },
    ],
    "tenants": [{"id": "t", "priority": 0}],
    "workload": [
        {
            "kind": "copilot",
            "tenant": "t",
            "rate_per_s": 0.5,
            "calls": [6, 10],
            "prompt_tokens": {"median": 4000, "max": 8000},
            "output_tokens": {"median": 100, "max": 400},
            "shared_prefix_tokens": 3500,
            "models": ["llama-70b"],
            "deadline_s": 300,
            "client": {"timeout_s": 60, "max_retries": 2},
        }
    ],
}


def test_llm_d_baseline_runs_and_keeps_tasks_on_their_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "prefix.yaml"
    path.write_text(yaml.safe_dump(PREFIX_HEAVY))
    assert main(["sim", "--scenario", str(path), "--compare", "modern,llm-d", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert runs["llm-d"]["policy"] == "baseline-llm-d"
    assert runs["llm-d"]["tasks"]["succeeded"] == runs["modern"]["tasks"]["succeeded"] > 0
    # a hit skips 3,500 of ~4,000 tokens of prefill on a 70B model
    assert runs["llm-d"]["latency"]["ttft_p50_ms"] < 0.6 * runs["modern"]["latency"]["ttft_p50_ms"]


def test_llm_d_is_a_known_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "prefix.yaml"
    path.write_text(yaml.safe_dump(PREFIX_HEAVY))
    assert main(["sim", "--scenario", str(path), "--baseline", "nope"]) == 2
    assert "known: none, classic, modern, llm-d" in capsys.readouterr().err


def test_readme_names_every_baseline_and_its_file() -> None:
    from fleetloop.sim.command import BASELINES

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `fleetloop sim --scenario"))
    assert "--baseline " + "\\|".join(BASELINES) in row
    for name in BASELINES:
        assert f"policies/baselines/{name}.yaml" in readme, name


def test_a_reclaimed_node_comes_back_unknown_to_the_endpoint_pickers_index(tiny: Scenario) -> None:
    sim = FleetSim(tiny, 1, start_ms=EPOCH_MS)
    index = sim.router.epp.index
    for node_id in ("small/0", "small/1"):
        index.record(node_id, "t", prefix_blocks=10, total_blocks=20, capacity_blocks=1000)
    sim.crash_node(sim.nodes["small/0"], comes_back=True)  # preempted: a new pod under the same id
    sim.crash_node(sim.nodes["small/1"], comes_back=False)  # crashed: listed until its readiness fails
    assert index.matched("small/0", "t", 10) == 0
    assert index.matched("small/1", "t", 10) == 10
