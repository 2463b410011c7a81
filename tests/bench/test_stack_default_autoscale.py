"""fleetloop's own autoscaler in ``fleetloop bench stack`` over idle nodes, as the daemon runs it: the
fleetloop arms' built-in policy (``default``: slo-predictive, one spare node) through the daemon's
engine in event time, fed the telemetry ``fleetloop scrape`` makes of the stack scenario's 24 nodes
once the load has ended (no calls, nothing queued, a little KV still held, fresh every second).

An idle pool's target must come down monotonically to the floor the policy intends and stay there:
a target that goes back up without demand provisions GPUs (cold starts, money) for nothing. It once
alternated between 18 and 24 every 30 s: nodes asked to drain that were still reporting were read,
one window later, as the pool's size, and the scale-down rate limit "held" the target there. A real
return of demand must still scale up within the up window.

Nodes asked to drain that keep reporting, ready, for a grace (one lead: 120 s here, no cold start
seen) are ones the fleet keeps (its own floor, or no actuator at all): the engine takes them back
into rotation (``shaping.keep_draining``). Counted again, their trace of KV reads as pressure (the
open question of docs/decisions/slo-predictive.md: an idle node's own figures read as load), so the
target may then rise a little, never above the nodes the pool has: nothing is provisioned."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from fleetloop.bench.stack.arms import ARMS
from fleetloop.core.decide.engine import Engine
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.policies.registry import CompiledPolicy, builtin_policy, load_policy
from fleetloop.schemas import AutoscaleDecision, Tick
from fleetloop.sim.scenario import Pool, load_scenario
from tests.support.records import telemetry

T = 1_700_000_000_000
IDLE_S = 600
IDLE = {"queue_depth": 0, "running_requests": 0, "kv_cache_used_frac": 0.1, "gpu_util_frac": 0.0}
BUSY = {"queue_depth": 6, "running_requests": 8, "kv_cache_used_frac": 0.95, "gpu_util_frac": 1.0}


def _pool() -> Pool:
    return load_scenario("scenarios/stack/degraded-gpu.yaml").pools[0]


@dataclass
class _Fleet:
    """The nodes the scraper sees: ``obey`` is a worker manager acting on each target as the bench's
    fleet does (held within the pool's min and max nodes; surplus nodes drain and, idle, leave at
    once, so their telemetry stops; a new node is seen once warm, a cold start later); without it the
    nodes stay, reporting, whatever the target (an actuator that has not acted yet)."""

    pool: Pool
    obey: bool
    warm_at: dict[int, int] = field(default_factory=dict)  # node index -> second it is seen from
    provisioned: int = 0  # nodes the worker manager added

    def __post_init__(self) -> None:
        self.warm_at = dict.fromkeys(range(self.pool.nodes), 0)

    def telemetry(self, k: int, now: int, load: dict[str, Any]) -> list[Any]:
        return [
            telemetry(f"{self.pool.id}/{i}", self.pool.id, ts_ms=now, model=self.pool.model,
                      gpu_type=self.pool.gpu, gpu_count=self.pool.gpus_per_node, **load)
            for i, at in sorted(self.warm_at.items()) if at <= k
        ]  # fmt: skip

    def act(self, k: int, d: AutoscaleDecision) -> None:
        if not self.obey:
            return
        want = min(max(d.desired_nodes, self.pool.min_nodes), self.pool.hi_nodes)
        have = sorted(self.warm_at)
        if want > len(have):
            for i in range(max(have, default=-1) + 1, max(have, default=-1) + 1 + want - len(have)):
                self.warm_at[i] = k + round(self.pool.cold_start_s)
                self.provisioned += 1
            return
        named = [int(n.rsplit("/", 1)[1]) for n in d.drain]
        victims = [i for i in named if i in self.warm_at] + [i for i in reversed(have) if i not in named]
        for i in victims[: len(have) - want]:
            del self.warm_at[i]


def _run(
    fleet: _Fleet,
    phases: list[tuple[int, dict[str, Any]]],
    policy: CompiledPolicy | None = None,
    currents: list[int] | None = None,
) -> list[int]:
    """The target the daemon publishes each second, on ``policy`` (``default`` unless given), over
    ``phases`` of (seconds, node load); ``currents`` gets the nodes the decision counts."""
    engine, model = Engine(policy or builtin_policy("default")), FleetModel()
    targets: list[int] = []
    k = 0
    for seconds, load in phases:
        for _ in range(seconds):
            k += 1
            now = T + k * 1_000
            apply(model, fleet.telemetry(k, now, load))
            result = engine.tick(snapshot(model, now), Tick(ts_ms=now, tick_id=k, pool_id=fleet.pool.id))
            (d,) = [d.body for d in result.decisions if isinstance(d.body, AutoscaleDecision)]
            targets.append(d.desired_nodes)
            if currents is not None:
                currents.append(d.current_nodes)
            fleet.act(k, d)
    return targets


def _rises(targets: list[int]) -> list[tuple[int, int, int]]:
    """(second, from, to) of every rise of the target."""
    return [(k + 1, a, b) for k, (a, b) in enumerate(pairwise(targets)) if b > a]


def test_the_fleetloop_arms_run_the_default_policy() -> None:
    assert {a.policy for a in ARMS if a.fleetloop} == {"default"}
    autoscale = builtin_policy("default").sections["autoscale"]
    assert autoscale.algorithm.name == "slo-predictive"


def _taken_back(currents: list[int]) -> int:
    """The first second the nodes the pool counts rose again: nodes taken back after their grace."""
    return next((k for k, (a, b) in enumerate(pairwise(currents), 1) if b > a), len(currents))


def test_idle_nodes_still_reporting_bring_the_target_down_without_a_rise() -> None:
    """No actuator acts: the nodes asked to drain keep reporting, not draining. The target falls
    without a rise while they are on the list; a grace after each was asked it is back in rotation,
    every node serves again, and the target never rises above them."""
    pool = _pool()
    currents: list[int] = []
    targets = _run(_Fleet(pool, obey=False), [(IDLE_S, IDLE)], currents=currents)
    back = _taken_back(currents)
    assert back < IDLE_S, "nodes still reporting a grace after they were asked are taken back"
    assert _rises(targets[:back]) == [], f"the target rose with no demand: {_rises(targets)[:4]}"
    assert all(t <= c for t, c in zip(targets, currents, strict=True)), "a target above the nodes there"
    assert currents[-1] == pool.nodes, "every node the fleet kept is back in rotation"
    assert targets[0] == pool.nodes
    assert targets[-1] < pool.min_nodes  # its own floor (the spare node over a trace of KV)
    assert len(set(targets[-120:])) == 1, "settled, and stays"


def test_an_obeying_fleet_at_its_floor_sees_a_target_that_only_falls() -> None:
    """The bench's worker manager: it scales in to its pool's minimum (16) and keeps it. The nodes it
    keeps below the target are taken back into rotation a grace after they were asked."""
    pool = _pool()
    fleet = _Fleet(pool, obey=True)
    currents: list[int] = []
    targets = _run(fleet, [(IDLE_S, IDLE)], currents=currents)
    back = _taken_back(currents)
    assert _rises(targets[:back]) == [], f"the target rose with no demand: {_rises(targets)[:4]}"
    assert all(t <= c for t, c in zip(targets, currents, strict=True)), "a target above the nodes there"
    assert fleet.provisioned == 0, "a node was provisioned for an idle pool"
    assert len(fleet.warm_at) == pool.min_nodes
    assert currents[-1] == pool.min_nodes, "the nodes its floor keeps are back in rotation"
    assert len(set(targets[-120:])) == 1


def test_demand_that_returns_after_the_idle_stretch_scales_up_within_the_up_window() -> None:
    pool = _pool()
    fleet = _Fleet(pool, obey=True)
    targets = _run(fleet, [(IDLE_S, IDLE), (30, BUSY)])
    floor, busy = targets[IDLE_S - 1], targets[IDLE_S:]
    params: Any = builtin_policy("default").sections["autoscale"].params
    # Every node queues (P = 1.75): the pool needs about 16 x 1.75 + 1 = 29 nodes. The up window
    # keeps one noisy second from buying nodes, no more; the envelope's step limit then lets out at
    # most 8 nodes over the 16 seen (the new ones are seen once warm).
    first_up = next(i for i, t in enumerate(busy) if t > floor)
    assert first_up <= params.up_window_s + 1
    assert max(busy) == pool.min_nodes + 8
    assert fleet.provisioned == 8


CAPACITY = Path("examples/policies/capacity.yaml")  # the default with the capacity autoscaler


@pytest.mark.parametrize("obey", [False, True])
def test_the_capacity_autoscaler_brings_an_idle_pool_down_without_a_rise(obey: bool) -> None:
    """The same idle pool on the capacity autoscaler, which keeps committed-size logic of its own (its
    holds compare with the nodes seen, which count the nodes it asked to drain again a window later:
    docs/decisions/slo-predictive.md). Its target must not rise either. It waits one lead (its
    catalog cold start, about 20 minutes here) before a first scale-down."""
    pool = _pool()
    fleet = _Fleet(pool, obey=obey)
    targets = _run(fleet, [(1_500, IDLE)], load_policy(CAPACITY))
    assert _rises(targets) == [], f"the target rose with no demand: {_rises(targets)[:4]}"
    assert targets[0] == pool.nodes
    assert targets[-1] < pool.min_nodes
    assert len(set(targets[-120:])) == 1, "settled, and stays"
    assert fleet.provisioned == 0


def test_the_capacity_autoscaler_counts_the_nodes_it_asked_to_drain_as_leaving() -> None:
    """No actuator acts, so the nodes asked to drain keep reporting, not draining. The engine holds
    them on the pool's drain list, and the rule reads that list (``PolicyContext.draining``): once
    asked, a node is not counted in the pool's size again. It once was a window later, from the
    rule's own memory of one window: the count went 24, 1, 24 every 11 s, and any hold fired in the
    24 state would have raised the target back to nodes already given back."""
    pool = _pool()
    currents: list[int] = []
    targets = _run(_Fleet(pool, obey=False), [(1_500, IDLE)], load_policy(CAPACITY), currents)
    assert targets[-1] < pool.min_nodes
    first_fall = next(k for k, c in enumerate(currents) if c < pool.nodes)
    rises = [(k, a, b) for k, (a, b) in enumerate(pairwise(currents[first_fall:])) if b > a]
    assert rises == [], f"nodes asked to drain were counted again: {rises[:4]}"
    assert currents[-1] == targets[-1]
