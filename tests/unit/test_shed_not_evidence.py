"""Shed and unattributed calls are not evidence against a node: the fleet model folds them into the
pool's and tenant's windows only, so no breaker opens (or is allowed by the ejection cap) because a
router turned calls away, whether its record names no node (the router library's sheds, HAProxy's
``<NOSRV>`` 503s) or, as the schema allows, one."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fleetloop.core.decide.engine import EngineState, decide, decide_many
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.policies.registry import CompiledPolicy, compile_policy, parse_document
from fleetloop.schemas import BreakerDecision, NodeTelemetry, RequestOutcome, Tick
from tests.oracles.fold import fold_plain
from tests.support.policies import foundation
from tests.support.records import outcome, telemetry

T = 1_700_000_000_000
NODES = ("p/0", "p/1", "p/2", "p/3")


def with_breaker(name: str) -> CompiledPolicy:
    doc = foundation().document.model_dump(mode="json")
    doc["spec"]["breaker"] = {"type": name}
    doc["spec"]["envelope"]["max_ejected_frac"] = 1.0  # nothing held back by the cap
    return compile_policy(parse_document(doc, "test"))


def records(shed_node: str | None, ticks: int) -> list[NodeTelemetry | RequestOutcome]:
    """Healthy telemetry each second and, on p/0, a long run of shed calls (and a few ok ones on
    the others), as when every slot of a backend was put in maint."""
    out: list[NodeTelemetry | RequestOutcome] = []
    for k in range(ticks):
        ts = T + k * 1000
        out += [telemetry(n, ts_ms=ts + 1, tbt_p50_ms=20.0) for n in NODES]
        out += [outcome(shed_node, "shed", ts_ms=ts + 10 + i, n=k * 100 + i) for i in range(40)]
        out += [outcome(n, "ok", ts_ms=ts + 500, n=k * 100 + 50 + j) for j, n in enumerate(NODES[1:])]
    return out


@pytest.mark.parametrize("shed_node", [None, "p/0"], ids=["unattributed", "naming-a-node"])
def test_the_model_keeps_sheds_off_the_nodes(shed_node: str | None) -> None:
    recs = records(shed_node, 3)
    one = apply(FleetModel(), recs)
    batch = FleetModel()
    fold_plain(batch, [r for r in recs if isinstance(r, NodeTelemetry)], outcomes=False)
    batch.fold_outcomes([r for r in recs if isinstance(r, RequestOutcome)])
    for model in (one, batch):
        snap = snapshot(model, T + 3_000)
        a = snap.nodes["p/0"]
        assert (a.requests_w, a.ok_w, a.failures_w, a.consecutive_failures) == (0, 0, 0, 0)
        assert snap.pools["p"].shed_w == 120  # the pool and tenant still count them
        assert snap.tenants["t"].shed_w == 120


@pytest.mark.parametrize("breaker", ["consecutive-errors", "envoy-outlier", "latency-outlier"])
@pytest.mark.parametrize("shed_node", [None, "p/0"], ids=["unattributed", "naming-a-node"])
def test_no_breaker_opens_on_shed_calls(breaker: str, shed_node: str | None) -> None:
    policy = with_breaker(breaker)
    model = FleetModel()
    states: Sequence[EngineState] = [EngineState()]
    recs = records(shed_node, 30)
    for k in range(30):
        apply(model, recs[k * 47 : (k + 1) * 47])
        tick = Tick(ts_ms=T + k * 1000 + 999, tick_id=k + 1, pool_id="p")
        snap = snapshot(model, tick.ts_ms)
        (result,) = decide_many(snap, policy, states, [tick])
        assert [d.body for d in result.decisions] == [
            d.body for d in decide(snap, policy, states[0], tick).decisions
        ]
        states = [result.state]
        for d in result.decisions:
            if isinstance(d.body, BreakerDecision):
                assert d.body.state == "closed", (k, d.body)
