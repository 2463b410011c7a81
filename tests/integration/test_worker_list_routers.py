"""``fleetloop actuate vllm-router`` and ``fleetloop actuate sglang-router`` with the real routers (PyPI
``vllm-router`` and ``sglang-router``, their Rust binaries) on loopback and a real broker: breaker
and autoscale decisions add and remove workers, and a manual change is undone as drift."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from fleetloop.router import clock
from fleetloop.schemas.decisions import (
    AutoscaleDecision,
    BreakerDecision,
    Decision,
    PolicyStamp,
    RoutingDecision,
)
from fleetloop.schemas.topics import STATE
from tests.support.actuators import start_actuator
from tests.support.http import Handler, nodes
from tests.support.kafka import producer
from tests.support.vllm_router import start_sglang_router, start_vllm_router
from tests.support.wait import wait_until

STAMP = PolicyStamp(name="t", version=1, hash="0" * 16, mode="enforce")


@contextlib.asynccontextmanager
async def workers(n: int) -> AsyncIterator[list[str]]:
    """OpenAI-style backends that say which node answered (they are backends, not a proxy)."""

    def answer(node: str) -> Handler:
        async def complete(request: web.Request) -> web.Response:
            body = {
                "id": "c",
                "object": "text_completion",
                "model": "m",
                "choices": [{"text": node, "index": 0}],
            }
            return web.json_response(body)

        return complete

    async with nodes(n, answer) as ports:
        yield [f"http://127.0.0.1:{p}" for p in ports]


async def _listed(client: httpx.AsyncClient, router: str) -> set[str]:
    if router == "vllm-router":
        return set((await client.get("/list_workers")).json()["urls"])
    return {w["url"] for w in (await client.get("/workers")).json()["workers"]}


async def _add_by_hand(client: httpx.AsyncClient, router: str, url: str) -> None:
    if router == "vllm-router":
        (await client.post("/add_worker", params={"url": url})).raise_for_status()
    else:
        (await client.post("/workers", json={"url": url})).raise_for_status()


START = {"vllm-router": start_vllm_router, "sglang-router": start_sglang_router}


@pytest.mark.parametrize("router", ["vllm-router", "sglang-router"])
async def test_breaker_and_autoscale_add_and_remove_workers_on_a_real_router(
    kafka_env: Any, tmp_path: Path, router: str
) -> None:
    async with workers(3) as urls, producer(kafka_env) as prod:
        wmap = tmp_path / "workers.yaml"
        wmap.write_text("pools:\n  chat:\n" + "".join(f"    chat/{i}: {u}\n" for i, u in enumerate(urls)))
        vr, port = await START[router]([urls[0]], "round_robin", tmp_path / f"{router}.log")
        log_path = tmp_path / "actuator.log"
        act: subprocess.Popen[bytes] | None = None
        client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0)

        async def listed() -> set[str]:
            return await _listed(client, router)

        async def publish(tick: int, *bodies: Any) -> float:
            for b in bodies:
                d = Decision(ts_ms=clock.wall_ms(), tick_id=tick, policy=STAMP, body=b)
                await prod.send(
                    kafka_env.topic(STATE), key=d.key.encode(), value=orjson.dumps(d.model_dump(mode="json"))
                )
            await prod.flush()
            return clock.monotonic_s()

        async def answered_by(n: int) -> set[str]:
            got = set()
            for _ in range(n):
                r = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1})
                if r.status_code == 200:
                    got.add(r.json()["choices"][0]["text"])
            return got

        def routing(weights: dict[str, float]) -> RoutingDecision:
            return RoutingDecision(entity="pool/chat", reason="r", pool_id="chat", weights=weights)

        try:
            await publish(1, routing({"chat/0": 0.5, "chat/1": 0.5}))  # chat/2 not provisioned yet
            act = start_actuator(
                router, kafka_env, log_path, "--url", f"http://127.0.0.1:{port}", "--worker-map", str(wmap)
            )

            async def members(want: set[str]) -> Any:
                async def check() -> bool:
                    return await listed() == want

                return check

            await wait_until(await members({urls[0], urls[1]}), 60, "chat/1 added")
            assert await answered_by(6) == {"chat/0", "chat/1"}

            # a breaker opens on chat/0: the worker leaves the router within two ticks
            t0 = await publish(
                2,
                BreakerDecision(entity="chat/0", reason="r", pool_id="chat", node_id="chat/0", state="open"),
                routing({"chat/0": 0.0, "chat/1": 1.0}),
            )
            await wait_until(await members({urls[1]}), 2.0, "chat/0 removed")
            removed_after_s = clock.monotonic_s() - t0
            assert await answered_by(6) == {"chat/1"}

            # autoscale: chat/2 provisioned (it appears in routing), chat/0 back after its breaker closes
            await publish(
                3,
                BreakerDecision(
                    entity="chat/0", reason="r", pool_id="chat", node_id="chat/0", state="closed"
                ),
                routing({"chat/0": 0.3, "chat/1": 0.4, "chat/2": 0.3}),
            )
            await wait_until(await members(set(urls)), 10, "chat/0 and chat/2 added")
            assert await answered_by(9) == {"chat/0", "chat/1", "chat/2"}

            # scale down: chat/1 on the drain list leaves
            await publish(
                4,
                AutoscaleDecision(
                    entity="pool/chat",
                    reason="r",
                    pool_id="chat",
                    current_nodes=3,
                    desired_nodes=2,
                    drain=("chat/1",),
                ),
            )
            await wait_until(await members({urls[0], urls[2]}), 10, "chat/1 drained")

            # drift: someone adds chat/1 back by hand; the actuator removes it again and says so
            await _add_by_hand(client, router, urls[1])

            async def drift_logged() -> bool:
                return "drift:" in log_path.read_text()

            # The drift line first: sglang-router lists a worker only after its first health check,
            # so right after the add the list can still read {chat/0, chat/2} with no drift undone
            # yet; the actuator logs the drift when it sees chat/1 listed and removes it (the
            # router's health-check interval plus a reconcile, seconds under load; over 30 s once in
            # a fresh-clone CI run with the whole suite on two workers, so the bound is 90 s: it only
            # says how long to wait before failing, and the drift must still be seen and undone).
            await wait_until(drift_logged, 90, "drift line")
            await wait_until(await members({urls[0], urls[2]}), 10, "drift undone")

            # SIGTERM: the actuator puts every mapped worker back in the router's list before it
            # exits (a dead actuator must not leave workers out that nothing brings back)
            act.send_signal(signal.SIGTERM)
            exiting = act  # polled, not waited on: the workers answer the router's health checks here
            await wait_until(lambda: exiting.poll() is not None, 60, "the actuator exits")
            assert await listed() == set(urls), log_path.read_text()[-2000:]
            assert f"restore: add {urls[1]}" in log_path.read_text()
            assert "exit: plain state restored (1 change(s))" in log_path.read_text()
        finally:
            await client.aclose()
            if act is not None and act.poll() is None:
                act.terminate()
                act.wait(10)
            vr.terminate()
            vr.wait(10)
        assert act is not None
        assert act.returncode == 0, log_path.read_text()[-2000:]
        print(f"\nbreaker -> worker removed from {router} in {removed_after_s * 1000:.0f} ms")


async def test_a_worker_sglang_router_never_lists_fails_the_pass_with_the_router_s_account(
    tmp_path: Path,
) -> None:
    """SGLang's router queues an addition and lists the worker only once its health check passes: an
    add that never settles is an error naming the router's job, so the pass stops before removing."""
    from fleetloop.edges.actuate.sglang_router.command import SglangRouterApi
    from fleetloop.edges.actuate.worker_list.actuator import WorkerListError
    from tests.support.http import free_port

    async with workers(1) as urls:
        proc, port = await start_sglang_router(urls, "round_robin", tmp_path / "sglang-router.log")
        api = SglangRouterApi(f"http://127.0.0.1:{port}", settle_s=2.0)
        try:
            # the router lists a worker given at start only once its first health check passes
            async def started() -> bool:
                return await api.list_workers() == set(urls)

            await wait_until(started, 30.0, "sglang-router to list the worker it started with")
            nowhere = f"http://127.0.0.1:{free_port()}"
            with pytest.raises(WorkerListError, match="not listed 2 s after it was added") as exc:
                await api.add_worker(nowhere)
            assert "AddWorker" in str(exc.value)
            await api.remove_worker(urls[0])
            assert await api.list_workers() == set()
            await api.remove_worker(urls[0])  # already gone: nothing to do
        finally:
            await api.close()
            proc.terminate()
            proc.wait(10)
