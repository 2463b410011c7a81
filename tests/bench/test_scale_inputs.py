"""The fleet-scale scenario's shape, the benches' argument checks, and the daemon's GC setting."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from fleetloop.cli.main import main
from fleetloop.daemon.runtime import tune_gc
from fleetloop.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_fleet_scenario_has_1000_nodes_in_30_pools_of_several_gpus_and_regions() -> None:
    sc = load_scenario(ROOT / "scenarios" / "fleet" / "fleet-1024.yaml")
    assert sum(p.nodes for p in sc.pools) >= 1000
    assert len(sc.pools) >= 30
    assert len({p.gpu for p in sc.pools}) >= 4
    assert len({p.id.split("-")[0] + "-" + p.id.split("-")[1] for p in sc.pools}) >= 4  # regions
    assert {p.model for p in sc.pools} == {"llama-8b", "llama-70b"}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["bench", "ingest", "--events", "10"], "--events"),
        (["bench", "ingest", "--nodes", "3"], "--nodes"),
        (["bench", "latency", "--trials", "0"], "--trials"),
        (["bench", "latency", "--nodes", "1"], "--nodes"),
        (["bench", "decide", "--nodes", "5"], "--nodes"),
    ],
)
def test_benches_refuse_bad_arguments_in_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert needle in err
    assert "Traceback" not in err


def test_tune_gc_raises_the_young_threshold_and_keeps_the_others() -> None:
    before = gc.get_threshold()
    try:
        tune_gc(123_456)
        assert gc.get_threshold() == (123_456, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
