"""``fleetloop policy status ... | head -3`` on a real broker: the reader going away early ends the
command quietly (no BrokenPipeError traceback), as for every command (tests/unit/test_closed_pipe.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from fleetloop.clock import wall_ms
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.control import Activation, ActivePolicy
from fleetloop.schemas.topics import POLICY_ACTIVE
from tests.support.kafka import producer, send
from tests.support.pipes import SIGPIPE_EXIT, closed_reader


async def test_policy_status_into_a_closed_pipe_ends_quietly(kafka_env: Any) -> None:
    policy = builtin_policy("default")
    stamp = policy.stamp
    active = ActivePolicy(
        group="fleetloop",
        name=stamp.name,
        version=stamp.version,
        hash=stamp.hash,
        from_ts_ms=wall_ms(),
        from_tick_id=0,
        considered_offset=-1,
        history=[Activation(from_ts_ms=wall_ms(), document=policy.document)],
    )
    async with producer(kafka_env) as prod:
        await send(prod, kafka_env, POLICY_ACTIVE, [active], key=b"fleetloop")
    argv = ["policy", "status", "--bootstrap-servers", kafka_env.bootstrap_servers]
    code, err = await asyncio.to_thread(closed_reader, *argv, "--topic-prefix", kafka_env.prefix)
    assert err == ""
    assert code == SIGPIPE_EXIT
