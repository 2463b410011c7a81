"""The emulated fleet's worker manager and faults, on live nodes over loopback HTTP."""

from __future__ import annotations

import asyncio

import httpx
import openai
from fleetloop.edges.fleet.live import LiveFleet
from fleetloop.schemas.decisions import (
    AutoscaleDecision,
    BatchingDecision,
    Decision,
    DecisionBody,
    PolicyStamp,
)
from fleetloop.sim.scenario import Fault
from tests.edges.test_fleet_http import one_node

STAMP = PolicyStamp(name="t", version=1, hash="0" * 16, mode="enforce")


def _d(body: DecisionBody, tick: int) -> Decision:
    return Decision(ts_ms=1, tick_id=tick, policy=STAMP, body=body)


async def _up(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=1.0) as http:
            return (await http.get(f"{url}/health")).status_code == 200
    except httpx.HTTPError:
        return False


async def test_autoscale_cold_start_drain_and_batching() -> None:
    s = one_node()
    s = s.model_copy(update={"pools": [s.pools[0].model_copy(update={"max_nodes": 3, "cold_start_s": 1.0})]})
    fleet = LiveFleet(s, seed=1)
    await fleet.start()
    try:
        fleet.apply(
            [_d(AutoscaleDecision(entity="p", reason="t", pool_id="p", current_nodes=1, desired_nodes=2), 5)]
        )
        assert sorted(fleet.live) == ["p/0", "p/1"]
        assert "p/1" not in fleet.urls(), "a new node listens only after the pool's cold start"
        async with asyncio.timeout(10):
            while "p/1" not in fleet.urls() or not await _up(fleet.urls()["p/1"]):
                await asyncio.sleep(0.05)
        # an older decision (by tick) is dropped; a newer one drains the surplus node
        fleet.apply(
            [_d(AutoscaleDecision(entity="p", reason="t", pool_id="p", current_nodes=2, desired_nodes=3), 4)]
        )
        assert len(fleet.live) == 2
        url0 = fleet.urls()["p/0"]
        api = openai.AsyncOpenAI(base_url=f"{url0}/v1", api_key="x", max_retries=0)
        busy = asyncio.create_task(  # its 80 tokens take about 2 s: still running at the drain
            api.chat.completions.create(
                model="llama-8b", messages=[{"role": "user", "content": "x"}], max_tokens=80
            )
        )
        async with asyncio.timeout(10):
            while fleet.live["p/0"].node.running == 0:
                await asyncio.sleep(0.02)
        drain = AutoscaleDecision(
            entity="p", reason="t", pool_id="p", current_nodes=2, desired_nodes=1, drain=("p/0",)
        )
        fleet.apply([_d(drain, 6)])
        assert fleet.live["p/0"].state == "draining"
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{url0}/health")).status_code == 503  # refuses new work...
        resp = await busy  # ...but finishes what it holds
        assert resp.usage is not None
        assert resp.usage.completion_tokens == 80
        async with asyncio.timeout(10):
            while "p/0" in fleet.urls():
                await asyncio.sleep(0.02)
        assert fleet.live["p/0"].state == "stopped"
        fleet.apply([_d(BatchingDecision(entity="p", reason="t", pool_id="p", max_batch_tokens=512), 7)])
        assert fleet.live["p/1"].node.max_batch_tokens == 512
        # The autoscale log keeps each accepted change of target or reason, not the dropped older
        # decision nor a repeat of the same target and reason.
        held = AutoscaleDecision(entity="p", reason="held", pool_id="p", current_nodes=1, desired_nodes=1)
        fleet.apply([_d(held.model_copy(update={"reason": "t"}), 8)])
        fleet.apply([_d(held, 9)])
        fleet.apply([_d(held, 10)])
        assert [(p, n, why) for _, p, n, why in fleet.autoscale_log] == [
            ("p", 2, "t"),
            ("p", 1, "t"),
            ("p", 1, "held"),
        ]
        times = [t for t, *_ in fleet.autoscale_log]
        assert times == sorted(times)
    finally:
        await fleet.stop()


async def test_faults_hit_live_nodes() -> None:
    s = one_node()
    s = s.model_copy(update={"pools": [s.pools[0].model_copy(update={"nodes": 2, "cold_start_s": 1.0})]})
    fleet = LiveFleet(s, seed=1)
    await fleet.start()
    try:
        fleet.inject(Fault(at_s=0, kind="degrade", node="p/1", factor=8.0))
        assert fleet.live["p/1"].node.degrade == 8.0
        url0 = fleet.urls()["p/0"]
        fleet.inject(Fault(at_s=0, kind="crash", node="p/0"))
        async with asyncio.timeout(5):
            while "p/0" in fleet.urls():
                await asyncio.sleep(0.02)
        async with httpx.AsyncClient() as http:
            try:
                await http.get(f"{url0}/health")
                refused = False
            except httpx.ConnectError:
                refused = True
        assert refused, "a crashed node is not listening"
        fleet.inject(Fault(at_s=0, kind="preempt", node="p/1"))
        assert fleet.live["p/1"].node.weights_state == "cold"
        async with asyncio.timeout(10):  # comes back after the pool's cold start
            while "p/1" not in fleet.urls() or not await _up(fleet.urls()["p/1"]):
                await asyncio.sleep(0.05)
        assert fleet.live["p/1"].node.degrade == 1.0
        fleet.inject(Fault(at_s=0, kind="load_spike", factor=3.0))
        assert fleet.rate_factor("t") == 3.0
        assert [f["kind"] for f in fleet.fault_log] == ["degrade", "crash", "preempt", "load_spike"]
    finally:
        await fleet.stop()
