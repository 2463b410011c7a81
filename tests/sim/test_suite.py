"""The suite targets, on hand-made rows: per (scenario, seed) pair and in geometric mean."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fleetloop.sim.suite import (
    suite_ablation_markdown,
    suite_files,
    suite_jobs,
    suite_markdown,
    suite_targets,
)

ROOT = Path(__file__).resolve().parents[2]


def _row(scenario: str, seed: int, policy: str, usd: float, ok: int = 990, p0: int = 495) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "seed": seed,
        "policy": policy,
        "success_rate": ok / 1000,
        "p0_success_rate": p0 / 500,
        "tasks_started": 1000,
        "tasks_succeeded": ok,
        "p0_tasks_started": 500,
        "p0_tasks_succeeded": p0,
        "per_successful_task_usd": usd,
        "ttft_p99_ms": 1000.0,
        "p0_ttft_p99_ms": 900.0,
        "p0_calls": 600,
        "p0_calls_ttft_within_slo": 597,
        "tbt_p99_ms": 50.0,
        "slo_ttft_ms": 1000.0,
        "slo_tbt_ms": 80.0,
        "wall_s": 1.0,
    }


def _pairs(**default: Any) -> list[dict[str, Any]]:
    rows = []
    for s in ("a", "b"):
        for seed in (1, 2):
            rows.append(_row(s, seed, "classic", 1.0))
            rows.append(_row(s, seed, "default", 0.5))
    rows[-1].update(default)
    return rows


def test_met_when_every_pair_is_within_one_task_and_cheap_enough() -> None:
    checks, ok = suite_targets(_pairs(tasks_succeeded=989, p0_tasks_succeeded=494))  # one task fewer
    assert ok
    assert len(checks) == 4


@pytest.mark.parametrize(
    "change",
    [
        {"tasks_succeeded": 988},  # two tasks fewer than classic
        {"p0_tasks_succeeded": 493},  # two priority-0 tasks fewer
        {"per_successful_task_usd": 1.03},  # over 1.02x classic on one seed
        {"per_successful_task_usd": None},  # nothing succeeded
    ],
)
def test_one_bad_pair_fails_the_suite(change: dict[str, Any]) -> None:
    _, ok = suite_targets(_pairs(**change))
    assert not ok


def test_geometric_mean_over_point_seven_fails() -> None:
    rows = [_row("a", 1, "classic", 1.0), _row("a", 1, "default", 0.75)]
    _, ok = suite_targets(rows)
    assert not ok
    rows[1]["per_successful_task_usd"] = 0.69
    assert suite_targets(rows)[1]


def test_a_missing_run_fails() -> None:
    rows = _pairs()[:-1]
    assert not suite_targets(rows)[1]


def test_markdown_names_the_failing_pair_and_ablation_counts_tasks() -> None:
    rows = _pairs(tasks_succeeded=900)
    md = suite_markdown("stress", rows, 2)
    assert "| b | 2 |" in md
    assert "NO: tasks" in md
    assert "every target met: **no**" in md
    rows.append({**_row("a", 1, "no-breaker", 0.6), "tasks_succeeded": 980})
    ab = suite_ablation_markdown(rows, ["breaker"])
    assert "| breaker | 1.200 | 1.20 (+10) | - |" in ab


def test_stress_suite_ships_the_issue_scenarios_and_five_more_with_descriptions() -> None:
    files = suite_files("stress", ROOT)
    names = {f.stem for f in files}
    assert {"long-prompt-light-load", "mass-preempt-budget", "storm-poolwide-slowdown"} <= names
    assert len(names) >= 8
    for f in files:
        assert "description:" in f.read_text()
    jobs = suite_jobs(files[:1], 3, [("classic", "baseline:classic")])
    assert [j[3] for j in jobs] == [jobs[0][3], jobs[0][3] + 1, jobs[0][3] + 2]


def test_the_fleet_suite_runs_the_fleet_scale_scenarios_and_all_leaves_them_out() -> None:
    from fleetloop.sim.scenario import load_scenario

    fleet = suite_files("fleet", ROOT)
    assert [f.stem for f in fleet] == ["fleet-1024"]
    sc = load_scenario(fleet[0])
    assert sum(p.nodes for p in sc.pools) >= 1000
    assert len(sc.pools) >= 30
    assert not set(suite_files("all", ROOT)) & set(fleet)  # minutes per run: on its own


def test_modern_is_reported_against_default_per_run_and_unknown_policies_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fleetloop.sim.table import main, suite_against_modern

    rows = [_row("f", 9, "classic", 1.0), _row("f", 9, "default", 0.5), _row("f", 9, "modern", 0.8, ok=980)]
    md = suite_against_modern(rows)
    assert "| f | 9 | 0.625 | +1.00% |" in md
    # its heading is not the summary section's ("## Against modern (reported, not a target)")
    assert "## Against modern, seed by seed (reported, not a target)" in md
    assert suite_against_modern(rows[:2]) == ""
    assert main(["--suite", "fleet", "--policies", "default,bogus"]) == 2
    assert "known: none, classic, modern, llm-d, default" in capsys.readouterr().err


def test_llm_d_is_reported_against_default_beside_modern() -> None:
    from fleetloop.sim.suite import suite_markdown

    rows = [
        _row("f", 9, "classic", 1.0),
        _row("f", 9, "default", 0.5),
        _row("f", 9, "modern", 0.8, ok=980),
        _row("f", 9, "llm-d", 0.4, ok=980),
    ]
    md = suite_markdown("stress", rows, 1)
    assert "## Against modern (reported, not a target)" in md
    assert "## Against llm-d (reported, not a target)" in md
    assert "| f | 1 | 1.250 | +10 | +0 |" in md  # $/success 0.5 / 0.4; tasks 990 - 980
    assert "- geometric mean of $/success default vs llm-d over 1 runs: **1.250**" in md
    assert "## Against llm-d" not in suite_markdown("stress", rows[:3], 1)


def test_reuse_takes_only_baseline_rows_of_the_same_scenario_file_and_seed(tmp_path: Path) -> None:
    import orjson
    from fleetloop.sim.suite import reuse_rows, scenario_sha

    scen = tmp_path / "s.yaml"
    scen.write_text("name: s\n")
    other = tmp_path / "t.yaml"
    other.write_text("name: t\n")
    sha = scenario_sha(scen)
    rows = [
        {**_row("s", 1, "classic", 1.0), "scenario_sha": sha},
        {**_row("s", 1, "modern", 0.8), "scenario_sha": sha},
        {**_row("s", 1, "default", 0.5), "scenario_sha": sha},  # never reused: the policy under test
        {**_row("s", 2, "classic", 1.0), "scenario_sha": "0" * 64},  # the file changed since
    ]
    src = tmp_path / "earlier.json"
    src.write_bytes(orjson.dumps({"rows": rows}))
    jobs = [
        (str(scen), label, "spec", seed) for seed in (1, 2) for label in ("classic", "modern", "default")
    ] + [(str(other), "classic", "spec", 1)]
    todo, taken = reuse_rows(jobs, [src])
    assert [(r["policy"], r["seed"]) for r in taken] == [("classic", 1), ("modern", 1)]
    assert todo == [
        (str(scen), "default", "spec", 1),
        (str(scen), "classic", "spec", 2),
        (str(scen), "modern", "spec", 2),
        (str(scen), "default", "spec", 2),
        (str(other), "classic", "spec", 1),
    ]
    # Rows of the policy under test only when asked (one commit's runs split over processes).
    todo, taken = reuse_rows(jobs, [src], ("classic", "modern", "default"))
    assert [(r["policy"], r["seed"]) for r in taken] == [("classic", 1), ("modern", 1), ("default", 1)]
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"[]")
    with pytest.raises(ValueError, match="not a suite JSON"):
        reuse_rows(jobs, [bad])


def test_markdown_reports_default_against_modern_and_names_reused_rows() -> None:
    rows = _pairs()
    for s in ("a", "b"):
        for seed in (1, 2):
            rows.append(_row(s, seed, "modern", 0.25, ok=980, p0=490))
    md = suite_markdown("stress", rows, 2, reused_from=["earlier.json"])
    assert "## Against modern" in md
    assert "| a | 2 | 2.000 | +20 | +10 |" in md
    assert "`--reuse earlier.json`" in md
    assert "--reuse" not in suite_markdown("stress", _pairs(), 2)


def test_reuse_runs_again_a_row_written_before_a_field_existed(tmp_path: Path) -> None:
    import orjson
    from fleetloop.sim.suite import reuse_rows, scenario_sha

    scen = tmp_path / "s.yaml"
    scen.write_text("name: s\n")
    sha = scenario_sha(scen)
    old = {**_row("s", 1, "classic", 1.0), "scenario_sha": sha}
    del old["p0_ttft_p99_ms"]  # written by a table without the latency columns
    src = tmp_path / "earlier.json"
    src.write_bytes(orjson.dumps({"rows": [old, {**_row("s", 1, "modern", 1.0), "scenario_sha": sha}]}))
    todo, taken = reuse_rows([(str(scen), "classic", "spec", 1), (str(scen), "modern", "spec", 1)], [src])
    assert todo == [(str(scen), "classic", "spec", 1)]
    assert [r["policy"] for r in taken] == ["modern"]


@pytest.mark.parametrize(
    ("change", "ttft_ok", "tbt_ok"),
    [
        ({}, True, True),
        ({"p0_ttft_p99_ms": 1000.0}, True, True),  # at the SLO is within it
        ({"p0_ttft_p99_ms": 1000.5}, False, True),
        ({"tbt_p99_ms": 80.5}, True, False),
        ({"p0_ttft_p99_ms": None}, None, True),  # no priority-0 call got a first token
        ({"slo_tbt_ms": None}, True, None),  # a row without the field says nothing
    ],
)
def test_latency_is_judged_against_the_scenarios_slo(
    change: dict[str, Any], ttft_ok: bool | None, tbt_ok: bool | None
) -> None:
    from fleetloop.sim.suite import within_slo

    assert within_slo({**_row("a", 1, "default", 1.0), **change}) == (ttft_ok, tbt_ok)


def test_markdown_counts_latency_within_slo_per_policy_without_changing_the_targets() -> None:
    from fleetloop.sim.suite import latency_counts

    rows = _pairs()
    rows[1]["p0_ttft_p99_ms"] = 4000.0  # default, a seed 1: priority-0 TTFT p99 four times the SLO
    rows[3]["tbt_p99_ms"] = 120.0  # default, a seed 2: TBT over
    rows[5]["p0_ttft_p99_ms"] = None  # default, b seed 1: no figure
    assert latency_counts(rows, "default") == (2, 3, 3, 4)
    assert latency_counts(rows, "classic") == (4, 4, 4, 4)
    md = suite_markdown("stress", rows, 2)
    assert "| a | 1000 / 80 | 2/2 / 2/2 | 1/2 / 1/2 | 900 / 4000 |" in md
    assert "| b | 1000 / 80 | 2/2 / 2/2 | 1/1 / 2/2 | 900 / 900 |" in md
    assert "- default: priority-0 TTFT p99 within SLO on **2** of 3 pairs, TBT p99 on **3** of 4" in md
    assert suite_targets(rows)[1]  # reported, not a target


@pytest.mark.parametrize(
    ("change", "ok"),
    [
        ({}, True),  # 597 of 600: 99.5%
        ({"p0_calls_ttft_within_slo": 594}, True),  # exactly 99%: the p99 call is within the SLO
        ({"p0_calls_ttft_within_slo": 593}, False),
        ({"p0_calls": 0, "p0_calls_ttft_within_slo": 0}, None),  # no priority-0 call
        ({"p0_calls_ttft_within_slo": None}, None),  # a row without the figure
    ],
)
def test_the_caller_view_is_met_when_99_percent_of_calls_got_a_first_token_within_the_slo(
    change: dict[str, Any], ok: bool | None
) -> None:
    from fleetloop.sim.suite import caller_ttft_ok

    assert caller_ttft_ok({**_row("a", 1, "default", 1.0), **change}) is ok


def test_markdown_reports_first_tokens_as_callers_see_them_beside_the_attempt_percentiles() -> None:
    """A policy whose successful attempts are fast but which fails calls (classic here: the
    attempt p99 within the SLO on every seed) meets the caller view on fewer pairs."""
    from fleetloop.sim.suite import caller_ttft_counts, latency_summary

    rows = _pairs()
    rows[0]["p0_calls_ttft_within_slo"] = 560  # classic, a seed 1: 40 calls failed or were late
    rows[4]["p0_calls"] = 0  # classic, b seed 1: no priority-0 call, no figure
    assert caller_ttft_counts(rows, "classic") == (2, 3, 560 + 597 * 2, 1800)
    assert caller_ttft_counts(rows, "default") == (4, 4, 597 * 4, 2400)
    assert latency_summary(rows)["classic"]["p0_caller_ttft_pairs_met"] == 2
    md = suite_markdown("stress", rows, 2)
    assert "### Priority-0 first tokens as callers see them" in md
    assert "| a | 1000 | 1/2 | 2/2 | 96.42% / 99.50% |" in md
    assert "| b | 1000 | 1/1 | 2/2 | 99.50% / 99.50% |" in md
    assert (
        "- classic: at least 99% of priority-0 calls within the TTFT SLO as callers see it on **2** of 3"
        " pairs; 97.44% of all priority-0 calls"
    ) in md
    assert suite_targets(rows)[1]  # reported, not a target


def test_a_suite_ablation_writes_its_own_files_and_leaves_the_suites_alone(tmp_path: Path) -> None:
    from fleetloop.sim.table import main

    kept = tmp_path / "sim-stress.json"
    kept.write_text("the 5-seed table")
    rc = main(
        [
            "--suite", "stress", "--seeds", "1", "--only", "black-hole-node", "--ablation",
            "--levers", "retry_budget", "--policies", "classic,default", "--workers", "1",
            "--out", str(tmp_path), "--json",
        ]
    )  # fmt: skip
    assert rc == 0
    assert kept.read_text() == "the 5-seed table"
    import orjson

    data = orjson.loads((tmp_path / "sim-stress-ablation.json").read_bytes())
    assert {r["policy"] for r in data["rows"]} == {"classic", "default", "no-retry_budget"}
    assert set(data["latency"]) == {"classic", "default"}
    assert (tmp_path / "sim-stress-ablation.md").read_text().count("## Latency") == 1


def test_the_results_name_a_reused_file_only_when_the_repository_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scratch ``--reuse`` file (outside the repository, or in its tree but untracked) would name a
    path the table's reader cannot find: it is named as not in the repository."""
    from fleetloop.sim.table import NOT_KEPT, kept_path

    monkeypatch.chdir(ROOT / "bench")
    assert kept_path("results/sim-stress.json") == "bench/results/sim-stress.json"
    assert kept_path(str(ROOT / "bench" / "results" / "sim-stress.json")) == "bench/results/sim-stress.json"
    scratch = tmp_path / "rerun.json"
    scratch.write_text("{}")
    assert kept_path(str(scratch)) == NOT_KEPT
    assert kept_path("results/sim-stress-rerun-not-committed.json") == NOT_KEPT
    assert kept_path("results") == NOT_KEPT  # a directory: many files, none of them the one read
    assert kept_path("results/sim-*.json") == NOT_KEPT  # a name, never a pattern
