"""The in-process, virtual-time runner: the simulated fleet driven by the daemon's own MODEL and DECIDE.

Every ``policy.tick_ms`` of virtual time ``t`` (tick ``n``)::

    emitted = sim.advance_to(t)
    model   = apply(model, emitted.telemetry + emitted.outcomes)
    snap = snapshot(model, t, window_ms=env.window_ms, stale_after_ms=env.stale_after_ms)
    for result in engine.tick_many(snap, [Tick(ts_ms=t, tick_id=n, pool_id=p) for p in sorted(pools)]):
        sim.apply(result.decisions)

The records are folded as their msgspec twins (``sim.advance_twins``, what the daemon folds):
each is the twin of the wire record ``sim.advance_to`` makes, and the model folds either alike;
``run(..., wire_records=True)`` folds the wire models instead (the statement;
``tests/sim/test_sim_fast.py`` holds the two equal, decision for decision).

The policy runs against the scenario's SLO: the scenario's ``slo`` becomes the policy's
``spec.slo`` default and the policy's classes are scaled with it
(:func:`fleetloop.policies.slo.restated`; :func:`under_scenario_slo`), so the objective the report
judges latency by and the one admission, batching, autoscaling and the breaker steer by are one.
An HPA-based autoscaler takes each pool's ``min_nodes``/``max_nodes`` as its replica bounds
(:func:`under_scenario_bounds`).

There is no second control loop: the decisions come from :mod:`fleetloop.core.decide` exactly as
the daemon would compute them from the same records. The run ends when every task has succeeded or
failed after arrivals stop (deadlines bound it), or at a safety horizon of ``duration_s`` plus the
longest deadline plus ten minutes. The wall clock is read only to report ``sim.wall_s``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetloop.clock import monotonic_s
from fleetloop.core.decide import Engine
from fleetloop.core.decide.engine import envelope_of
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.policies.autoscale.hpa.params import ReplicaBounds
from fleetloop.policies.registry import CompiledPolicy, compile_policy, with_slo
from fleetloop.policies.slo import restated
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.policy import PolicyDocument
from fleetloop.sim.fleet import FleetSim, SimReport
from fleetloop.sim.scenario import Scenario

# Virtual time starts at this epoch (2025-01-01T00:00:00Z) so records carry plausible event times.
EPOCH_MS = 1_735_689_600_000


@dataclass(frozen=True, slots=True)
class RunResult:
    report: SimReport
    policy: str
    wall_s: float
    ticks: int
    decisions: int

    def to_json(self, scenario_path: str | None = None) -> dict[str, Any]:
        s = self.report.summary
        virtual_s = self.report.virtual_s
        return {
            "scenario": self.report.scenario,
            "scenario_file": scenario_path,
            "policy": self.policy,
            "seed": self.report.seed,
            "tasks": s["tasks"],
            "cost": s["cost"],
            "latency": s["latency"],
            "requests": s["requests"],
            "by_priority": s["by_priority"],
            "nodes": s["nodes"],
            "faults": s["faults"],
            "control": {"ticks": self.ticks, "decisions": self.decisions},
            "sim": {
                "virtual_s": virtual_s,
                "wall_s": round(self.wall_s, 3),
                "speedup": round(virtual_s / self.wall_s, 1) if self.wall_s > 0 else None,
            },
        }


def under_scenario_slo(policy: CompiledPolicy, scenario: Scenario) -> CompiledPolicy:
    """``policy`` held to ``scenario.slo``: the scenario's SLO is the default of ``spec.slo`` and
    every class keeps its ratio to the policy's own default (the scenario sets the scale, the policy
    the shape). Why the scenario wins: it describes the workload, whose SLO the report judges; a
    policy steering by another objective would be graded on one it never saw."""
    spec = restated(policy.document.spec.slo, float(scenario.slo.ttft_ms), float(scenario.slo.tbt_ms))
    return with_slo(policy, spec)


def under_scenario_bounds(policy: CompiledPolicy, scenario: Scenario) -> CompiledPolicy:
    """``policy`` with an HPA-based autoscaler (``hpa``, ``keda-engine``, ``keda-epp``: any whose
    parameters are :class:`ReplicaBounds`) bounded by each scenario pool's ``min_nodes`` and
    ``max_nodes``, unless its file bounds that pool itself.

    Why. A Kubernetes HPA's ``minReplicas``/``maxReplicas`` (a KEDA ScaledObject's
    ``minReplicaCount``/``maxReplicaCount``) are its scale target's only bounds: no floor stands
    apart from them, so it never names a replica below its floor. The simulator's pool is the scale
    target and ``min_nodes`` its floor. Left at a file's own ``min_replicas`` (1 by default) below
    it, the HPA named floor nodes to drain each sync; the simulator kept them (its floor) and the
    router kept them out of rotation (the drain list), a stack no one runs: ``modern`` served on
    fewer nodes than it paid for. Other autoscalers (slo-predictive, capacity) do not learn the
    floor: they run beside an orchestrator whose floor they may not know, which the engine's drain
    list grace handles (``fleetloop.core.decide.shaping.keep_draining``)."""
    section = policy.sections.get("autoscale")
    if section is None or not isinstance(section.params, ReplicaBounds):
        return policy
    data = policy.document.model_dump(mode="json")
    pools = data["spec"]["autoscale"].setdefault("params", {}).setdefault("pools", {})
    for p in scenario.pools:
        pools.setdefault(p.id, {"min_replicas": p.min_nodes, "max_replicas": p.hi_nodes})
    return compile_policy(PolicyDocument.model_validate(data))


def run(
    scenario: Scenario,
    policy: CompiledPolicy,
    *,
    seed: int | None = None,
    progress: Callable[[float, float], None] | None = None,
    wire_records: bool = False,
    on_tick: Callable[[int, list[Decision]], None] | None = None,
) -> RunResult:
    """Run ``scenario`` under ``policy`` to the end; ``progress(virtual_s, horizon_s)`` now and then,
    ``on_tick(tick, decisions)`` after every tick (for tests)."""
    started = monotonic_s()
    seed = scenario.seed if seed is None else seed
    policy = under_scenario_bounds(under_scenario_slo(policy, scenario), scenario)
    sim = FleetSim(scenario, seed, start_ms=EPOCH_MS)
    engine = Engine(policy)
    env = envelope_of(policy)
    model = FleetModel()
    tick_ms = policy.tick_ms
    pools = sorted(p.id for p in scenario.pools)
    longest_deadline = max(w.deadline_s for w in scenario.workload)
    horizon_ms = int((scenario.duration_s + longest_deadline + 600.0) * 1000.0)
    n = 0
    decisions = 0
    rel = 0
    while not sim.done and rel < horizon_ms:
        n += 1
        rel = n * tick_ms
        t = EPOCH_MS + rel
        emitted = sim.advance_to(t) if wire_records else sim.advance_twins(t)
        model = apply(model, [*emitted.telemetry, *emitted.outcomes])
        # One snapshot serves every pool of the tick: deciding does not change the model.
        snap = snapshot(model, t, window_ms=env.window_ms, stale_after_ms=env.stale_after_ms)
        # Every pool in one decide_many (what the loop of engine.tick decides, pool by pool); the
        # decisions are applied in pool order, as before: applying them does not touch the model.
        for result in engine.tick_many(snap, [Tick(ts_ms=t, tick_id=n, pool_id=pool) for pool in pools]):
            decisions += len(result.decisions)
            sim.apply(result.decisions)
            if on_tick is not None:
                on_tick(n, list(result.decisions))
        if progress is not None and n % 60 == 0:
            progress(rel / 1000.0, horizon_ms / 1000.0)
    return RunResult(
        report=sim.report(),
        policy=policy.stamp.name,
        wall_s=monotonic_s() - started,
        ticks=n,
        decisions=decisions,
    )
