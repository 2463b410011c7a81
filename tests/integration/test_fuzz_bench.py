"""``fleetloop bench fuzz`` in CI's short form, on both brokers: hostile records never stop the loop.

The run sends malformed bytes, wrong types, NaN and 1e308, 10**400, negatives, timestamps in
seconds, far past and far future, a flood of invented nodes and pools, an oversized record and
forged policies next to a real fleet, and compares the real pools' decisions with a clean run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from fleetloop.daemon.brokers import ProcessBroker

pytestmark = pytest.mark.system  # a benchmark (fuzz)


async def test_fuzz_short_form_no_crash_no_missed_tick_no_lost_dead_letter(broker: ProcessBroker) -> None:
    argv = [
        sys.executable,
        "-m",
        "fleetloop.cli.main",
        "bench",
        "fuzz",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--records",
        "1000",
        "--flood-nodes",
        "2500",
        "--flood-pools",
        "300",
        "--ticks",
        "6",
        "--json",
    ]
    done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=400)
    assert done.returncode in (0, 1), done.stderr.decode()[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["crashes"] == 0
    assert result["ticks"]["missed"] == 0
    assert result["ticks"]["failed"] == 0
    assert result["dead_letters"]["lost"] == 0
    assert result["dead_letters"]["total"] >= 1000  # every mixed hostile record was refused at the door
    assert result["policies"]["refused"] == result["policies"]["forged"] > 0
    decisions = result["decisions"]
    # Cache-aware spill-over ranks only pools serving the same model: invented pools that pass the
    # door no longer reach a real pool's decisions (the full-size run: 0 of 840 differ).
    assert decisions["differing"] == 0, decisions["first_difference"]
    # 2,500 node ids in one pool: those beyond the 2,048-node pool cap are dead-lettered, not dropped.
    assert result["dead_letters"]["by_reason"].get("capacity-nodes", 0) >= 2500 - 2048
