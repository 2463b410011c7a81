"""slo-predictive (its batch form, a pool at a time) decides exactly as its oracle reading each pool's
node views one by one (``tests/oracles/predictive.py``): the same decisions' JSON, diagnostics bit for
bit and states, tick after tick on a generated fleet whose nodes go cold, drain, go silent, fail and
report hostile values; and ``NodeFigures`` (read from the snapshot's columns, no views) are the views'
own values."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from fleetloop.policies.autoscale import predictive
from fleetloop.policies.autoscale.predictive import NodeFigures, SloPredictive, SloPredictiveParams
from fleetloop.policies.autoscale.predictive.signals import Siblings, Sides
from fleetloop.policies.base import PolicyContext
from fleetloop.policies.slo import DEFAULT_BOOK
from fleetloop.schemas.decisions import AutoscaleDecision, BreakerDecision
from tests.oracles import predictive as oracle
from tests.support.perturbed import perturbed_snapshots


@pytest.fixture(scope="module")
def snapshots() -> list[Any]:
    return list(perturbed_snapshots(320, 45))


def test_node_figures_are_the_views_values(snapshots: list[Any]) -> None:
    for snap in snapshots[::5]:
        for pool_id in [*sorted(snap.pools), "no-such-pool"]:
            views = snap.pool_nodes(pool_id)
            got = predictive.node_figures(snap, pool_id)
            assert len(got) == len(views)
            for f, v in zip(got, views, strict=True):
                want = tuple(getattr(v, name) for name in NodeFigures._fields)
                assert [(type(x), repr(x)) for x in f] == [(type(x), repr(x)) for x in want]


@pytest.mark.parametrize(
    "params",
    [SloPredictiveParams(), SloPredictiveParams(spare_nodes=0, tolerance=0.0, down_period_s=0.0)],
    ids=["default", "eager"],
)
def test_predictive_decides_as_its_oracle_on_views(snapshots: list[Any], params: Any) -> None:
    algo = SloPredictive()
    fast: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    reasons: set[str] = set()
    # A pool whose node reports 10**12 queued prompt tokens (a value the schema accepts) used to ask
    # for ~1.7e15 nodes, beyond the decision's figure bound, failing the pool's tick in both forms;
    # the need is capped at MAX_NEED_NODES now, so no tick may be refused.
    refused = 0
    desired: set[int] = set()
    for k, snap in enumerate(snapshots):
        for pool_id in sorted(snap.pools):
            # Now and then a breaker ejects the pool's first node: the sibling reads leave it out.
            nodes = snap.pool_nodes(pool_id)
            breakers = {}
            if nodes and k % 3 == 0:
                n = nodes[0]
                breakers[n.node_id] = BreakerDecision(
                    entity=f"node/{n.node_id}", reason="x", pool_id=pool_id, node_id=n.node_id, state="open"
                )
            ctx = PolicyContext(
                now_ms=snap.now_ms, tick_id=k, tick_ms=1000, pool_id=pool_id, seed=(k,), breakers=breakers
            )
            refusal: ValueError | None = None
            try:
                a = algo.decide(snap, params, fast.get(pool_id, algo.initial_state()), ctx)
            except ValueError as e:  # both forms refuse the same hostile figures (see above)
                refusal = e
            if refusal is not None:
                with pytest.raises(type(refusal), match=re.escape(str(refusal))):
                    oracle.decide(snap, params, plain.get(pool_id, algo.initial_state()), ctx)
                refused += 1
                continue
            b = oracle.decide(snap, params, plain.get(pool_id, algo.initial_state()), ctx)
            assert [d.model_dump_json() for d in a.decisions] == [d.model_dump_json() for d in b.decisions]
            assert {x: v.hex() for x, v in a.diagnostics.items()} == {
                x: v.hex() for x, v in b.diagnostics.items()
            }
            assert a.state == b.state
            fast[pool_id], plain[pool_id] = a.state, b.state
            reasons.update(d.reason.split(":")[0] for d in a.decisions)
            desired.update(d.desired_nodes for d in a.decisions if isinstance(d, AutoscaleDecision))
    assert len(reasons) >= 2, reasons
    assert len(desired) >= 5, desired
    assert refused == 0


def test_the_sibling_short_the_most_is_the_first_greatest_of_the_others() -> None:
    """``Siblings.most_short`` (two best per model, not a scan per pool) picks what the plain scan
    over the model's short pools picks for every pool asking, ties to the first in pool order and
    the pool's own entry skipped, with the pressure of the entry picked."""

    class Listed(Siblings):
        def __init__(self, listed: list[tuple[str, float, float]]) -> None:
            super().__init__(None, SloPredictiveParams(), Sides([], [], [], [], [], [], []))  # type: ignore[arg-type]
            self.listed = listed

        def shortfalls(self, model: str, slo: Any) -> list[tuple[str, float, float]]:
            return self.listed

    slo = DEFAULT_BOOK.default
    for n in range(6):  # every order of shortfalls among three values, ties included
        for shorts in itertools.product((0.5, 1.0, 2.0), repeat=n):
            listed = [(f"p{i}", 0.1 * i, short) for i, short in enumerate(shorts)]
            sib = Listed(listed)
            for pool_id in [f"p{i}" for i in range(n + 1)]:
                want = (0.0, 0.0)
                for sid, p_s, short in listed:
                    if sid != pool_id and short > want[1]:
                        want = (p_s, short)
                assert sib.most_short("m", slo, pool_id) == want, (listed, pool_id)
