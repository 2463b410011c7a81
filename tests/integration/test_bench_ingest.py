"""``fleetloop bench ingest``'s measurement on each real broker, small: the floor and the daemon read
every produced record, the daemon folds them all (none dead-lettered), and both report rates."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop import clock
from fleetloop.bench.ingest import _rates, _records, measure_on

pytestmark = pytest.mark.system  # a benchmark


async def test_floor_and_daemon_read_every_record_and_fold_them_all(kafka_env: Any) -> None:
    records = _records(3_000, 100, clock.wall_ms())
    row = await measure_on(
        kafka_env.bootstrap_servers,
        kafka_env.prefix,
        records,
        idempotence=kafka_env.broker.capabilities.idempotent_producer,
        label=kafka_env.broker.kind,
    )
    floor, ours = _rates(row["floor"]), _rates(row["fleetloop"])
    assert floor["events"] == 3_000
    assert ours["dead_letters"] == 0
    assert ours["telemetry"] + ours["outcomes"] == 3_000  # every record decoded
    assert ours["folded"] == 3_000  # and folded into a shard's model
    assert ours["fold_errors"] == 0
    assert floor["events_per_cpu_s"] > 0
    assert ours["events_per_cpu_s"] > 0
