"""``fleetloop demo`` end to end on each real broker: the loop closes and the breaker acts."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.system  # the whole demo, a minute and more per broker


def test_demo_closes_the_loop_and_opens_the_degraded_nodes_breaker(kafka_env: Any) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetloop.cli.main",
            "demo",
            "--seconds",
            "25",
            "--json",
            "--bootstrap-servers",
            kafka_env.bootstrap_servers,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"--json prints exactly one JSON object on stdout, got: {proc.stdout[:500]!r}"
    result = json.loads(lines[0])
    assert result["tasks"]["succeeded"] > 0
    assert result["tasks"]["started"] == result["tasks"]["succeeded"] + result["tasks"]["failed"]
    assert result["breaker_opens"] >= 1
    assert result["degraded_node"] in result["breaker_opened_nodes"]
    assert result["deadletter"] == 1  # the one malformed record the demo injects
    assert result["decisions_published"] > 0
    assert result["cost"]["total_usd"] > 0
    assert result["cost"]["per_successful_task_usd"] > 0
    assert result["latency"]["ttft_p99_ms"] >= result["latency"]["ttft_p50_ms"] > 0
    assert result["broker"]["bootstrap_servers"] == kafka_env.bootstrap_servers
    # While it ran, the demo served its live page and said where (stderr), and names it in --json.
    url = result["live_page"]
    assert url.startswith("http://127.0.0.1:")
    assert url.endswith("/")
    assert f"live page: {url}" in proc.stderr
