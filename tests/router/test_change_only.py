"""Change-only breaker records (:mod:`fleetloop.policies.breaker.emission`) seen from a router.

A router keeps the newest breaker record per node (:class:`fleetloop.router.state.DesiredState`),
so the change-only stream must leave it, at every tick, with the same per-node breaker view (the
state fields, and which nodes are ejected) as the full stream, one record per node per tick, did.
The full stream is the same engine run with each breaker's memory of what it emitted cleared
before every tick (no rule reads it: an ejection enforced is held to its end by the engine, whose
memory of what it let out is kept in both runs). Keyframes must reach every node of a pool
within ``KEYFRAME_TICKS`` ticks, also after ticks that were not decided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from fleetloop.core.decide.engine import EngineState, decide
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.policies.base import FleetSnapshot, PolicyContext
from fleetloop.policies.breaker.emission import (
    KEYFRAME_TICKS,
    emits,
    fields_of,
    keyframe,
    keyframe_residue,
    phase,
)
from fleetloop.policies.breaker.latency_outlier import LatencyOutlier, LatencyOutlierParams
from fleetloop.policies.registry import CompiledPolicy, builtin_policy, compile_policy, parse_document
from fleetloop.router.state import DesiredState
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import BreakerDecision, Decision
from tests.support.bench_fleet import bench_snapshots
from tests.support.perturbed import perturbed_snapshots


def _with_breaker(name: str, params: dict[str, Any] | None = None) -> CompiledPolicy:
    doc = builtin_policy("default").document.model_dump(mode="json")
    doc["metadata"]["name"] = f"change-only-{name}"
    doc["spec"]["breaker"] = {"type": name, "params": params or {}}
    return compile_policy(parse_document(doc, "test"))


def _policies() -> dict[str, CompiledPolicy]:
    return {
        "default": builtin_policy("default"),  # latency-outlier
        "classic": builtin_policy("classic"),  # envoy-outlier
        "consecutive-errors": _with_breaker("consecutive-errors", {"threshold": 2, "base_ejection_ms": 3000}),
        "never": _with_breaker("never"),
    }


def _forget_emitted(state: EngineState) -> EngineState:
    """The breakers' memory of what they emitted cleared: every node's decision is emitted."""
    algos = {}
    for key, s in state.algorithms.items():
        if key[0] == "breaker":
            s = dataclasses.replace(s, emitted={}) if dataclasses.is_dataclass(s) else {}
        algos[key] = s
    return dataclasses.replace(state, algorithms=algos)


def _run(
    snaps: list[FleetSnapshot], policy: CompiledPolicy, *, full: bool
) -> Iterator[tuple[FleetSnapshot, list[Decision]]]:
    state = EngineState()
    for k, snap in enumerate(snaps):
        out: list[Decision] = []
        for pool_id in sorted(snap.pools):
            if full:
                state = _forget_emitted(state)
            result = decide(snap, policy, state, Tick(ts_ms=snap.now_ms, tick_id=1000 + k, pool_id=pool_id))
            state = result.state
            out.extend(result.decisions)
        yield snap, out


def _view(router: DesiredState, snap: FleetSnapshot) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pool_id in sorted(snap.pools):
        for n in snap.pool_nodes(pool_id):
            b = router.breakers.get(n.node_id)
            out[n.node_id] = (None if b is None else fields_of(b), router.ejected(n.node_id))
    return out


@pytest.mark.parametrize("name", ["default", "classic", "consecutive-errors", "never"])
def test_a_router_fed_the_change_only_stream_holds_the_full_streams_view_at_every_tick(name: str) -> None:
    policy = _policies()[name]
    snaps = list(perturbed_snapshots(240, 70))
    changed, full = DesiredState(), DesiredState()
    sent = {"change-only": 0, "full": 0}
    states: set[str] = set()
    for (snap, a), (_, b) in zip(
        _run(snaps, policy, full=False), _run(snaps, policy, full=True), strict=True
    ):
        # Everything but the breaker records is the same bytes: the later sections and the engine's
        # shaping read an absent breaker as closed-unchanged, which it is.
        assert [decision_bytes(d) for d in a if d.body.kind != "breaker"] == [
            decision_bytes(d) for d in b if d.body.kind != "breaker"
        ]
        for d in a:
            changed.accept(d, 0.0)
        for d in b:
            full.accept(d, 0.0)
        assert _view(changed, snap) == _view(full, snap)
        # Every node not closed is in the change-only stream of this very tick.
        in_a = {d.body.node_id for d in a if isinstance(d.body, BreakerDecision)}
        for d in b:
            if isinstance(d.body, BreakerDecision) and d.body.state != "closed":
                assert d.body.node_id in in_a
        sent["change-only"] += sum(isinstance(d.body, BreakerDecision) for d in a)
        sent["full"] += sum(isinstance(d.body, BreakerDecision) for d in b)
        states.update(d.body.state for d in b if isinstance(d.body, BreakerDecision))
    assert sent["change-only"] < sent["full"] / 3, sent
    if name != "never":
        assert "open" in states, states  # the run tripped breakers, not only "closed, healthy"


def _steady(n_nodes: int, ticks: int) -> Iterator[FleetSnapshot]:
    return bench_snapshots(n_nodes, ticks, seed=3, outcomes_per_node=1.5, workflow_stride=4)


def test_keyframes_cover_every_node_within_k_ticks_also_across_undecided_ticks() -> None:
    algo, params = LatencyOutlier(), LatencyOutlierParams()
    snaps = list(_steady(400, 4 * KEYFRAME_TICKS + 10))
    fleet = len(snaps[-1].nodes)
    states: dict[str, Any] = {}
    last: dict[str, int] = {}  # node -> tick of its newest record
    decided = [*range(0, 2 * KEYFRAME_TICKS + 5), *range(4 * KEYFRAME_TICKS, 4 * KEYFRAME_TICKS + 10)]
    per_tick: list[int] = []
    for t in decided:
        snap = snaps[t]
        tick_id = 500 + t
        count = 0
        for pool_id in sorted(snap.pools):
            ctx = PolicyContext(now_ms=snap.now_ms, tick_id=tick_id, tick_ms=1000, pool_id=pool_id, seed=(t,))
            r = algo.decide(snap, params, states.get(pool_id, algo.initial_state()), ctx)
            states[pool_id] = r.state
            for d in r.decisions:
                last[d.node_id] = tick_id  # type: ignore[union-attr]
            count += len(r.decisions)
            for n in snap.pool_nodes(pool_id):
                assert 0 <= tick_id - last[n.node_id] < KEYFRAME_TICKS, (n.node_id, tick_id, last[n.node_id])
        per_tick.append(count)
    # Steady state (after the first tick, before the gap): about 1/K of the fleet a tick, staggered.
    steady = per_tick[KEYFRAME_TICKS : 2 * KEYFRAME_TICKS]
    assert max(steady) < fleet / KEYFRAME_TICKS * 3, steady
    assert sum(steady) >= fleet * 0.9, steady  # every node about once in K ticks (a few changed more)
    # The first tick after the gap re-sends every node (their records became too old), once.
    gap = decided.index(4 * KEYFRAME_TICKS)
    assert per_tick[gap] >= fleet
    assert per_tick[gap + 1] < fleet / KEYFRAME_TICKS * 3


def test_the_rule() -> None:
    closed = ("closed", True, 0.0, None, "healthy", 0)
    node_id = "p/7"
    t = 1000
    while keyframe(node_id, t):
        t += 1
    assert keyframe_residue(t) != phase(node_id)
    assert not emits(node_id, closed, (closed, t - 1), t)  # unchanged, not its keyframe
    assert emits(node_id, closed, None, t)  # never emitted
    assert emits(node_id, closed, (("closed", True, 0.0, None, "latency-suspect", 0), t - 1), t)  # reason
    assert emits(node_id, closed, (("closed", True, 0.0, None, "healthy", 1), t - 1), t)  # ejections
    assert emits(
        node_id, ("open", True, 0.0, 5, "ejected", 1), (("open", True, 0.0, 5, "ejected", 1), t - 1), t
    )
    assert emits(
        node_id,
        ("half_open", True, 0.05, None, "probe", 1),
        (("half_open", True, 0.05, None, "probe", 1), t - 1),
        t,
    )
    assert emits(node_id, closed, (closed, t - KEYFRAME_TICKS), t)  # too old
    assert emits(node_id, closed, (closed, t + 1), t)  # from a later tick
    k = t + (keyframe_residue(t) - phase(node_id)) % KEYFRAME_TICKS
    assert keyframe(node_id, k)
    assert emits(node_id, closed, (closed, k - 1), k)


def test_the_schema_states_the_keyframe_period() -> None:
    assert f"at least once every {KEYFRAME_TICKS} ticks" in (BreakerDecision.__doc__ or "")
