"""fixed: the target is always the pool's current node count."""

from __future__ import annotations

from fleetloop.policies.autoscale.fixed import Fixed, FixedParams
from fleetloop.schemas.decisions import AutoscaleDecision
from tests.policies.snapshots import ctx, node, snapshot


def test_desired_is_current_whatever_the_load() -> None:
    snap = snapshot(
        [
            node("a", gpu_util_frac=1.0, queue_depth=900),
            node("b", weights_state="cold"),
            node("c", draining=True),
            node("x", pool_id="q"),
        ]
    )
    (d,) = Fixed().decide(snap, FixedParams(), None, ctx(snap)).decisions
    assert isinstance(d, AutoscaleDecision)
    # nodes seen in the pool, warm or not
    assert (d.pool_id, d.current_nodes, d.desired_nodes, d.drain, d.reason) == ("p", 3, 3, (), "fixed-fleet")


def test_empty_pool() -> None:
    snap = snapshot(pool_fields={"p": {}})
    (d,) = Fixed().decide(snap, FixedParams(), None, ctx(snap)).decisions
    assert isinstance(d, AutoscaleDecision)
    assert (d.current_nodes, d.desired_nodes) == (0, 0)
