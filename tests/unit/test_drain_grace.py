"""A node the fleet keeps is taken back off its pool's drain list a grace after it was asked
(``shaping.keep_draining``, rules 1 and 3): a worker manager with a floor of its own (the
simulator's ``min_nodes``, an orchestrator's minimum replicas) never removes some of the nodes an
autoscaler names, and the engine once held them on the list for good: idle, paid for, out of
rotation. Taken back, such a node is not named again while its pool's target has not fallen below
its target at the take-back: an autoscaler that names its surplus afresh each tick (the HPA-style
ones) would otherwise drain it and take it back every grace."""

from __future__ import annotations

import pytest
from fleetloop.core.checkpoint import decode, encode
from fleetloop.core.decide.engine import Engine, EngineState, envelope_of
from fleetloop.core.decide.shaping import GRACE_WITHOUT_LEAD_S, PoolDrains, drain_grace_ms, keep_draining
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.policies.registry import CompiledPolicy, builtin_policy
from fleetloop.schemas import AutoscaleDecision, Tick
from tests.policies.snapshots import NOW_MS, node
from tests.policies.snapshots import snapshot as views_snapshot
from tests.support.checkpoints import blob_of, edit_field, tree_of
from tests.support.records import telemetry
from tests.unit.test_engine import policy

T = 1_700_000_000_000
IDLE = {"queue_depth": 0, "running_requests": 0, "kv_cache_used_frac": 0.1, "gpu_util_frac": 0.0}
IDS = [f"p/{i:02d}" for i in range(12)]
GRACE_MS = 120_000.0


def _tick(engine: Engine, model: FleetModel, k: int) -> AutoscaleDecision:
    """Second ``k``: every node of ``IDS`` reports idle (no actuator removes any), and the engine
    decides; the pool's autoscale decision."""
    now = T + k * 1_000
    apply(model, [telemetry(i, "p", ts_ms=now, **IDLE) for i in IDS])
    result = engine.tick(snapshot(model, now), Tick(ts_ms=now, tick_id=k, pool_id="p"))
    (d,) = [d.body for d in result.decisions if isinstance(d.body, AutoscaleDecision)]
    return d


def _lists(pol: CompiledPolicy, seconds: int) -> list[AutoscaleDecision]:
    engine, model = Engine(pol), FleetModel()
    return [_tick(engine, model, k) for k in range(1, seconds + 1)]


def test_a_listed_node_still_reporting_past_its_grace_is_taken_back() -> None:
    """The default policy (slo-predictive, no cold start seen: a lead of 120 s) over twelve idle nodes
    nobody removes. Each node it asks to drain stays on the list for exactly the grace, then is back
    in rotation (it was held on the list for good before). A target that falls below its target at
    the take-back may name it again: another whole grace."""
    seconds = 420
    decisions = _lists(builtin_policy("default"), seconds)
    assert decisions[-1].inputs["lead_s"] * 1000 == GRACE_MS
    on: dict[str, int] = {}  # node -> the second it was put on the list
    stays: list[int] = []  # how long each node that left the list was on it
    for k, d in enumerate(decisions, 1):
        for i in d.drain:
            on.setdefault(i, k)
        stays.extend(k - on.pop(i) for i in [i for i in on if i not in d.drain])
    assert len(stays) >= 6, "nodes were asked and taken back"
    assert set(stays) == {GRACE_MS / 1000}
    assert all(seconds + 1 - k <= GRACE_MS / 1000 for k in on.values()), "none is held past its grace"


def _decision(desired: int, drain: tuple[str, ...] = (), **inputs: float) -> AutoscaleDecision:
    return AutoscaleDecision(
        entity="pool/p", pool_id="p", current_nodes=8, desired_nodes=desired, drain=drain,
        reason="test", inputs=inputs,
    )  # fmt: skip


@pytest.mark.parametrize(("asked_ms_ago", "taken"), [(119_999, False), (120_000, True), (500_000, True)])
def test_the_grace_runs_from_when_the_node_was_asked(asked_ms_ago: int, taken: bool) -> None:
    """n7 asked ``asked_ms_ago``, n6 just now; the target (5) is left where it is."""
    snap = views_snapshot([node(f"n{i}") for i in range(8)])
    held = PoolDrains(("n7", "n6"), {"n7": NOW_MS - asked_ms_ago, "n6": NOW_MS}, {})
    d, kept = keep_draining(_decision(5), snap, held, GRACE_MS)
    assert d.desired_nodes == 5
    assert d.drain == (("n6",) if taken else ("n7", "n6"))
    assert kept.taken == ({"n7": 5} if taken else {})
    assert kept.since == ({"n6": NOW_MS} if taken else {"n7": NOW_MS - asked_ms_ago, "n6": NOW_MS})


def test_a_node_seen_leaving_restarts_its_grace_and_is_never_taken_back_while_it_leaves() -> None:
    """A node draining by its own telemetry (or stale: its actuator removed it) is leaving: its grace
    counts from the last tick it was seen so; should it report ready again, it has a whole grace."""
    views = [*(node(f"n{i}") for i in range(6)), node("n6", draining=True)]
    snap = views_snapshot(views)
    held = PoolDrains(("n6",), {"n6": NOW_MS - 500_000}, {})
    d, kept = keep_draining(_decision(5), snap, held, GRACE_MS)
    assert d.drain == ("n6",)
    assert kept.since == {"n6": NOW_MS}


def test_a_node_on_a_list_from_an_older_checkpoint_counts_its_grace_from_now() -> None:
    snap = views_snapshot([node(f"n{i}") for i in range(8)])
    d, kept = keep_draining(_decision(5), snap, PoolDrains(("n7",), {}, {}), GRACE_MS)
    assert d.drain == ("n7",)
    assert kept.since == {"n7": NOW_MS}


@pytest.mark.parametrize(
    ("desired", "listed", "free"),
    [
        (5, ("n5",), False),  # the target held: n7, taken back at 5, is not named again
        (6, ("n5",), False),  # risen: still not
        (4, ("n5", "n7"), True),  # fallen below 5: n7 may be named again
    ],
)
def test_a_node_taken_back_is_not_named_again_until_the_target_falls_below_its_take_back(
    desired: int, listed: tuple[str, ...], free: bool
) -> None:
    snap = views_snapshot([node(f"n{i}") for i in range(8)])
    held = PoolDrains((), {}, {"n7": 5})
    d, kept = keep_draining(_decision(desired, ("n5", "n7")), snap, held, GRACE_MS)
    assert d.drain == listed
    assert kept.taken == ({} if free else {"n7": 5})


def test_a_node_taken_back_and_gone_from_the_pool_is_forgotten() -> None:
    snap = views_snapshot([node(f"n{i}") for i in range(7)])
    _, kept = keep_draining(_decision(5), snap, PoolDrains((), {}, {"n7": 5}), GRACE_MS)
    assert kept == PoolDrains()


HPA = policy(autoscale={"type": "hpa"})


def test_an_autoscaler_naming_its_surplus_each_tick_does_not_drain_a_node_taken_back_again() -> None:
    """The Kubernetes HPA names its surplus afresh each tick (the newest nodes, highest ids first).
    Twelve idle nodes nobody removes: once the grace has taken them back (no lead in its decision:
    :data:`GRACE_WITHOUT_LEAD_S`), none is named again while the target stays; without the rule each
    was back on the list the next tick, a drain and a take-back every grace."""
    decisions = _lists(HPA, 900)
    first = next(k for k, d in enumerate(decisions) if d.drain)  # a step of 8, the other 3 next tick
    target = decisions[-1].desired_nodes
    assert target < len(IDS)
    grace = int(GRACE_WITHOUT_LEAD_S)
    assert all(d.desired_nodes == target for d in decisions[first + 1 :]), "the target stays"
    assert all(len(d.drain) == len(IDS) - target for d in decisions[first + 1 : first + grace])
    assert all(d.drain == () for d in decisions[first + grace + 1 :]), [
        (k, d.drain) for k, d in enumerate(decisions[first + grace :], first + grace) if d.drain
    ][:3]


def test_the_grace_is_the_autoscalers_lead_within_its_floor() -> None:
    env = envelope_of(builtin_policy("default"))
    assert drain_grace_ms(_decision(5, lead_s=300.0), env) == 300_000
    assert drain_grace_ms(_decision(5), env) == GRACE_WITHOUT_LEAD_S * 1000
    assert drain_grace_ms(_decision(5, lead_s=1.0), env) == env.stale_after_ms + env.window_ms


def _run_from(
    engine: Engine, model: FleetModel, seconds: range, restore: bool = False
) -> tuple[list[bytes], EngineState]:
    out: list[bytes] = []
    for k in seconds:
        now = T + k * 1_000
        apply(model, [telemetry(i, "p", ts_ms=now, **IDLE) for i in IDS])
        out += [
            decision_bytes(d)
            for d in engine.tick(snapshot(model, now), Tick(ts_ms=now, tick_id=k, pool_id="p")).decisions
        ]
    return out, engine.pools["p"]


def _copy(engine: Engine, state: EngineState) -> Engine:
    other = Engine(engine.policy)
    other.pools["p"] = state
    return other


def _checkpointed(state: EngineState, *, old: bool = False) -> EngineState:
    """``state`` through a checkpoint; ``old``: one written before the grace was kept."""
    tree = tree_of(encode(state))
    if old:
        for field in ("drains_taken", "drains_since"):
            edit_field(tree, "fleetloop.core.decide.engine:EngineState", field)
    restored = decode(blob_of(tree))
    assert isinstance(restored, EngineState)
    return restored


def test_the_drain_times_round_trip_through_a_checkpoint_and_an_older_one_restarts_the_grace() -> None:
    """Mid-grace (some nodes asked, some taken back): a restored engine decides byte for byte as the
    continuous one. A checkpoint written before the grace was kept has the list but not the times:
    it restores, and the nodes on the list count their grace from the restore."""
    engine, model = Engine(builtin_policy("default")), FleetModel()
    _, state = _run_from(engine, model, range(1, 300))
    assert state.drains_since["p"], "mid-grace"
    assert state.drains_taken["p"], "some taken back"
    restored = _checkpointed(state)
    assert (restored.drains_held, restored.drains_since, restored.drains_taken) == (
        state.drains_held, state.drains_since, state.drains_taken,
    )  # fmt: skip
    other_model = decode(encode(model))
    continuous, _ = _run_from(engine, model, range(300, 420))
    again, _ = _run_from(_copy(engine, restored), other_model, range(300, 420))
    assert again == continuous

    old = _checkpointed(state, old=True)
    assert old.drains_held == state.drains_held
    assert (old.drains_since, old.drains_taken) == ({}, {})
    _, after = _run_from(_copy(engine, old), decode(encode(other_model)), range(300, 301))
    assert set(after.drains_since["p"].values()) == {T + 300 * 1_000}
