"""The embedded broker keeps topics in memory: restarted, it comes back empty. The daemon says so in
one line and starts clean (and decides again) instead of crashing or stalling.

This test runs its own Tansu broker (it has to restart it on the same port), so it runs once, not
once per broker: Apache Kafka keeps its data across a restart, which test_restarts.py covers with a
broker outage on both brokers."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from fleetloop.daemon.brokers import ensure_topics
from fleetloop.daemon.brokers.base import free_port
from fleetloop.daemon.brokers.tansu import TANSU_CAPABILITIES, EmbeddedTansu, tansu_binary, tansu_command
from fleetloop.schemas.topics import CHECKPOINT, DECISIONS
from tests.integration.test_restarts import Proc, _committed, _policy, _read, feeding
from tests.support.wait import wait_until

pytestmark = pytest.mark.system  # a broker restarted under a running daemon


class RestartableTansu(EmbeddedTansu):
    """Tansu that comes back on the same port after a stop (with nothing in it, as always)."""

    def __init__(self) -> None:
        super().__init__()
        self.fixed_port = free_port()

    def _prepare(self, workdir: Path) -> tuple[int, list[str]]:
        return self.fixed_port, tansu_command(tansu_binary(), self.fixed_port, self._host)


class _Env:
    def __init__(self, bootstrap: str, prefix: str) -> None:
        self.bootstrap_servers = bootstrap
        self.prefix = prefix

        class _B:
            capabilities = TANSU_CAPABILITIES

        self.broker = _B()

    def topic(self, logical: str) -> str:
        from fleetloop.schemas.topics import topic_name

        return topic_name(self.prefix, logical)

    def group(self, name: str) -> str:
        return f"{self.prefix}.{name}"


async def test_a_restarted_empty_tansu_is_detected_and_the_daemon_starts_clean(tmp_path: Path) -> None:
    broker = RestartableTansu()
    await asyncio.to_thread(broker.start)
    try:
        env = _Env(broker.bootstrap_servers, "emptied")
        await ensure_topics(env.bootstrap_servers, env.prefix)
        policy_path, _ = _policy(tmp_path)
        log = tmp_path / "daemon.log"
        proc = Proc(env, policy_path, log)
        try:
            async with feeding(env):
                await proc.assigned()

                async def checkpointed_and_committed() -> bool:
                    committed = await _committed(env)
                    return all(committed.values()) and bool((await _read(env, CHECKPOINT)).get(0))

                await wait_until(
                    checkpointed_and_committed, 60, "commits on every partition and a checkpoint"
                )
            await asyncio.to_thread(broker.stop)
            await asyncio.to_thread(broker.start)  # empty, same port
            await ensure_topics(env.bootstrap_servers, env.prefix)  # the operator re-creates topics
            async with feeding(env):

                async def decided_again() -> bool:
                    assert proc.p.poll() is None, log.read_text()[-3000:]
                    return len((await _read(env, DECISIONS)).get(0, [])) > 50

                await wait_until(decided_again, 90, "50 decisions after the restart", interval_s=1)
            text = log.read_text()
            lines = [line for line in text.splitlines() if "starting clean" in line]
            assert lines, text[-3000:]
            assert '"partitions": [' in lines[0]  # one line names every partition it concerns
            assert proc.p.poll() is None, "the daemon must not crash on an emptied broker"
        finally:
            if proc.p.poll() is None:
                proc.p.send_signal(signal.SIGTERM)
                await proc.wait(60)
    finally:
        await asyncio.to_thread(broker.stop)
