"""A worker that fails every call, heard through the router's own metrics: real vllm-router 0.1.17 and
real SGLang router 0.3.2 on loopback, a real broker and daemon, ``fleetloop actuate ROUTER
--metrics-url``. Neither router reports a call to fleetloop; the actuator reads their per-worker
outcome counters and publishes them on ``fleet.requests``, and the daemon's breaker ejects the node.

Every node's telemetry (the test publishes it each second with a tick, as ``fleetloop scrape`` and
``fleetloop run``'s ticker would) says it is healthy, so nothing but the translated outcomes can
open the breaker: without them the node stays in the router, and the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web
from fleetloop.router import clock
from fleetloop.schemas import Tick
from fleetloop.schemas.decisions import BreakerDecision
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.topics import REQUESTS, STATE, TELEMETRY, TICKS
from tests.integration.test_worker_list_routers import _listed
from tests.support.actuators import start_actuator
from tests.support.http import Handler, nodes
from tests.support.kafka import decisions_of, producer, read_all, running_daemon, send
from tests.support.records import telemetry
from tests.support.vllm_router import start_sglang_router, start_vllm_router
from tests.support.wait import wait_until

NODES = ("chat/0", "chat/1", "chat/2")
START = {"vllm-router": start_vllm_router, "sglang-router": start_sglang_router}


def _default_policy(tmp_path: Path) -> Any:
    """The shipped default policy (latency-outlier breaker: its failure streak ejects at 5) with a
    fixed fleet: three synthetic nodes have no demand model to size."""
    from fleetloop.policies.registry import load_policy

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "policies" / "default.yaml").read_text())
    doc["spec"]["autoscale"] = {"type": "fixed"}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_policy(path)


def answer(node: str) -> Handler:
    """Node ``chat/0`` answers 500 to every call (its health check passes); the others serve."""
    return _answer(node, failing=node == "chat/0")


def serving(node: str) -> Handler:
    return _answer(node, failing=False)


def _answer(node: str, *, failing: bool) -> Handler:
    async def complete(request: web.Request) -> web.Response:
        if failing:
            return web.Response(status=500, text="CUDA error")
        await asyncio.sleep(0.005)
        body = {"id": "c", "object": "text_completion", "model": "m", "choices": [{"text": node, "index": 0}]}
        return web.json_response(body)

    return complete


@pytest.mark.parametrize("failure", ["http-500", "refused"])
@pytest.mark.parametrize("router", ["vllm-router", "sglang-router"])
async def test_a_worker_failing_every_call_is_ejected_through_the_router_s_metrics(
    kafka_env: Any, tmp_path: Path, router: str, failure: str
) -> None:
    """``http-500``: chat/0 answers 500 to every call; ``refused``: chat/0 served when the router
    listed it, and its process is gone before the first call (connection refused)."""
    procs: list[subprocess.Popen[bytes]] = []
    servers = contextlib.AsyncExitStack()
    if failure == "http-500":
        ports = await servers.enter_async_context(nodes(3, answer))
        gone = None
    else:
        gone = contextlib.AsyncExitStack()
        ports = [*await gone.enter_async_context(nodes(1, serving))]
        ports += await servers.enter_async_context(nodes(2, serving))
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    wmap = tmp_path / "workers.yaml"
    wmap.write_text("pools:\n  chat:\n" + "".join(f"    chat/{i}: {u}\n" for i, u in enumerate(urls)))
    log_path = tmp_path / "actuator.log"
    tick_id = 0
    removed_at = -1.0

    async def tick_once(p: Any) -> None:
        nonlocal tick_id
        tick_id += 1
        now = clock.wall_ms()
        healthy = {"tbt_p50_ms": 20.0, "tbt_p99_ms": 30.0, "ttft_p50_ms": 120.0, "ttft_p99_ms": 250.0}
        records = [telemetry(n, pool="chat", ts_ms=now, **healthy) for n in NODES]
        await send(p, kafka_env, TELEMETRY, records, key=b"chat")
        await send(p, kafka_env, TICKS, [Tick(ts_ms=now, tick_id=tick_id, pool_id="chat")], key=b"chat")

    async with running_daemon(kafka_env, policy=_default_policy(tmp_path)), producer(kafka_env) as p:
        try:
            metrics_port: list[int] = []
            proc, port = await START[router](
                urls, "round_robin", tmp_path / f"{router}.log", metrics_port=metrics_port
            )
            procs.append(proc)
            client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0)
            servers.push_async_callback(client.aclose)

            async def all_listed() -> bool:
                return await _listed(client, router) == set(urls)

            await wait_until(all_listed, 30, f"{router} to list its three workers")
            flags = [
                "--url", f"http://127.0.0.1:{port}", "--worker-map", str(wmap),
                "--metrics-url", f"http://127.0.0.1:{metrics_port[-1]}/metrics",
                "--metrics-period-s", "0.5", "--model", "llama-8b", "--keep-state-on-exit",
            ]  # fmt: skip
            procs.append(start_actuator(router, kafka_env, log_path, *flags))

            async def publishing() -> bool:
                return "publishing the outcomes" in log_path.read_text()

            await wait_until(publishing, 60, "the actuator to take its baseline scrape")
            if gone is not None:
                await gone.aclose()  # chat/0's process is gone: its port refuses connections
            t0 = clock.monotonic_s()
            while clock.monotonic_s() < t0 + 30 and removed_at < 0:
                await tick_once(p)
                for _ in range(10):  # the router retries a failed call on another worker
                    r = await client.post(
                        "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1}
                    )
                    assert r.status_code == 200, r.text
                    await asyncio.sleep(0.05)
                if urls[0] not in await _listed(client, router):
                    removed_at = clock.monotonic_s()
        finally:
            for proc in reversed(procs):
                proc.terminate()
            for proc in procs:
                proc.wait(10)
            await servers.aclose()
            if gone is not None:
                await gone.aclose()

        seen = [RequestOutcome.model_validate_json(r.value) for r in await read_all(kafka_env, REQUESTS)]
        state = decisions_of(await read_all(kafka_env, STATE))

    log = log_path.read_text()
    assert removed_at > 0, f"chat/0 never left {router}: {log[-2000:]}"
    by_node: dict[str | None, set[str]] = {}
    for o in seen:
        by_node.setdefault(o.node_id, set()).add(o.outcome)
        assert o.pool_id == "chat"
        assert o.model == "llama-8b"
        assert o.task_outcome == ("succeeded" if o.outcome == "ok" else None)  # a task of its own
    # keyed to the right node: every call chat/0 took failed, and only chat/0's did
    assert by_node.get("chat/0") == {"error"}, by_node
    assert sum(o.node_id == "chat/0" for o in seen) >= 5  # the breaker's failure streak
    assert by_node.get("chat/1") == {"ok"}, by_node
    assert by_node.get("chat/2") == {"ok"}, by_node
    assert set(by_node) == set(NODES)
    opened = [d.body for d in state if isinstance(d.body, BreakerDecision) and d.body.state == "open"]
    assert {b.node_id for b in opened} == {"chat/0"}, opened
    assert "apply: remove " + urls[0] in log
    assert "not in the worker map" not in log
    took = removed_at - t0
    print(f"\n{router}, {failure}: chat/0 removed {took:.1f} s after the first calls ({len(seen)} outcomes)")


@pytest.mark.parametrize("router", ["vllm-router", "sglang-router"])
async def test_a_metrics_page_that_is_not_the_router_s_stops_the_command_with_one_line(
    kafka_env: Any, tmp_path: Path, router: str
) -> None:
    """Refused at start, before anything is published: a page that does not answer, and one that
    answers but is not this router's (the other router's page: a worker map and two routers on one
    host make that mix-up easy)."""
    from tests.support.actuators import actuate_argv
    from tests.support.http import free_port

    other = "sglang-router" if router == "vllm-router" else "vllm-router"
    async with nodes(1, answer) as ports:
        urls = [f"http://127.0.0.1:{ports[0]}"]
        wmap = tmp_path / "workers.yaml"
        wmap.write_text(f"pools:\n  chat:\n    chat/0: {urls[0]}\n")
        mine: list[int] = []
        theirs: list[int] = []
        proc, port = await START[router](urls, "round_robin", tmp_path / "r.log", metrics_port=mine)
        proc2, _ = await START[other](urls, "round_robin", tmp_path / "o.log", metrics_port=theirs)
        try:
            for page, says in (
                (f"http://127.0.0.1:{free_port()}/metrics", f"{router} metrics at http://127.0.0.1:"),
                (f"http://127.0.0.1:{theirs[-1]}/metrics", f"metric on the page (not {router}'s?)"),
            ):
                argv = actuate_argv(
                    router, kafka_env, "--url", f"http://127.0.0.1:{port}", "--worker-map", str(wmap),
                    "--metrics-url", page,
                )  # fmt: skip
                done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=60)
                err = done.stderr.decode()
                assert done.returncode == 2, err
                assert len(err.splitlines()) == 1, err
                assert err.startswith(f"fleetloop actuate {router}: --metrics-url: "), err
                assert says in err, err
        finally:
            for p in (proc, proc2):
                p.terminate()
                p.wait(10)
