"""The bench's generated fleet (``fleetloop.bench.fleetgen``) folded into a model second by second:
one snapshot per tick, as the daemon would take it. The batch forms' tests hold ``decide_pools``
to the loop of ``decide`` on these."""

from __future__ import annotations

from collections.abc import Iterator

from fleetloop.bench.fleetgen import BASE_TS_MS, make_fleet, outcomes_at, telemetry_at
from fleetloop.core.model.fleet import FleetModel, ModelConfig, snapshot
from fleetloop.policies.base import FleetSnapshot


def bench_snapshots(
    n_nodes: int,
    ticks: int,
    *,
    seed: int = 7,
    degraded_per_1000: float = 3.0,
    outcomes_per_node: float = 1.0,
    workflow_stride: int = 2,
) -> Iterator[FleetSnapshot]:
    """``ticks`` snapshots (10 s window, 5 s staleness) of a fleet of ``n_nodes``, one a second;
    each second's outcomes start workflow ids ``workflow_stride * n_nodes`` past the last's."""
    fleet = make_fleet(n_nodes, seed=seed, degraded_per_1000=degraded_per_1000)
    model = FleetModel(ModelConfig())
    ts = BASE_TS_MS
    for k in range(ticks):
        ts += 1000
        for t in telemetry_at(fleet, ts):
            model.fold_telemetry(t)
        for o in outcomes_at(fleet, ts, outcomes_per_node, workflow_base=k * n_nodes * workflow_stride):
            model.fold_outcome(o)
        yield snapshot(model, ts, window_ms=10_000, stale_after_ms=5_000)
