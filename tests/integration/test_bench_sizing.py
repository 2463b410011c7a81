"""``fleetloop bench sizing``'s run on each real broker, small and short: one daemon in real time,
every tick of the window decided (after the load stops at the latest), its cost per fleet-second
measured. The real-time verdict is not asserted: it is the machine's as much as the daemon's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from fleetloop.bench.sizing import _run

pytestmark = pytest.mark.system  # a benchmark


async def test_one_daemon_decides_every_tick_of_the_window_and_reports_its_cost(
    kafka_env: Any, tmp_path: Path
) -> None:
    # Every boundary decided is what this test holds, so the overload rule is off (a loaded CI machine
    # would otherwise skip boundaries, as it should in production).
    args = argparse.Namespace(nodes=120, seconds=6.0, outcomes_per_node=2.0, overload_max_ticks=0)
    r = await _run(kafka_env.bootstrap_servers, kafka_env.prefix, args, str(tmp_path / "daemon.log"))
    assert r["tick_ids_are_boundaries"]
    assert r["ticks_expected"] == r["pools"] * r["boundaries"] > 0
    assert r["ticks_decided"] == r["ticks_expected"], (tmp_path / "daemon.log").read_text()[-2000:]
    assert r["ticks_skipped"] == 0
    assert r["caught_up_after_s"] is not None
    assert r["cpu_s_per_fleet_s"] > 0
    assert r["events_per_s"] > 0
    assert r["lag_p99_ms"] is not None
