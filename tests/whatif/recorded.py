"""A recorded window from the simulator itself: the records a fleet running ``scenario`` under
``policy`` publishes (the same NodeTelemetry and RequestOutcome the demo writes to Kafka), so a
derivation can be checked against the scenario that made them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetloop.core.decide import Engine
from fleetloop.core.decide.engine import envelope_of
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.policies.registry import CompiledPolicy
from fleetloop.schemas.control import Tick
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.sim.fleet import FleetSim
from fleetloop.sim.runner import EPOCH_MS
from fleetloop.sim.scenario import Scenario


@dataclass(frozen=True)
class Recording:
    telemetry: list[NodeTelemetry]
    outcomes: list[RequestOutcome]
    summary: dict[str, Any]  # the simulator's own KPI summary of the run
    faults: list[dict[str, Any]]  # what the faults hit, when (relative s)
    from_ms: int
    to_ms: int


def record(scenario: Scenario, policy: CompiledPolicy, seed: int = 7) -> Recording:
    """Run like ``fleetloop.sim.runner.run`` and keep every record the fleet emitted."""
    sim = FleetSim(scenario, seed, start_ms=EPOCH_MS)
    engine = Engine(policy)
    env = envelope_of(policy)
    model = FleetModel()
    pools = sorted(p.id for p in scenario.pools)
    telemetry: list[NodeTelemetry] = []
    outcomes: list[RequestOutcome] = []
    n = 0
    while not sim.done and n < 20_000:
        n += 1
        t = EPOCH_MS + n * policy.tick_ms
        emitted = sim.advance_to(t)
        telemetry += emitted.telemetry
        outcomes += emitted.outcomes
        model = apply(model, [*emitted.telemetry, *emitted.outcomes])
        snap = snapshot(model, t, window_ms=env.window_ms, stale_after_ms=env.stale_after_ms)
        for pool in pools:
            sim.apply(engine.tick(snap, Tick(ts_ms=t, tick_id=n, pool_id=pool)).decisions)
    report = sim.report()
    return Recording(
        telemetry=telemetry,
        outcomes=outcomes,
        summary=report.summary,
        faults=report.summary["faults"],
        from_ms=EPOCH_MS,
        to_ms=EPOCH_MS + int(scenario.duration_s * 1000),
    )
