"""The engine's routing shaping (``shaping.shape_routing``, a batch) equals the loop of
``shape_routing_plain`` (the statement, ``tests.oracles.engine``) bit for bit: on the perturbed
fleet's snapshots (nodes cold, draining, stale, silent), with breakers open and half-open, enforced
or not, weights that do not match the pool's nodes, several priority classes, pools every node of
which is zeroed (fail open, no node), pools the snapshot does not hold, and hostile weights (1e308,
subnormal, -0.0, NaN, ties of ``r6``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from fleetloop.core.decide.engine import envelope_of
from fleetloop.core.decide.shaping import shape_routing
from fleetloop.daemon.cli_common import policy_from
from fleetloop.policies.base import FleetSnapshot
from fleetloop.policies.columns import fleet_columns
from fleetloop.schemas.decisions import BreakerDecision, RoutingDecision
from tests.oracles.engine import _ARRAY_FROM as ARRAY_FROM
from tests.oracles.engine import shape_routing_plain
from tests.support.perturbed import perturbed_snapshots

ENV = envelope_of(policy_from(None))
HOSTILE = (1e308, 5e-324, -0.0, 0.0, math.nan, 0.0000005, 0.0000015, 2.5e-6, 1.0, 1e-300, 3.0)


def bits(x: Any) -> Any:
    if isinstance(x, float):
        return x.hex()
    if isinstance(x, dict):  # in order: the order is what goes on the wire
        return [(k, bits(v)) for k, v in x.items()]
    if isinstance(x, (list, tuple)):
        return [bits(v) for v in x]
    return x


def body_bits(d: RoutingDecision | None) -> Any:
    """None for a pool the shaping gives no decision (no node to route to)."""
    return None if d is None else [(k, type(v).__name__, bits(v)) for k, v in d.__dict__.items()]


def pick(rng: np.random.Generator, options: tuple[Any, ...]) -> Any:
    return options[int(rng.integers(len(options)))]


Items = list[tuple[RoutingDecision, dict[str, Any]]]


def decisions_for(snap: FleetSnapshot, rng: np.random.Generator) -> Items:
    cols = fleet_columns(snap)
    items: Items = []
    # A pool without rows first and last: its decision is dropped (no node to route to), and the
    # batch's per-class bookkeeping must skip its classes for the decisions after it.
    pools = ["0-no-rows", *sorted(cols.bounds), "no-such-pool"]
    for pool_id in pools:
        lo, hi = cols.bounds.get(pool_id, (0, 0))
        ids = sorted(cols.table.ids[lo:hi]) if cols.table is not None else []
        kind = int(rng.integers(8))
        if kind == 0:  # extra and missing nodes
            ids = [*ids[1:], "ghost-a", "ghost-b"]
        weights: dict[str, float] = {}
        for n in ids:
            r = rng.random()
            if kind == 1:
                weights[n] = 0.0  # every weight zero: fail open
            elif kind == 2 and r < 0.5:
                weights[n] = pick(rng, HOSTILE)
            else:
                weights[n] = round(r, int(rng.integers(1, 9)))
        if kind == 3:
            weights = dict(list(weights.items())[: ARRAY_FROM - 2])  # the scalar path's size
        classes: dict[str, dict[str, float]] = {}
        for cls in ("0", "3", "7")[: int(rng.integers(0, 4))]:
            ws = {n: w * pick(rng, (0.5, 1.0, 0.0, 3.0)) for n, w in weights.items()}
            classes[cls] = dict(reversed(ws.items())) if rng.random() < 0.5 else ws
        breakers: dict[str, Any] = {}
        for n in ids:
            r = rng.random()
            if r < 0.15:
                state = pick(rng, ("open", "half_open", "closed"))
                breakers[n] = BreakerDecision.model_construct(
                    pool_id=pool_id,
                    node_id=n,
                    state=state,
                    enforced=rng.random() < 0.8,
                    probe_frac=pick(rng, (0.05, 0.3, 0.0, 1.0)),
                )
        if kind == 4:  # every node open: all weights zeroed, fail open over the warm ones
            breakers = {
                n: BreakerDecision.model_construct(pool_id=pool_id, node_id=n, state="open", enforced=True)
                for n in ids
            }
        d = RoutingDecision.model_construct(
            pool_id=pool_id,
            weights=weights,
            by_priority=classes,
            spill_to=tuple(f"s{i}" for i in range(int(rng.integers(0, 6)))),
            reason="scored",
            inputs={"nodes": float(len(ids))},
        )
        items.append((d, breakers))
    return items


def test_the_batch_shaping_equals_the_loop_on_the_perturbed_fleet() -> None:
    rng = np.random.default_rng(5)
    seen_reasons: set[str] = set()
    probing = 0
    for snap in perturbed_snapshots(320, 24):
        items = decisions_for(snap, rng)
        want = [shape_routing_plain(d, snap, b, ENV) for d, b in items]
        got = shape_routing(items, snap, ENV)
        assert [body_bits(d) for d in got] == [body_bits(d) for d in want]
        seen_reasons.update(d.reason if d is not None else "none" for d in got)
        probing += sum(d.inputs["probing_nodes"] > 0 for d in got if d is not None)
    assert {"fail-open", "none", "scored"} <= seen_reasons  # none: a pool with no node gets no decision
    assert "no-node" not in seen_reasons
    assert probing > 0


def test_an_empty_batch_and_a_batch_of_one() -> None:
    snap = next(iter(perturbed_snapshots(40, 1)))
    assert shape_routing([], snap, ENV) == []
    (d, b) = decisions_for(snap, np.random.default_rng(1))[0]
    want = shape_routing_plain(d, snap, b, ENV)
    assert body_bits(shape_routing([(d, b)], snap, ENV)[0]) == body_bits(want)


def test_the_row_path_meets_breakers_in_any_order_and_on_stale_nodes() -> None:
    """Decisions whose weights name exactly their pools' rows (cache-aware routing's, the path
    without a step per node, ``_unscaled_rows``) with a breaker on every node, listed in reverse node
    order: half-open ones whose probe shares sum differently in another order (0.1 + 0.2 + 0.3),
    open ones, not enforced ones, and breakers on stale and cold nodes (a stale node is zeroed as
    stale, its breaker ignored; a cold half-open one probes 0.0)."""
    rng = np.random.default_rng(11)
    fracs = (0.1, 0.2, 0.3, 0.7, 1e-300, 5e-324, 0.0)
    row_path = stale_breakers = 0
    for snap in perturbed_snapshots(320, 24):
        cols = fleet_columns(snap)
        assert cols.table is not None
        stale = cols.stale.tolist()
        items: Items = []
        for pool_id in sorted(cols.bounds):
            lo, hi = cols.bounds[pool_id]
            ids = list(cols.table.ids[lo:hi])
            weights = {n: pick(rng, (0.25, 0.5, 1.0, 1e308, -0.0, 3.0)) for n in ids}
            breakers: dict[str, Any] = {}
            for r, n in reversed(list(enumerate(ids))):
                state = pick(rng, ("half_open", "half_open", "open", *("closed",) * 5))
                breakers[n] = BreakerDecision.model_construct(
                    pool_id=pool_id,
                    node_id=n,
                    state=state,
                    enforced=rng.random() < 0.9,
                    probe_frac=pick(rng, fracs),
                )
                stale_breakers += stale[lo + r] and state == "half_open"
            classes = {"0": dict(weights), "5": {n: w * 0.5 for n, w in reversed(weights.items())}}
            d = RoutingDecision.model_construct(
                pool_id=pool_id, weights=weights, by_priority=classes, spill_to=(), reason="scored",
                inputs={},
            )  # fmt: skip
            row_path += ids == sorted(ids)
            items.append((d, breakers))
        want = [shape_routing_plain(d, snap, b, ENV) for d, b in items]
        got = shape_routing(items, snap, ENV)
        assert [body_bits(d) for d in got] == [body_bits(d) for d in want]
    assert row_path > 0
    assert stale_breakers > 0
