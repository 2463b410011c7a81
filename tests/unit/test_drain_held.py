"""The engine holds a pool's autoscale drain list (``shaping.keep_draining``): a node asked to drain
stays on the list until it is gone from the pool or a target above the nodes left serving takes it
back, whichever autoscaler named it and however often.

slo-predictive names the nodes to give back once, on the tick its target falls; the next tick's
decision for the pool (the same compacted key on ``control.state``) had ``drain=()``, so a router
following the newest decision took the node back into rotation a tick later, until the actuator
removed it."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.core.decide.engine import Engine
from fleetloop.core.decide.shaping import PoolDrains, keep_draining
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas import AutoscaleDecision, Tick
from tests.policies.snapshots import NOW_MS, node
from tests.policies.snapshots import snapshot as views_snapshot
from tests.support.records import telemetry

T = 1_700_000_000_000
IDLE = {"queue_depth": 0, "running_requests": 0, "kv_cache_used_frac": 0.1, "gpu_util_frac": 0.0}
IDS = [f"p/{i:02d}" for i in range(12)]


def _autoscale(engine: Engine, model: FleetModel, k: int) -> AutoscaleDecision:
    now = T + k * 1_000
    result = engine.tick(snapshot(model, now), Tick(ts_ms=now, tick_id=k, pool_id="p"))
    (d,) = [d.body for d in result.decisions if isinstance(d.body, AutoscaleDecision)]
    return d


def _report(model: FleetModel, k: int, ids: list[str], load: dict[str, Any]) -> None:
    apply(model, [telemetry(i, "p", ts_ms=T + k * 1_000, **load) for i in ids])


def test_a_node_asked_to_drain_stays_on_the_list_while_it_still_reports() -> None:
    """Twelve idle nodes on the default policy; no actuator acts, so every node keeps reporting, not
    draining. Until the first node's grace has run (one lead, 120 s: no cold start seen), each
    tick's list is the last one plus the nodes the new step gives back, and it always leaves exactly
    the target serving."""
    engine, model = Engine(builtin_policy("default")), FleetModel()
    lists: list[tuple[str, ...]] = []
    first: int | None = None
    for k in range(1, 300):
        _report(model, k, IDS, IDLE)
        d = _autoscale(engine, model, k)
        if first is None and d.drain:
            first = len(lists)
        lists.append(d.drain)
        if first is not None and len(lists) - first >= GRACE_MS / 1000:
            break
        if d.drain:
            assert len(IDS) - len(d.drain) == d.desired_nodes, (k, d.desired_nodes, d.drain)
    assert first is not None
    assert len(set(lists[first:])) >= 3, "the target fell several times"
    for k, (before, after) in enumerate(zip(lists[first:], lists[first + 1 :], strict=False), first + 2):
        assert after[: len(before)] == before, f"tick {k}: {before} became {after}"


def test_a_node_leaves_the_list_once_the_fleet_model_forgets_it() -> None:
    """The actuator removes the drained nodes: they stop reporting, go stale (still on the list:
    should one report again under its id, it is still draining) and leave the list once the model
    forgets them."""
    engine, model = Engine(builtin_policy("default")), FleetModel()
    k = 0
    drain: tuple[str, ...] = ()
    while not drain:
        k += 1
        _report(model, k, IDS, IDLE)
        drain = _autoscale(engine, model, k).drain
        assert k < 300
    kept = [i for i in IDS if i not in drain]
    seen: list[tuple[str, ...]] = []
    for _ in range(90):
        k += 1
        _report(model, k, kept, IDLE)
        seen.append(_autoscale(engine, model, k).drain)
    assert seen[0][: len(drain)] == drain
    assert seen[30][: len(drain)] == drain, "a stale node is still on the list"
    assert not set(drain) & set(seen[-1]), "a forgotten node is off the list"


GRACE_MS = 120_000.0


def _held(*listed: str, since: int = NOW_MS, taken: dict[str, int] | None = None) -> PoolDrains:
    """A pool's held drain list, every node put on it at ``since``."""
    return PoolDrains(listed, dict.fromkeys(listed, since), taken or {})


def _drain_decision(desired: int, drain: tuple[str, ...] = ()) -> AutoscaleDecision:
    return AutoscaleDecision(
        entity="pool/p", pool_id="p", current_nodes=8, desired_nodes=desired, drain=drain,
        reason="test", inputs={},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("desired", "named", "listed"),
    [
        # The list held, nothing new: 8 nodes, 3 on the list, 5 serving.
        (5, (), ("n7", "n6", "n5")),
        # A new step names two more: appended in the order named.
        (3, ("n4", "n3"), ("n7", "n6", "n5", "n4", "n3")),
        # An HPA-style autoscaler names other nodes for the same surplus: the ones named first stay.
        (5, ("n0", "n1", "n2"), ("n7", "n6", "n5")),
        # The target rises: the most recently asked come back first.
        (6, (), ("n7", "n6")),
        (8, (), ()),
    ],
)
def test_the_list_is_held_and_a_rising_target_takes_back_the_newest_first(
    desired: int, named: tuple[str, ...], listed: tuple[str, ...]
) -> None:
    snap = views_snapshot([node(f"n{i}") for i in range(8)])
    shaped, _ = keep_draining(_drain_decision(desired, named), snap, _held("n7", "n6", "n5"), GRACE_MS)
    assert shaped.drain == listed


def test_nodes_gone_stale_or_draining_themselves_are_not_taken_back() -> None:
    """A node the actuator already removed (stale) or is removing (its telemetry says draining) is
    leaving whatever the list says: a rising target takes back only the others, and the node that
    is gone from the snapshot leaves the list."""
    views = [
        *(node(f"n{i}") for i in range(5)),
        node("n5", stale=True, last_seen_ms=NOW_MS - 30_000, age_ms=30_000),
        node("n6", draining=True),
    ]
    snap = views_snapshot(views)
    shaped, _ = keep_draining(_drain_decision(8), snap, _held("n7", "n6", "n5", "n4", "n3"), GRACE_MS)
    assert shaped.drain == ("n6", "n5")  # n7 forgotten; n4 and n3 taken back, newest first
