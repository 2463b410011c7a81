"""fleetloop's LiteLLM callback in LiteLLM's Router SDK over emulated nodes on loopback, on its async
path (``Router.acompletion``: the filter hook) and its sync path (``Router.completion``: fleetloop's
strategy): every call goes to fleetloop's pick, and every attempt's outcome (LiteLLM's own retries
included) is the node's that served it. No broker (but in the last test, one that cannot be
reached): desired state goes in through the core's ``apply``, outcomes out through ``publish``."""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM fetches its price map otherwise

from collections.abc import AsyncIterator, Iterator
from typing import Any

import litellm
import numpy as np
import pytest
import pytest_asyncio
from fleetloop.edges.fleet.live import LiveFleet
from fleetloop.edges.litellm import launch
from fleetloop.edges.litellm.handler import FleetloopCallback
from fleetloop.router import clock
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.sim.scenario import Scenario
from tests.edges.test_fleet_http import one_node
from tests.router.test_pick import admission, breaker, routing
from tests.support.http import loopback

NODES = ["p/0", "p/1", "p/2"]
# LiteLLM logs from a worker task of its own, bound to the loop it first ran in: one loop for the
# module, the worker started before any test (so no test is taken to have left it) and stopped after.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module", autouse=True)
async def litellm_logging_worker() -> AsyncIterator[None]:
    from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER

    GLOBAL_LOGGING_WORKER.start()
    yield
    await GLOBAL_LOGGING_WORKER.stop()


def three_nodes() -> Scenario:
    s = one_node()
    pool = s.pools[0].model_copy(update={"nodes": 3, "min_nodes": 3, "max_nodes": 3})
    return s.model_copy(update={"pools": [pool]})


@pytest_asyncio.fixture(loop_scope="module")
async def fleet() -> AsyncIterator[LiveFleet]:
    f = LiveFleet(three_nodes(), seed=1)
    await f.start()
    try:
        yield f
    finally:
        await f.stop()


@pytest.fixture
def outcomes() -> Iterator[tuple[FleetloopCallback, list[RequestOutcome]]]:
    got: list[RequestOutcome] = []
    cb = FleetloopCallback(None, publish=got.append, rng=np.random.default_rng(0))
    litellm.logging_callback_manager.add_litellm_callback(cb)
    try:
        yield cb, got
    finally:  # LiteLLM keeps one logger per class in its success and failure lists: take it off all
        litellm.logging_callback_manager.remove_callback_from_all_lists(cb)


def router(fleet: LiveFleet, cb: FleetloopCallback | None = None, **kw: Any) -> litellm.Router:
    """A Router over the fleet's nodes; with ``cb``, fleetloop's strategy registered (its sync calls'
    pick)."""
    cfg = launch.proxy_config(fleet.urls(), model="llama-8b", pool="p")
    r = litellm.Router(model_list=cfg["model_list"], **kw)
    if cb is not None:
        r.register_plugin(cb.strategy(r))
    return r


async def until(cond: Any, timeout_s: float = 10.0) -> None:
    """LiteLLM logs a call's success in a task of its own, after the call returns."""
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.02)


def _request(task: str, stream: bool, priority: int) -> dict[str, Any]:
    return {
        "model": "llama-8b",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": stream,
        "metadata": {"fleetloop": {"task": task, "call": 1, "tenant": "gold", "priority": priority}},
    }


def sync_call(r: litellm.Router, task: str, *, stream: bool, priority: int = 0) -> None:
    """``Router.completion``, LiteLLM's sync path (in a thread of its own: the fleet serves from the
    test's loop)."""
    resp = r.completion(**_request(task, stream, priority))
    if stream:
        for _ in resp:
            pass


async def call(r: litellm.Router, task: str, *, stream: bool, priority: int = 0, sync: bool = False) -> None:
    if sync:
        await asyncio.to_thread(sync_call, r, task, stream=stream, priority=priority)
        return
    resp = await r.acompletion(**_request(task, stream, priority))
    if stream:
        async for _ in resp:
            pass


# every path: the async calls (the callback's deployment filter), and the sync calls
# (``Router.completion``: fleetloop's strategy, which LiteLLM's sync path runs in place of filters)
PATHS = pytest.mark.parametrize("sync", [False, True], ids=["acompletion", "completion"])


@PATHS
async def test_calls_go_where_fleetloop_picks_and_each_outcome_names_its_node(
    fleet: LiveFleet, outcomes: tuple[FleetloopCallback, list[RequestOutcome]], sync: bool
) -> None:
    cb, got = outcomes
    cb.routing.apply([routing("p", dict.fromkeys(NODES, 1.0)), breaker("p/1")], clock.monotonic_s())
    r = router(fleet, cb if sync else None, num_retries=0)
    for i in range(12):
        await call(r, f"t{i}", stream=i % 2 == 0, sync=sync)
    await until(lambda: len(got) == 12)
    got.sort(key=lambda o: int(o.workflow_id[1:]))  # a sync call's success is logged from a thread
    assert {o.node_id for o in got} == {"p/0", "p/2"}  # never the node behind the open breaker
    assert {(o.outcome, o.pool_id, o.model, o.tenant_id, o.priority, o.step_index) for o in got} == {
        ("ok", "p", "llama-8b", "gold", 0, 1)
    }
    assert [o.workflow_id for o in got] == [f"t{i}" for i in range(12)]
    streamed = [o for i, o in enumerate(got) if i % 2 == 0]
    assert all(o.ttft_ms is not None and 0 < o.ttft_ms <= o.e2e_ms for o in streamed)
    assert all(o.ttft_ms is None for o in got[1::2])  # no first token seen on a whole answer
    assert all(o.output_tokens == 3 for o in got)
    assert cb.routing.counts.picked == 12  # each call placed once
    # each result found the call it placed (the SDK's filter sees only a trace id): none outstanding
    assert not cb.routing.pending
    assert set(cb.routing.router.outstanding.values()) == {0}


@PATHS
async def test_each_failed_attempt_counts_against_its_node_and_a_breaker_moves_the_next_call(
    fleet: LiveFleet, outcomes: tuple[FleetloopCallback, list[RequestOutcome]], sync: bool
) -> None:
    cb, got = outcomes
    cb.routing.apply([routing("p", {"p/0": 1.0, "p/1": 0.0, "p/2": 0.0}, tick=1)], clock.monotonic_s())
    node = fleet.node("p/0")
    assert node is not None
    fleet.crash_node(node, comes_back=False)  # connections refused from now on
    r = router(fleet, cb if sync else None, num_retries=2, retry_after=0)
    with pytest.raises(litellm.InternalServerError):
        await call(r, "t-1", stream=True, sync=sync)
    # LiteLLM tried three times and logs one failure; each attempt is the node's, as the daemon's
    # breaker must count them (fleetloop's decision named only p/0, so each retry went there too)
    await until(lambda: len(got) == 3)
    assert [(o.node_id, o.outcome, o.workflow_id) for o in got] == [("p/0", "error", "t-1")] * 3
    cb.routing.apply([breaker("p/0", tick=2), routing("p", {"p/0": 0.0, "p/1": 1.0, "p/2": 1.0}, tick=2)],
                     clock.monotonic_s())  # fmt: skip
    await call(r, "t-2", stream=True, sync=sync)
    await until(lambda: len(got) == 4)
    assert (got[-1].outcome, got[-1].workflow_id) == ("ok", "t-2")
    assert got[-1].node_id in ("p/1", "p/2")


@PATHS
async def test_a_shed_call_is_refused_by_litellm_and_published_with_no_node(
    fleet: LiveFleet, outcomes: tuple[FleetloopCallback, list[RequestOutcome]], sync: bool
) -> None:
    cb, got = outcomes
    now = clock.monotonic_s()
    cb.routing.apply([routing("p", dict.fromkeys(NODES, 1.0)), admission("p", max_queue_depth={"2": 0})], now)
    r = router(fleet, cb if sync else None, num_retries=0)
    await call(r, "t-0", stream=False, priority=0, sync=sync)  # the nodes are known from then on
    await until(lambda: len(got) == 1)
    from litellm.types.router import RouterRateLimitError

    with pytest.raises(RouterRateLimitError) as refused:  # the proxy answers it 429
        await call(r, "t-2", stream=False, priority=2, sync=sync)
    assert refused.value.status_code == 429
    assert [(o.workflow_id, o.outcome, o.node_id) for o in got][-1] == ("t-2", "shed", None)


@pytest_asyncio.fixture(loop_scope="module")
async def busy_node() -> AsyncIterator[str]:
    """A deployment that turns every call away for load: 429 Too Many Requests (a vLLM server behind
    its own rate limiter, or another router as a deployment)."""
    from aiohttp import web

    async def refuse(_: web.Request) -> web.Response:
        body = {"error": {"message": "too many requests", "type": "rate_limit", "code": 429}}
        return web.json_response(body, status=429)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    async with loopback(app) as port:
        yield f"http://127.0.0.1:{port}"


@PATHS
async def test_a_deployments_429_is_a_shed_not_an_error_of_its_node(
    fleet: LiveFleet, busy_node: str, outcomes: tuple[FleetloopCallback, list[RequestOutcome]], sync: bool
) -> None:
    """LiteLLM's failure hooks classify an attempt's answer by the rule every integration shares
    (``fleetloop.edges.answers.answer_outcome``): a 429 is a shed, no node's error; counted as one,
    a deployment that sheds for load would open its breaker and lose the calls it could serve."""
    cb, got = outcomes
    cb.routing.apply([routing("p", {"p/0": 0.0, "p/1": 0.0, "p/2": 0.0, "p/9": 1.0})], clock.monotonic_s())
    cfg = launch.proxy_config({**fleet.urls(), "p/9": busy_node}, model="llama-8b", pool="p")
    r = litellm.Router(model_list=cfg["model_list"], num_retries=0)
    if sync:
        r.register_plugin(cb.strategy(r))
    with pytest.raises(litellm.RateLimitError):
        await call(r, "t-429", stream=False, sync=sync)
    await until(lambda: len(got) == 1)
    assert [(o.workflow_id, o.outcome, o.node_id) for o in got] == [("t-429", "shed", None)]
    assert not cb.routing.pending


async def test_the_strategy_leaves_out_deployments_litellm_holds_in_cooldown(
    fleet: LiveFleet, outcomes: tuple[FleetloopCallback, list[RequestOutcome]]
) -> None:
    """The filter gets LiteLLM's candidates with its cooldowns applied; the strategy, which LiteLLM
    hands no candidates, reads the same cooldowns itself."""
    cb, got = outcomes
    cb.routing.apply([routing("p", dict.fromkeys(NODES, 1.0))], clock.monotonic_s())
    r = router(fleet, cb, num_retries=0)
    r.health().cooldowns.add_deployment_to_cooldown("p-1", RuntimeError("test"), 500, 120.0)
    for i in range(9):
        await call(r, f"t{i}", stream=False, sync=True)
    await until(lambda: len(got) == 9)
    assert {o.node_id for o in got} == {"p/0", "p/2"}


async def test_async_calls_through_the_strategy_are_each_placed_once(
    fleet: LiveFleet, outcomes: tuple[FleetloopCallback, list[RequestOutcome]]
) -> None:
    """A router with fleetloop's strategy also hands it its async calls: the strategy places them
    and the deployment filter, which then sees only that deployment, does not place them again."""
    cb, got = outcomes
    cb.routing.apply([routing("p", dict.fromkeys(NODES, 1.0))], clock.monotonic_s())
    r = router(fleet, cb, num_retries=0)
    for i in range(4):
        await call(r, f"a{i}", stream=i % 2 == 0)
    await until(lambda: len(got) == 4)
    assert cb.routing.counts.picked == 4
    assert {o.outcome for o in got} == {"ok"}
    assert not cb.routing.pending


async def test_a_sync_call_never_waits_for_the_broker(fleet: LiveFleet) -> None:
    """With no broker to reach (nothing listens on the port), a sync call is served at once: the
    Kafka clients start in a thread of their own and retry there; its outcome waits in the buffer."""
    cb = FleetloopCallback("127.0.0.1:1", rng=np.random.default_rng(0))
    litellm.logging_callback_manager.add_litellm_callback(cb)
    try:
        cb.routing.apply([routing("p", dict.fromkeys(NODES, 1.0))], clock.monotonic_s())
        r = router(fleet, cb, num_retries=0)
        await call(r, "t-0", stream=False, sync=True)
        await until(lambda: len(cb._buffer) == 1)
        assert cb.publisher is None
        assert cb._thread is not None
        assert cb._thread.is_alive()
        assert cb._loop is not None
        assert cb._loop is not asyncio.get_running_loop()
        assert [(o.workflow_id, o.outcome) for o in cb._buffer] == [("t-0", "ok")]
    finally:
        litellm.logging_callback_manager.remove_callback_from_all_lists(cb)
        await asyncio.to_thread(cb.close, 5.0)
    assert cb._thread is None
