"""The daemon over real brokers: the loop closes, bad records are dead-lettered, restarts lose nothing.

Tests drive the daemon with their own ticks (``run_ticker=False``) so "within N ticks" is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pytest
from fleetloop.router import Endpoint, Router
from fleetloop.router.follow import StateFollower
from fleetloop.schemas.decisions import refresh_s_of
from fleetloop.schemas.topics import DEADLETTER, DECISIONS, REQUESTS, STATE, TELEMETRY, TICKS
from tests.support.kafka import decisions_of, producer, read_all, running_daemon, send, wait_decided
from tests.support.records import outcome, telemetry, tick, to_bytes

NODES = ("p/0", "p/1", "p/2")


async def test_failing_node_is_ejected_within_three_ticks(kafka_env: Any) -> None:
    async with running_daemon(kafka_env) as daemon, producer(kafka_env) as p:
        await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=1000) for n in NODES])
        await send(p, kafka_env, REQUESTS, [outcome(n, "ok", ts_ms=1100, n=i) for i, n in enumerate(NODES)])
        await send(p, kafka_env, TICKS, [tick(1)])
        await wait_decided(daemon, 1000)
        # p/2 starts failing: six errors in a row, while the others keep answering.
        failing = [outcome("p/2", "error", ts_ms=1200 + i, n=10 + i) for i in range(6)]
        healthy = [outcome("p/0", "ok", ts_ms=1300 + i, n=20 + i) for i in range(3)]
        await send(p, kafka_env, REQUESTS, failing + healthy)
        for k in (2, 3, 4):
            await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=k * 1000) for n in NODES])
            await send(p, kafka_env, TICKS, [tick(k)])
            await wait_decided(daemon, k * 1000)

    def ejected(records: Sequence[Any]) -> bool:
        ds = decisions_of(records)
        return any(
            d.body.kind == "breaker" and d.body.node_id == "p/2" and d.body.state == "open" for d in ds
        )

    state = decisions_of(await read_all(kafka_env, STATE, until=ejected))
    opened = [
        d for d in state if d.body.kind == "breaker" and d.body.node_id == "p/2" and d.body.state == "open"
    ]
    assert opened, "the failing node's breaker never opened on control.state"
    assert opened[0].tick_id <= 4, (
        f"breaker opened at tick {opened[0].tick_id}, more than 3 ticks after the failures"
    )
    routing = [d for d in state if d.body.kind == "routing" and d.tick_id == opened[0].tick_id]
    assert routing
    assert routing[-1].body.weights["p/2"] == 0.0  # type: ignore[union-attr]
    assert sum(routing[-1].body.weights.values()) > 0.99  # type: ignore[union-attr]
    # Before the failures, the node had traffic.
    first = next(d for d in state if d.body.kind == "routing" and d.tick_id == 1)
    assert first.body.weights["p/2"] > 0  # type: ignore[union-attr]
    assert opened[0].body.reason == "consecutive-failures"
    assert opened[0].policy.name == "foundation"
    assert opened[0].input_offsets, "decisions must say which input offsets they were computed from"


async def test_malformed_records_go_to_the_dead_letter_topic_and_the_daemon_goes_on(kafka_env: Any) -> None:
    bad_json = b"{not json"
    missing = orjson.dumps({"ts_ms": 5, "node_id": "p/9"})  # NodeTelemetry without its other fields
    negative = to_bytes(telemetry("p/0", ts_ms=1000)).replace(b'"queue_depth":0', b'"queue_depth":-3')
    async with running_daemon(kafka_env) as daemon, producer(kafka_env) as p:
        await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=1000) for n in NODES])
        await send(p, kafka_env, TELEMETRY, [bad_json, missing, negative])
        await send(p, kafka_env, TICKS, [b"[]"])
        await send(p, kafka_env, TICKS, [tick(1)])
        await wait_decided(daemon, 1000)
        assert daemon.stats.dead_letters == 4
    letters = await read_all(kafka_env, DEADLETTER, until=lambda rs: len(rs) >= 4)
    assert len(letters) == 4
    by_value = {r.value: dict(r.headers) for r in letters}
    assert set(by_value) == {bad_json, missing, negative, b"[]"}
    assert b"json" in by_value[bad_json]["fleetloop.error"].lower()
    assert b"missing" in by_value[missing]["fleetloop.error"]
    assert b"queue_depth" in by_value[negative]["fleetloop.error"]
    assert by_value[bad_json]["fleetloop.source"].startswith(kafka_env.topic(TELEMETRY).encode())
    assert all(r.key == b"p" for r in letters)
    # ...and the loop went on: the tick after the bad records was decided from the good ones.
    decided = decisions_of(await read_all(kafka_env, DECISIONS, until=lambda rs: len(rs) > 0))
    routing = [d for d in decided if d.body.kind == "routing"]
    assert routing
    assert sorted(routing[0].body.weights) == list(NODES)  # type: ignore[union-attr]


@pytest.mark.system  # a restart
async def test_restart_resumes_from_committed_offsets_without_losing_a_decision(kafka_env: Any) -> None:
    async with producer(kafka_env) as p:
        async with running_daemon(kafka_env) as daemon:
            for k in (1, 2, 3):
                await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=k * 1000) for n in NODES])
                await send(p, kafka_env, TICKS, [tick(k)])
            await wait_decided(daemon, 3000)
        # While the daemon is down, the fleet goes on: telemetry and ticks pile up.
        for k in (4, 5):
            await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=k * 1000) for n in NODES])
            await send(p, kafka_env, TICKS, [tick(k)])
        async with running_daemon(kafka_env) as daemon2:
            await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=6000) for n in NODES])
            await send(p, kafka_env, TICKS, [tick(6)])
            await wait_decided(daemon2, 6000)
            assert daemon2.stats.shards_restored == 1, "the restart restored the checkpoint written at stop"
            assert daemon2.stats.ticks_restored == 0, "nothing before the checkpoint is read again"
    decided = decisions_of(await read_all(kafka_env, DECISIONS, until=lambda rs: len(rs) >= 6 * 9))
    routing_ticks = sorted(d.tick_id for d in decided if d.body.kind == "routing")
    assert routing_ticks == [1, 2, 3, 4, 5, 6], "every tick decided exactly once across the restart"
    # The restarted daemon decided tick 4 from a model that still had the history: all nodes, warm.
    t4 = next(d for d in decided if d.body.kind == "routing" and d.tick_id == 4)
    assert sorted(t4.body.weights) == list(NODES)  # type: ignore[union-attr]
    assert t4.body.reason == "least-queue"


async def test_control_state_holds_changes_in_the_change_only_form_and_a_router_reads_it(
    kafka_env: Any,
) -> None:
    """On a real broker: control.decisions holds every decision of every tick, control.state the
    enforced ones that changed (and the first of each key), each with the form's headers; the
    router library's follower files the pool's routing with the daemon's refresh period."""
    async with running_daemon(kafka_env) as daemon, producer(kafka_env) as p:
        for k in range(1, 7):
            await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=k * 1000) for n in NODES])
            await send(p, kafka_env, TICKS, [tick(k)])
            await wait_decided(daemon, k * 1000)
    logged = await read_all(
        kafka_env, DECISIONS, until=lambda rs: {d.tick_id for d in decisions_of(rs)} >= {6}
    )
    state = await read_all(kafka_env, STATE, until=lambda rs: len(rs) > 0)
    assert state
    assert all(refresh_s_of(r.headers) == 10.0 for r in state)
    assert all(not r.headers for r in logged)
    assert len(state) < len(logged)  # steady telemetry, unchanged decisions: not re-sent
    assert {d.key for d in decisions_of(state)} == {d.key for d in decisions_of(logged)}
    eps = {n: Endpoint(node_id=n, pool_id="p") for n in NODES}
    router: Router[Endpoint] = Router(
        {"m": ("p",)}, np.random.default_rng(0), members={"p": list(eps.values())}, nodes=eps
    )
    follower = StateFollower(router, kafka_env.bootstrap_servers, topic_prefix=kafka_env.prefix)
    await follower.start()
    try:
        assert router.state.pools["p"].routing_refresh_s == 10.0
    finally:
        await follower.stop()
