"""Routers that report calls without their output tokens (vllm-router, SGLang's router and HAProxy,
read from their logs and counters) must not cost tasks: the model then takes a pool's output rate
from its nodes' own counts (``PoolView.output_from_nodes``), which the autoscaler's TBT reading and
demand read. In the simulator (scenarios' own seeds), with every outcome's output tokens
stripped, prefix-heavy-copilot keeps its tasks: 837 against 834 with them. Without the nodes' counts
it kept 752, and cascade-degraded-gpu 6,788 of 7,980 (7,966 with them; ``docs/decisions/slo-predictive.md``,
"Shipped: output tokens from the nodes when outcomes carry none")."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from fleetloop.policies.registry import load_policy
from fleetloop.sim import fleet, runner
from fleetloop.sim.scenario import load_scenario
from fleetloop.sim.table import DEFAULT_POLICY

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
# the module (the package re-exports its function under the same name)
snapshot_module = importlib.import_module("fleetloop.core.model.snapshot")
SCENARIO = ROOT / "scenarios" / "prefix-heavy-copilot.yaml"


def _strip_output_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request outcome the simulated routers publish, with ``output_tokens`` 0 (telemetry as is)."""
    twin, wire = fleet.twin_record, fleet.RequestOutcome

    def twin_record(cls: Any, accepts: Any, rec: dict[str, Any]) -> Any:
        return twin(cls, accepts, {**rec, "output_tokens": 0} if cls is fleet.OUTCOME_TWIN else rec)

    monkeypatch.setattr(fleet, "twin_record", twin_record)
    monkeypatch.setattr(fleet, "RequestOutcome", lambda **rec: wire(**{**rec, "output_tokens": 0}))


def _tasks() -> int:
    result = runner.run(load_scenario(SCENARIO), load_policy(Path(DEFAULT_POLICY)))
    return int(result.to_json()["tasks"]["succeeded"])


def test_outcomes_without_output_tokens_keep_the_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    with_tokens = _tasks()
    read: list[bool] = []
    views = snapshot_module._pool_views

    def pool_views(*args: Any, **kwargs: Any) -> Any:
        out = views(*args, **kwargs)
        read.extend(v.output_from_nodes for v in out.values() if v.ok_w)
        return out

    monkeypatch.setattr(snapshot_module, "_pool_views", pool_views)
    _strip_output_tokens(monkeypatch)
    without = _tasks()
    assert read
    assert all(read)  # every pool with ok calls read its nodes' counts
    assert without >= with_tokens - 5, (without, with_tokens)
