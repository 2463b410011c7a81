"""The fleet-wide second stage, pure: per-shard summaries from a model, and their fold into fleet
figures (complete once every live shard reported a boundary; partial otherwise)."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.core.model.fleet import NANO, FleetModel, snapshot
from fleetloop.core.rollup import FleetRollup, fleet_body, summarize
from fleetloop.daemon.rollup.command import STAMP, decision_of
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.summary import ShardSummary
from tests.support.records import outcome, telemetry


def _summary(partition: int, ts_ms: int, **kw: Any) -> ShardSummary:
    fields: dict[str, Any] = {
        "ts_ms": ts_ms,
        "tick_id": ts_ms // 1000,
        "group": "g",
        "partition": partition,
        "window_ms": 10_000,
        "pools": 2,
        "nodes": 10,
        "cost_rate_usd_per_h": 20.0,
        "requests_w": 100,
        "retries_w": 5,
        "shed_w": 1,
        "retries_allowed": 10,
        "tasks_started": 50,
        "tasks_succeeded": 40,
        "tasks_failed": 2,
        "fleet_cost_nusd": 4 * NANO,
        "spend_on_failed_nusd": NANO // 10,
    }
    fields.update(kw)
    return ShardSummary(**fields)


def test_a_summary_adds_up_what_the_shards_model_holds() -> None:
    m = FleetModel()
    m.fold(telemetry("old", pool="p0", ts_ms=1000, cost_rate_usd_per_h=99.0))
    for n in range(3):
        m.fold(telemetry(f"n{n}", pool=f"p{n % 2}", ts_ms=11_000, cost_rate_usd_per_h=3.6))
        m.fold(telemetry(f"n{n}", pool=f"p{n % 2}", ts_ms=12_000, cost_rate_usd_per_h=3.6))
    m.fold(outcome("n0", "ok", pool="p0", ts_ms=11_500, n=1, task_outcome="succeeded", cost_usd=0.5))
    m.fold(outcome("n1", "retry", pool="p1", ts_ms=11_600, n=2, attempt=1))
    m.fold(outcome(None, "shed", pool="p1", ts_ms=11_700, n=3))
    s = summarize(
        m,
        group="g",
        partition=3,
        ts_ms=12_000,
        tick_id=12,
        window_ms=10_000,
        retries_allowed={"p0": 4, "p1": 6},
    )
    snap = snapshot(m, 12_000)
    assert s.pools == 2
    assert s.nodes == 3
    assert s.cost_rate_usd_per_h == pytest.approx(3 * 3.6)
    assert s.requests_w == sum(p.requests_w for p in snap.pools.values()) == 3
    assert s.retries_w == sum(p.retries_w for p in snap.pools.values()) == 1
    assert s.shed_w == 1
    assert s.retries_allowed == 10
    assert s.tasks_succeeded == 1
    assert s.fleet_cost_nusd == m.ledger.fleet_cost_nusd  # every interval folded, old node's too
    assert s.fleet_cost_nusd == round(99.0 / 3600 * NANO) + 6 * round(3.6 / 3600 * NANO)
    assert (s.group, s.partition, s.ts_ms, s.tick_id) == ("g", 3, 12_000, 12)


def test_the_fleet_figure_sums_every_shard_and_is_complete_once_all_reported() -> None:
    r = FleetRollup("g")
    assert r.add(_summary(0, 1000))
    assert r.add(_summary(1, 1000, tasks_succeeded=10, fleet_cost_nusd=NANO))
    assert r.complete() == [1000]
    r.add(_summary(0, 2000))
    assert r.complete() == [1000]  # shard 1 has not reported 2000 yet
    fig = r.figures(1000)
    b = fig.body
    assert (b.reason, b.shards, b.shards_behind) == ("complete", 2, 0)
    assert (b.pools, b.nodes, b.requests_w, b.retries_w, b.retries_allowed) == (4, 20, 200, 10, 20)
    assert b.retry_budget_used_frac == pytest.approx(0.5)
    assert b.fleet_cost_usd == pytest.approx(5.0)
    assert b.tasks_succeeded == 50
    assert b.cost_per_successful_task_usd == pytest.approx(5.0 / 50)
    assert b.cost_rate_usd_per_h == pytest.approx(40.0)
    assert r.complete() == []
    assert r.pending() == [2000]
    partial = r.figures(2000)  # the hold expired: shard 1 contributes its newest (1000) summary
    assert (partial.body.reason, partial.body.shards, partial.body.shards_behind) == ("partial", 2, 1)
    assert [p.ts_ms for p in partial.parts] == [2000, 1000]


def test_a_silent_shard_stops_holding_boundaries_back_and_other_groups_are_ignored() -> None:
    r = FleetRollup("g", live_ms=30_000)
    r.add(_summary(0, 1000))
    r.add(_summary(1, 1000))
    r.figures(1000)
    r.add(_summary(0, 40_000))
    assert r.complete() == [40_000]  # shard 1 is 39 s behind: no longer live
    assert r.figures(40_000).body.shards == 1
    assert not r.add(_summary(2, 50_000, group="other"))
    assert not r.add(_summary(0, 39_000))  # older than the shard's newest
    assert r.ignored == 2


def test_a_boundary_reported_again_is_replaced_and_history_is_bounded() -> None:
    r = FleetRollup("g")
    r.add(_summary(0, 1000, nodes=1))
    r.add(_summary(0, 1000, nodes=7))
    assert r.figures(1000).body.nodes == 7
    for k in range(2, 200):
        r.add(_summary(0, k * 1000))
    assert len(r.shards[0]) <= 64


def test_no_success_no_budget_means_none_not_a_division_by_zero_and_it_is_a_valid_decision() -> None:
    b = fleet_body([_summary(0, 1000, tasks_succeeded=0, retries_allowed=0)])
    assert b.cost_per_successful_task_usd is None
    assert b.retry_budget_used_frac is None
    r = FleetRollup("g")
    r.add(_summary(0, 1000))
    d = decision_of(r.figures(1000), offset=1)
    again = Decision.model_validate_json(d.model_dump_json())
    assert again == d
    assert again.key == "fleet/fleet"
    assert again.policy == STAMP
    assert again.body.kind == "fleet"


def test_routers_ignore_a_fleet_decision_on_control_state() -> None:
    from fleetloop.router.state import DesiredState

    r = FleetRollup("g")
    r.add(_summary(0, 1000))
    st = DesiredState()
    assert st.accept(decision_of(r.figures(1000), offset=1), now_s=0.0)
    assert (st.pools, st.breakers, st.version) == ({}, {}, 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hold-s", "-1"], "--hold-s must be within 0..600"),
        (["--live-s", "0"], "--live-s must be within 1..86400"),
        ([], "cannot reach 127.0.0.1:1"),
    ],
)
def test_rollup_refuses_bad_flags_and_an_unreachable_broker_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetloop.cli.main import main

    assert main(["rollup", "--bootstrap-servers", "127.0.0.1:1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert "\n" not in err
    assert "Traceback" not in err
