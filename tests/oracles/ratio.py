"""ratio's pool counts stated node by node: the test oracle of
:mod:`fleetloop.policies.retry_budget.ratio`, which reads them from the fleet-wide columns
(:mod:`fleetloop.policies.pool_figures`). The lost calls, the lost nodes and the episode from a
pool's nodes; the tests hold the product's figures to them value for value."""

from __future__ import annotations

from collections.abc import Iterable

from fleetloop.policies.base import NodeView
from fleetloop.policies.retry_budget.ratio import Episode, RatioParams, episode_after


def lost_nodes(nodes: Iterable[NodeView]) -> int:
    """Nodes that failed calls in the window and left service: crashed (stale) or reclaimed (not
    warm, not draining). A scale-up node still loading has failed nothing and is not counted."""
    return sum(
        1 for n in nodes if n.failures_w > 0 and (n.stale or (n.weights_state != "warm" and not n.draining))
    )


def lost_calls(nodes: Iterable[NodeView]) -> int:
    """Calls that failed on nodes no longer serving: crashed (stale) or reclaimed (not warm)."""
    return sum(n.failures_w for n in nodes if n.stale or n.weights_state != "warm")


def next_episode(
    params: RatioParams, episode: Episode | None, nodes: Iterable[NodeView], now_ms: int, window_ms: int
) -> tuple[Episode | None, int, int]:
    """(the episode after this tick, ``k`` nodes short, ``warm`` nodes serving) from the pool's
    nodes: ``episode_after`` with the counts taken node by node."""
    nodes = list(nodes)
    warm = sum(1 for n in nodes if n.warm and not n.stale)
    return episode_after(
        params, episode, warm, lost_now=lambda: lost_nodes(nodes), now_ms=now_ms, window_ms=window_ms
    )
