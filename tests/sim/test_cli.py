"""`fleetloop sim` as a user runs it: JSON keys, report files, one-line errors, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fleetloop.cli.main import main
from tests.sim.conftest import small_scenario_dict

KEYS = {
    "scenario": None,
    "policy": None,
    "seed": None,
    "tasks": {"started", "succeeded", "failed", "success_rate"},
    "cost": {"total_usd", "per_successful_task_usd", "wasted_usd"},
    "latency": {"ttft_p50_ms", "ttft_p99_ms", "tbt_p99_ms"},
    "requests": {"sent", "retries", "shed", "errors"},
    "by_priority": None,
    "sim": {"virtual_s", "wall_s", "speedup"},
}


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    d = small_scenario_dict()
    d["duration_s"] = 40
    p = tmp_path / "tiny.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_json_has_the_design_keys(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--scenario", str(scenario_file), "--baseline", "none", "--json", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    data = json.loads(out)
    for key, sub in KEYS.items():
        assert key in data, key
        if sub:
            assert sub <= set(data[key]), (key, sub - set(data[key]))
    assert data["seed"] == 3
    assert data["policy"] == "baseline-none"
    for row in data["by_priority"].values():
        assert {"tasks_started", "tasks_succeeded", "success_rate", "ttft_p99_ms"} <= set(row)
        assert 0 <= row["calls_ttft_within_slo"] <= row["calls"]
        assert row["calls"] >= row["tasks_started"]  # every task made at least one call
    assert set(data["by_priority"]) == {"0", "2"}


def test_table_and_report(scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "rep"
    assert main(["sim", "--scenario", str(scenario_file), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "cost per successful task" in out
    assert "failed tasks by cause" in out
    assert "orphans" in out
    assert "within SLO" in out  # the by-priority column of calls whose first token came within it
    page = (report / "index.html").read_text()
    assert "priority-0 calls, first token within SLO" in page
    assert page.count("<img") == 6
    for png in ("ttft.png", "tasks.png", "cost.png", "nodes.png", "control.png", "storm.png"):
        assert (report / png).read_bytes()[:4] == b"\x89PNG"


def test_bad_scenario_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = small_scenario_dict()
    d["pools"][0]["gpu"] = "H900"
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(d))
    assert main(["sim", "--scenario", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pools[0].gpu: unknown GPU 'H900'" in err


def test_modern_baseline_runs(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--scenario", str(scenario_file), "--baseline", "modern", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["policy"] == "baseline-modern"
    assert data["tasks"]["started"] > 0


def test_unknown_baseline_exit_2(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--scenario", str(scenario_file), "--baseline", "fancy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown baseline 'fancy'" in err


def test_compare_sets_percentiles_beside_the_slo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stack that is cheaper because it misses the SLO must read so in the comparison: each
    percentile stands beside the scenario's SLO and a miss says "over"."""
    d = small_scenario_dict()
    d["duration_s"] = 40
    d["slo"] = {"ttft_ms": 100_000, "tbt_ms": 1}  # every time between tokens misses 1 ms
    p = tmp_path / "tight.yaml"
    p.write_text(yaml.safe_dump(d))
    assert main(["sim", "--scenario", str(p), "--compare", "default,none", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ttft = next(line for line in lines if "TTFT p99 ms (SLO 100000)" in line)
    tbt = next(line for line in lines if "TBT p99 ms (SLO 1)" in line)
    assert "over" not in ttft
    assert tbt.count("over") == 2
