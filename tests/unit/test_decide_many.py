"""``decide_many`` (a boundary's ticks, section by section) equals the loop of ``decide_plain`` (the
statement, ``tests.oracles.engine``), bit for bit: decisions in the same order per pool (their bytes
and fields set), states (pickled: what a checkpoint holds) and diagnostics (their bits and order),
over many ticks with state carried, on generated fleets with hostile values, silent and late pools,
under the shipped policies, in shadow mode, across policy changes that swap algorithms, and with
algorithms that decide many pools in one call (``decide_pools``) or draw from the tick's
generator."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from fleetloop.core.decide.engine import Engine, EngineState, TickResult, decide, decide_many
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult
from fleetloop.policies.registry import CompiledPolicy, Section, builtin_policy, compile_policy
from fleetloop.schemas import Tick
from fleetloop.schemas.policy import PolicyDocument
from tests.oracles.engine import decide_plain
from tests.support.perturbed import perturbed_snapshots
from tests.support.policies import foundation


def with_spec(policy: CompiledPolicy, **spec: Any) -> CompiledPolicy:
    data = policy.document.model_dump(mode="json")
    data["spec"].update(spec)
    return compile_policy(PolicyDocument.model_validate(data))


def section_shadow(policy: CompiledPolicy, *sections: str) -> CompiledPolicy:
    data = policy.document.model_dump(mode="json")
    for s in sections:
        data["spec"][s]["mode"] = "shadow"
    return compile_policy(PolicyDocument.model_validate(data))


def bits(result: TickResult) -> Any:
    return (
        [decision_bytes(d) for d in result.decisions],
        [sorted(d.model_fields_set) for d in result.decisions],
        [(k, v.hex()) for k, v in result.diagnostics.items()],
        pickle.dumps(result.state),
    )


def loop(
    snap: FleetSnapshot,
    policy: CompiledPolicy,
    states: Sequence[EngineState],
    ticks: Sequence[Tick],
    offsets: dict[str, int] | None,
) -> list[TickResult]:
    return [decide_plain(snap, policy, s, t, offsets) for s, t in zip(states, ticks, strict=True)]


def run_both(
    policies: Sequence[CompiledPolicy],
    *,
    n_nodes: int = 320,
    ticks: int = 30,
    seed: int = 11,
    shuffle: bool = True,
    extra_pools: Sequence[str] = (),
) -> set[str]:
    """Decide every tick both ways (policy ``k % len(policies)`` changes every 7 ticks), states
    carried separately; returns the kinds and reasons seen."""
    rng = np.random.default_rng(seed)
    plain: dict[str, EngineState] = {}
    many: dict[str, EngineState] = {}
    seen: set[str] = set()
    for k, snap in enumerate(perturbed_snapshots(n_nodes, ticks, seed=seed)):
        policy = policies[(k // 7) % len(policies)]
        pools = [*sorted(snap.pools), *extra_pools]
        if shuffle:
            pools = [pools[i] for i in rng.permutation(len(pools))]
        batch = [Tick(ts_ms=snap.now_ms, tick_id=k + 1, pool_id=p) for p in pools]
        offsets = {"fleetloop.telemetry:0": 7 * k, "fleetloop.requests:0": 11 * k}
        a = loop(snap, policy, [plain.get(p, EngineState()) for p in pools], batch, offsets)
        b = decide_many(snap, policy, [many.get(p, EngineState()) for p in pools], batch, offsets)
        assert len(a) == len(b) == len(pools)
        for p, x, y in zip(pools, a, b, strict=True):
            assert bits(x) == bits(y), (k, p)
            assert x.decisions == y.decisions
            plain[p], many[p] = x.state, y.state
            seen.update(f"{d.body.kind}:{d.policy.mode}:{getattr(d.body, 'reason', '')}" for d in y.decisions)
    return seen


def test_decide_many_equals_the_loop_under_the_shipped_default() -> None:
    seen = run_both([builtin_policy("default")], ticks=40)
    # The run went through more than the healthy path: ejections, fail-open, silent-pool freezes.
    reasons = {s.split(":", 2)[2] for s in seen}
    assert any("latency" in r or "consecutive" in r for r in reasons), sorted(seen)
    assert any("silent-pool-frozen" in r for r in reasons), sorted(seen)


def test_decide_many_equals_the_loop_across_policy_changes_that_swap_algorithms() -> None:
    seen = run_both(
        [builtin_policy("default"), builtin_policy("classic"), foundation(), builtin_policy("modern")],
        ticks=36,
        seed=5,
    )
    assert seen


def test_decide_many_equals_the_loop_in_shadow_mode() -> None:
    default = builtin_policy("default")
    eager = with_spec(
        foundation(),
        breaker={"type": "consecutive-errors", "params": {"threshold": 1, "base_ejection_ms": 2000}},
    )
    seen = run_both([with_spec(default, mode="shadow"), section_shadow(eager, "breaker", "autoscale"), eager])
    assert any(s.startswith("breaker:shadow:") for s in seen)
    assert any(s.startswith("routing:enforce:") for s in seen)


def test_decide_many_equals_the_loop_for_unknown_and_small_pools() -> None:
    # Pools the snapshot does not hold (no nodes, no outcomes) decided beside real ones.
    policies = [builtin_policy("default"), foundation()]
    run_both(policies, n_nodes=40, ticks=12, extra_pools=["ghost", "zz-gone"])


def test_decide_many_keeps_other_pools_states_as_decide_does() -> None:
    """A state holding other pools' (and a swapped-out algorithm's) entries is kept and filtered
    exactly as the statement does, key order included."""
    policy = builtin_policy("default")
    classic = builtin_policy("classic")
    snaps = list(perturbed_snapshots(80, 6))
    pools = sorted(snaps[-1].pools)
    merged = EngineState()
    for k, snap in enumerate(snaps[:5]):
        pol = classic if k < 3 else policy
        for p in pools:
            merged = decide(snap, pol, merged, Tick(ts_ms=snap.now_ms, tick_id=k + 1, pool_id=p)).state
    snap = snaps[-1]
    batch = [Tick(ts_ms=snap.now_ms, tick_id=9, pool_id=p) for p in reversed(pools)]
    a = loop(snap, classic, [merged] * len(batch), batch, None)
    b = decide_many(snap, classic, [merged] * len(batch), batch, None)
    assert [bits(x) for x in a] == [bits(y) for y in b]


class Batched:
    """The wrapped algorithm, with a ``decide_pools`` that records its calls and checks the
    engine's side of the protocol (pool-id order, distinct pools, one time and tick)."""

    def __init__(self, inner: Any, *, draw: bool = False, reverse: bool = False) -> None:
        self.inner = inner
        self.name = inner.name
        self.section = inner.section
        self.Params = inner.Params
        self.draw = draw
        self.reverse = reverse
        self.calls: list[int] = []

    def initial_state(self) -> Any:
        return self.inner.initial_state()

    def decide(self, snap: FleetSnapshot, params: Any, state: Any, ctx: PolicyContext) -> PolicyResult[Any]:
        result: PolicyResult[Any] = self.inner.decide(snap, params, state, ctx)
        if self.draw:  # a draw from the tick's generator, reported: a fresh generator per section
            figure = float(ctx.rng.random())
            result = replace(result, diagnostics={**result.diagnostics, "draw": figure})
        return result

    def decide_pools(
        self, snap: FleetSnapshot, params: Any, states: Sequence[Any], ctxs: Sequence[PolicyContext]
    ) -> list[PolicyResult[Any]]:
        ids = [c.pool_id for c in ctxs]
        assert ids == sorted(set(ids))
        assert len({(c.now_ms, c.tick_id, c.tick_ms, id(c.slo)) for c in ctxs}) == 1
        self.calls.append(len(ctxs))
        out = [self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]
        return out[::-1] if self.reverse else out


def batched(policy: CompiledPolicy, **how: Any) -> tuple[CompiledPolicy, dict[str, Batched]]:
    wrapped: dict[str, Batched] = {}
    sections = dict(policy.sections)
    for name, sec in policy.sections.items():
        wrapped[name] = Batched(sec.algorithm, **how)
        sections[name] = Section(algorithm=wrapped[name], params=sec.params, mode=sec.mode)  # type: ignore[arg-type]
    return replace(policy, sections=sections), wrapped


def test_decide_many_calls_decide_pools_once_per_section_and_batch() -> None:
    policy, wrapped = batched(builtin_policy("default"))
    run_both([policy], n_nodes=200, ticks=8)
    for algo in wrapped.values():
        assert len(algo.calls) == 8, algo.calls
        assert min(algo.calls) >= 2, algo.calls


def test_decide_many_gives_each_section_a_fresh_generator() -> None:
    """Algorithms that draw from ``ctx.rng`` in several sections draw what they would in
    :func:`decide` (the engine keeps a context across sections only while nothing drew from it)."""
    policy, _ = batched(builtin_policy("default"), draw=True)
    run_both([policy], n_nodes=120, ticks=5)
    plain_routing = builtin_policy("default").sections["routing"]
    mixed = replace(policy, sections={**policy.sections, "routing": plain_routing})
    run_both([mixed], n_nodes=120, ticks=5)


def test_the_equality_check_catches_a_decide_pools_that_breaks_the_protocol() -> None:
    policy, _ = batched(builtin_policy("default"), reverse=True)
    with pytest.raises(AssertionError):
        run_both([policy], n_nodes=120, ticks=3)


def test_engine_tick_many_equals_engine_tick() -> None:
    policy = builtin_policy("default")
    one, many = Engine(policy), Engine(policy)
    for k, snap in enumerate(perturbed_snapshots(160, 10, seed=3)):
        batch = [Tick(ts_ms=snap.now_ms, tick_id=k + 1, pool_id=p) for p in sorted(snap.pools)]
        a = [one.tick(snap, t) for t in batch]
        b = many.tick_many(snap, batch)
        assert [bits(x) for x in a] == [bits(y) for y in b]
    assert pickle.dumps(one.state) == pickle.dumps(many.state)


def test_decide_many_refuses_a_batch_that_is_not_one_boundary() -> None:
    snap = next(iter(perturbed_snapshots(40, 1)))
    policy = foundation()
    (pool, *_) = sorted(snap.pools)
    t = Tick(ts_ms=snap.now_ms, tick_id=1, pool_id=pool)
    assert decide_many(snap, policy, [], []) == []
    with pytest.raises(ValueError, match="one tick per pool"):
        decide_many(snap, policy, [EngineState()] * 2, [t, t])
    other = t.model_copy(update={"tick_id": 2, "pool_id": "x"})
    with pytest.raises(ValueError, match="share ts_ms and tick_id"):
        decide_many(snap, policy, [EngineState()] * 2, [t, other])
    with pytest.raises(ValueError, match="states"):
        decide_many(snap, policy, [], [t])


def test_the_wrappers_shared_fields_set_is_never_changed_in_place() -> None:
    snap = next(iter(perturbed_snapshots(40, 1)))
    ticks = [Tick(ts_ms=snap.now_ms, tick_id=1, pool_id=p) for p in sorted(snap.pools)]
    (first, *_), *_ = [
        r.decisions for r in decide_many(snap, foundation(), [EngineState()] * len(ticks), ticks)
    ]
    shared = first.model_fields_set
    copied = first.model_copy(update={"tick_id": 2})
    assert copied.model_fields_set is not shared
    assert shared == {"ts_ms", "tick_id", "policy", "input_offsets", "body"}
