"""The breaker path's stages after a tick boundary (``runtime.TripTrace``, the "trip path" line)
and what the runtime does with a tripping pool's decisions."""

from __future__ import annotations

from fleetloop.daemon.runtime import TRACE_BOUNDARIES, TripTrace


def test_a_trace_keeps_each_stages_first_time_for_the_newest_boundaries() -> None:
    trace = TripTrace()
    trace.stamp(1000, "woke", 1001)
    trace.stamp(1000, "woke", 1050)  # the first time stands
    trace.stamp(1000, "staged", 1080)
    trace.trips.add(1000)
    assert trace.after(1000) == {"woke": 1, "staged": 80}
    assert trace.after(5000) == {}
    for k in range(1, TRACE_BOUNDARIES + 1):  # newer boundaries push the oldest out, with its trip
        trace.stamp(1000 + k * 1000, "woke", 1000 + k * 1000)
    assert len(trace.marks) == TRACE_BOUNDARIES
    assert 1000 not in trace.marks
    assert trace.trips == set()


async def test_a_tripping_pools_decisions_are_acknowledged_before_any_routine_pool_is_decided() -> None:
    """``Daemon._decide_ready``: the troubled pools of each shard's head boundary are decided,
    staged and acknowledged (``Publisher.settle``) before the first routine pool is decided; the
    trace has each of their stages and one "trip path" line. Without the settle (the mutation),
    the trip's decisions wait for the client's turns between the routine batches."""
    from typing import Any

    from fleetloop.daemon.runtime import Daemon, DaemonConfig, _HeldTick
    from fleetloop.daemon.shard import Row, Shard
    from fleetloop.policies.registry import builtin_policy
    from fleetloop.schemas import Tick
    from fleetloop.schemas.topics import REQUESTS, TELEMETRY
    from tests.support.records import outcome, telemetry

    t0 = 1_700_000_000_000
    events: list[tuple[str, ...]] = []

    class Publisher:
        async def stage(self, decisions: Any, shadow: Any = ()) -> None:
            events.append(("stage", *sorted({d.body.entity.split("/")[1] for d in decisions})))

        async def settle(self) -> bool:
            events.append(("settle",))
            return True

    class Consumer:
        def highwater(self, tp: Any) -> None:
            return None

    daemon = Daemon(DaemonConfig(bootstrap_servers="127.0.0.1:9", policy=builtin_policy("default")))
    daemon._consumer = Consumer()  # type: ignore[assignment]
    daemon._publisher = Publisher()  # type: ignore[assignment]
    boundary = t0 + 1000
    for p, pools in ((0, ("a", "b")), (1, ("c", "d"))):
        shard = daemon.shards[p] = Shard(p)
        shard.add(
            TELEMETRY, [Row(i, t0 + i, telemetry(f"{q}/0", q, ts_ms=t0 + i)) for i, q in enumerate(pools)]
        )
        kinds = ("ok", "error") if p == 1 else ("ok", "ok")  # pool d of shard 1 has a failed call
        shard.add(
            REQUESTS,
            [
                Row(i, t0 + 5 + i, outcome(f"{q}/0", k, q, ts_ms=t0 + 5 + i))
                for i, (q, k) in enumerate(zip(pools, kinds, strict=True))
            ],
        )
        cut = {TELEMETRY: 2, REQUESTS: 2}
        daemon._publish_from[p] = 0
        daemon._held[p] = [
            _HeldTick(k, Tick(ts_ms=boundary, tick_id=boundary // 1000, pool_id=q), boundary, cut, None, 0.0)
            for k, q in enumerate(pools)
        ]
    decided = await daemon._decide_ready()
    assert {d.body.entity.split("/")[1] for d in decided} == {"a", "b", "c", "d"}
    assert events[:2] == [("stage", "d"), ("settle",)]
    assert sorted(events[2:]) == [("stage", "a"), ("stage", "b"), ("stage", "c")]
    stages = daemon.trace.after(boundary)
    assert list(stages) == ["ticks_read", "cut_ready", "folded", "decided", "staged", "acked"]
    assert daemon.trace.trips == set()  # logged once, at the settle
