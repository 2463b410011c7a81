"""The side-by-side table's target checks, on hand-made rows: met and not met."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fleetloop.sim.table import against_modern, available_policies, targets, timed_out


def _row(scenario: str, policy: str, usd: float, **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "scenario": scenario,
        "policy": policy,
        "success_rate": 0.99,
        "p0_success_rate": 1.0,
        "per_successful_task_usd": usd,
        "ttft_p99_ms": 1000.0,
        "tasks_started": 1000,
        "failed_by": {},
        "retries": 0,
        "timeouts": 0,
        "orphaned": 0,
    }
    row.update(kw)
    return row


def _rows(default_storm: dict[str, int], classic_storm: dict[str, int]) -> list[dict[str, Any]]:
    return [
        _row("steady", "classic", 1.0),
        _row("steady", "default", 0.5),
        _row("cascade-x", "classic", 1.0, failed_by=classic_storm),
        _row("cascade-x", "default", 0.5, failed_by=default_storm),
    ]


def test_timed_out_counts_tasks_whose_last_call_timed_out() -> None:
    row = {"failed_by": {"deadline:timeout": 4, "retries_exhausted:timeout": 1, "retries_exhausted:shed": 7}}
    assert timed_out(row) == 5


def test_cascade_target_met_when_classic_loses_tasks_to_timeouts_and_default_does_not() -> None:
    text, ok = targets(_rows({"deadline:timeout": 1}, {"deadline:timeout": 30}))
    assert ok
    assert "classic **30** (3.00%" in text
    assert "default **1** (0.10%" in text
    assert ": met)" in text


def test_cascade_target_not_met_when_classic_holds_or_default_loses_as_many() -> None:
    _, ok = targets(_rows({}, {"deadline:timeout": 5}))  # classic loses 0.5%: no storm to win
    assert not ok
    text, ok = targets(_rows({"retries_exhausted:timeout": 10}, {"deadline:timeout": 40}))
    assert not ok
    assert "NOT met" in text


def test_cost_target_fails_over_two_percent_above_classic() -> None:
    rows = _rows({}, {"deadline:timeout": 30})
    rows[1]["per_successful_task_usd"] = 1.03
    text, ok = targets(rows)
    assert not ok
    assert "(over 1.02)" in text


def test_default_is_reported_against_modern_per_scenario() -> None:
    rows = [
        _row("steady", "modern", 0.8, success_rate=0.98, ttft_p99_ms=2000.0),
        _row("steady", "default", 0.4),
        _row("burst", "modern", 1.0),
        _row("burst", "default", 1.0, success_rate=0.97, p0_success_rate=0.9),
    ]
    text = against_modern(rows)
    assert "| steady | 0.500 | +1.00% | +0.00% | 2.00x |" in text
    assert "| burst | 1.000 | -2.00% | -10.00% | 1.00x |" in text
    assert "geometric mean of $/success vs modern: **0.707**" in text
    assert against_modern(rows[1:]) == ""  # a scenario without a modern row: nothing to report


def test_against_modern_sets_each_tbt_p99_beside_the_slo() -> None:
    """Where default costs more than modern, the table says whether the difference buys a TBT p99
    within the SLO that modern misses; a miss is starred."""
    slo = {"slo_tbt_ms": 60}
    rows = [
        _row("steady", "modern", 0.8, tbt_p99_ms=101.0, **slo),
        _row("steady", "default", 1.0, tbt_p99_ms=38.0, **slo),
        _row("burst", "modern", 1.0, tbt_p99_ms=50.0, **slo),
        _row("burst", "default", 1.2, tbt_p99_ms=70.0, **slo),
        _row("calm", "modern", 1.0, tbt_p99_ms=90.0, **slo),
        _row("calm", "default", 0.9, tbt_p99_ms=40.0, **slo),
    ]
    text = against_modern(rows)
    assert "| 101* / 38 (60) |" in text
    assert "| 50 / 70* (60) |" in text
    assert (
        "TBT p99 within the SLO (* marks a miss): default on **2** of 3, modern on **1**; where default"
        " costs more per successful task than modern (2 of 3), default's is within it and modern's over"
        " it on **1**"
    ) in text


def test_the_table_runs_every_baseline() -> None:
    assert [label for label, _ in available_policies()] == ["none", "classic", "modern", "default"]


def test_the_table_reports_each_finished_run_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table of several minutes says how far it is, one line per run, as the suites do; the
    markdown still goes to stdout and ``--json`` keeps stderr quiet."""
    import yaml
    from fleetloop.sim.table import main
    from tests.sim.conftest import small_scenario_dict

    scen = tmp_path / "scenarios"
    scen.mkdir()
    d = small_scenario_dict()
    d["duration_s"] = 20
    (scen / "tiny.yaml").write_text(yaml.safe_dump(d))
    out = tmp_path / "out"
    assert main(["--scenarios", str(scen), "--out", str(out), "--workers", "1"]) == 0
    got = capsys.readouterr()
    n = len(available_policies())
    lines = [x for x in got.err.splitlines() if x.startswith("[")]
    assert [x.split("]")[0] for x in lines] == [f"[{i}/{n}" for i in range(1, n + 1)]
    assert all(" tiny seed 11 " in x and "success" in x for x in lines)
    assert "| tiny |" in got.out
    assert main(["--scenarios", str(scen), "--out", str(out), "--workers", "1", "--json"]) == 0
    assert capsys.readouterr().err == ""
