"""tbt-feedback's pool figure node by node: the statement ``tbt_feedback.pool_tbt_ms`` is held to
(``tests/unit/test_pool_figures.py``)."""

from __future__ import annotations

from fleetloop.policies.base import FleetSnapshot, PolicyContext


def pool_tbt_ms_plain(snap: FleetSnapshot, ctx: PolicyContext) -> float | None:
    """``tbt_feedback.pool_tbt_ms`` node by node (the rule's statement)."""
    values: list[float] = []
    for n in snap.pool_nodes(ctx.pool_id):
        if not n.warm or n.stale or n.tbt_p99_ms is None:
            continue
        b = ctx.breakers.get(n.node_id)
        if b is not None and b.enforced and b.state == "open":
            continue
        values.append(n.tbt_p99_ms)
    if not values:
        return None
    values.sort()
    return values[len(values) // 2]
