"""fleetloop.router over a real broker: the follower keeps a router current from control.state, and
the publisher gets every outcome to fleet.requests, keyed by pool."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from fleetloop.router import Endpoint, Router
from fleetloop.router.follow import StateFollower
from fleetloop.router.publish import OutcomePublisher
from fleetloop.schemas import RequestOutcome
from fleetloop.schemas.decisions import BreakerDecision, Decision, PolicyStamp, RoutingDecision
from fleetloop.schemas.topics import REQUESTS, STATE, TELEMETRY
from tests.support.kafka import producer, read_all, send
from tests.support.records import outcome, telemetry
from tests.support.wait import wait_until

STAMP = PolicyStamp(name="t", version=1, hash="0" * 16, mode="enforce")


def _state(body: Any, tick: int, ts_ms: int) -> bytes:
    d = Decision(ts_ms=ts_ms, tick_id=tick, policy=STAMP, body=body)
    return orjson.dumps(d.model_dump(mode="json"))


def _newer(record: bytes, kind: str | None = None) -> bytes:
    """A decision as a daemon newer than this router writes it: one more field in its body, or (with
    ``kind``) a kind of decision this router does not know."""
    d = orjson.loads(record)
    d["body"]["a_field_from_a_newer_daemon"] = {}
    if kind is not None:
        d["body"]["kind"] = kind
    return orjson.dumps(d)


def _routing(weights: dict[str, float]) -> RoutingDecision:
    return RoutingDecision(entity="pool/p", reason="r", pool_id="p", weights=weights)


def _pick(router: Router[Endpoint]) -> str:
    from fleetloop.router import clock

    r = router.pick(("m",), 0, None, new_task=False, budget_ms=1000, now_s=clock.monotonic_s())
    return r.node.node_id if r.node is not None else f"none:{r.reason}"


async def test_follower_catches_up_then_follows_and_survives_bad_records(kafka_env: Any) -> None:
    from fleetloop.router import clock

    now_ms = clock.wall_ms()
    eps = {f"p/{i}": Endpoint(node_id=f"p/{i}", pool_id="p") for i in range(3)}
    router: Router[Endpoint] = Router(
        {"m": ("p",)}, np.random.default_rng(0), members={"p": list(eps.values())}, nodes=eps
    )
    async with producer(kafka_env) as p:
        await send(
            p,
            kafka_env,
            STATE,
            [
                _state(_routing({"p/0": 1.0}), 7, now_ms),
                _state(_routing({"p/1": 1.0}), 6, now_ms),  # older tick, read later: dropped
                b'{"tick_id": "not a decision"}',
                # a field this reader does not know: read without it (the daemon upgraded first)
                _newer(_state(_routing({"p/0": 1.0}), 8, now_ms)),
                _newer(_state(_routing({"p/1": 1.0}), 9, now_ms), kind="placement"),  # skipped
            ],
            key=b"routing/pool/p",
        )
        follower = StateFollower(
            router, kafka_env.bootstrap_servers, topic_prefix=kafka_env.prefix, endpoints=eps
        )
        await follower.start()
        try:
            assert follower.stats.caught_up
            assert follower.stats.malformed == 1
            assert follower.stats.newer == 2
            assert "kind placement" in follower.stats.last_newer
            assert router.state.dropped_stale == 1
            assert router.state.held.get("routing/pool/p") == 8  # the newer daemon's record, applied
            assert _pick(router) == "p/0"
            # live: a breaker opens and the routing moves; the router follows within a poll or two
            breaker = BreakerDecision(entity="p/0", reason="r", pool_id="p", node_id="p/0", state="open")
            await send(p, kafka_env, STATE, [_state(breaker, 9, now_ms)], key=b"breaker/p/0")
            await send(
                p, kafka_env, STATE, [_state(_routing({"p/2": 1.0}), 9, now_ms)], key=b"routing/pool/p"
            )
            st = router.state
            await wait_until(lambda: st.ejected("p/0") and st.held.get("routing/pool/p") == 9)
            assert {_pick(router) for _ in range(20)} == {"p/2"}
            # endpoint load follows fleet.telemetry (the shed thresholds read it)
            await send(p, kafka_env, TELEMETRY, [telemetry("p/2", queue_depth=9, running_requests=4)])
            await wait_until(lambda: eps["p/2"].queue_depth == 9)
            assert eps["p/2"].running == 4
        finally:
            await follower.stop()


async def test_a_compacted_state_older_than_the_ttl_is_not_taken_for_fresh(kafka_env: Any) -> None:
    from fleetloop.router import clock

    eps = {f"p/{i}": Endpoint(node_id=f"p/{i}", pool_id="p") for i in range(2)}
    router: Router[Endpoint] = Router(
        {"m": ("p",)},
        np.random.default_rng(0),
        members={"p": list(eps.values())},
        nodes=eps,
        fail_static_s=5.0,
    )
    old_ms = clock.wall_ms() - 60_000  # decided a minute ago, fleetloop silent since
    async with producer(kafka_env) as p:
        await send(p, kafka_env, STATE, [_state(_routing({"p/1": 1.0}), 3, old_ms)], key=b"routing/pool/p")
    follower = StateFollower(router, kafka_env.bootstrap_servers, topic_prefix=kafka_env.prefix)
    await follower.start()
    try:
        assert router.state.accepted == 1
        picks = [_pick(router) for _ in range(4)]
        # plain round robin over both members, not the stale "all to p/1"
        assert picks == ["p/0", "p/1", "p/0", "p/1"]
    finally:
        await follower.stop()


async def test_publisher_delivers_every_outcome_keyed_by_pool(kafka_env: Any) -> None:
    pub = OutcomePublisher(kafka_env.bootstrap_servers, topic_prefix=kafka_env.prefix)
    await pub.start()
    sent = [outcome(f"{pool}/0", pool=pool, n=i) for i in range(40) for pool in ("a", "b")]
    try:
        assert all(pub.publish(o) for o in sent)
    finally:
        await pub.stop()
    assert (pub.stats.sent, pub.stats.dropped, pub.stats.failed) == (80, 0, 0)
    records = await read_all(kafka_env, REQUESTS, until=lambda rs: len(rs) >= 80)
    assert len(records) == 80
    got = [RequestOutcome.model_validate_json(r.value) for r in records]
    assert {(r.key.decode(), o.pool_id) for r, o in zip(records, got, strict=True)} == {
        ("a", "a"),
        ("b", "b"),
    }
    assert sorted(o.request_id for o in got) == sorted(o.request_id for o in sent)


async def test_publisher_sends_a_moved_calls_copy_keyed_by_the_pool_it_was_moved_from(kafka_env: Any) -> None:
    """A call the router moved from pool a to pool b goes out twice: as served (keyed b) and as its
    copy keyed a, so a's shard sizes for it wherever the partitions fall; a shed call has no copy."""
    pub = OutcomePublisher(kafka_env.bootstrap_servers, topic_prefix=kafka_env.prefix)
    await pub.start()
    sent = [outcome("b/0", "ok", pool="b", n=i, routed_from="a") for i in range(5)]
    sent.append(outcome(None, "shed", pool="b", n=9, routed_from="a"))
    try:
        assert all(pub.publish(o) for o in sent)
    finally:
        await pub.stop()
    assert (pub.stats.sent, pub.stats.dropped, pub.stats.failed) == (11, 0, 0)
    records = await read_all(kafka_env, REQUESTS, until=lambda rs: len(rs) >= 11)
    got = [(r.key.decode(), RequestOutcome.model_validate_json(r.value)) for r in records]
    seen = sorted((key, o.pool_id, o.routed_from, o.diverted_to, o.cost_usd) for key, o in got)
    served = [("b", "b", "a", None, o.cost_usd) for o in sent]
    copies = [("a", "a", None, "b", 0.0)] * 5
    assert seen == sorted(served + copies)


async def test_publisher_never_blocks_when_its_queue_is_full(kafka_env: Any) -> None:
    pub = OutcomePublisher(kafka_env.bootstrap_servers, topic_prefix=kafka_env.prefix, max_pending=5)
    await pub.start()
    try:
        results = [pub.publish(outcome("p/0", n=i)) for i in range(12)]  # no await: the loop never runs
    finally:
        await pub.stop()
    assert (results.count(True), pub.stats.dropped) == (5, 7)
    assert pub.stats.sent == 5
