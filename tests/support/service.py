"""Run ``fleetloop run`` as a real child process and talk to its HTTP face."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

FLEETLOOP = str(Path(sys.executable).with_name("fleetloop"))


class RunningService:
    def __init__(self, proc: subprocess.Popen[str], port: int, stderr_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.stderr_path = stderr_path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def get(self, path: str) -> httpx.Response:
        async with httpx.AsyncClient(timeout=5.0) as client:
            return await client.get(self.url + path)

    async def wait_status(self, path: str, status: int, timeout_s: float = 90.0) -> httpx.Response:
        last: Any = None
        async with asyncio.timeout(timeout_s):
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"fleetloop run exited {self.proc.returncode}: {self.stderr()[-2000:]}"
                    )
                with contextlib.suppress(httpx.TransportError):
                    last = await self.get(path)
                    if last.status_code == status:
                        return last
                await asyncio.sleep(0.2)
        raise AssertionError(f"{path} never answered {status}; last: {last}")  # pragma: no cover

    async def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        text = (await self.get("/metrics")).text
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        return out

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")


def broker_args(kafka_env: Any, group: str, *extra: str) -> list[str]:
    """``fleetloop run`` flags for the test's broker, topic prefix and a consumer group of its own."""
    return [
        "--bootstrap-servers",
        kafka_env.bootstrap_servers,
        "--topic-prefix",
        kafka_env.prefix,
        "--group-id",
        kafka_env.group(group),
        *extra,
    ]


@contextlib.asynccontextmanager
async def fleetloop_run(
    args: Sequence[str], tmp_path: Path, *, port: int, env: Mapping[str, str] | None = None
) -> AsyncIterator[RunningService]:
    """``fleetloop run ARGS --http-port PORT``; SIGTERM and wait at the end (kills after 30 s).

    The event-time window is off unless ARGS set it: the tests' records carry synthetic event
    times (seconds after epoch 0), far outside any window around the broker's timestamps."""
    if not any(a.startswith("--event-time-window") for a in args):  # also "--event-time-window=..."
        args = [*args, "--event-time-window", "off"]
    err = tmp_path / f"fleetloop-run-{port}.stderr"
    with err.open("w", encoding="utf-8") as f:
        proc = subprocess.Popen(
            [FLEETLOOP, "run", *args, "--http-port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=f,
            text=True,
            env={**os.environ, **(env or {})},
        )
    service = RunningService(proc, port, err)
    try:
        yield service
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def total(samples: Mapping[str, list[tuple[dict[str, str], float]]], metric: str, **labels: str) -> float:
    return sum(v for lbl, v in samples.get(metric, []) if all(lbl.get(k) == x for k, x in labels.items()))


# What the daemon exports on /metrics (test_service checks each is there; the Grafana dashboard
# may query only these: tests/unit/test_deploy.py).
EXPORTED_METRICS = frozenset(
    {
        "fleetloop_events_consumed_total",
        "fleetloop_dead_letters_total",
        "fleetloop_decisions_total",
        "fleetloop_ticks_total",
        "fleetloop_tick_duration_seconds_bucket",
        "fleetloop_tick_duration_seconds_count",
        "fleetloop_tick_duration_seconds_sum",
        "fleetloop_consumer_lag",
        "fleetloop_policy_info",
        "fleetloop_broker_connected",
        "fleetloop_ready",
        "fleetloop_model_pools",
        "fleetloop_model_nodes",
        "fleetloop_model_open_workflows",
        "fleetloop_log_lines_dropped_total",
        "fleetloop_log_lines_suppressed_total",
        "fleetloop_broker_errors_total",
    }
)
