"""LiteLLM's sync SDK path (``Router.completion``) with fleetloop's callback on a real broker: a
caller with no event loop of its own. The callback's Kafka clients run in a loop on a thread of
their own: its follower takes a decision from ``control.state`` that the sync calls' picks then
obey, and every call's outcome reaches ``fleet.requests`` through the producer there."""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM fetches its price map otherwise

from typing import Any

import litellm
import numpy as np
import orjson
from fleetloop.edges.fleet.live import LiveFleet
from fleetloop.edges.litellm import launch
from fleetloop.edges.litellm.handler import FleetloopCallback
from fleetloop.router import clock
from fleetloop.schemas import RequestOutcome
from fleetloop.schemas.decisions import Decision, RoutingDecision
from fleetloop.schemas.topics import REQUESTS, STATE
from fleetloop.sim.scenario import load_scenario
from tests.integration.test_litellm_proxy import POOL, SCENARIO
from tests.router.test_pick import STAMP
from tests.support.kafka import producer, read_all, send
from tests.support.wait import wait_until

ONLY = "chat-l40s/2"


def sync_call(r: litellm.Router, task: str) -> None:
    r.completion(
        model="llama-8b",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        metadata={"fleetloop": {"task": task, "priority": 0}},
    )


async def test_a_sync_caller_follows_control_state_and_publishes_every_outcome(kafka_env: Any) -> None:
    fleet = LiveFleet(load_scenario(SCENARIO), seed=5)
    await fleet.start(faults=False)
    urls = fleet.urls()
    weights = {n: (1.0 if n == ONLY else 0.0) for n in urls}
    decision = Decision(
        ts_ms=clock.wall_ms(), tick_id=3, policy=STAMP,
        body=RoutingDecision(entity=f"pool/{POOL}", reason="r", pool_id=POOL, weights=weights),
    )  # fmt: skip
    async with producer(kafka_env) as p:
        await send(
            p, kafka_env, STATE, [orjson.dumps(decision.model_dump(mode="json"))], key=decision.key.encode()
        )
    cb = FleetloopCallback(
        kafka_env.bootstrap_servers, topic_prefix=kafka_env.prefix, rng=np.random.default_rng(0)
    )
    litellm.logging_callback_manager.add_litellm_callback(cb)
    try:
        cfg = launch.proxy_config(urls, model="llama-8b", pool=POOL)
        r = litellm.Router(model_list=cfg["model_list"], num_retries=0)
        r.register_plugin(cb.strategy(r))
        await asyncio.to_thread(sync_call, r, "t-0")  # the first call starts the clients' thread
        await wait_until(lambda: cb.follower is not None and cb.follower.stats.caught_up, 30.0)
        assert cb._thread is not None
        for i in range(1, 7):
            await asyncio.to_thread(sync_call, r, f"t-{i}")
        recs = await read_all(kafka_env, REQUESTS, until=lambda rs: len(rs) >= 7)
    finally:
        litellm.logging_callback_manager.remove_callback_from_all_lists(cb)
        await asyncio.to_thread(cb.close)
        await fleet.stop()
    got = {o.workflow_id: o for o in (RequestOutcome.model_validate_json(x.value) for x in recs)}
    assert set(got) == {f"t-{i}" for i in range(7)}
    assert {o.outcome for o in got.values()} == {"ok"}
    # the calls after the follower caught up went where control.state says (the first one may
    # have been placed before it had read anything: fail static)
    assert {got[f"t-{i}"].node_id for i in range(1, 7)} == {ONLY}
    assert cb._thread is None  # closed: the clients' loop ended with the flush
