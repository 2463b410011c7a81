"""``fleetloop actuate haproxy`` leaves real HAProxy plain when it stops: a dead actuator must not
leave servers in maint or drain, at uneven weights or with a maxconn that nothing will ever undo.

Real HAProxy with three live backends, a real broker, the actuator as a subprocess. The desired
state puts one server in maint (not a member), one in drain (autoscale) at half weight, and a
maxconn on all; the actuator applies it; then SIGTERM. Without a flag every mapped server is back
ready at the plain weight with no maxconn, and the log says what was restored; with
``--keep-state-on-exit`` HAProxy stays as last reconciled.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fleetloop.edges.actuate.haproxy.mapping import Observed, parse_servers_state, parse_stat_maxconn
from fleetloop.edges.actuate.haproxy.runtime_api import RuntimeApi
from fleetloop.schemas.decisions import AdmissionDecision, AutoscaleDecision
from fleetloop.schemas.topics import STATE
from tests.integration.test_haproxy import _decision, backends, routing
from tests.support.haproxy import chat_backend_map, haproxy_config, running_haproxy, start_actuator
from tests.support.http import free_port
from tests.support.kafka import producer
from tests.support.wait import wait_until

SERVERS = ("s0", "s1", "s2")


async def _servers(api: RuntimeApi) -> dict[str, Observed]:
    seen = parse_servers_state(await api.run(["show servers state chat"]))
    limits = parse_stat_maxconn(await api.run(["show stat"]))
    return {
        s: Observed(seen[("chat", s)].admin, seen[("chat", s)].weight, limits[("chat", s)]) for s in SERVERS
    }


@pytest.mark.parametrize("keep", [False, True], ids=["restore", "keep-state-on-exit"])
async def test_sigterm_puts_haproxy_back_to_plain_load_balancing(
    kafka_env: Any, tmp_path: Path, keep: bool
) -> None:
    fe_port, log_port = free_port(), free_port(socket.SOCK_DGRAM)
    bmap = chat_backend_map(tmp_path)
    log_path = tmp_path / "actuator.log"
    async with (
        backends(3) as ports,
        producer(kafka_env) as prod,
        running_haproxy(tmp_path, haproxy_config(tmp_path, fe_port, log_port, ports)) as api,
    ):
        act: subprocess.Popen[bytes] | None = None
        try:
            plain = await _servers(api)
            assert plain == dict.fromkeys(SERVERS, Observed("ready", 100, 0))
            bodies = [
                routing({"chat/0": 1.0, "chat/1": 0.5}),  # chat/2 not a member: maint
                AutoscaleDecision(
                    entity="pool/chat", reason="r", pool_id="chat", current_nodes=2, desired_nodes=1,
                    drain=("chat/1",),
                ),
                AdmissionDecision(
                    entity="pool/chat", reason="r", pool_id="chat", max_queue_depth={},
                    max_outstanding={"0": 5, "1": 5},
                ),
            ]  # fmt: skip
            for b in bodies:
                key, value = _decision(b, 1)
                await prod.send(kafka_env.topic(STATE), key=key, value=value)
            await prod.flush()
            act = start_actuator(
                tmp_path, bmap, kafka_env, log_path, *(["--keep-state-on-exit"] if keep else [])
            )
            steered = {
                "s0": Observed("ready", 256, 5),
                "s1": Observed("drain", 128, 5),
                "s2": Observed("maint", 100, 0),
            }

            async def applied() -> bool:
                return await _servers(api) == steered

            await wait_until(applied, 60, "the desired state applied")
            act.send_signal(signal.SIGTERM)
            act.wait(30)
            log = log_path.read_text()
            assert act.returncode == 0, log[-2000:]
            after = await _servers(api)
            if keep:
                assert after == steered
                assert "exit: last state kept" in log
                assert "restore:" not in log
            else:
                assert after == plain, log[-2000:]
                assert "restore: chat/s2 admin maint -> ready" in log
                assert "restore: chat/s1 admin drain -> ready" in log
                assert "restore: chat/s0 maxconn 5 -> 0" in log
                assert "exit: plain state restored (6 change(s))" in log
        finally:
            if act is not None and act.poll() is None:
                act.kill()
                act.wait(10)
