"""Bounded state and fail-safe decisions: caps with eviction of silent entities and
counters, per-pool clocks, a silent pool's autoscale target frozen, forged policy versions refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from fleetloop.core.decide.engine import Engine, EngineState, decide
from fleetloop.core.decide.shaping import pool_is_silent
from fleetloop.core.model import FleetModel, ModelConfig, apply, snapshot
from fleetloop.daemon.runtime.follower import PolicyFollower
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import AutoscaleDecision, Tick
from tests.support.policies import foundation
from tests.support.records import outcome, telemetry
from tests.support.runtime_harness import rig
from tests.support.virtual_time import FakeClock, run_virtual
from tests.unit.test_engine import HPA_DOWN, policy

T = 1_700_000_000_000


# -- caps -------------------------------------------------------------------------------------------


def test_pools_beyond_the_cap_are_refused_while_the_others_are_live() -> None:
    model = FleetModel(ModelConfig(max_pools=3))
    for p in ("a", "b", "c"):
        assert model.fold_telemetry(telemetry(f"{p}/0", p, T)) is None
    refused = model.fold_telemetry(telemetry("x/0", "x", T + 1_000))
    assert refused is not None
    assert refused.startswith("capacity-pools: pool cap 3")
    assert model.fold_outcome(outcome("x/0", pool="x", ts_ms=T + 1_000)) is not None
    assert sorted(model.pools) == ["a", "b", "c"]
    assert model.refused["pools"] == 2
    assert "x/0" not in model.nodes


def test_a_silent_pool_makes_room_for_a_new_one() -> None:
    model = FleetModel(ModelConfig(max_pools=2))
    apply(model, [telemetry("a/0", "a", T), telemetry("b/0", "b", T + 59_000)])
    assert model.fold_telemetry(telemetry("c/0", "c", T + 61_000)) is None  # a: silent 61 s > 60 s
    assert sorted(model.pools) == ["b", "c"]
    assert "a/0" not in model.nodes
    assert model.evicted["pools"] == 1


def test_a_thousand_invented_pools_cost_a_bounded_model_and_real_pools_keep_their_nodes() -> None:
    model = FleetModel(ModelConfig(max_pools=10))
    apply(model, [telemetry(f"real/{i}", "real", T) for i in range(3)])
    refusals = [model.fold_telemetry(telemetry(f"inv{i}/0", f"inv{i}", T + 500)) for i in range(1_000)]
    assert sum(r is not None for r in refusals) == 1_000 - 9
    assert len(model.pools) == 10
    assert snapshot(model, T + 1_000).pools["real"].node_ids == ("real/0", "real/1", "real/2")


def test_nodes_beyond_the_pool_cap_are_refused_and_a_silent_one_makes_room() -> None:
    model = FleetModel(ModelConfig(max_nodes_per_pool=3))
    apply(model, [telemetry(f"n{i}", ts_ms=T + i * 1_000) for i in range(3)])
    assert model.fold_telemetry(telemetry("n3", ts_ms=T + 3_000)) is not None
    assert model.refused["nodes"] == 1
    assert model.fold_telemetry(telemetry("n0", ts_ms=T + 3_000)) is None  # a known node always folds
    # n1 silent for 61 s: it is evicted to make room for n4.
    apply(model, [telemetry("n0", ts_ms=T + 62_000), telemetry("n2", ts_ms=T + 62_000)])
    assert model.fold_telemetry(telemetry("n4", ts_ms=T + 62_000)) is None
    assert sorted(snapshot(model, T + 62_000).nodes) == ["n0", "n2", "n4"]


def test_the_fleet_wide_node_cap_holds_across_pools() -> None:
    model = FleetModel(ModelConfig(max_nodes=5))
    refusals = [model.fold_telemetry(telemetry(f"n{i}", f"p{i % 3}", T)) for i in range(8)]
    assert [r is None for r in refusals] == [True] * 5 + [False] * 3
    assert refusals[-1] == "capacity-nodes: fleet node cap 5 reached"
    assert len(model.nodes) == 5


def test_a_flood_of_invented_node_ids_is_refused_in_bounded_time() -> None:
    model = FleetModel(ModelConfig(max_nodes_per_pool=100))
    apply(model, [telemetry(f"real/{i}", ts_ms=T) for i in range(3)])
    refusals = [model.fold_telemetry(telemetry(f"inv/{i}", ts_ms=T + 100)) for i in range(100_000)]
    assert sum(r is not None for r in refusals) == 100_000 - 97
    assert len(model.pools["p"].nodes) == 100
    assert {"real/0", "real/1", "real/2"} <= set(snapshot(model, T + 200).nodes)


def test_tenants_workflows_and_unplaced_nodes_are_capped_the_record_still_counts_for_its_pool() -> None:
    model = FleetModel(ModelConfig(max_tenants=2, max_open_workflows=2, max_unplaced_nodes=2))
    records = [
        outcome(f"ghost{i}", ts_ms=T, n=i, tenant_id=f"t{i}", workflow_id=f"w{i}", request_id=f"r{i}")
        for i in range(5)
    ]
    assert all(model.fold_outcome(o) is None for o in records)
    assert (len(model.tenants), len(model.ledger.active), len(model.node_wins)) == (2, 2, 2)
    assert model.refused["tenants"] == model.refused["unplaced_nodes"] == 3
    # Open workflows: the earliest opened are let go for the new ones (by count), never refused.
    assert list(model.ledger.active) == ["w3", "w4"]
    assert model.refused["workflows"] == 0
    assert model.ledger.tasks_handed_off == model.evicted["workflows"] == 3
    assert snapshot(model, T + 500).pools["p"].requests_w == 5


def test_finished_workflows_are_bounded_by_count_oldest_forgotten_first() -> None:
    model = FleetModel(ModelConfig(max_finished_workflows=3))
    for i in range(5):
        model.fold_outcome(outcome("a", ts_ms=T + i, n=i, workflow_id=f"w{i}", task_outcome="succeeded"))
    assert list(model.ledger.finished) == ["w2", "w3", "w4"]
    assert model.evicted["finished_workflows"] == 2
    assert model.ledger.tasks_succeeded == 5


def test_silent_tenants_and_unplaced_nodes_are_evicted_as_the_fleet_clock_moves() -> None:
    model = FleetModel()
    apply(model, [outcome("ghost", ts_ms=T, tenant_id="old"), telemetry("a", ts_ms=T)])
    assert "old" in model.tenants
    assert "ghost" in model.node_wins
    apply(model, [telemetry("a", ts_ms=T + 320_000)])
    assert "old" not in model.tenants
    assert "ghost" not in model.node_wins
    assert model.evicted["tenants"] == model.evicted["unplaced_nodes"] == 1


# -- per-pool clocks --------------------------------------------------------------------------------


def test_a_far_future_record_moves_only_its_own_pools_clock() -> None:
    model = FleetModel()
    pools = ("a", "b", "c")
    apply(model, [telemetry(f"{p}/0", p, T) for p in pools])
    model.fold_telemetry(telemetry("forged", "c", 4_102_444_800_000))  # the year 2100, in pool c
    apply(model, [telemetry(f"{p}/0", p, T + 1_000) for p in ("a", "b")])
    snap = snapshot(model, T + 1_000)
    assert snap.pools["a"].node_ids == ("a/0",)
    assert snap.pools["b"].node_ids == ("b/0",)
    assert model.watermark_ms == T + 1_000  # the fleet clock (upper median) did not jump
    assert model.late_dropped == 0


def test_a_dead_pool_does_not_stop_the_fleet_clock_and_is_evicted() -> None:
    model = FleetModel()
    apply(model, [telemetry(f"{p}/0", p, T) for p in ("a", "b", "dead")])
    for k in range(1, 40):
        apply(model, [telemetry(f"{p}/0", p, T + k * 10_000) for p in ("a", "b")])
    assert "dead" not in model.pools
    assert model.watermark_ms == T + 390_000


# -- fail-safe autoscale ------------------------------------------------------------------------------


def _fleet(ts_ms: int, n: int, *, outcomes: int = 0, **kw: Any) -> list[Any]:
    recs: list[Any] = [telemetry(f"n{i:02d}", ts_ms=ts_ms, **kw) for i in range(n)]
    recs += [outcome(f"n{i % n:02d}", ts_ms=ts_ms, n=i, request_id=f"r{ts_ms}-{i}") for i in range(outcomes)]
    return recs


def _autoscale(result: Any) -> AutoscaleDecision:
    (d,) = [x.body for x in result.decisions if x.body.kind == "autoscale"]
    assert isinstance(d, AutoscaleDecision)
    return d


def test_a_silent_pool_keeps_its_autoscale_target() -> None:
    """The issue's run: a whole pool goes silent and the default policy's autoscaler drove it from
    11 nodes to 1 within 8 s. Now the engine holds the target; the algorithm's own proposal is
    kept in the decision's inputs (and shows it would still have scaled down)."""
    engine, model = Engine(builtin_policy("default")), FleetModel()
    decisions = []
    for k in range(1, 31):
        now = T + k * 1_000
        if k <= 5:
            apply(model, _fleet(now, 11, outcomes=20, gpu_util_frac=0.8))
        decisions.append(
            _autoscale(engine.tick(snapshot(model, now), Tick(ts_ms=now, tick_id=k, pool_id="p")))
        )
    held = decisions[4].desired_nodes
    assert held >= 11
    assert [d.desired_nodes for d in decisions] == [held] * 30
    frozen = [d for d in decisions if d.reason.endswith(":silent-pool-frozen")]
    assert frozen, "the pool went silent: its decisions must say they were frozen"
    assert min(d.inputs["proposed_nodes"] for d in frozen) < 11, "the algorithm alone would have scaled down"
    assert all(d.drain == () for d in frozen)


def test_silence_is_no_fresh_telemetry_from_any_node() -> None:
    model = apply(FleetModel(), _fleet(T, 3))
    assert not pool_is_silent(snapshot(model, T + 1_000), "p")
    assert pool_is_silent(snapshot(model, T + 6_000), "p")
    apply(model, [outcome("n00", ts_ms=T + 5_500)])  # routers still report: the nodes are still silent
    assert pool_is_silent(snapshot(model, T + 6_000), "p")
    apply(model, [telemetry("n01", ts_ms=T + 5_500)])
    assert not pool_is_silent(snapshot(model, T + 6_000), "p")


def test_a_pool_without_nodes_but_with_demand_is_not_silent() -> None:
    model = apply(FleetModel(), [outcome(None, "shed", pool="empty", ts_ms=T)])
    assert not pool_is_silent(snapshot(model, T + 1_000), "empty")
    assert pool_is_silent(snapshot(model, T + 20_000), "empty")


def test_a_silent_pool_without_history_holds_at_least_its_serving_nodes() -> None:
    silent_snap = snapshot(apply(FleetModel(), _fleet(T, 4)), T + 10_000)  # 4 nodes, all stale
    d = _autoscale(
        decide(
            silent_snap,
            policy(autoscale=HPA_DOWN),
            EngineState(),
            Tick(ts_ms=T + 10_000, tick_id=1, pool_id="p"),
        )
    )
    assert d.desired_nodes == 4
    assert d.drain == ()


# -- forged policy versions -------------------------------------------------------------------------


@dataclass
class _Rec:
    value: bytes | None
    topic: str = "control.policy"
    partition: int = 0
    offset: int = 0
    key: bytes | None = b"foundation"
    timestamp: int = T


def _doc(version: int) -> bytes:
    doc = foundation().document.model_dump(mode="json")
    doc["metadata"]["version"] = version
    return orjson.dumps(doc)


def _follower_check(check: Callable[[PolicyFollower], None], **kw: Any) -> None:
    async def run(clock: FakeClock) -> None:
        async with rig(clock, policy=foundation(), **kw) as r:
            check(r.follower())

    run_virtual(run)


def test_a_forged_policy_version_is_refused_and_later_real_versions_still_apply() -> None:
    def check(f: PolicyFollower) -> None:
        active = foundation().stamp.version
        letter = f.consider(_Rec(_doc(10**15)), "foundation")
        assert letter is not None
        assert letter.reason.startswith("policy-version-jump: version 1000000000000000")
        assert f.pending_policy is None
        assert f.consider(_Rec(_doc(active + 1)), "foundation") is None
        assert f.pending_policy is not None
        assert f.pending_policy.stamp.version == active + 1
        assert f.stats.policies_refused == 1

    _follower_check(check, max_policy_version_step=100)


def test_a_policy_record_that_is_anything_but_a_document_is_refused() -> None:
    def check(f: PolicyFollower) -> None:
        values = (b"", b"{", b"[1e999]", b'{"apiVersion": 1}', b"x" * 200_000, _doc(2**53 + 1))
        letters = [f.consider(_Rec(value), "foundation") for value in values]
        # Each reason starts with a kind that says what was wrong (what dead letters are counted by),
        # never an exception's class name or the record's own topic and offset.
        assert [d.kind if d is not None else None for d in letters] == [
            "empty-value",
            "json_invalid",
            "json_invalid",
            "policy-invalid",
            "record-too-large",
            "policy-invalid",
        ]
        assert f.stats.policies_refused == 6
        assert f.pending_policy is None

    _follower_check(check)


def test_a_flood_of_same_model_pools_fills_no_routing_decision_beyond_max_spill_pools() -> None:
    records: list[Any] = [telemetry(f"p/{i}", ts_ms=T) for i in range(3)]
    records += [telemetry(f"x{i}/0", f"x{i}", T) for i in range(50)]  # valid pools serving the same model
    served = [outcome(f"x{i}/0", pool=f"x{i}", ts_ms=T + 100) for i in range(50)]

    def spill_to(recs: list[Any]) -> tuple[str, ...]:
        snap = snapshot(apply(FleetModel(), recs), T + 500)
        result = decide(
            snap, builtin_policy("default"), EngineState(), Tick(ts_ms=T + 500, tick_id=1, pool_id="p")
        )
        (routing,) = [d.body for d in result.decisions if d.body.kind == "routing"]
        return routing.spill_to  # type: ignore[union-attr,no-any-return]

    assert len(spill_to(records + served)) == 8  # calls completed on them: real pools, capped at 8
    assert spill_to(records) == ()  # telemetry alone never makes a spill target
