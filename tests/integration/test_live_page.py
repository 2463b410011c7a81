"""The live page on ``/`` in headless Chromium (Debian's ``chromium``, installed by .ci/run), both brokers.

``fleetloop run --http-port`` decides on records fed through the broker; Chromium loads ``/``, runs
its script against ``/api/state`` and the test reads the rendered DOM: nodes with weights, breaker
states, shed thresholds, autoscale targets, recent decisions with reasons, the KPI figures. A
screenshot is kept under ``artifacts/`` (``live-page-<broker>.png``).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fleetloop.daemon.brokers import free_port
from fleetloop.schemas.topics import REQUESTS, TELEMETRY, TICKS
from tests.support.kafka import producer, send
from tests.support.policies import FOUNDATION_YAML
from tests.support.records import outcome, telemetry, tick
from tests.support.service import broker_args, fleetloop_run, total
from tests.support.tools import require_tool

pytestmark = pytest.mark.system  # headless Chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
NODES = ("p/0", "p/1", "p/2")


def _headless(chromium: str, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1280,1000",
        "--virtual-time-budget=4000",
        *extra,
        url,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


async def test_live_page_shows_what_the_daemon_decides(kafka_env: Any, tmp_path: Path) -> None:
    chromium = require_tool("chromium")
    args = broker_args(
        kafka_env,
        "live",
        "--policy",
        str(FOUNDATION_YAML),
        "--no-ticker",
    )
    async with fleetloop_run(args, tmp_path, port=free_port()) as svc:
        await svc.wait_status("/readyz", 200)
        async with producer(kafka_env) as p:
            for k in (1, 2, 3):
                await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=k * 1000) for n in NODES])
                await send(
                    p,
                    kafka_env,
                    REQUESTS,
                    [
                        outcome(n, "ok", ts_ms=k * 1000 + 100, n=10 * k + i, task_outcome="succeeded")
                        for i, n in enumerate(NODES)
                    ],
                )
                await send(p, kafka_env, TICKS, [tick(k)])
        async with asyncio.timeout(60):
            while total(await svc.metrics(), "fleetloop_ticks_total", outcome="decided") < 3:
                await asyncio.sleep(0.3)
        state = (await svc.get("/api/state")).json()
        dom = await asyncio.to_thread(_headless, chromium, svc.url + "/", "--dump-dom")
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / f"live-page-{kafka_env.broker.kind}.png"
        shot.unlink(missing_ok=True)
        taken = await asyncio.to_thread(_headless, chromium, svc.url + "/", f"--screenshot={shot}")
    assert state["routing"]
    assert sorted(state["routing"][0]["weights"]) == list(NODES)
    assert state["kpi"], "one KPI sample per decided tick"
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-loaded="1"' in html, "the page's script did not render /api/state"
    assert "policy foundation v1" in html
    for node in NODES:
        assert f"<td>{node}</td>" in html
    routing = html[html.index('id="routing"') : html.index('id="breakers"')]
    assert len(re.findall(r"<td>p/\d</td>", routing)) == 3
    assert "least-queue" in routing  # the reason of each weight
    recent = html[html.index('id="recent"') :]
    assert recent.count("<tr>") >= 2  # header + decisions, each with its reason
    assert "cost per successful task" in html
    assert re.search(r'id="cpst">\$\d+\.\d{4}<', html), "cost per successful task not rendered"
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.is_file()
    assert shot.stat().st_size > 10_000
