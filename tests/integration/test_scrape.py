"""``fleetloop scrape`` against real HTTP endpoints and a real broker (both brokers).

One target serves a vLLM 0.33 engine's pages (the fixtures: baseline, +1 s, restarted), one serves
an HTML error page, one a node_exporter-style page (good exposition, no vLLM metric), one is a closed
port. The good node's records reach ``fleet.telemetry`` keyed by the pool; the others only count
failures and go stale, without stopping the good one (the node_exporter one is no idle vLLM node).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aiohttp import web
from fleetloop.daemon.brokers import free_port
from fleetloop.schemas.telemetry import NodeTelemetry
from tests.support.kafka import read_all

FIXTURES = Path(__file__).resolve().parents[1] / "edges" / "fixtures"
NODE_EXPORTER = (
    "# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.42\n"
    "# HELP process_start_time_seconds Start time.\n# TYPE process_start_time_seconds gauge\n"
    "process_start_time_seconds 1.7e+09\n"
)


async def _serve(pages: list[str]) -> tuple[web.AppRunner, int]:
    served = {"n": 0}

    async def metrics(_: web.Request) -> web.Response:
        i = min(served["n"], len(pages) - 1)
        served["n"] += 1
        return web.Response(text=pages[i], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def test_scrape_publishes_good_targets_and_survives_bad_ones(kafka_env: Any) -> None:
    pages = [(FIXTURES / f"vllm-0.33.0.{n}.prom").read_text() for n in (1, 2, 3)]
    good, good_port = await _serve(pages)
    bad, bad_port = await _serve(["<html><body>502 Bad Gateway</body></html>\n"])
    other, other_port = await _serve([NODE_EXPORTER])
    dead_port = free_port()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fleetloop.cli.main", "scrape", "--runtime", "vllm",
            "--pool", "chat", "--bootstrap-servers", kafka_env.bootstrap_servers,
            "--topic-prefix", kafka_env.prefix, "--interval-s", "0.3", "--duration-s", "4",
            "--gpu-type", "L40S", "--usd-per-h", "1.5", "--json",
            "--target", f"chat/good=http://127.0.0.1:{good_port},chat/bad=127.0.0.1:{bad_port},"
            f"chat/dead=http://127.0.0.1:{dead_port}/metrics,chat/other=127.0.0.1:{other_port}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    finally:
        await good.cleanup()
        await bad.cleanup()
        await other.cleanup()
    assert proc.returncode == 0, err.decode()
    report = {t["node_id"]: t for t in json.loads(out)["targets"]}
    assert report["chat/good"]["up"] is True
    assert report["chat/good"]["release"] == "0.33.0 (V1)"
    assert report["chat/good"]["counter_resets"] > 0
    assert report["chat/bad"]["parse_errors"] > 0
    assert report["chat/bad"]["published"] == 0
    assert report["chat/dead"]["failures"] > 0
    assert report["chat/dead"]["published"] == 0
    assert report["chat/other"]["up"] is False
    assert report["chat/other"]["published"] == 0
    assert report["chat/other"]["release"] is None
    assert report["chat/other"]["last_error"] == (
        f"no vllm metrics at http://127.0.0.1:{other_port}/metrics (is this a vllm server?)"
    )
    assert "down chat/other" in err.decode()
    assert "down" in err.decode()

    recs = await read_all(kafka_env, "fleet.telemetry", until=lambda rs: len(rs) >= 2, timeout_s=30)
    assert {r.key for r in recs} == {b"chat"}
    tel = [NodeTelemetry.model_validate_json(r.value) for r in recs]
    assert {t.node_id for t in tel} == {"chat/good"}
    # scrape 1 is the baseline; 2 is one second of work; 3 the restarted engine's own counts
    assert tel[0].prompt_tokens == 1500
    assert tel[0].queue_depth == 2
    assert tel[0].gpu_type == "L40S"
    assert tel[0].cost_rate_usd_per_h == 1.5
    assert {t.engine for t in tel} == {"vllm"}  # the runtime it read, on the wire
    assert tel[1].prompt_tokens == 300
    assert all(t.prompt_tokens >= 0 for t in tel)
