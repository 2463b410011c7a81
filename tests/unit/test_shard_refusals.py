"""Nothing silent, nothing unbounded in a shard: every record the model refuses (a cap) or cannot
fold (an exception) comes out as a refusal with its reason and its own bytes, exactly once and only
when its cut is decided; pools the model evicted or refused leave the shard's per-pool bookkeeping."""

from __future__ import annotations

from typing import Any

from fleetloop.core.model.fleet import FleetModel, ModelConfig
from fleetloop.core.shard import Row, Shard
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import Tick
from fleetloop.schemas.topics import REQUESTS, TELEMETRY
from tests.support.records import outcome, telemetry, to_bytes

T0 = 1_700_000_000_000
POLICY = builtin_policy("default")


def shard_with(config: ModelConfig) -> Shard:
    shard = Shard(0)
    shard.model = FleetModel(config)
    shard.refusals = []
    return shard


def row(offset: int, item: Any) -> Row:
    return Row(offset, item.ts_ms, item, f"k{offset}".encode(), to_bytes(item))


def tick_at(ts: int, pool: str) -> Tick:
    return Tick(ts_ms=ts, tick_id=ts // 1000, pool_id=pool)


def test_cap_refusals_come_out_with_reason_and_bytes_once_their_cut_is_decided() -> None:
    shard = shard_with(ModelConfig(max_pools=2, max_tenants=1, max_open_workflows=1))
    rows = [row(i, telemetry("n", pool=f"pool-{i}", ts_ms=T0 + i)) for i in range(4)]
    shard.add(TELEMETRY, rows)
    assert shard.refusals == []  # read, not yet cut: nothing decided about them
    shard.decide(tick_at(T0 + 1000, "pool-0"), {TELEMETRY: 3, REQUESTS: 0}, POLICY)
    assert [(r.offset, r.reason.split(":")[0]) for r in shard.refusals] == [(2, "capacity-pools")]
    assert shard.refusals[0].value == rows[2].value
    assert shard.refusals[0].key == b"k2"
    shard.refusals = []
    shard.decide(tick_at(T0 + 2000, "pool-0"), {TELEMETRY: 4, REQUESTS: 0}, POLICY)
    assert [r.offset for r in shard.refusals] == [3]  # the next cut: the next record, not again
    shard.refusals = []
    outs = [
        row(0, outcome("n", pool="pool-0", ts_ms=T0 + 2100, tenant_id="a", workflow_id="w1")),
        row(1, outcome("n", pool="pool-0", ts_ms=T0 + 2200, tenant_id="b", workflow_id="w1")),
        row(2, outcome("n", pool="pool-0", ts_ms=T0 + 2300, tenant_id="a", workflow_id="w2")),
    ]
    shard.add(REQUESTS, outs)
    shard.decide(tick_at(T0 + 3000, "pool-0"), {TELEMETRY: 4, REQUESTS: 3}, POLICY)
    assert [(r.logical, r.offset, r.reason.split(":")[0]) for r in shard.refusals] == [
        (REQUESTS, 1, "capacity-tenants"),
    ]  # the open-workflow cap refuses nothing: w1 was let go for w2
    assert list(shard.model.ledger.active) == ["w2"]
    assert shard.model.ledger.tasks_handed_off == 1


def test_a_fold_that_raises_is_a_refusal_with_the_error() -> None:
    shard = shard_with(ModelConfig())
    good = row(0, telemetry("n", pool="p", ts_ms=T0))
    # A forged record (built without validation) whose fold raises: a price that is not a number.
    forged = telemetry("m", pool="p", ts_ms=T0 + 1).model_copy(update={"cost_rate_usd_per_h": "x"})
    bad = Row(1, forged.ts_ms, forged, b"k1", b"{}")
    after = row(2, telemetry("o", pool="p", ts_ms=T0 + 2))
    shard.add(TELEMETRY, [good, bad, after])
    decided = shard.decide(tick_at(T0 + 1000, "p"), {TELEMETRY: 3, REQUESTS: 0}, POLICY)
    assert decided  # the pool is decided from what did fold
    assert shard.fold_errors == 1
    assert shard.refusals is not None
    assert [(r.offset, r.reason.split(":")[:2]) for r in shard.refusals] == [
        (1, ["fold-error", " TypeError"])
    ]
    assert sorted(shard.model.nodes) == ["n", "o"]  # the batch went on past the record that raised


def test_replay_shards_keep_no_refusals() -> None:
    shard = Shard(0)
    shard.model = FleetModel(ModelConfig(max_pools=1))
    shard.add(TELEMETRY, [row(i, telemetry("n", pool=f"q{i}", ts_ms=T0 + i)) for i in range(3)])
    shard.decide(tick_at(T0 + 1000, "q0"), {TELEMETRY: 3, REQUESTS: 0}, POLICY)
    assert shard.refusals is None
    assert shard.model.refused["pools"] == 2


def test_per_pool_bookkeeping_is_bounded_by_the_model_not_by_every_pool_ever_seen() -> None:
    shard = shard_with(ModelConfig(max_pools=4, retention_ms=10_000, forget_node_after_ms=5_000))
    ts = T0
    offset = 0
    # 400 invented pools, one record each, over time: at most 4 are held at once.
    for i in range(400):
        ts += 100
        shard.add(TELEMETRY, [row(offset, telemetry(f"n{i}", pool=f"fp-{i}", ts_ms=ts))])
        offset += 1
        boundary = ts + 1
        for pool in shard.pools():
            shard.decide(tick_at(boundary, pool), {TELEMETRY: offset, REQUESTS: 0}, POLICY)
        assert len(shard.pools()) <= 4
        assert len(shard.last_tick) <= 4
        assert len(shard.states) <= 4
        assert not shard.pending_pools  # everything read was cut
    assert shard.model.refused["pools"] > 0
    assert shard.model.evicted["pools"] > 0
    # A refused pool's tick decides nothing and leaves nothing behind.
    assert shard.decide(tick_at(ts + 5000, "never-held"), {TELEMETRY: offset, REQUESTS: 0}, POLICY) == ()
    assert "never-held" not in shard.last_tick
