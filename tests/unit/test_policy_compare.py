"""``policy compare``'s arithmetic: pairs by tick, pool and key; distance per kind; stamps ignored."""

from __future__ import annotations

from fleetloop.daemon.replay.compare import compare, total_variation
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    AutoscaleDecision,
    BreakerDecision,
    Decision,
    DecisionBody,
    PolicyStamp,
    RoutingDecision,
)

ENF = PolicyStamp(name="default", version=3, hash="a" * 16, mode="enforce")
SHA = PolicyStamp(name="default", version=4, hash="b" * 16, mode="shadow")


def dec(tick: int, body: DecisionBody, stamp: PolicyStamp, reason: str = "") -> Decision:
    if reason:
        body = body.model_copy(update={"reason": reason})
    return Decision(ts_ms=tick * 1000, tick_id=tick, policy=stamp, body=body)


def routing(**w: float) -> RoutingDecision:
    return RoutingDecision(entity="pool/p", pool_id="p", weights=w, reason="score")


def breaker(state: str) -> BreakerDecision:
    return BreakerDecision(entity="p/1", pool_id="p", node_id="p/1", state=state, reason="r")  # type: ignore[arg-type]


def autoscale(n: int) -> AutoscaleDecision:
    return AutoscaleDecision(entity="pool/p", pool_id="p", current_nodes=4, desired_nodes=n, reason="r")


def admission(q0: int, q1: int | None) -> AdmissionDecision:
    table = {"0": q0} | ({"1": q1} if q1 is not None else {})
    return AdmissionDecision(entity="pool/p", pool_id="p", max_queue_depth=table, reason="r")


def test_total_variation() -> None:
    assert total_variation({"a": 0.5, "b": 0.5}, {"a": 1.0}) == 0.5
    assert total_variation({"a": 1.0}, {"b": 1.0}) == 1.0
    assert total_variation({}, {}) == 0.0


def test_distances_per_kind_and_entity_ignoring_stamps_reasons_and_unpaired_ticks() -> None:
    enforced = [
        dec(1, routing(a=0.5, b=0.5), ENF),
        dec(1, breaker("closed"), ENF),
        dec(1, autoscale(4), ENF),
        dec(1, admission(10, 5), ENF),
        dec(2, routing(a=0.5, b=0.5), ENF),
        dec(2, breaker("open"), ENF),
        dec(2, autoscale(4), ENF),
        dec(2, admission(10, 5), ENF),
        dec(3, routing(a=1.0), ENF),  # no shadow ran at tick 3: not compared
    ]
    shadow = [
        dec(1, routing(a=0.8, b=0.2), SHA),  # TV 0.3
        dec(1, breaker("open"), SHA),
        dec(1, autoscale(7), SHA),
        dec(1, admission(10, 5), SHA, reason="other-reason"),  # same thresholds: no difference
        dec(2, routing(a=0.5, b=0.5), SHA, reason="other-reason"),  # same weights, other stamp
        dec(2, breaker("open"), SHA),
        dec(2, autoscale(2), SHA),
        dec(2, admission(6, None), SHA),  # class 0: 10 -> 6; class 1 unlimited in the shadow
    ]
    c = compare(enforced, shadow)
    assert (c.ticks_paired, c.ticks_enforced_only, c.ticks_shadow_only) == (2, 1, 0)
    k = {kind: t.as_json() for kind, t in c.by_kind.items()}
    assert k["routing"]["compared"] == 2
    assert k["routing"]["differ"] == 1
    assert abs(k["routing"]["distance_max"] - 0.3) < 1e-9
    assert k["breaker"]["differ"] == 1
    assert k["breaker"]["most_common"] == "closed->open"
    assert k["autoscale"]["differ"] == 2
    assert k["autoscale"]["distance_max"] == 3.0
    assert k["autoscale"]["distance_mean"] == 2.5
    assert k["admission"]["differ"] == 1
    assert k["admission"]["distance_max"] == 5.0
    assert c.shadow_policies == {("default", 4, "b" * 16)}
    # The window keeps only tick 2.
    w = compare(enforced, shadow, from_ms=2000, to_ms=2000)
    assert w.ticks_paired == 1
    assert w.by_kind["routing"].differ == 0
    # The same decisions under another stamp: nothing differs.
    same = compare(enforced, [d.model_copy(update={"policy": SHA}) for d in enforced])
    assert sum(t.differ for t in same.by_kind.values()) == 0
    assert same.ticks_paired == 3


def test_change_only_breakers_are_compared_as_a_router_holds_them() -> None:
    """A closed breaker that did not change is not re-published (change-only records): its newest
    record holds, for up to ``KEYFRAME_TICKS`` ticks. The enforced side opened p/1 at tick 2 and keeps
    it open (sent every tick); the shadow's stays closed and is not re-sent: ticks 2-4 differ."""
    from fleetloop.policies.breaker.emission import KEYFRAME_TICKS

    enforced = [dec(1, breaker("closed"), ENF), *(dec(t, breaker("open"), ENF) for t in (2, 3, 4))]
    shadow = [dec(1, breaker("closed"), SHA)] + [dec(t, routing(a=1.0), SHA) for t in (2, 3, 4)]
    enforced += [dec(t, routing(a=1.0), ENF) for t in (1, 2, 3, 4)]
    shadow += [dec(1, routing(a=1.0), SHA)]
    got = compare(enforced, shadow).as_json()["by_kind"]["breaker"]
    assert (got["compared"], got["differ"], got["only_enforced"], got["only_shadow"]) == (4, 3, 0, 0)
    # A record older than KEYFRAME_TICKS ticks is a node that left the pool: no longer held.
    late = 1 + KEYFRAME_TICKS
    enforced = [dec(1, breaker("closed"), ENF), dec(late, routing(a=1.0), ENF)]
    shadow = [dec(1, breaker("closed"), SHA), dec(late, routing(a=1.0), SHA)]
    got = compare(enforced, shadow).as_json()["by_kind"]["breaker"]
    assert (got["compared"], got["only_enforced"], got["only_shadow"]) == (1, 0, 0)


V1 = PolicyStamp(name="default", version=1, hash="1" * 16, mode="enforce")
V2 = PolicyStamp(name="default", version=2, hash="2" * 16, mode="enforce")


def test_the_enforced_versions_named_are_those_that_decided_the_compared_ticks() -> None:
    """v1 decided ticks 1-5 (a breaker record of p/1 at tick 4, held since: change-only), v2 from
    tick 6; the shadow ran from tick 8. Only v2 decided a compared tick: v1 is not named, though
    its breaker record is still what a router holds for p/1."""
    enforced = [dec(t, routing(a=1.0), V1 if t < 6 else V2) for t in range(1, 13)]
    enforced.append(dec(4, breaker("closed"), V1))
    shadow = [dec(t, routing(a=1.0), SHA) for t in range(8, 13)]
    shadow.append(dec(8, breaker("closed"), SHA))
    c = compare(enforced, shadow)
    assert c.by_kind["breaker"].compared == 5
    assert c.ticks_paired == 5
    assert c.enforced_policies == {("default", 2, "2" * 16)}
    j = c.as_json()
    assert [(s["version"], s["from_tick"], s["to_tick"], s["ticks"]) for s in j["enforced_stretches"]] == [
        (2, 8, 12, 5)
    ]
    assert [(s["version"], s["from_tick"], s["to_tick"]) for s in j["shadow_stretches"]] == [(4, 8, 12)]
    # Across an enforced change inside the compared ticks: both, each with its own ticks.
    shadow = [dec(t, routing(a=1.0), SHA) for t in range(3, 13)]
    j = compare(enforced, shadow).as_json()
    assert [(s["version"], s["from_tick"], s["to_tick"]) for s in j["enforced_stretches"]] == [
        (1, 3, 5),
        (2, 6, 12),
    ]


def test_a_breaker_held_on_one_side_only_is_closed_on_the_other() -> None:
    """The shadow starts from the enforced breakers and re-sends a closed node only at its keyframe:
    p/1 held closed on the enforced side and absent on the shadow's is the same state; p/1 open on
    the enforced side (sent every tick) and absent on the shadow's is a difference, open->closed."""
    enforced = [dec(1, breaker("closed"), ENF), *(dec(t, routing(a=1.0), ENF) for t in (1, 2, 3))]
    shadow = [dec(t, routing(a=1.0), SHA) for t in (2, 3)]
    got = compare(enforced, shadow).by_kind["breaker"]
    assert (got.compared, got.differ, got.only_enforced, got.only_shadow) == (2, 0, 0, 0)
    enforced += [dec(t, breaker("open"), ENF) for t in (2, 3)]
    got = compare(enforced, shadow).by_kind["breaker"]
    assert (got.compared, got.differ, got.only_enforced) == (2, 2, 0)
    assert got.details == {"open->closed": 2}
