"""``fleetloop bench decide`` and the decide path it measures: per-pool state, one shared snapshot."""

from __future__ import annotations

import orjson
import pytest
from fleetloop.bench.decide import fleet_tick
from fleetloop.bench.fleetgen import BASE_TS_MS, make_fleet, outcomes_at, telemetry_at
from fleetloop.cli.main import main
from fleetloop.core.decide.engine import Engine
from fleetloop.core.model.fleet import FleetModel, snapshot
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.control import Tick


def test_generated_fleet_has_pools_of_16_to_64_and_several_gpu_types() -> None:
    fleet = make_fleet(2000)
    sizes = [len(p.node_ids) for p in fleet.pools]
    assert sum(sizes) == 2000
    assert all(16 <= s <= 64 for s in sizes[:-1])
    assert len({p.gpu_type for p in fleet.pools}) >= 4
    assert len({p.pool_id.split("-")[0] for p in fleet.pools}) >= 3  # regions
    # Deterministic per seed.
    assert [p.pool_id for p in make_fleet(2000).pools] == [p.pool_id for p in fleet.pools]


def _model_and_engine(n_nodes: int, seconds: int) -> tuple[FleetModel, Engine, list[str], int]:
    fleet = make_fleet(n_nodes)
    model = FleetModel()
    engine = Engine(builtin_policy("default"))
    pools = sorted(fleet.pool_ids)
    ts = BASE_TS_MS
    for k in range(seconds):
        ts += 1000
        for t in telemetry_at(fleet, ts):
            model.fold_telemetry(t)
        for o in outcomes_at(fleet, ts, workflow_base=k * 10_000):
            model.fold_outcome(o)
        fleet_tick(model, engine, ts, pools)
    return model, engine, pools, ts


def test_each_pool_state_holds_only_its_own_nodes() -> None:
    model, engine, pools, _ = _model_and_engine(300, 3)
    for pool_id in pools:
        own = set(snapshot(model, model.watermark_ms).pools[pool_id].node_ids)
        for (section, _, pool), state in engine.pools[pool_id].algorithms.items():
            assert pool == pool_id
            if section in {"routing", "breaker"}:  # the speed / latency memory: a row per node
                assert set(state.memory.node_ids if section == "breaker" else state.node_ids) <= own
                figures = (state.memory if section == "breaker" else state).figures()
                assert figures  # and it did remember something


def test_shared_snapshot_gives_the_same_decisions_as_one_snapshot_per_pool() -> None:
    model, _, pools, ts = _model_and_engine(200, 3)
    policy = builtin_policy("default")
    shared, separate = Engine(policy), Engine(policy)
    ts += 1000
    snap = snapshot(model, ts)
    for pool in pools:
        tick = Tick(ts_ms=ts, tick_id=ts // 1000, pool_id=pool)
        a = shared.tick(snap, tick)
        b = separate.tick(snapshot(model, ts), tick)
        assert [d.model_dump_json() for d in a.decisions] == [d.model_dump_json() for d in b.decisions]


def test_bench_decide_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    import gc

    threshold = gc.get_threshold()
    assert main(["bench", "decide", "--nodes", "64,128", "--ticks", "2", "--warmup", "1", "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    # It ran with the daemon's collector settings and gave the process its own back.
    assert out["gc"] == "daemon"
    assert gc.get_threshold() == threshold
    assert gc.get_freeze_count() == 0
    assert [r["nodes"] for r in out["sizes"]] == [64, 128]
    for r in out["sizes"]:
        assert r["tick_cpu_p50_ms"] > 0
        assert 0 < r["snapshot_cpu_p50_ms"] < r["tick_cpu_p50_ms"]  # a part of the tick
        # Every pool's routing, admission, retry budget, autoscale and batching decisions (breaker
        # records are change-only: a closed node's only on a change or its keyframe).
        assert r["decisions_per_tick"] >= 5 * r["pools"]
    assert isinstance(out["growth_exponent"], float)


def test_bench_decide_folds_twins_as_the_daemon_does_and_reports_the_collector(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["bench", "decide", "--nodes", "64", "--ticks", "3", "--warmup", "2", "--json"]
    assert main(args) == 0  # the default: what the daemon folds
    twin = orjson.loads(capsys.readouterr().out)
    assert main([*args, "--records", "model"]) == 0
    plain = orjson.loads(capsys.readouterr().out)
    assert (twin["records"], plain["records"]) == ("twin", "model")
    # The same fleet folded either way decides the same number of records a tick.
    assert twin["sizes"][0]["decisions_per_tick"] == plain["sizes"][0]["decisions_per_tick"]
    for r in (twin["sizes"][0], plain["sizes"][0]):
        assert len(r["gc_collections_in_ticks"]) == len(r["gc_collections_in_folds"]) == 3
        assert 0 <= r["gc_in_tick_cpu_p50_ms"] <= r["gc_in_tick_cpu_max_ms"]
        # As the daemon decides: the collector held over the fold and the tick; what came due
        # runs after the tick, reported beside it with the rest of the second's collections.
        assert r["gc_collections_in_ticks"] == r["gc_collections_in_folds"] == [0, 0, 0]
        assert len(r["gc_collections_outside_ticks"]) == 3
        assert 0 <= r["gc_outside_tick_cpu_p50_ms"] <= r["gc_outside_tick_cpu_max_ms"]
        assert r["gc_longest_cpu_ms"] <= r["gc_outside_tick_cpu_max_ms"]


def test_bench_decide_collects_what_the_held_tick_put_off_after_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A fleet whose seconds allocate past the daemon's young threshold: with the daemon's
    settings every collection falls outside the ticks and folds (after them, as the daemon
    collects once the decisions are staged), and is reported; with Python's they land inside."""
    args = ["bench", "decide", "--nodes", "3000", "--ticks", "8", "--warmup", "1", "--json"]
    assert main(args) == 0
    (held,) = orjson.loads(capsys.readouterr().out)["sizes"]
    assert held["gc_collections_in_ticks"] == held["gc_collections_in_folds"] == [0, 0, 0]
    # Young objects past the daemon's threshold every few seconds at this size.
    assert sum(held["gc_collections_outside_ticks"]) >= 1
    assert held["gc_outside_tick_cpu_max_ms"] > 0
    assert main([*args, "--gc", "python"]) == 0
    (python,) = orjson.loads(capsys.readouterr().out)["sizes"]
    assert sum(python["gc_collections_in_ticks"]) > 0


def test_bench_decide_refuses_a_bad_size_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "decide", "--nodes", "ten"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--nodes" in err


def test_a_whole_fleet_tick_scores_the_fleet_once_and_each_pool_once_not_pools_squared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The snapshot-only scorers once for the whole fleet, the speed scorer once per pool for its own
    routing and once for the fleet's spill-over headroom (shared by every pool)."""
    from fleetloop.policies.routing.cache_aware import batch, rule

    calls = {"load_terms": 0, "with_speed": 0}

    def counting(name: str) -> object:
        real = getattr(rule, name)

        def wrapped(*args: object, **kwargs: object) -> object:
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapped

    # Wherever the package calls them: the rule's module (the fleet's load, a pool's scores, the
    # headroom) and the batch's (a batch's scores).
    for name in calls:
        wrapped = counting(name)
        for module in (rule, batch):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, wrapped)
    for n_nodes in (200, 800):
        model, engine, pools, ts = _model_and_engine(n_nodes, 1)
        calls.update(dict.fromkeys(calls, 0))
        fleet_tick(model, engine, ts + 1000, pools)
        # The speed scorer once per pool (the loop of decide) or once for the batch (cache-aware's
        # decide_pools, which since d297dfd decides every tick's pools, growing ones too), and once
        # for the fleet's headroom: never pools squared.
        assert calls["load_terms"] == 1
        assert 2 <= calls["with_speed"] <= len(pools) + 1


def test_the_workflow_phase_holds_n_workflows_past_the_default_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--workflows N`` measures one model holding N open workflows: the default open-workflow cap
    is raised to N for it (before, at N above the cap the phase never ended)."""
    from fleetloop.bench import decide as bench_decide
    from fleetloop.core.model.fleet import ModelConfig

    def small_default(**kw: int) -> ModelConfig:  # a default cap of 2,000 instead of 500,000
        return ModelConfig(**({"max_open_workflows": 2_000} | kw))

    monkeypatch.setattr(bench_decide, "ModelConfig", small_default)
    row = bench_decide.run_size(64, policy=builtin_policy("default"), ticks=2, warmup=1, workflows=5_000)
    assert row["workflows"]["open_workflows"] >= 5_000


def test_the_workflow_phase_ends_when_the_model_holds_no_more_and_times_new_tasks_then() -> None:
    from fleetloop.bench.decide import _with_workflows
    from fleetloop.core.model.fleet import ModelConfig

    fleet = make_fleet(64)
    model = FleetModel(ModelConfig(max_open_workflows=1_000))
    engine = Engine(builtin_policy("default"))
    row = _with_workflows(fleet, model, engine, sorted(fleet.pool_ids), ts=BASE_TS_MS, n=5_000, ticks=1)
    assert row["open_workflows"] == 1_000
    # Full: one more second of new tasks (n / 10), each letting go of the earliest open one.
    assert row["handed_off_at_cap"] >= 450
    assert row["new_task_us_at_cap"] > 0
    assert row["new_task_us_below_cap"] > 0
    roomy = FleetModel(ModelConfig(max_open_workflows=2_000))
    row = _with_workflows(fleet, roomy, engine, sorted(fleet.pool_ids), ts=BASE_TS_MS, n=1_000, ticks=1)
    assert "new_task_us_at_cap" not in row  # not full: nothing to time
