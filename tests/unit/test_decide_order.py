"""The runtime decides the pools of one boundary in any order (the troubled ones first): a pool's
decisions depend only on its tick, the shard's cut and its own state, never on which pools of the
same boundary were decided before it. Replay decides in log order and must produce the same bytes."""

from __future__ import annotations

import numpy as np
import pytest
from fleetloop.core.shard import INPUTS, Row, Shard
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import Tick
from fleetloop.schemas.topics import REQUESTS, TELEMETRY
from tests.support.records import outcome, telemetry

POOLS = ("a", "b", "c", "d")
T0 = 1_700_000_000_000
SECONDS = 40


def stream(seed: int = 5) -> dict[str, list[Row]]:
    """Four pools of five nodes on one shard; node c/4 fails from second 10 to 25."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list[Row]] = {TELEMETRY: [], REQUESTS: []}
    n = 0
    for s in range(SECONDS):
        base = T0 + s * 1000
        for pool in POOLS:
            for i in range(5):
                node = f"{pool}/{i}"
                q = int(rng.integers(0, 6)) + (25 if node == "c/4" and 10 <= s < 25 else 0)
                rows[TELEMETRY].append(
                    Row(
                        len(rows[TELEMETRY]),
                        base + 10 + i,
                        telemetry(node, pool, ts_ms=base + 10 + i, queue_depth=q),
                    )
                )
        calls = []
        for _ in range(int(rng.integers(20, 40))):
            pool = POOLS[int(rng.integers(len(POOLS)))]
            node = f"{pool}/{int(rng.integers(5))}"
            bad = node == "c/4" and 10 <= s < 25
            kind = "error" if bad else ("timeout" if rng.random() < 0.02 else "ok")
            ts = base + int(rng.integers(0, 1000))
            calls.append((ts, outcome(node, kind, pool, ts_ms=ts, n=n, workflow_id=f"w-{n // 3}")))
            n += 1
        for ts, item in sorted(calls, key=lambda c: c[0]):
            rows[REQUESTS].append(Row(len(rows[REQUESTS]), ts, item))
    return rows


def run(rows: dict[str, list[Row]], order: str) -> tuple[dict[tuple[int, str], list[bytes]], int]:
    """Decide every pool at every boundary, in ``order``; the decisions per (tick, pool), and how
    many boundaries had a troubled pool."""
    policy = builtin_policy("default")
    shard = Shard(0)
    out: dict[tuple[int, str], list[bytes]] = {}
    troubled_boundaries = 0
    for s in range(1, SECONDS + 1):
        boundary = T0 + s * 1000
        cut = {k: sum(1 for r in rows[k] if r.timestamp_ms <= boundary) for k in INPUTS}
        for logical in INPUTS:
            shard.add(logical, rows[logical][shard.read[logical] : cut[logical]])
        troubled = shard.troubled(cut)
        troubled_boundaries += bool(troubled)
        pools = list(POOLS)
        if order == "reversed":
            pools.reverse()
        elif order == "troubled-first":
            pools.sort(key=lambda p: (p not in troubled, p))
        for pool in pools:
            decided = shard.decide(Tick(ts_ms=boundary, tick_id=boundary // 1000, pool_id=pool), cut, policy)
            assert decided is not None
            out[(boundary, pool)] = [decision_bytes(d) for d in decided]
    return out, troubled_boundaries


@pytest.mark.parametrize("order", ["reversed", "troubled-first"])
def test_the_pools_of_one_boundary_decide_the_same_bytes_in_any_order(order: str) -> None:
    rows = stream()
    in_log_order, troubled = run(rows, "log")
    other, _ = run(rows, order)
    assert other == in_log_order
    # The run exercised what the order is for: boundaries with a troubled pool, a breaker opened.
    assert troubled >= 10
    assert any(b'"state":"open"' in d for ds in in_log_order.values() for d in ds)


def test_troubled_names_the_pools_with_a_failed_call_within_the_cut_only() -> None:
    rows = stream()
    shard = Shard(0)
    for logical in INPUTS:
        shard.add(logical, rows[logical])
    # Before the first failed call (an error or a timeout) no pool is troubled; with it, its pool.
    first_bad = next(
        r for r in rows[REQUESTS] if r.item is not None and r.item.outcome in ("error", "timeout")
    )
    assert first_bad.item is not None
    before = {TELEMETRY: len(rows[TELEMETRY]), REQUESTS: first_bad.offset}
    assert shard.troubled(before) == set()
    assert shard.troubled({**before, REQUESTS: first_bad.offset + 1}) == {first_bad.item.pool_id}
    assert "c" in shard.troubled(shard.read)  # c/4's run of errors


def test_the_decider_puts_the_troubled_pools_of_each_shards_head_boundary_first() -> None:
    """``Decider.decide_ready``: across shards, the ticks of the boundary at the head of each queue
    whose pool has a failed call in that cut are decided and acknowledged first; not a later
    boundary's, not an untroubled pool's."""
    from typing import Any

    from fleetloop.daemon.runtime.partition import HeldTick
    from tests.support.runtime_harness import Rig, on_rig

    events: list[str] = []

    class Publisher:
        async def stage(self, decisions: Any, shadow: Any = ()) -> None:
            events.extend(sorted({d.body.entity.split("/")[1] for d in decisions}))

        async def settle(self) -> bool:
            events.append("settle")
            return True

    class Consumer:
        def highwater(self, tp: Any) -> None:
            return None

    t1, t2 = T0 + 1000, T0 + 2000

    async def check(r: Rig) -> None:
        for p, pools in ((0, ("a", "b")), (1, ("c", "d"))):
            owned = r.own(p)
            shard = owned.shard
            shard.add(
                TELEMETRY, [Row(i, T0 + i, telemetry(f"{q}/0", q, ts_ms=T0 + i)) for i, q in enumerate(pools)]
            )
            bad = "b" if p == 0 else "z"  # shard 1's failure is in pool z, which ticks at t2 only
            shard.add(
                REQUESTS,
                [
                    Row(0, T0 + 5, outcome(f"{pools[0]}/0", "ok", pools[0], ts_ms=T0 + 5)),
                    Row(1, T0 + 6, outcome(f"{bad}/0", "error", bad, ts_ms=T0 + 6)),
                ],
            )
            cut = {TELEMETRY: 2, REQUESTS: 2}
            ticks = [Tick(ts_ms=t1, tick_id=t1 // 1000, pool_id=q) for q in pools]
            ticks.append(Tick(ts_ms=t2, tick_id=t2 // 1000, pool_id="b" if p == 0 else "z"))
            owned.held = [HeldTick(k, t, t.ts_ms, cut, None, 0.0) for k, t in enumerate(ticks)]
        # Pool z's failure is in shard 1's cut, but z's tick is at a later boundary: not ahead of c and d.
        assert r.parts[1].shard.troubled({TELEMETRY: 2, REQUESTS: 2}) == {"z"}
        await r.decider().decide_ready()
        assert events[:2] == ["b", "settle"]
        assert events[2:6] == ["a", "b", "c", "d"]  # then each queue in order

    on_rig(check, consumer=Consumer(), publisher=Publisher(), wall_ms=T0)


def test_every_pool_of_a_shard_ticks_a_boundary_at_one_cut_computed_once() -> None:
    """``Ticker.publish``: the ticks of one shard at one boundary carry one cut, the cut as it stood
    when the boundary was published, even when the loop reads more records (stamped before the
    boundary) while the ticker awaits its sends; and the cut is computed once per shard and
    boundary, not once per pool (a scan of the shard's pending records: at 10,000 nodes, a third of
    the daemon's CPU when done per pool)."""
    import dataclasses
    from typing import Any

    import orjson
    from fleetloop.daemon.runtime.config import CUT_HEADER
    from tests.support.runtime_harness import rig
    from tests.support.virtual_time import FakeClock, run_virtual

    pools = ("a", "b", "c", "d")
    boundary = T0 + 1000
    scans: list[int] = []
    sent: list[tuple[bytes, bytes]] = []

    async def run(clock: FakeClock) -> dict[str, int]:
        async with rig(clock) as r:
            shard = r.own(0).shard
            shard.add(
                TELEMETRY, [Row(i, T0 + i, telemetry(f"{q}/0", q, ts_ms=T0 + i)) for i, q in enumerate(pools)]
            )
            expected = shard.cut_by_time(boundary)
            real_cut = shard.cut_by_time

            def counted(ts_ms: int) -> dict[str, int]:
                scans.append(ts_ms)
                return real_cut(ts_ms)

            shard.cut_by_time = counted  # type: ignore[method-assign]
            producer = r.session.producer

            class Recorder:  # the producer's send, while the loop goes on reading records
                async def send(self, topic: str, **kw: Any) -> Any:
                    sent.append((kw["key"], dict(kw["headers"])[CUT_HEADER]))
                    n = shard.read[TELEMETRY]
                    shard.add(TELEMETRY, [Row(n, T0 + 500, telemetry("a/1", "a", ts_ms=T0 + 500))])
                    return await producer.send(topic, **kw)

            r.link.session = dataclasses.replace(r.session, producer=Recorder())  # type: ignore[arg-type]
            await r.ticker().publish(boundary, 1000)
            return expected

    expected = run_virtual(run, wall_ms=T0)
    assert [k for k, _ in sent] == [q.encode() for q in pools]
    assert {cut for _, cut in sent} == {orjson.dumps(expected, option=orjson.OPT_SORT_KEYS)}
    assert scans == [boundary]


def test_a_shards_summary_waits_until_every_tick_of_its_boundary_is_decided() -> None:
    """``Summaries.publish``: a boundary whose ticks a shard decided over two batches is summarized
    once, after the second batch (each batch published one before, the first without the pools
    still to decide: two summaries for one boundary)."""
    from fleetloop.daemon.runtime.partition import HeldTick
    from fleetloop.schemas.topics import SUMMARIES
    from tests.support.runtime_harness import Rig, on_rig

    async def check(r: Rig) -> None:
        owned = r.own(0)
        shard = owned.shard
        shard.add(
            TELEMETRY,
            [Row(0, T0, telemetry("a/0", "a", ts_ms=T0)), Row(1, T0, telemetry("b/0", "b", ts_ms=T0))],
        )
        shard.fold_read()
        summaries = r.summaries()
        boundary = T0 + 1000
        ticks = [Tick(ts_ms=boundary, tick_id=boundary // 1000, pool_id=q) for q in ("a", "b")]
        # Batch one decided pool a's tick; pool b's, of the same boundary, is still held.
        summaries.note(0, ticks[0], ())
        owned.held = [HeldTick(1, ticks[1], boundary, None, None, 0.0)]
        await summaries.publish()
        assert r.broker.records(SUMMARIES) == []
        # Batch two decided pool b's: the boundary is whole, summarized once.
        owned.held = []
        summaries.note(0, ticks[1], ())
        await summaries.publish()
        await summaries.publish()
        assert [x.key for x in r.broker.records(SUMMARIES)] == [b"fleetloop/0"]
        assert r.stats.summaries_published == 1

    on_rig(check, wall_ms=T0)
