"""No telemetry is "unknown", never "no nodes": a pool fleetloop sees only through router outcomes
(a new pool, a scraper not running or down) gets no autoscale target the daemon has not held
before, and never one below the target it held. Otherwise a Kubernetes actuator following
``control.state`` would scale a running, unscraped pool to 0 (every HPA-style autoscaler's
``no-nodes-yet`` is 0) or below what it runs, which fleetloop's absence would not."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.core.decide.engine import Engine, envelope_of, settle_autoscale
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.policies.base import FleetSnapshot
from fleetloop.policies.registry import CompiledPolicy
from fleetloop.schemas import AutoscaleDecision, Tick
from tests.support.records import outcome, telemetry
from tests.unit.test_engine import policy

T = 1_700_000_000_000

AUTOSCALERS: dict[str, dict[str, Any]] = {
    "hpa": {"type": "hpa"},
    "keda-engine": {"type": "keda-engine", "params": {"min_replicas": 0}},
    "keda-epp": {"type": "keda-epp"},
    "slo-predictive": {"type": "slo-predictive", "params": {"spare_nodes": 1}},
    "fixed": {"type": "fixed"},
}


def _targets(engine: Engine, snap: FleetSnapshot, tick_id: int, *, many: bool) -> list[AutoscaleDecision]:
    t = Tick(ts_ms=snap.now_ms, tick_id=tick_id, pool_id="p")
    result = engine.tick_many(snap, [t])[0] if many else engine.tick(snap, t)
    return [d.body for d in result.decisions if isinstance(d.body, AutoscaleDecision)]


def _calls(now: int, k: int) -> list[Any]:
    """A second of calls through a router to the pool's three nodes, one shed."""
    recs: list[Any] = [outcome(f"n{i % 3:02d}", ts_ms=now, n=i, request_id=f"r{k}-{i}") for i in range(5)]
    recs.append(outcome(None, "shed", ts_ms=now, n=9, request_id=f"r{k}-shed"))
    return recs


def _policy(name: str) -> CompiledPolicy:
    return policy(autoscale=AUTOSCALERS[name])


@pytest.mark.parametrize("many", [False, True], ids=["decide", "decide_many"])
@pytest.mark.parametrize("name", sorted(AUTOSCALERS))
def test_a_pool_seen_only_through_outcomes_gets_no_target(name: str, many: bool) -> None:
    """Calls flow for 30 s, then stop for 30 s; no node ever reports: nothing is published (the
    actuator keeps what it had), never a target of 0."""
    engine, model = Engine(_policy(name)), FleetModel()
    published: list[AutoscaleDecision] = []
    for k in range(1, 61):
        now = T + k * 1_000
        if k <= 30:
            apply(model, _calls(now, k))
        published += _targets(engine, snapshot(model, now), k, many=many)
    assert published == [], [(d.desired_nodes, d.reason) for d in published]


@pytest.mark.parametrize("many", [False, True], ids=["decide", "decide_many"])
@pytest.mark.parametrize("name", sorted(AUTOSCALERS))
def test_a_pool_whose_telemetry_stops_never_gets_a_target_below_the_one_held(name: str, many: bool) -> None:
    """Three nodes report for 10 s, then the scraper dies while calls keep flowing for 3 minutes
    (the model forgets the nodes after 60 s): every target after that is at least the one held."""
    engine, model = Engine(_policy(name)), FleetModel()
    held: int | None = None
    after: list[AutoscaleDecision] = []
    for k in range(1, 191):
        now = T + k * 1_000
        if k <= 10:
            apply(model, [telemetry(f"n{i:02d}", ts_ms=now, gpu_util_frac=0.7) for i in range(3)])
        apply(model, _calls(now, k))
        out = _targets(engine, snapshot(model, now), k, many=many)
        if k <= 10:
            (d,) = out
            held = d.desired_nodes
        else:
            after += out
    assert held is not None
    assert held >= 3
    assert not snapshot(model, T + 190_000).pool_nodes("p"), "the model forgot the nodes"
    low = [(d.desired_nodes, d.reason) for d in after if d.desired_nodes < held]
    assert low == [], f"held {held}"
    assert all(d.drain == () for d in after)


def _unscraped(now: int) -> FleetSnapshot:
    return snapshot(apply(FleetModel(), _calls(now, 1)), now + 500)


def _proposal(desired: int, reason: str = "scale-up") -> AutoscaleDecision:
    return AutoscaleDecision(
        entity="pool/p", pool_id="p", current_nodes=0, desired_nodes=desired, reason=reason
    )


def test_an_unscraped_pool_may_still_scale_up_from_its_held_target() -> None:
    """Demand with no capacity (a pool scaled to zero, its calls shed) still scales up; the held
    target is a floor, not a ceiling; without a held target nothing is published."""
    e = envelope_of(_policy("hpa"))
    snap = _unscraped(T)
    up = settle_autoscale(_proposal(2), snap, e, held=0, silent=False)
    assert up is not None
    assert up[0].desired_nodes == 2
    settled = settle_autoscale(_proposal(0, "no-nodes-yet"), snap, e, held=4, silent=False)
    assert settled is not None
    kept = settled[0]
    assert (kept.desired_nodes, kept.reason) == (4, "no-nodes-yet:no-telemetry-held")
    assert kept.inputs["proposed_nodes"] == 0.0
    assert settle_autoscale(_proposal(3), snap, e, held=None, silent=False) is None
    assert settle_autoscale(_proposal(0), snap, e, held=None, silent=True) is None
