"""The simulator's routers are the router library's: one implementation of the per-call pick is
exercised by every simulation, the demo and every test (``fleetloop.router``, its docstring has the
semantics). This module only binds the library to the simulator's nodes: a ``Router[Node]`` that
sees the fleet's members (for plain load balancing when it fails static) and every provisioned node
(for the weighted pick), with the simulator's seeded router stream as its generator, and pools of
one model splitting its calls by their nodes' decode bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fleetloop.router import FAIL_STATIC_S, Route, Router
from fleetloop.sim.node import Node

__all__ = ["FAIL_STATIC_S", "Route", "Router", "SimRouter", "sim_router"]

SimRouter = Router[Node]


def sim_router(
    pools_by_model: Mapping[str, tuple[str, ...]],
    rng: np.random.Generator,
    members: Mapping[str, Sequence[Node]],
    nodes: Mapping[str, Node],
) -> SimRouter:
    return Router(pools_by_model, rng, members=members, nodes=nodes, capacity_of=_decode_bandwidth)


def _decode_bandwidth(node: Node) -> float:
    """A node's share of its model's traffic across pools: the HBM bytes/s a decode step is bound by."""
    return node.spec.bytes_per_s
