"""The simulator's routers are the router library's: one implementation of the per-call pick is
exercised by every simulation, the demo and every test (``fleetloop.router``, its docstring has the
semantics). This module only binds the library to the simulator's nodes: a ``Router[Node]`` that
sees the fleet's members (for plain load balancing when it fails static) and every provisioned node
(for the weighted pick), with the simulator's seeded router stream as its generator, and pools of
one model splitting its calls by their nodes' decode bandwidth. ``llm-d-epp`` reads each node's KV
cache in use and its size from the node itself, as llm-d's endpoint picker scrapes them from the
engine every 50 ms (here: the value at the call).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fleetloop.router import FAIL_STATIC_S, Route, Router
from fleetloop.sim.node import Node

__all__ = ["FAIL_STATIC_S", "Route", "Router", "SimRouter", "kv_used_frac", "sim_router"]

SimRouter = Router[Node]


def sim_router(
    pools_by_model: Mapping[str, tuple[str, ...]],
    rng: np.random.Generator,
    members: Mapping[str, Sequence[Node]],
    nodes: Mapping[str, Node],
) -> SimRouter:
    return Router(
        pools_by_model,
        rng,
        members=members,
        nodes=nodes,
        capacity_of=_decode_bandwidth,
        engine_of=_engine_figures,
    )


def _decode_bandwidth(node: Node) -> float:
    """A node's share of its model's traffic across pools: the HBM bytes/s a decode step is bound by."""
    return node.spec.bytes_per_s


def kv_used_frac(node: Node) -> float:
    """The share of a node's KV cache its requests hold (vLLM ``kv_cache_usage_perc``: cached prefix
    blocks no request uses are free to evict, so they do not count)."""
    return min(1.0, node.kv_used / max(1, node.capacity))


def _engine_figures(node: Node) -> tuple[float, int]:
    return kv_used_frac(node), node.capacity
