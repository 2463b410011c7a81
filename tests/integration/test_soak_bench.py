"""``fleetloop bench soak`` in CI's short form, on both brokers: the daemon's ingest capacity is
measured, then it is offered twice that; ticks are decided in every sample, none fails, the backlog
drains once the overload stops, and RSS stays under a fixed ceiling (its growth verdict needs the
long soak: see the test)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from fleetloop.daemon.brokers import ProcessBroker

pytestmark = pytest.mark.system  # a benchmark (soak)

RSS_CEILING_MIB = 1024.0  # the memory budget for a whole 10k-node fleet with 1M open workflows


async def test_soak_short_form_at_twice_the_measured_capacity(broker: ProcessBroker) -> None:
    argv = [
        sys.executable,
        "-m",
        "fleetloop.cli.main",
        "bench",
        "soak",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--minutes",
        "0.4",
        "--calibrate-s",
        "8",
        "--sample-s",
        "5",
        "--json",
    ]
    done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=420)
    assert done.returncode in (0, 1), done.stderr.decode()[-2000:]
    r: dict[str, Any] = json.loads(done.stdout)
    progress = done.stderr.decode()[-3000:]
    assert r["crashed"] is None, progress
    capacity = r["capacity"]["events_per_s"]
    assert capacity > 0, progress
    assert r["offered_events_per_s"] >= 2 * capacity - 1, r  # the overload asked for twice the capacity
    assert len(r["samples"]) >= 3, progress
    assert r["bounded"]["ticks"], (r["samples_without_a_decided_tick"], r["ticks_failed"])
    assert r["bounded"]["lag"], (r["max_lag"], r["final_lag"], r["drain_s"])
    # RSS: 24 s of overload is warm-up. Open workflows are let go only past a handoff horizon each
    # shard learns from 1,000 call gaps (120 s until then, 10 s at the least), so here the ledger is
    # still filling; on an idle machine, where the measured capacity and so the offered rate are
    # highest, the second half grew +62 MiB against a ~56 MiB limit. The growth verdict belongs to
    # the long soak (`fleetloop bench soak --minutes 3`: second half -12.4 MiB,
    # bench/results/soak-3m-tansu.json). Here a gross leak still fails, under a fixed ceiling.
    assert r["rss_mib"]["max"] < RSS_CEILING_MIB, r["rss_mib"]
    failed = sorted(k for k, v in r["bounded"].items() if isinstance(v, bool) and not v)
    assert failed in ([], ["rss"]), failed
    assert done.returncode == (1 if failed else 0), progress
    print(
        f"soak on {r['broker']}: capacity {capacity:,}/s ({r['capacity']['bound']}-bound), offered "
        f"{r['offered_events_per_s']:,}/s, max lag {r['max_lag']:,}, drained in {r['drain_s']} s, "
        f"RSS {r['rss_mib']['first']} -> {r['rss_mib']['last']} MiB"
    )
