"""The emulated fleet over the wire, on both brokers.

- ``fleetloop scrape --runtime vllm`` reads emulated nodes over loopback HTTP and their
  NodeTelemetry reaches the broker with what the nodes served;
- ``fleetloop demo --wire-telemetry-only``: Tansu/Kafka, ``fleetloop run``, ``fleetloop fleet`` and
  ``fleetloop scrape`` as separate processes, agents publishing no outcomes: the degraded GPU's
  breaker opens from scraped vLLM metrics alone.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

import openai
import pytest
from fleetloop.edges.fleet.live import LiveFleet
from fleetloop.schemas.telemetry import NodeTelemetry
from tests.edges.test_fleet_http import one_node
from tests.support.kafka import read_all


async def test_scrape_reads_emulated_nodes_onto_the_broker(kafka_env: Any) -> None:
    s = one_node()
    s = s.model_copy(update={"pools": [s.pools[0].model_copy(update={"nodes": 2})]})
    fleet = LiveFleet(s, seed=3)
    await fleet.start()
    try:
        targets = ",".join(f"{nid}={url}" for nid, url in fleet.urls().items())
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fleetloop.cli.main", "scrape", "--runtime", "vllm", "--pool", "p",
            "--target", targets, "--bootstrap-servers", kafka_env.bootstrap_servers,
            "--topic-prefix", kafka_env.prefix, "--interval-s", "0.5", "--duration-s", "120", "--json",
            "--gpu-type", "L40S",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(60):  # past every node's baseline scrape
            while min(ln.scrapes for ln in fleet.live.values()) < 2:
                await asyncio.sleep(0.05)
        for nid, url in fleet.urls().items():
            api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            n = 3 if nid == "p/0" else 1
            for _ in range(n):
                await api.chat.completions.create(
                    model="llama-8b", messages=[{"role": "user", "content": "x"}], max_tokens=10
                )

        def completed(rs: list[Any]) -> int:
            return sum(NodeTelemetry.model_validate_json(r.value).requests_completed for r in rs)

        recs = await read_all(kafka_env, "fleet.telemetry", until=lambda rs: completed(rs) >= 4, timeout_s=45)
        proc.send_signal(signal.SIGTERM)  # the scraper stops cleanly and prints its report
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    finally:
        await fleet.stop()
    assert proc.returncode == 0, err.decode()
    report = json.loads(out)
    assert all(t["release"] == "0.33.0 (V1)" for t in report["targets"])
    tel = [NodeTelemetry.model_validate_json(r.value) for r in recs]
    assert report["targets"][0]["published"] > 0, report
    done = {nid: sum(t.requests_completed for t in tel if t.node_id == nid) for nid in ("p/0", "p/1")}
    assert done == {"p/0": 3, "p/1": 1}
    assert sum(t.output_tokens for t in tel) == 40
    assert all(t.model == "llama-8b" and t.pool_id == "p" for t in tel)
    assert any(t.ttft_p50_ms is not None for t in tel)


@pytest.mark.system  # the whole wire demo
async def test_wire_demo_breaker_opens_from_scraped_metrics_alone(kafka_env: Any) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fleetloop.cli.main", "demo", "--wire-telemetry-only", "--seconds", "45",
        "--bootstrap-servers", kafka_env.bootstrap_servers, "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 280)
    assert proc.returncode == 0, err.decode()[-2000:]
    r = json.loads(out)
    assert r["telemetry_only"] is True
    opened = {o["node_id"]: o for o in r["breaker_opens"]}
    assert "chat-l40s/2" in opened, f"no breaker opened for the degraded node: {r}"
    o = opened["chat-l40s/2"]
    assert o["reason"] == "latency-outlier"  # the reason it opened, though the cap may have held it back
    assert o["held_back_by"] in (None, "capacity-cap", "max-ejected-cap")
    assert o["after_degrade_s"] is not None
    assert o["after_degrade_s"] > 0
    assert r["fleet"]["tasks"]["succeeded"] > 0
    assert sum(t["published"] for t in r["scrape"]) > 0
