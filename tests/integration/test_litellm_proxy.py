"""fleetloop inside a real LiteLLM proxy (``litellm --config``, a subprocess on loopback) in front of
the emulated fleet, driven by the ``openai`` SDK, with a real broker and a real daemon.

The proxy runs ``examples/litellm/config.yaml`` with the fleet's ports, and LiteLLM's own cooldowns
off so that only fleetloop can take a node out. Every call's outcome arrives on ``fleet.requests``
with its task, priority and node; a node that starts refusing connections collects errors there,
the daemon opens its breaker (consecutive errors), and the node leaves LiteLLM's picks; when the
daemon stops and its state goes stale (``FLEETLOOP_FAIL_STATIC_S``), LiteLLM's picks spread over
every deployment again (fail static: what the proxy did without fleetloop). The test publishes each
node's telemetry and a tick every second, as ``fleetloop scrape`` and ``fleetloop run``'s ticker
would. Nothing the proxy does leaves loopback: its price map is the copy in its wheel
(``LITELLM_LOCAL_MODEL_COST_MAP``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml
from aiokafka import AIOKafkaConsumer
from fleetloop.edges.fleet.live import LiveFleet
from fleetloop.edges.litellm import launch
from fleetloop.router import clock
from fleetloop.schemas import RequestOutcome, Tick
from fleetloop.schemas.decisions import BreakerDecision, Decision
from fleetloop.schemas.topics import REQUESTS, STATE, TELEMETRY, TICKS
from fleetloop.sim.scenario import load_scenario
from tests.support.http import free_port
from tests.support.kafka import producer, running_daemon, send
from tests.support.records import telemetry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "litellm" / "config.yaml"
SCENARIO = ROOT / "scenarios" / "stack" / "degraded-gpu-small.yaml"
POOL = "chat-l40s"
BAD = "chat-l40s/1"
KEY = "sk-fleetloop-test-9f2c4e6a8b0d"
FAIL_STATIC_S = 4.0


def proxy_config(tmp: Path, urls: dict[str, str]) -> Path:
    """The example config with the fleet's ports, and LiteLLM's cooldowns off."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    for d in doc["model_list"]:
        d["litellm_params"]["api_base"] = f"{urls[d['model_info']['fleetloop_node']]}/v1"
    assert {d["model_info"]["fleetloop_node"] for d in doc["model_list"]} == set(urls)
    doc["router_settings"]["disable_cooldowns"] = True
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@contextlib.asynccontextmanager
async def litellm_proxy(config: Path, kafka_env: Any, log: Path) -> AsyncIterator[str]:
    """The proxy on a free loopback port, once it answers; its base URL."""
    env = launch.proxy_env(bootstrap=kafka_env.bootstrap_servers, topic_prefix=kafka_env.prefix)
    env |= {"FLEETLOOP_FAIL_STATIC_S": str(FAIL_STATIC_S), "LITELLM_MASTER_KEY": KEY}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            launch.proxy_argv(config, port), stdout=out, stderr=subprocess.STDOUT, env=env
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=2.0) as probe, asyncio.timeout(120):
            while True:
                assert proc.poll() is None, log.read_text()[-3000:]
                with contextlib.suppress(httpx.HTTPError):
                    if (await probe.get(f"{url}{launch.LIVENESS}")).status_code == 200:
                        break
                await asyncio.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Records:
    """Every outcome on fleet.requests and every breaker decision on control.state, as they arrive."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[float, RequestOutcome]] = []
        self.opened: dict[str, float] = {}

    async def follow(self, kafka_env: Any) -> None:
        c = AIOKafkaConsumer(
            kafka_env.topic(REQUESTS),
            kafka_env.topic(STATE),
            bootstrap_servers=kafka_env.bootstrap_servers,
            auto_offset_reset="earliest",
        )
        await c.start()
        try:
            while True:
                batch = await c.getmany(timeout_ms=100)
                now = clock.monotonic_s()
                for tp, rs in batch.items():
                    for r in rs:
                        if tp.topic == kafka_env.topic(REQUESTS):
                            self.outcomes.append((now, RequestOutcome.model_validate_json(r.value)))
                            continue
                        d = Decision.model_validate_json(r.value)
                        b = d.body
                        if isinstance(b, BreakerDecision) and b.state == "open" and b.enforced:
                            self.opened.setdefault(b.node_id, now)
        finally:
            await c.stop()

    def nodes(self, since: float, until: float | None = None) -> set[str | None]:
        end = until if until is not None else float("inf")
        return {o.node_id for t, o in self.outcomes if since <= t < end}


async def test_litellm_proxy_follows_the_daemon_and_fails_static_when_it_goes(
    kafka_env: Any, tmp_path: Path
) -> None:
    fleet = LiveFleet(load_scenario(SCENARIO), seed=5)
    await fleet.start(faults=False)
    urls = fleet.urls()
    records = Records()
    seq = itertools.count(1)
    ticking = asyncio.Event()
    ticking.set()
    tick_id = 0

    async def tick(p: Any) -> None:
        nonlocal tick_id
        while ticking.is_set():
            tick_id += 1
            now = clock.wall_ms()
            await send(
                p,
                kafka_env,
                TELEMETRY,
                [telemetry(n, pool=POOL, ts_ms=now) for n in sorted(urls)],
                key=POOL.encode(),
            )
            await send(
                p, kafka_env, TICKS, [Tick(ts_ms=now, tick_id=tick_id, pool_id=POOL)], key=POOL.encode()
            )
            await asyncio.sleep(1.0)  # one tick a second, traffic flowing meanwhile

    async def drive(api: openai.AsyncOpenAI, stop: asyncio.Event) -> None:
        while not stop.is_set():
            n = next(seq)
            headers = {
                "x-fleetloop-task": f"task-{n // 3}",
                "x-fleetloop-call": str(n % 3),
                "x-fleetloop-tenant": "gold",
                "x-fleetloop-priority": str(n % 2),
            }
            with contextlib.suppress(openai.OpenAIError):
                stream = await api.chat.completions.create(
                    model="llama-8b", messages=[{"role": "user", "content": f"call {n}"}], max_tokens=4,
                    stream=True, extra_headers=headers,
                )  # fmt: skip
                async for _ in stream:
                    pass
            await asyncio.sleep(0.05)

    bg: list[asyncio.Task[Any]] = [asyncio.create_task(records.follow(kafka_env))]
    stop = asyncio.Event()
    try:
        async with (
            producer(kafka_env) as p,
            litellm_proxy(proxy_config(tmp_path, urls), kafka_env, tmp_path / "litellm.log") as url,
        ):
            api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=10.0)
            async with running_daemon(kafka_env):
                bg.append(asyncio.create_task(tick(p)))
                bg += [asyncio.create_task(drive(api, stop)) for _ in range(3)]

                # every call's outcome arrives, with its task, priority and the node that served it
                async with asyncio.timeout(60):
                    while records.nodes(0.0) != set(urls):
                        await asyncio.sleep(0.2)
                first = [o for _, o in records.outcomes if o.outcome == "ok"]
                assert first, "no call succeeded through the proxy"
                assert {o.pool_id for o in first} == {POOL}
                assert {o.model for o in first} == {"llama-8b"}
                assert {o.tenant_id for o in first} == {"gold"}
                assert {o.priority for o in first} == {0, 1}
                assert all(o.workflow_id.startswith("task-") for o in first)
                assert all(o.ttft_ms is not None and o.ttft_ms > 0 for o in first)

                # the node refuses connections: its errors reach the daemon, which opens its breaker
                node = fleet.node(BAD)
                assert node is not None
                fleet.crash_node(node, comes_back=False)
                crashed = clock.monotonic_s()
                async with asyncio.timeout(60):
                    while BAD not in records.opened:
                        await asyncio.sleep(0.1)
                opened = records.opened[BAD]
                errors = [o for t, o in records.outcomes if t >= crashed and o.outcome == "error"]
                assert {o.node_id for o in errors} == {BAD}
                # ... and the node leaves LiteLLM's picks (a tick to publish the routing, a beat for
                # calls already placed), for the rest of the ejection (10 s, the policy's)
                await asyncio.sleep(8.0)  # a window of traffic in which no call may reach the node
                out = records.nodes(opened + 2.0, opened + 8.0)
                assert out, "no call completed while the breaker was open"
                assert BAD not in out, out

            # the daemon is gone and its state goes stale: fail static, every deployment again
            ticking.clear()
            gone = clock.monotonic_s()
            async with asyncio.timeout(FAIL_STATIC_S + 30):
                while BAD not in records.nodes(gone + FAIL_STATIC_S):
                    await asyncio.sleep(0.2)
            stop.set()
            await asyncio.gather(*bg[2:])
    finally:
        stop.set()
        ticking.clear()
        for t in bg:
            t.cancel()
        await asyncio.gather(*bg, return_exceptions=True)
        await fleet.stop()
    shed = [o for _, o in records.outcomes if o.outcome == "shed"]
    assert all(o.node_id is None for o in shed)
    print(
        f"\n{len(records.outcomes)} outcomes; breaker opened {opened - crashed:.1f} s after the node "
        f"failed; back in LiteLLM's picks within {FAIL_STATIC_S:g} s (+ a call) of the state going stale"
    )
