"""Faults: what goes wrong in a fleet, injected by time (scenario) or live (the demo).

- ``degrade``: the node (``node``, or ``count`` nodes of ``pool``) runs every iteration ``factor``
  times slower for ``duration_s`` (thermal throttling, a bad HBM stack, a noisy neighbour on PCIe).
  It still answers, just slowly: the failure a consecutive-errors breaker cannot see until clients
  time out, and the seed of a retry cascade.
- ``crash``: the node(s) die: every request in flight is lost (clients see a connection error at
  once), billing stops, telemetry stops. The router keeps sending to a dead node until the control
  plane zeroes it (stale telemetry), and those calls fail at once.
- ``preempt``: the host is reclaimed mid-decode: in-flight work is lost and the node comes back cold
  (it reloads its weights over a fresh cold start, billed throughout).
- ``load_spike``: task arrivals of every workload (or of one ``tenant``) run ``factor`` times faster
  for ``duration_s``.

Targets named by count are chosen deterministically: the live, warm, non-draining nodes of the pool
in a seeded random order (the fault stream of the simulation's generator).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fleetloop.sim.node import Node
from fleetloop.sim.scenario import Fault


class FaultTarget(Protocol):
    now: float

    def pool_nodes(self, pool_id: str) -> Sequence[Node]: ...
    def node(self, node_id: str) -> Node | None: ...
    def crash_node(self, node: Node, *, comes_back: bool) -> None: ...
    def degrade_node(self, node: Node, factor: float, until: float | None) -> None: ...
    def spike(self, factor: float, tenant: str | None, until: float | None) -> None: ...


def targets(world: FaultTarget, fault: Fault, rng: np.random.Generator) -> list[Node]:
    if fault.node is not None:
        node = world.node(fault.node)
        return [node] if node is not None and node.alive else []
    if fault.pool is None:
        return []
    live = [n for n in world.pool_nodes(fault.pool) if n.alive and n.warm and not n.draining]
    count = min(len(live), fault.count or 1)
    if count == 0:
        return []
    order = rng.permutation(len(live))
    return sorted((live[int(i)] for i in order[:count]), key=lambda n: n.node_id)


def fire(world: FaultTarget, fault: Fault, rng: np.random.Generator) -> list[str]:
    """Apply ``fault`` now; returns the ids of the nodes it hit (empty for a load spike)."""
    until = world.now + fault.duration_s if fault.duration_s is not None else None
    if fault.kind == "load_spike":
        world.spike(fault.factor or 1.0, fault.tenant, until)
        return []
    hit = targets(world, fault, rng)
    for node in hit:
        if fault.kind == "degrade":
            world.degrade_node(node, fault.factor or 1.0, until)
        else:
            world.crash_node(node, comes_back=fault.kind == "preempt")
    return [n.node_id for n in hit]
