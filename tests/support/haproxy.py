"""Real HAProxy for the tests that drive it (Debian's package, through ``require_tool``): the config
of a frontend over the three-server ``chat`` backend, the backend map that names those servers to
``fleetloop actuate haproxy``, HAProxy itself running until the test is done, and the actuator on it."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fleetloop.edges.actuate.haproxy.logs import HAPROXY_FRONTEND_SNIPPET
from fleetloop.edges.actuate.haproxy.runtime_api import RuntimeApi
from tests.support import actuators
from tests.support.tools import require_tool
from tests.support.wait import wait_until

SOCKET = "admin.sock"  # the runtime API's socket, in the test's tmp directory
START_TIMEOUT_S = 10.0  # HAProxy opens its socket in milliseconds; this is a loaded machine's bound


def haproxy_config(tmp: Path, fe_port: int, log_port: int, ports: list[int]) -> str:
    """A frontend on ``fe_port`` over backend ``chat`` (its three servers on ``ports``, weight 100,
    round robin), the request log sent to UDP ``log_port``, the runtime API at ``tmp/admin.sock``."""
    return f"""
global
    stats socket {tmp}/{SOCKET} mode 600 level admin
    log 127.0.0.1:{log_port} len 4096 local0
defaults
    mode http
    log global
    timeout connect 1s
    timeout client 10s
    timeout server 10s
    timeout queue 2s
frontend fe
    bind 127.0.0.1:{fe_port}
{HAPROXY_FRONTEND_SNIPPET}
    default_backend chat
backend chat
    balance roundrobin
    server s0 127.0.0.1:{ports[0]} weight 100
    server s1 127.0.0.1:{ports[1]} weight 100
    server s2 127.0.0.1:{ports[2]} weight 100
"""


def chat_backend_map(tmp: Path) -> Path:
    """``tmp/backends.yaml``: pool ``chat`` (llama-8b) is backend ``chat``, node chat/i server si."""
    path = tmp / "backends.yaml"
    path.write_text(
        "pools:\n  chat:\n    backend: chat\n    model: llama-8b\n"
        "    servers: {chat/0: s0, chat/1: s1, chat/2: s2}\n"
    )
    return path


@contextlib.asynccontextmanager
async def running_haproxy(tmp: Path, config: str) -> AsyncIterator[RuntimeApi]:
    """HAProxy on ``config`` (written to ``tmp/haproxy.cfg``; its runtime API socket must be
    ``tmp/admin.sock``), yielded as its runtime API once the socket is there; stopped after. A config
    HAProxy refuses fails the test at once, not at the first command on a missing socket."""
    require_tool("haproxy")
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(config)
    sock = tmp / SOCKET
    hap = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stderr=subprocess.DEVNULL)
    try:
        await wait_until(
            lambda: sock.exists() or hap.poll() is not None, START_TIMEOUT_S, "HAProxy's runtime API socket"
        )
        assert hap.poll() is None, f"haproxy exited {hap.returncode} on {cfg}"
        yield RuntimeApi(f"unix:{sock}")
    finally:
        hap.terminate()
        hap.wait(10)


def start_actuator(
    tmp: Path, bmap: Path, kafka_env: Any, log: Path, *extra: str, log_port: int | None = None
) -> subprocess.Popen[bytes]:
    """``fleetloop actuate haproxy`` on the runtime API in ``tmp`` and the backend map ``bmap``, with
    ``extra`` flags; HAProxy's log read on UDP ``log_port`` (as outcomes) when one is given. Its own
    log lines go to ``log``."""
    listen = ["--log-listen", f"127.0.0.1:{log_port}"] if log_port is not None else []
    return actuators.start_actuator(
        "haproxy", kafka_env, log, "--runtime-api", f"unix:{tmp}/{SOCKET}", "--backend-map", str(bmap),
        *listen, *extra,
    )  # fmt: skip
