"""``fleetloop bench router`` prints figures, and the cache it measures pays off at pool sizes users run."""

from __future__ import annotations

import json

import pytest
from fleetloop.cli.main import main


def test_bench_router_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "router", "--nodes", "8,1000", "--seconds", "0.05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {(r["nodes"], r["picker"]): r for r in out["rows"]}
    assert set(rows) == {
        (n, p)
        for n in (8, 1000)
        for p in ("weighted-random", "round-robin", "least-request-p2c", "least-outstanding")
    }
    assert all(r["pick_us"] > 0 and r["uncached_pick_us"] > 0 for r in rows.values())
    # a ratio measured in the same run: sorting 1,000 nodes per call against a bisection
    assert rows[(1000, "weighted-random")]["speedup"] > 5


def test_bench_router_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "router", "--nodes", "1"]) == 2
    assert "--nodes" in capsys.readouterr().err
