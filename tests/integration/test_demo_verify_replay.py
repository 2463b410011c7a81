"""``fleetloop demo --verify-replay`` on the embedded broker it starts itself: a policy change
halfway, then a replay of the demo's own window with 0 differences."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.system  # the whole demo with a policy change and a replay


def test_demo_verify_replay_applies_a_change_midway_and_replays_its_window_with_0_differences() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fleetloop.cli.main", "demo", "--seconds", "12", "--verify-replay"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    out = proc.stdout
    m = re.search(r"^replay: (\d+) decisions, (\d+) differ$", out, re.M)
    assert m, out
    assert int(m[2]) == 0
    published = re.search(r"decisions published\s*│\s*(\d+)", out)
    assert published, out
    assert int(m[1]) == int(published[1]) > 100
    # The window spans the change: ticks decided under both versions were replayed.
    assert re.search(r"policy change \(--verify-replay\)\s*│\s*v\d+ \([0-9a-f]{16}\) from tick \d+", out), out
    per_policy = re.search(r"ticks replayed, per policy\s*│\s*(\d+) \((\d+), (\d+)\)", out)
    assert per_policy, out
    assert int(per_policy[2]) > 0
    assert int(per_policy[3]) > 0
    assert int(per_policy[2]) + int(per_policy[3]) == int(per_policy[1])
    assert "applied default v" in proc.stderr
    assert "tansu (embedded)" in out
