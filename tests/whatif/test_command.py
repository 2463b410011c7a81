"""``fleetloop whatif`` without a broker: bad input is one line and exit 2 before connecting; the
KPI comparison and fidelity rows (fleetloop.whatif.compare)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fleetloop.cli.main import main
from fleetloop.whatif.compare import comparison, fidelity, kpis
from fleetloop.whatif.derive import Observed

BASE = ["whatif", "--bootstrap-servers", "127.0.0.1:9"]


def one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, f"expected one line, got {err!r}"
    return lines[0]


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (["--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01T00:00:00Z"], "an empty window"),
        (["--from", "1000", "--to", "1000"], "an empty window"),
        (["--from", "yesterday", "--to", "end"], "fleetloop whatif: cannot read time 'yesterday'"),
        (["--from", "2026-01-01T00:00:00", "--to", "end"], "needs a zone"),
    ],
)
def test_a_bad_window_is_one_line_before_connecting(
    capsys: pytest.CaptureFixture[str], window: list[str], message: str
) -> None:
    policy = str(Path(__file__).resolve().parents[2] / "fleetloop/policies/baselines/classic.yaml")
    assert main([*BASE, *window, "--policy", policy]) == 2
    out, err = capsys.readouterr()
    assert message in one_line(err)
    assert out == ""


def test_a_bad_policy_file_is_one_line_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: fleetloop/v1\nkind: FleetPolicy\nmetadata: {name: x, version: 0}\n")
    assert main([*BASE, "--from", "beginning", "--to", "end", "--policy", str(bad)]) == 2
    assert "policy refused" in one_line(capsys.readouterr().err)
    assert main([*BASE, "--from", "beginning", "--to", "end", "--policy", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ("tgi", "fleetloop whatif: --engine: unknown engine 'tgi'"),
        ("big=vllm:0.1", "vllm has no profile '0.1'"),
        ("=sglang", "an empty pool name"),
    ],
)
def test_a_bad_engine_is_one_line_before_connecting(
    capsys: pytest.CaptureFixture[str], engine: str, message: str
) -> None:
    policy = str(Path(__file__).resolve().parents[2] / "fleetloop/policies/baselines/classic.yaml")
    assert main([*BASE, "--from", "beginning", "--to", "end", "--policy", policy, "--engine", engine]) == 2
    out, err = capsys.readouterr()
    assert message in one_line(err)
    assert out == ""


def test_an_unreachable_broker_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    policy = str(Path(__file__).resolve().parents[2] / "fleetloop/policies/baselines/classic.yaml")
    code = main([*BASE, "--from", "beginning", "--to", "end", "--policy", policy])
    assert code == 2
    assert one_line(capsys.readouterr().err).startswith("fleetloop whatif: cannot read from 127.0.0.1:9")


def _run(success: float, p0: float | None, cost: float | None, ttft: float, failed: int) -> dict[str, Any]:
    return {
        "tasks": {"success_rate": success, "failed": failed},
        "by_priority": {} if p0 is None else {"0": {"success_rate": p0}},
        "cost": {"per_successful_task_usd": cost},
        "latency": {"ttft_p99_ms": ttft},
    }


def _observed(success: float, cost: float | None, ttft: float | None) -> Observed:
    return Observed(
        tasks_started=10,
        tasks_succeeded=8,
        tasks_failed=2,
        tasks_unresolved=0,
        success_rate=success,
        p0_tasks=5,
        p0_success_rate=0.8,
        ttft_p99_ms=ttft,
        fleet_cost_usd=1.0,
        cost_source="telemetry",
        cost_per_successful_task_usd=cost,
        costed_until_ms=0,
    )


def test_delta_is_candidate_minus_recorded() -> None:
    rows = comparison([_run(0.9, 0.8, 0.010, 400.0, 3)], [_run(0.95, None, 0.008, 500.0, 1)])
    assert rows["task_success"]["delta"] == pytest.approx(0.05)
    assert rows["cost_per_successful_task_usd"]["delta"] == pytest.approx(-0.002)
    assert rows["ttft_p99_ms"]["delta"] == pytest.approx(100.0)
    assert rows["tasks_lost"]["delta"] == -2
    assert rows["p0_success"] == {
        "recorded": 0.8,
        "candidate": None,
        "delta": None,
        "delta_min": None,
        "delta_max": None,
    }
    assert kpis(_run(0.5, 0.25, None, 1.0, 7))["cost_per_successful_task_usd"] is None


def test_fidelity_is_simulated_minus_observed_signed() -> None:
    f = fidelity(_observed(0.8, 0.010, 400.0), [_run(0.9, 0.8, 0.012, 300.0, 1)])
    assert f["task_success"]["error"] == pytest.approx(0.1)  # the simulation is too optimistic
    assert "relative_error" not in f["task_success"]  # points, not a ratio of a rate
    assert f["ttft_p99_ms"]["error"] == pytest.approx(-100.0)
    assert f["ttft_p99_ms"]["relative_error"] == pytest.approx(-0.25)
    assert f["cost_per_successful_task_usd"]["relative_error"] == pytest.approx(0.2)
    unknown = fidelity(_observed(0.8, None, None), [_run(0.9, 0.8, 0.012, 300.0, 1)])
    assert unknown["cost_per_successful_task_usd"]["error"] is None
    assert unknown["ttft_p99_ms"]["relative_error"] is None


def _doc(version: int) -> Any:
    import yaml
    from fleetloop.policies.registry import parse_document
    from tests.support.policies import FOUNDATION_YAML

    data = yaml.safe_load(FOUNDATION_YAML.read_text())
    data["metadata"]["version"] = version
    return parse_document(data)


def test_without_decisions_the_recorded_policy_is_the_one_active_at_the_windows_start() -> None:
    from fleetloop.policies.registry import compile_policy
    from fleetloop.schemas.control import Activation, ActivePolicy
    from fleetloop.whatif.command import active_at

    def active(group: str, *history: tuple[int, int]) -> ActivePolicy:
        acts = [Activation(from_ts_ms=t, document=_doc(v)) for t, v in history]
        last = compile_policy(acts[-1].document).stamp
        return ActivePolicy(
            group=group,
            name=last.name,
            version=last.version,
            hash=last.hash,
            from_ts_ms=acts[-1].from_ts_ms,
            from_tick_id=0,
            considered_offset=0,
            history=acts,
        )

    older = active("g", (1000, 1))
    newer = active("g", (1000, 1), (5000, 2))  # the group's newest record wins
    assert active_at([older, newer], 4999) == _doc(1)
    assert active_at([older, newer], 5000) == _doc(2)
    assert active_at([newer], 999) is None  # nothing was active yet
    # Two groups that ran different documents then: ambiguous, so the user must name it.
    assert active_at([newer, active("h", (0, 1))], 6000) is None
    assert active_at([newer, active("h", (0, 2))], 6000) == _doc(2)


def test_over_several_seeds_means_and_deltas_paired_by_seed() -> None:
    recorded = [_run(0.8, 0.7, 0.010, 400.0, 4), _run(0.9, 0.9, 0.020, 600.0, 2)]
    candidate = [_run(0.85, 0.7, 0.012, 300.0, 3), _run(0.91, 0.8, 0.018, 700.0, 2)]
    rows = comparison(recorded, candidate)
    cost = rows["cost_per_successful_task_usd"]
    assert (cost["recorded"], cost["candidate"]) == (pytest.approx(0.015), pytest.approx(0.015))
    # equal means, but paired by seed the candidate costs +0.002 then -0.002
    assert (cost["delta"], cost["delta_min"], cost["delta_max"]) == (
        pytest.approx(0.0),
        pytest.approx(-0.002),
        pytest.approx(0.002),
    )
    assert rows["tasks_lost"]["recorded"] == 3.0
    f = fidelity(_observed(0.8, 0.010, 400.0), recorded)
    assert f["task_success"]["simulated"] == pytest.approx(0.85)
    assert f["ttft_p99_ms"]["error"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="one candidate run per recorded run"):
        comparison(recorded, candidate[:1])
