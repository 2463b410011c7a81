"""``fleetloop actuate haproxy`` with a real HAProxy (Debian's package) on loopback and a real broker.

Two aiohttp backends stand for two serving nodes (they are backends, not a proxy); an httpx client
keeps live HTTP traffic going through HAProxy; the test publishes desired state to control.state as
fleetloop would, one decision set per tick (1 s), and watches where the traffic goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiohttp import web
from fleetloop.router import clock
from fleetloop.schemas import RequestOutcome
from fleetloop.schemas.decisions import (
    AutoscaleDecision,
    BreakerDecision,
    Decision,
    PolicyStamp,
    RoutingDecision,
)
from fleetloop.schemas.topics import REQUESTS, STATE
from tests.support.actuators import actuate_argv
from tests.support.haproxy import chat_backend_map, haproxy_config, running_haproxy, start_actuator
from tests.support.http import Handler, free_port, nodes
from tests.support.kafka import producer, read_all
from tests.support.wait import wait_until

TICK_S = 1.0
STAMP = PolicyStamp(name="t", version=1, hash="0" * 16, mode="enforce")
NODES = ("chat/0", "chat/1", "chat/2")  # chat/2 is a declared slot with no node behind it yet


@dataclass
class Traffic:
    """Every answered request: (monotonic send time, node that answered)."""

    seen: list[tuple[float, str]] = field(default_factory=list)
    failed: int = 0

    def share(self, node: str, t0: float, t1: float) -> tuple[float, int]:
        window = [n for t, n in self.seen if t0 <= t < t1]
        return (window.count(node) / len(window) if window else 0.0), len(window)

    def last_to(self, node: str) -> float:
        return max((t for t, n in self.seen if n == node), default=-1.0)


def backends(n: int) -> contextlib.AbstractAsyncContextManager[list[int]]:
    """``n`` backends that say which node answered, a little slowly (5 ms)."""

    def answer(node: str) -> Handler:
        async def hello(request: web.Request) -> web.Response:
            await asyncio.sleep(0.005)
            return web.json_response({"node": node}, headers={"x-node": node})

        return hello

    return nodes(n, answer)


def _decision(body: Any, tick: int) -> tuple[bytes, bytes]:
    d = Decision(ts_ms=clock.wall_ms(), tick_id=tick, policy=STAMP, body=body)
    return d.key.encode(), orjson.dumps(d.model_dump(mode="json"))


def routing(weights: dict[str, float]) -> RoutingDecision:
    return RoutingDecision(entity="pool/chat", reason="r", pool_id="chat", weights=weights)


def breaker(state: str, probe: float = 0.0) -> BreakerDecision:
    return BreakerDecision(
        entity="chat/0",
        reason="r",
        pool_id="chat",
        node_id="chat/0",
        state=state,  # type: ignore[arg-type]
        probe_frac=probe,
    )


async def _drive(fe_port: int, traffic: Traffic, stop: asyncio.Event) -> None:
    n = 0
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{fe_port}", timeout=5.0) as client:
        while not stop.is_set():
            n += 1
            t = clock.monotonic_s()
            headers = {
                "x-fleetloop-request": f"req-{n}",
                "x-fleetloop-task": f"task-{n // 5}",
                "x-fleetloop-call": str(n % 5),
                "x-fleetloop-tenant": "gold",
                "x-fleetloop-priority": "0",
                "x-fleetloop-budget-ms": "5000",
            }
            if n % 5 == 4:  # the task's last call
                headers["x-fleetloop-final"] = "1"
            try:
                r = await client.post("/v1/completions", headers=headers, content=b"{}")
                if r.status_code == 200:
                    traffic.seen.append((t, r.headers["x-node"]))
                else:
                    traffic.failed += 1
            except httpx.HTTPError:
                traffic.failed += 1
            await asyncio.sleep(0.004)


async def test_breaker_moves_live_traffic_off_a_node_within_two_ticks_and_slow_start_brings_it_back(
    kafka_env: Any, tmp_path: Path
) -> None:
    fe_port, log_port = free_port(), free_port(socket.SOCK_DGRAM)
    bmap = chat_backend_map(tmp_path)
    actuator_log = tmp_path / "actuator.log"
    async with (
        backends(3) as ports,
        producer(kafka_env) as prod,
        running_haproxy(tmp_path, haproxy_config(tmp_path, fe_port, log_port, ports)) as api,
    ):

        async def publish(tick: int, *bodies: Any) -> float:
            for b in bodies:
                key, value = _decision(b, tick)
                await prod.send(kafka_env.topic(STATE), key=key, value=value)
            await prod.flush()
            return clock.monotonic_s()

        # tick 1 before the actuator starts: it must catch up from the compacted topic
        await publish(1, routing({"chat/0": 0.5, "chat/1": 0.5}))
        act = start_actuator(tmp_path, bmap, kafka_env, actuator_log, log_port=log_port)
        traffic, stop = Traffic(), asyncio.Event()
        driver = asyncio.create_task(_drive(fe_port, traffic, stop))
        try:
            await wait_until(
                lambda: "chat/s2 admin ready -> maint" in actuator_log.read_text(), 60, "slot 2 disabled"
            )
            await wait_until(
                lambda: traffic.last_to("chat/0") > 0 and traffic.last_to("chat/1") > 0, 30, "traffic"
            )
            t_ok = clock.monotonic_s()
            await asyncio.sleep(2 * TICK_S)  # a window of traffic to measure the shares over
            share0, n = traffic.share("chat/0", t_ok, clock.monotonic_s())
            assert n > 20
            assert 0.3 < share0 < 0.7, share0
            assert traffic.share("chat/2", t_ok, clock.monotonic_s())[0] == 0.0  # not a member: maint

            # tick 2: chat/0's breaker opens (fleetloop zeroes its weight in the same tick)
            t_open = await publish(2, breaker("open"), routing({"chat/0": 0.0, "chat/1": 1.0}))
            await asyncio.sleep(2 * TICK_S)  # the claim's bound: traffic leaves within two ticks
            moved_after_s = traffic.last_to("chat/0") - t_open
            assert moved_after_s < 2 * TICK_S, (
                f"traffic still reached chat/0 {moved_after_s:.2f} s after the breaker"
            )
            t_quiet = t_open + 2 * TICK_S
            await asyncio.sleep(1.0)  # a window in which no request may reach chat/0
            assert traffic.share("chat/0", t_quiet, clock.monotonic_s())[0] == 0.0

            # ticks 3-6: half-open probe, then the slow-start ramp fleetloop publishes as weights
            ramp = [(3, 0.05), (4, 0.15), (5, 0.3), (6, 0.5)]
            shares = []
            for tick, w in ramp:
                state = "half_open" if w < 0.5 else "closed"
                t0 = await publish(
                    tick, breaker(state, w if w < 0.5 else 0.0), routing({"chat/0": w, "chat/1": 1 - w})
                )
                await asyncio.sleep(0.5)  # let the actuator apply it, then measure the rest of the tick
                t1 = t0 + 0.5
                await asyncio.sleep(TICK_S * 1.5)  # a window of traffic to measure the share over
                shares.append(traffic.share("chat/0", t1, clock.monotonic_s()))
            got = [s for s, _ in shares]
            assert all(n > 15 for _, n in shares), shares
            assert 0.0 < got[0] < 0.15, got  # a probe's worth, not a full share
            assert got[0] < got[1] < got[2] < got[3], got  # ramps up, tick by tick
            assert got[3] > 0.35, got

            # drift: someone sets a weight by hand; the actuator re-asserts it and says so
            await api.run(["set server chat/s1 weight 3"])
            await wait_until(
                lambda: "drift: chat/s1 weight was 3" in actuator_log.read_text(), 10, "drift line"
            )
            state_now = await api.run(["show servers state chat"])
            row = next(line.split() for line in state_now.splitlines() if " s1 " in line)
            assert row[7] == "256"  # srv_uweight back at the desired weight

            # autoscale drains chat/1: HAProxy drains the server
            await publish(
                7,
                AutoscaleDecision(
                    entity="pool/chat",
                    reason="r",
                    pool_id="chat",
                    current_nodes=2,
                    desired_nodes=1,
                    drain=("chat/1",),
                ),
            )
            await wait_until(lambda: "chat/s1 admin ready -> drain" in actuator_log.read_text(), 10, "drain")
        finally:
            stop.set()
            await driver
            act.terminate()
            act.wait(10)
        assert act.returncode == 0, actuator_log.read_text()[-2000:]

        # outcomes from HAProxy's log reached fleet.requests, with the headers' task, call, tenant, priority
        records = await read_all(kafka_env, REQUESTS, until=lambda rs: len(rs) >= 100, timeout_s=20)
        outcomes = [RequestOutcome.model_validate_json(r.value) for r in records]
        assert len(outcomes) >= 100
        sample = outcomes[len(outcomes) // 2]
        n = int(sample.request_id.removeprefix("req-"))
        got_fields = (sample.workflow_id, sample.step_index, sample.tenant_id, sample.priority)
        assert got_fields == (f"task-{n // 5}", n % 5, "gold", 0)
        assert sample.pool_id == "chat"
        assert sample.node_id in ("chat/0", "chat/1")
        assert sample.outcome == "ok"
        assert sample.latency_budget_ms == 5000
        assert {r.key for r in records} == {b"chat"}
        # a task's last call, answered, ends the task; no other call does
        ends = {(o.step_index, o.outcome, o.task_outcome) for o in outcomes if o.task_outcome is not None}
        assert ends == {(4, "ok", "succeeded")}
        assert all(o.task_outcome is None for o in outcomes if o.step_index != 4)
        print(f"\nbreaker -> traffic off chat/0 in {moved_after_s * 1000:.0f} ms; slow start shares {got}")


async def test_a_thousand_servers_reconcile_in_one_pass_and_drift_is_found(
    kafka_env: Any, tmp_path: Path
) -> None:
    """At the scale users run: 1,000 slots in one backend (more than one runtime-API line holds)."""
    n = 1000
    servers = "\n".join(f"    server s{i} 127.0.0.1:{20000 + i} weight 100" for i in range(n))
    config = (
        f"global\n    stats socket {tmp_path}/admin.sock mode 600 level admin\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
        f"frontend fe\n    bind 127.0.0.1:{free_port()}\n    default_backend big\nbackend big\n{servers}\n"
    )
    bmap = tmp_path / "backends.yaml"
    bmap.write_text(
        "pools:\n  big:\n    backend: big\n    model: m\n    servers:\n"
        + "".join(f"      big/{i}: s{i}\n" for i in range(n))
    )
    weights = {f"big/{i}": float(1 + i % 7) for i in range(n - 10)}  # the last 10 slots: not members
    async with running_haproxy(tmp_path, config) as api:
        async with producer(kafka_env) as prod:
            body = RoutingDecision(entity="pool/big", reason="r", pool_id="big", weights=weights)
            key, value = _decision(body, 1)
            await prod.send(kafka_env.topic(STATE), key=key, value=value)
            br = BreakerDecision(entity="big/3", reason="r", pool_id="big", node_id="big/3", state="open")
            key, value = _decision(br, 1)
            await prod.send(kafka_env.topic(STATE), key=key, value=value)
            await prod.flush()

        def once() -> dict[str, Any]:
            argv = actuate_argv(
                "haproxy", kafka_env, "--runtime-api", f"unix:{tmp_path}/admin.sock",
                "--backend-map", str(bmap), "--once", "--json",
            )  # fmt: skip
            proc = subprocess.run(argv, capture_output=True, timeout=120, check=False)
            assert proc.returncode == 0, proc.stderr.decode()[-2000:]
            return dict(orjson.loads(proc.stdout))

        first = once()
        assert first["decisions"] == 2
        state = await api.run(["show servers state big"])
        rows = {r.split()[3]: r.split() for r in state.splitlines() if r[:1].isdigit() and len(r.split()) > 8}
        assert len(rows) == n
        assert rows["s6"][7] == "256"  # weight 7 of max 7
        assert rows["s0"][7] == str(round(256 / 7))
        assert int(rows["s3"][6]) & 1  # breaker open: maint
        assert all(int(rows[f"s{i}"][6]) & 1 for i in range(n - 10, n))  # not members: maint
        # someone resets a weight by hand: the next pass finds exactly that one difference
        await api.run(["set server big/s6 weight 1"])
        second = once()
        assert [(c["server"], c["field"], c["was"]) for c in second["changes"]] == [("big/s6", "weight", "1")]
