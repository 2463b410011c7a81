"""Routers that report calls without their tokens must not cost tasks or money: vllm-router's and
SGLang's per-worker counters carry no tokens, HAProxy's log carries the prompt tokens of fleetloop's
header and no output tokens. The model then takes a pool's token rates from its nodes' own counts
(``PoolView.prompt_from_nodes``, ``output_from_nodes``), which the autoscaler's demand and TBT
reading read.

In the simulator, on the scenarios' own seeds (virtual time; ``docs/decisions/slo-predictive.md``,
"Shipped: token rates from the nodes when outcomes carry none"):
- prefix-heavy-copilot with the output tokens stripped (HAProxy's case) keeps its tasks: 837 against
  834 with them; with nothing read instead it kept 752;
- the stack bench's prefix-heavy scenario with every token stripped (the vllm-router arms' case)
  costs what it costs with them ($0.0527 per successful task, 88 tasks); with nothing read it cost
  $0.0764, 1.45x."""

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

NO_OUTPUT = {"output_tokens": 0}
NO_TOKENS = {"prompt_tokens": 0, "cached_prompt_tokens": 0, "output_tokens": 0}


def _strip(monkeypatch: pytest.MonkeyPatch, fields: dict[str, int]) -> None:
    """Every request outcome the simulated routers publish with ``fields`` set (telemetry as is)."""
    twin, wire = fleet.twin_record, fleet.RequestOutcome

    def twin_record(cls: Any, accepts: Any, rec: dict[str, Any]) -> Any:
        return twin(cls, accepts, {**rec, **fields} if cls is fleet.OUTCOME_TWIN else rec)

    monkeypatch.setattr(fleet, "twin_record", twin_record)
    monkeypatch.setattr(fleet, "RequestOutcome", lambda **rec: wire(**{**rec, **fields}))


def _watch(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """Each pool view with ok calls: (prompt read from the nodes, output read from the nodes)."""
    read: list[tuple[bool, bool]] = []
    views = snapshot_module._pool_views

    def pool_views(*args: Any, **kwargs: Any) -> Any:
        out = views(*args, **kwargs)
        read.extend((v.prompt_from_nodes, v.output_from_nodes) for v in out.values() if v.ok_w)
        return out

    monkeypatch.setattr(snapshot_module, "_pool_views", pool_views)
    return read


def _run(scenario: str) -> dict[str, Any]:
    result = runner.run(load_scenario(ROOT / "scenarios" / scenario), load_policy(Path(DEFAULT_POLICY)))
    return result.to_json()


def test_outcomes_without_output_tokens_keep_the_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    with_tokens = _run("prefix-heavy-copilot.yaml")["tasks"]["succeeded"]
    read = _watch(monkeypatch)
    _strip(monkeypatch, NO_OUTPUT)
    without = _run("prefix-heavy-copilot.yaml")["tasks"]["succeeded"]
    assert read
    assert set(read) == {(False, True)}  # the prompt from outcomes, the output from the nodes
    assert without >= with_tokens - 5, (without, with_tokens)


def test_outcomes_without_any_tokens_keep_the_tasks_and_the_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    with_tokens = _run("stack/prefix-heavy.yaml")
    read = _watch(monkeypatch)
    _strip(monkeypatch, NO_TOKENS)
    without = _run("stack/prefix-heavy.yaml")
    assert read
    assert set(read) == {(True, True)}
    assert without["tasks"]["succeeded"] >= with_tokens["tasks"]["succeeded"] - 1
    cost, base = (r["cost"]["per_successful_task_usd"] for r in (without, with_tokens))
    assert cost <= 1.05 * base, (cost, base)
