"""A shard's pending pools as their statement: what ``Shard.pending_pools`` (its pending counts'
keys) is held to after a fold (``tests/unit/test_overload.py``)."""

from __future__ import annotations

from fleetloop.core.shard import Shard


def pending_pools_plain(shard: Shard) -> set[str]:
    """The pools of the pending records."""
    return {row.item.pool_id for q in shard.pending.values() for row in q if row.item is not None}
