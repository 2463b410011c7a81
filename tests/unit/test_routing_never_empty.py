"""The daemon never publishes a routing decision with nothing to route to (engine.py, ``NO_NODE``):
a pool whose nodes it cannot see (outcomes but no telemetry yet, or a quiet period past the model's
``forget_node_after_ms``) gets no routing decision, so routers fail static instead of emptying it.
Both engine paths (``decide`` and ``decide_many``) agree, through the real fleet model."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from fleetloop.core.decide.engine import EngineState, TickResult, decide, decide_many
from fleetloop.core.model import FleetModel, ModelConfig, apply, snapshot
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.policies.base import FleetSnapshot
from fleetloop.policies.registry import CompiledPolicy, builtin_policy
from fleetloop.schemas import NodeTelemetry, RequestOutcome, RoutingDecision, Tick
from tests.support.perturbed import perturbed_snapshots
from tests.support.policies import foundation
from tests.support.records import outcome, telemetry

T = 1_700_000_000_000
POLICIES = [pytest.param(builtin_policy(), id="default"), pytest.param(foundation(), id="foundation")]
FORGET_MS = ModelConfig().forget_node_after_ms


def both(snap: FleetSnapshot, policy: CompiledPolicy, pools: Sequence[str]) -> list[TickResult]:
    """Each pool's tick by ``decide`` and by ``decide_many``, checked equal byte for byte."""
    ticks = [Tick(ts_ms=snap.now_ms, tick_id=snap.now_ms // 1000, pool_id=p) for p in pools]
    one = [decide(snap, policy, EngineState(), t) for t in ticks]
    many = decide_many(snap, policy, [EngineState()] * len(ticks), ticks)
    for a, b in zip(one, many, strict=True):
        assert [decision_bytes(d) for d in a.decisions] == [decision_bytes(d) for d in b.decisions]
    return one


def routing(result: TickResult) -> list[RoutingDecision]:
    return [d.body for d in result.decisions if isinstance(d.body, RoutingDecision)]


def fold(records: Sequence[NodeTelemetry | RequestOutcome]) -> FleetModel:
    return apply(FleetModel(), records)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    "first",
    [
        pytest.param(outcome("chat/0", "ok", pool="chat", ts_ms=T + 100), id="a-call-through-a-node"),
        pytest.param(outcome(None, "shed", pool="chat", ts_ms=T + 100), id="a-call-shed-for-no-node"),
    ],
)
def test_a_pool_with_outcomes_but_no_telemetry_gets_no_routing_decision(
    policy: CompiledPolicy, first: RequestOutcome
) -> None:
    """A new pool, or a scraper not yet running: its first call through the router must not come
    back as a decision naming no node (every HAProxy slot in maint, every call 503)."""
    (result,) = both(snapshot(fold([first]), T + 1_000), policy, ["chat"])
    assert routing(result) == []
    assert result.decisions  # the pool's other sections still decide


@pytest.mark.parametrize("policy", POLICIES)
def test_a_known_pool_through_a_quiet_period_fails_open_then_gets_no_routing_decision(
    policy: CompiledPolicy,
) -> None:
    model = fold([telemetry(f"chat/{i}", pool="chat", ts_ms=T) for i in range(2)])
    seen: list[tuple[str, dict[str, float]] | None] = []
    for after_ms in (1_000, 10_000, FORGET_MS + 1_000, 5 * FORGET_MS):
        (result,) = both(snapshot(model, T + after_ms), policy, ["chat"])
        got = routing(result)
        seen.append((got[0].reason, dict(got[0].weights)) if got else None)
    fresh, stale, forgotten, long_gone = seen
    assert fresh is not None
    assert sum(fresh[1].values()) > 0
    assert stale == ("fail-open", {"chat/0": 0.5, "chat/1": 0.5})  # silent, still known: evenly
    assert forgotten is None  # not seen at all: no decision, never "no members"
    assert long_gone is None
    # the nodes report again: routing resumes
    model = apply(model, [telemetry("chat/1", pool="chat", ts_ms=T + 5 * FORGET_MS + 500)])
    (result,) = both(snapshot(model, T + 5 * FORGET_MS + 1_000), policy, ["chat"])
    (back,) = routing(result)
    assert back.weights.get("chat/1", 0.0) > 0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_pool_of_cold_draining_nodes_only_gets_no_routing_decision(policy: CompiledPolicy) -> None:
    model = fold(
        [telemetry(f"p/{i}", pool="p", ts_ms=T, weights_state="cold", draining=True) for i in range(2)]
    )
    (result,) = both(snapshot(model, T + 500), policy, ["p"])
    assert routing(result) == []


def test_silent_and_live_pools_in_one_batch() -> None:
    """A silent pool's dropped decision leaves its neighbours' decisions in the batch as they were."""
    model = fold(
        [
            telemetry("a/0", pool="a", ts_ms=T + FORGET_MS + 500),
            outcome(None, "shed", pool="b", ts_ms=T + FORGET_MS + 500),
            telemetry("c/0", pool="c", ts_ms=T),  # forgotten by the tick
            telemetry("d/0", pool="d", ts_ms=T + FORGET_MS + 500),
        ]
    )
    results = both(snapshot(model, T + FORGET_MS + 1_000), builtin_policy(), ["a", "b", "c", "d"])
    assert [[r.pool_id for r in routing(x)] for x in results] == [["a"], [], [], ["d"]]


def test_no_routing_decision_ever_leaves_its_pool_nothing_to_route_to() -> None:
    """On generated fleets where nodes go cold, drain, fall silent and are forgotten, a whole pool
    goes silent and another joins late (and a pool no node ever reported): every routing decision
    published gives some node a weight above 0."""
    published = dropped = 0
    for snap in perturbed_snapshots(160, 24):
        pools = [*sorted(snap.pools), "never-reported"]
        for policy in (builtin_policy(), foundation()):
            for result in both(snap, policy, pools):
                for d in routing(result):
                    assert sum(d.weights.values()) > 0, d
                    published += 1
                dropped += not routing(result)
    assert published > 0
    assert dropped > 0


def test_the_readme_says_how_long_the_model_remembers_a_silent_node() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "integrations" / "routers.md").read_text()
    said = re.search(r"longer\s+than\s+the\s+model\s+remembers\s+a\s+node,\s+(\d+)\s+s\)", readme)
    assert said is not None
    assert int(said.group(1)) * 1000 == FORGET_MS
    for path in re.findall(r"`(tests/[\w/]+\.py)`", readme[said.start() - 3000 : said.end() + 1000]):
        assert (Path(__file__).resolve().parents[2] / path).exists(), path
