"""A pool behind real HAProxy keeps serving when fleetloop cannot see its nodes.

The whole loop: a real daemon (in process, its own ticker on the wall clock, the default policy),
a real broker, real HAProxy with three live backends, ``fleetloop actuate haproxy`` (a subprocess)
applying ``control.state`` and sending HAProxy's request log back as outcomes. No scraper runs at
first: the daemon sees the pool only through its outcomes. Then the nodes' telemetry arrives for a
few seconds and stops, with the traffic, for longer than the model remembers a silent node; then
the traffic comes back. Neither the pool without telemetry nor the pool after its quiet period may
lose a call: fleetloop without sight of a pool's nodes must leave it as HAProxy would be without
fleetloop (the rotation rule, fleetloop/router/state.py; the engine's ``NO_NODE``).
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

from fleetloop.core.model.fleet import ModelConfig
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.policies.registry import builtin_policy
from fleetloop.router import clock
from fleetloop.schemas import RoutingDecision
from fleetloop.schemas.topics import STATE, TELEMETRY
from tests.integration.test_haproxy import Traffic, _drive, backends
from tests.support.haproxy import chat_backend_map, haproxy_config, running_haproxy, start_actuator
from tests.support.http import free_port
from tests.support.kafka import decisions_of, producer, read_all, send
from tests.support.records import telemetry
from tests.support.wait import wait_until

NODES = ("chat/0", "chat/1", "chat/2")
FORGET_MS = 4_000  # the model forgets a node silent this long (production: 60 s)


def routings(records: list[Any]) -> list[RoutingDecision]:
    return [d.body for d in decisions_of(records) if isinstance(d.body, RoutingDecision)]


async def test_a_pool_without_telemetry_and_after_a_quiet_period_keeps_serving(
    kafka_env: Any, tmp_path: Path
) -> None:
    fe_port, log_port = free_port(), free_port(socket.SOCK_DGRAM)
    bmap = chat_backend_map(tmp_path)
    actuator_log = tmp_path / "actuator.log"
    daemon = Daemon(
        DaemonConfig(
            bootstrap_servers=kafka_env.bootstrap_servers,
            policy=builtin_policy(),
            prefix=kafka_env.prefix,
            group_id=kafka_env.group("daemon"),
            idempotence=kafka_env.broker.capabilities.idempotent_producer,
            model=ModelConfig(forget_node_after_ms=FORGET_MS),
        )
    )
    stop_daemon = asyncio.Event()
    async with (
        backends(3) as ports,
        producer(kafka_env) as prod,
        running_haproxy(tmp_path, haproxy_config(tmp_path, fe_port, log_port, ports)),
    ):
        running = asyncio.create_task(daemon.run(stop_daemon))
        act = start_actuator(tmp_path, bmap, kafka_env, actuator_log, log_port=log_port)
        traffic, stop = Traffic(), asyncio.Event()
        driver: asyncio.Task[None] | None = None
        try:
            await asyncio.wait_for(daemon.ready.wait(), 60)
            # 1. No telemetry at all: the daemon knows the pool from HAProxy's log alone.
            driver = asyncio.create_task(_drive(fe_port, traffic, stop))
            await wait_until(lambda: len(traffic.seen) > 20, 30, "traffic through HAProxy")
            decided = daemon.stats.ticks_decided
            await wait_until(lambda: daemon.stats.ticks_decided >= decided + 6, 30, "six ticks of the pool")
            assert traffic.failed == 0, f"{traffic.failed} calls failed: {actuator_log.read_text()[-1500:]}"
            served = len(traffic.seen)
            await asyncio.sleep(1.0)  # a window of traffic: every node must serve in it
            assert len(traffic.seen) > served + 20  # still serving, on every node
            assert {n for t, n in traffic.seen if t > clock.monotonic_s() - 1.5} == set(NODES)

            # 2. The nodes report for a while (a scraper runs), then telemetry and traffic stop.
            for _ in range(8):
                now_ms = clock.wall_ms()
                await send(prod, kafka_env, TELEMETRY, [telemetry(n, "chat", now_ms) for n in NODES], b"chat")
                await asyncio.sleep(0.5)  # the nodes report every half second, as a scraper would
            state = await read_all(
                kafka_env, STATE, until=lambda rs: any(sum(r.weights.values()) > 0 for r in routings(rs))
            )
            assert any(sum(r.weights.values()) > 0 for r in routings(state))
            stop.set()
            await driver
            driver = None
            quiet_from = clock.monotonic_s()
            decided = daemon.stats.ticks_decided
            await asyncio.sleep(FORGET_MS / 1000 + 4.0)  # every node forgotten, ticks going on
            assert daemon.stats.ticks_decided >= decided + 4

            # 3. The traffic comes back with no telemetry: served at once, nothing lost.
            failed_before = traffic.failed
            stop.clear()
            driver = asyncio.create_task(_drive(fe_port, traffic, stop))
            back = clock.monotonic_s()
            await asyncio.sleep(3.0)  # a window of traffic in which no call may fail
            assert traffic.failed == failed_before, (
                f"{traffic.failed - failed_before} calls failed after the quiet period: "
                f"{actuator_log.read_text()[-1500:]}"
            )
            assert sum(1 for t, _ in traffic.seen if t >= back) > 50
            assert quiet_from < back
        finally:
            stop.set()
            if driver is not None:
                await driver
            act.terminate()
            act.wait(10)
            stop_daemon.set()
            await asyncio.wait_for(running, 60)
        # whatever fleetloop published, it never told HAProxy the pool had no node to route to
        state = routings(await read_all(kafka_env, STATE))
        assert state, "the daemon published no routing decision at all"
        assert all(sum(r.weights.values()) > 0 for r in state), [r.reason for r in state]
        assert "-> maint" not in actuator_log.read_text()
