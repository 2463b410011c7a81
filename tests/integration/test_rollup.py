"""The fleet-wide second stage on a real broker: the daemon publishes one summary per shard per tick
boundary on control.summaries, and ``fleetloop rollup`` (run_rollup) folds them into fleet figures
on control.state (key fleet/fleet) that add up what was produced on every partition."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiokafka import AIOKafkaProducer
from fleetloop.core.model.fleet import nano_usd
from fleetloop.daemon.rollup.command import FLEET_KEY, run_rollup
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.decisions import Decision, FleetDecision
from fleetloop.schemas.summary import ShardSummary
from fleetloop.schemas.topics import REQUESTS, STATE, SUMMARIES, TELEMETRY, TICKS
from tests.support.kafka import read_all, running_daemon
from tests.support.records import outcome, telemetry, tick, to_bytes

POOLS = ("pa", "pb", "pc", "pd")  # pool i on partition i of every pool-keyed topic
RATE = 7.2  # $/h per node: 2 milli-dollars per one-second interval


async def _send(p: AIOKafkaProducer, env: Any, logical: str, partition: int, records: list[Any]) -> None:
    for r in records:
        await p.send(
            env.topic(logical), value=to_bytes(r), key=POOLS[partition].encode(), partition=partition
        )
    await p.flush()


async def test_rollup_adds_up_every_shard_into_fleet_figures_on_control_state(kafka_env: Any) -> None:
    published: list[Decision] = []
    stop = asyncio.Event()
    bootstrap = kafka_env.bootstrap_servers
    async with running_daemon(kafka_env, policy=builtin_policy("default")) as daemon:
        group = daemon.config.group_id
        rollup = asyncio.create_task(
            run_rollup(bootstrap, kafka_env.prefix, group, stop, hold_s=30.0, on_published=published.append)
        )
        p = AIOKafkaProducer(bootstrap_servers=kafka_env.bootstrap_servers, acks="all")
        await p.start()
        try:
            telemetry_sent = 0
            for k in (1, 2, 3):
                for i, pool in enumerate(POOLS):
                    nodes = [f"{pool}/{n}" for n in range(i + 1)]  # 1, 2, 3, 4 nodes
                    recs: list[Any] = [
                        telemetry(n, pool=pool, ts_ms=k * 1000 - 500, cost_rate_usd_per_h=RATE) for n in nodes
                    ]
                    telemetry_sent += len(recs)
                    await _send(p, kafka_env, TELEMETRY, i, recs)
                    outs = [
                        outcome(nodes[0], "ok", pool=pool, ts_ms=k * 1000 - 400, n=100 * k + i,
                                task_outcome="succeeded"),
                        outcome(nodes[-1], "retry", pool=pool, ts_ms=k * 1000 - 300, n=200 * k + i,
                                attempt=1),
                    ]  # fmt: skip
                    await _send(p, kafka_env, REQUESTS, i, outs)
                    await _send(p, kafka_env, TICKS, i, [tick(k, pool=pool)])
            async with asyncio.timeout(60):
                while not any(d.ts_ms == 3000 and d.body.reason == "complete" for d in published):
                    await asyncio.sleep(0.05)
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(rollup, 30)
            await p.stop()
        stats = rollup.result()
    last = next(d for d in published if d.ts_ms == 3000)
    body = last.body
    assert isinstance(body, FleetDecision)
    assert (body.shards, body.shards_behind, body.pools, body.nodes) == (4, 0, 4, 10)
    assert body.cost_rate_usd_per_h == 10 * RATE
    assert body.fleet_cost_usd == telemetry_sent * nano_usd(RATE / 3600) / 1e9
    assert body.tasks_succeeded == 12  # one per pool per second, each counted once
    assert body.cost_per_successful_task_usd == body.fleet_cost_usd / 12
    assert body.retries_w == 12
    assert body.requests_w == 24
    assert body.retries_allowed > 0
    assert body.retry_budget_used_frac == 12 / body.retries_allowed
    assert stats.published >= 1
    assert stats.malformed == 0
    # On the broker: every shard's summaries, and the fleet figure under its key on control.state.
    summaries = [ShardSummary.model_validate_json(r.value) for r in await read_all(kafka_env, SUMMARIES)]
    assert {s.partition for s in summaries if s.ts_ms == 3000} == {0, 1, 2, 3}
    assert all(s.group == group for s in summaries)
    state = await read_all(kafka_env, STATE, until=lambda rs: any(r.key == FLEET_KEY for r in rs))
    fleet = [Decision.model_validate_json(r.value) for r in state if r.key == FLEET_KEY]
    assert fleet
    assert fleet[-1] == last
    # Latency the stage adds (broker append times): from the last summary of a boundary to its figure.
    summary_at = {}
    for r in await read_all(kafka_env, SUMMARIES):
        s = ShardSummary.model_validate_json(r.value)
        summary_at[s.ts_ms] = max(summary_at.get(s.ts_ms, 0), r.timestamp)
    lags = sorted(
        r.timestamp - summary_at[Decision.model_validate_json(r.value).ts_ms]
        for r in state
        if r.key == FLEET_KEY and Decision.model_validate_json(r.value).ts_ms in summary_at
    )
    print(f"rollup stage latency ms (broker append times): {lags}; in-process: {stats.stage_latency_ms}")
    assert lags
    assert lags[-1] < 5_000


async def test_rollup_without_its_topic_says_so_in_one_line(kafka_env: Any) -> None:
    import pytest
    from fleetloop.daemon.cli_common import UsageError

    with pytest.raises(UsageError, match=r"control\.summaries does not exist"):
        await run_rollup(kafka_env.bootstrap_servers, "no-such-prefix", "g", asyncio.Event())
