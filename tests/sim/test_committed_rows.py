"""A few short rows of the committed tables come out of the simulator again, field for field.

The suites are judged on ``bench/results/sim-stress.json`` and ``sim-shipped.json`` (and the other
tables there); a change meant to leave the simulator's behaviour alone must not move a single
figure. These rows (~40 CPU-s together) are the quick check; a change that moves them on purpose
makes the tables again (``fleetloop bench results``, bench/README.md) and says what moved. Only the
wall time and the speed-up derived from it may differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from fleetloop.sim.table import DEFAULT_POLICY, run_one

pytestmark = pytest.mark.system  # simulator runs against the committed tables

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
SPECS = {
    "none": "baseline:none",
    "classic": "baseline:classic",
    "default": str(DEFAULT_POLICY),
}
VARY = {"wall_s", "speedup"}  # the only fields a run on another machine (or another day) changes

ROWS = [
    ("sim-shipped.json", "scenarios/host-loss-mid-decode.yaml", "default", 5),
    ("sim-shipped.json", "scenarios/host-loss-mid-decode.yaml", "classic", 5),
    ("sim-table.json", "scenarios/host-loss-mid-decode.yaml", "none", 5),
    ("sim-stress.json", "scenarios/stress/long-prompt-light-load.yaml", "default", 19),
    # the router's model spill and the preferred pool's diverted demand (default), which no
    # baseline reads (classic)
    ("sim-shipped.json", "scenarios/burst-cold-nodes.yaml", "default", 12),
    ("sim-shipped.json", "scenarios/burst-cold-nodes.yaml", "classic", 12),
]


def _committed(results: str, scenario: str, policy: str, seed: int) -> dict[str, Any]:
    rows = orjson.loads((RESULTS / results).read_bytes())["rows"]
    found = [r for r in rows if r["scenario"] == scenario and r["policy"] == policy and r["seed"] == seed]
    assert len(found) == 1, (results, scenario, policy, seed)
    row: dict[str, Any] = found[0]
    return row


@pytest.mark.parametrize(("results", "path", "policy", "seed"), ROWS)
def test_a_committed_row_comes_out_the_same(results: str, path: str, policy: str, seed: int) -> None:
    scenario = Path(path).stem
    want = _committed(results, scenario, policy, seed)
    got = run_one((str(ROOT / path), policy, SPECS[policy], seed))
    assert got["scenario_sha"] == want["scenario_sha"], "the scenario file changed: regenerate its rows"
    assert set(got) == set(want)
    diff = {k: (want[k], got[k]) for k in want if k not in VARY and got[k] != want[k]}
    assert not diff, diff
