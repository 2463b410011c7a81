"""The official openai SDK against an emulated node over loopback HTTP.

Streaming and not; a streaming client that disconnects aborts its request on the engine; a
non-streaming one that gives up leaves an orphan that runs on; /metrics reads as vLLM 0.33 to the
vLLM scraper.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from fleetloop.edges.fleet.live import LiveFleet
from fleetloop.edges.scrape.convert import Converter, NodeIdentity, parse_exposition
from fleetloop.sim.scenario import Scenario, parse_scenario
from tests.support.http import loopback
from tests.support.wait import wait_until


def one_node(model: str = "llama-8b") -> Scenario:
    return parse_scenario(
        {
            "name": "one-node",
            "seed": 1,
            "duration_s": 60,
            "slo": {"ttft_ms": 2000, "tbt_ms": 100},
            "pools": [{"id": "p", "model": model, "gpu": "L40S", "nodes": 1, "cold_start_s": 1}],
            "tenants": [{"id": "t", "priority": 0}],
            "workload": [
                {
                    "kind": "chatbot",
                    "tenant": "t",
                    "rate_per_s": 1.0,
                    "calls": [1, 1],
                    "prompt_tokens": {"median": 100, "max": 200},
                    "output_tokens": {"median": 10, "max": 20},
                    "models": [model],
                    "deadline_s": 30,
                    "client": {"timeout_s": 10},
                }
            ],
        },
        "<test>",
    )


@pytest.fixture
async def fleet() -> AsyncIterator[LiveFleet]:
    f = LiveFleet(one_node(), seed=1)
    await f.start()
    try:
        yield f
    finally:
        await f.stop()


def _client(fleet: LiveFleet) -> openai.AsyncOpenAI:
    url = fleet.urls()["p/0"]
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)


async def test_non_streaming_chat_and_completions(fleet: LiveFleet) -> None:
    api = _client(fleet)
    resp = await api.chat.completions.create(
        model="llama-8b", messages=[{"role": "user", "content": "hello"}], max_tokens=12
    )
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 12
    assert resp.choices[0].message.content is not None
    assert resp.choices[0].message.content.count("tok") == 12
    text = await api.completions.create(model="llama-8b", prompt="x" * 400, max_tokens=5)
    assert text.usage is not None
    assert text.usage.prompt_tokens == 100  # ~4 characters a token without the size header
    assert text.usage.completion_tokens == 5
    models = await api.models.list()
    assert [m.id for m in models.data] == ["llama-8b"]
    with pytest.raises(openai.NotFoundError):
        await api.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


async def test_streaming_with_usage_chunk(fleet: LiveFleet) -> None:
    api = _client(fleet)
    stream = await api.chat.completions.create(
        model="llama-8b",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Fleetloop-Prompt-Tokens": "3000"},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.count("tok") == 40
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 3000
    assert chunks[-1].usage.completion_tokens == 40


async def test_the_first_token_is_sent_when_the_engine_makes_it_not_at_the_next_poll(
    fleet: LiveFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler waits for the first token OR the end, whichever comes first. Waiting for both
    (asyncio.wait's default) held every stream's first chunk until the next disconnect poll or the
    call's end, so every emulated TTFT was a multiple of 250 ms. With the poll stretched to an hour,
    the first chunk arrives while the call is still decoding (its 100 tokens take seconds)."""
    from fleetloop.edges.fleet import server

    monkeypatch.setattr(server, "POLL_S", 3600.0)
    api = _client(fleet)
    node = fleet.live["p/0"].node
    stream = await api.chat.completions.create(
        model="llama-8b", messages=[{"role": "user", "content": "x"}], max_tokens=100, stream=True
    )
    running_at_first: int | None = None
    async with asyncio.timeout(60):
        async for chunk in stream:
            if running_at_first is None:
                running_at_first = node.running
                assert chunk.choices[0].delta.role == "assistant"
    assert running_at_first == 1  # the call was still decoding when its first token arrived


async def test_streaming_disconnect_aborts_the_request(fleet: LiveFleet) -> None:
    api = _client(fleet)
    node = fleet.live["p/0"].node
    stream = await api.chat.completions.create(
        model="llama-8b", messages=[{"role": "user", "content": "x"}], max_tokens=20000, stream=True
    )
    async for _ in stream:
        break  # the first token arrived: leave
    await stream.close()
    await wait_until(lambda: node.running == 0 and fleet.aborted == 1, 10.0)
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{fleet.urls()['p/0']}/metrics")).text
    assert 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="llama-8b"} 1.0' in text


async def test_non_streaming_give_up_leaves_an_orphan(fleet: LiveFleet) -> None:
    api = _client(fleet)
    node = fleet.live["p/0"].node
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):  # its 120 tokens take about 3 s of the node's time
            await api.chat.completions.create(
                model="llama-8b", messages=[{"role": "user", "content": "x"}], max_tokens=120
            )
    await asyncio.sleep(0.3)
    assert node.running == 1, "the engine cannot see a non-streaming client leave: the request runs on"
    assert fleet.aborted == 0
    await wait_until(lambda: node.running == 0, 30.0)
    assert fleet.aborted == 0


async def test_metrics_read_by_the_vllm_scraper(fleet: LiveFleet) -> None:
    url = fleet.urls()["p/0"]
    conv = Converter("vllm", NodeIdentity(node_id="p/0", pool_id="p"))
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{url}/health")).status_code == 200
        first = parse_exposition((await http.get(f"{url}/metrics")).text)
        assert conv.update(first, ts_ms=1, mono_ms=1000) is None
        api = _client(fleet)
        for _ in range(3):
            await api.chat.completions.create(
                model="llama-8b", messages=[{"role": "user", "content": "x"}], max_tokens=8
            )
        second = parse_exposition((await http.get(f"{url}/metrics")).text)
    rec = conv.update(second, ts_ms=2, mono_ms=2000)
    assert conv.release is not None
    assert conv.release.version == "0.33.0 (V1)"
    assert rec is not None
    assert rec.requests_completed == 3
    assert rec.output_tokens == 24
    assert rec.model == "llama-8b"
    assert rec.ttft_p50_ms is not None
    assert rec.tbt_p50_ms is not None


@contextlib.asynccontextmanager
async def router_at(chat: Any) -> AsyncIterator[str]:
    """A stand-in router on loopback answering ``POST /v1/chat/completions`` with ``chat``: its URL."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with loopback(app) as port:
        yield f"http://127.0.0.1:{port}/"


async def agents_behind(chat: Any, seconds: float) -> tuple[Any, LiveFleet]:
    """One node's scenario's agents for ``seconds``, every call to a router answering with ``chat``."""
    from fleetloop.edges.fleet.agents import Agents

    async with router_at(chat) as url:
        fleet = LiveFleet(one_node(), seed=3)
        await fleet.start()
        try:
            agents = Agents(fleet, router_url=url, rate_scale=10.0)
            await agents.run(fleet.t() + seconds, 10.0)
        finally:
            await fleet.stop()
    return agents, fleet


async def test_agents_send_every_call_to_one_router_url() -> None:
    """``Agents(router_url=...)``: no node is picked by the agent; every attempt goes to the one URL
    (as behind vllm-router or HAProxy) with the task headers, and the router's answers count."""
    import json as _json

    from aiohttp import web

    seen: list[dict[str, str]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append({k.lower(): v for k, v in request.headers.items()} | {"model": body["model"]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {"id": "r", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]}
        usage = {
            **base,
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        for chunk in (first, usage):
            await resp.write(f"data: {_json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    agents, fleet = await agents_behind(chat, 2.0)
    s = agents.stats
    assert s.tasks_started >= 5
    assert len(seen) == s.sent == s.ok == s.tasks_succeeded == s.p0_succeeded
    assert all(h["x-fleetloop-priority"] == "0" and h["x-fleetloop-task"] for h in seen)
    assert {h["model"] for h in seen} == {"llama-8b"}
    assert fleet.live["p/0"].node.counter == 0  # the node itself got nothing: the router answered


@pytest.mark.parametrize(
    ("status", "body", "counted"),
    [
        (429, "No deployments available for selected model", "shed"),  # LiteLLM's shed (fleetloop's too)
        (500, "internal error", "errors"),
        (503, "no server is available", "errors"),  # a node's 503 passed on looks the same
    ],
)
async def test_agents_count_a_routers_429_as_a_shed_and_other_refusals_as_errors(
    status: int, body: str, counted: str
) -> None:
    """Behind a router URL the agents read its answer by the rule HAProxy's log is read with
    (``fleetloop.edges.answers``): a 429 is a call the router placed nowhere, a shed."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"error": {"message": body, "code": str(status)}}, status=status)

    agents, _ = await agents_behind(chat, 1.0)
    s = agents.stats
    assert s.sent > 0
    assert s.ok == s.tasks_succeeded == 0
    assert {"shed": s.shed, "errors": s.errors, "timeouts": s.timeouts} == {
        "shed": s.sent if counted == "shed" else 0,
        "errors": s.sent if counted == "errors" else 0,
        "timeouts": 0,
    }


def test_a_prompt_as_text_carries_its_size_and_shared_prefix() -> None:
    from fleetloop.edges.fleet.server import prefix_in_text, prompt_text

    a = prompt_text(7000, "d1", 6000, "task-1 call 0")
    b = prompt_text(7500, "d1", 6000, "task-1 call 1")
    assert len(a) == 7000 * 4
    assert len(b) == 7500 * 4
    assert prefix_in_text(a) == prefix_in_text(b) == ("d1", 6000)
    assert a[: 6000 * 4] == b[: 6000 * 4]  # the shared part is the same text in every call
    assert "task-1 call 0" in a
    plain = prompt_text(300, None, 0, "chat 5")
    assert len(plain) == 1200
    assert prefix_in_text(plain) == (None, 0)
    assert prefix_in_text("[fleetloop-prefix broken") == (None, 0)


async def test_without_headers_the_node_reads_size_and_prefix_from_the_text(fleet: LiveFleet) -> None:
    """A router that forwards no client header (SGLang's) still delivers a prompt's size and its
    shared prefix: the second call of a prefix finds it cached."""
    from fleetloop.edges.fleet.server import prompt_text

    api = _client(fleet)
    usage = []
    for step in range(2):
        text = prompt_text(3000, "ctx", 2500, f"t call {step}")
        resp = await api.chat.completions.create(
            model="llama-8b", messages=[{"role": "user", "content": text}], max_tokens=2
        )
        assert resp.usage is not None
        usage.append(resp.usage)
    assert [u.prompt_tokens for u in usage] == [3000, 3000]
    assert dict(fleet.live["p/0"].node.cache) == {"ctx": 2500}
    assert usage[1].prompt_tokens_details is not None
    assert usage[1].prompt_tokens_details.cached_tokens == 2500


@pytest.mark.parametrize("stream", [True, False])
async def test_the_fleet_stops_at_once_with_calls_still_on_its_nodes(stream: bool) -> None:
    """A call still in a node's handler when the fleet stops can never finish (the engines stop
    first), so closing the node does not wait for it: aiohttp's default waited 60 s twice a node,
    and a bench run whose agents left orphans on a few slow nodes took minutes to tear down."""
    f = LiveFleet(one_node(), seed=1)
    await f.start()
    api = openai.AsyncOpenAI(base_url=f"{f.urls()['p/0']}/v1", api_key="x", max_retries=0)
    msgs: Any = [{"role": "user", "content": "x"}]

    async def call() -> None:
        if stream:
            async for _ in await api.chat.completions.create(
                model="llama-8b", messages=msgs, max_tokens=20000, stream=True
            ):
                pass
        else:
            await api.chat.completions.create(model="llama-8b", messages=msgs, max_tokens=20000)

    task = asyncio.create_task(call())
    node = f.live["p/0"].node
    try:
        await wait_until(lambda: node.running == 1, 10.0)
        async with asyncio.timeout(30):  # 120 s before; a second or two now
            await f.stop()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert f.urls() == {}


async def _retries_after_the_budget_went(fail_static_s: float, exempt: tuple[str, ...] = ()) -> int:
    """The agents' retries when a control plane published a spent retry budget for their pool once,
    then went away, and the pool's one node is down (every call fails: a retry each, if allowed)."""
    from fleetloop.edges.fleet.agents import Agents
    from fleetloop.schemas.decisions import Decision, PolicyStamp, RetryBudgetDecision, RoutingDecision

    fleet = LiveFleet(one_node(), seed=5)
    await fleet.start(faults=False)
    try:
        fleet.router.fail_static_s = fail_static_s
        stamp = PolicyStamp(name="t", version=1, hash="0" * 16, mode="enforce")
        bodies = [
            RoutingDecision(entity="pool/p", reason="t", pool_id="p", weights={"p/0": 1.0}),
            RetryBudgetDecision(
                entity="pool/p", reason="t", pool_id="p", retry_ratio=0.0, min_retries_per_s=0.0,
                retries_allowed_now=0, exempt_retries_of=exempt,  # type: ignore[arg-type]
            ),
        ]  # fmt: skip
        fleet.apply([Decision(ts_ms=fleet.wall_ms(), tick_id=1, policy=stamp, body=b) for b in bodies])
        node = fleet.node("p/0")
        assert node is not None
        fleet.crash_node(node, comes_back=False)
        agents = Agents(fleet, rate_scale=5.0)
        await agents.run(fleet.t() + 2.0, 5.0)
    finally:
        await fleet.stop()
    assert agents.stats.tasks_started >= 3
    return agents.stats.retries


async def test_the_agents_spend_a_retry_budget_at_event_time() -> None:
    """The emulated agents ask the router for a retry at the fleet's clock: a budget held from a
    control plane that went away (its routing older than the fail-static TTL, here 0.1 s) refuses
    nothing, while a fresh one (TTL 30 s) binds."""
    assert await _retries_after_the_budget_went(30.0) == 0
    assert await _retries_after_the_budget_went(0.1) > 0


async def test_the_agents_retry_a_dropped_or_shed_call_outside_the_budget() -> None:
    """The agents tell the router what the failed attempt ended as: the retry of a call its node
    dropped (or nobody took) goes without spending a budget that exempts it, as in the simulator."""
    assert await _retries_after_the_budget_went(30.0, ("error", "shed")) > 0
