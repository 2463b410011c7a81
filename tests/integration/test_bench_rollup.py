"""``fleetloop bench rollup``'s measurement on each real broker, small: every boundary's shard
summaries become one complete fleet figure on control.state, and the latency is reported."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.bench.rollup import measure

pytestmark = pytest.mark.system  # a benchmark


async def test_every_boundary_becomes_a_complete_fleet_figure_and_its_latency_is_measured(
    kafka_env: Any,
) -> None:
    r = await measure(kafka_env.bootstrap_servers, kafka_env.prefix, shards=3, boundaries=5, interval_ms=100)
    assert r["published"] == 5
    assert r["complete"] == 5
    assert r["malformed"] == 0
    assert r["latency_p50_ms"] is not None
    assert 0 <= r["latency_p50_ms"] <= r["latency_p99_ms"] <= r["latency_max_ms"] < 5_000
