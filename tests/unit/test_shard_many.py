"""A shard deciding a boundary's ticks in one call (``Shard.decide_many``, ``decide_shadow_many``)
gives each tick what ``Shard.decide`` / ``decide_shadow`` give one by one, and leaves the shard as
they do (its checkpoint, byte for byte): duplicates, pools without data, unknown pools, a tick whose
decision raises (it costs only itself), a shadow policy that comes and goes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from fleetloop.bench.fleetgen import BASE_TS_MS, make_fleet, outcomes_at, telemetry_at
from fleetloop.core.checkpoint import encode
from fleetloop.core.shard import INPUTS, Row, Shadow, Shard
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult
from fleetloop.policies.registry import CompiledPolicy, Section, builtin_policy, compile_policy
from fleetloop.schemas import Tick
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.policy import PolicyDocument
from fleetloop.schemas.topics import REQUESTS, TELEMETRY


def records(n_nodes: int, seconds: int, seed: int = 4) -> tuple[dict[str, list[Row]], list[str]]:
    """A generated fleet's telemetry and outcomes as one shard's rows (broker time = event time),
    with one pool failing its calls for a while and one pool reporting only late."""
    fleet = make_fleet(n_nodes, seed=seed, degraded_per_1000=30.0)
    pools = sorted(fleet.pool_ids)
    rows: dict[str, list[Row]] = {TELEMETRY: [], REQUESTS: []}
    for s in range(seconds):
        ts = BASE_TS_MS + (s + 1) * 1000
        for t in telemetry_at(fleet, ts):
            if t.pool_id == pools[-1] and s < 6:
                continue
            rows[TELEMETRY].append(Row(len(rows[TELEMETRY]), t.ts_ms, t))
        for o in outcomes_at(fleet, ts, workflow_base=s * n_nodes * 2):
            if o.pool_id == pools[0] and 5 <= s < 12:
                o = o.model_copy(update={"outcome": "error", "ttft_ms": None, "task_outcome": None})
            rows[REQUESTS].append(Row(len(rows[REQUESTS]), o.ts_ms, o))
        for k in INPUTS:
            rows[k].sort(key=lambda r: (r.timestamp_ms, r.offset))
            rows[k] = [Row(i, r.timestamp_ms, r.item) for i, r in enumerate(rows[k])]
    return rows, pools


def cut_at(rows: dict[str, list[Row]], ts: int) -> dict[str, int]:
    return {k: sum(1 for r in rows[k] if r.timestamp_ms <= ts) for k in INPUTS}


class Flaky:
    """The wrapped algorithm, raising for one pool on some ticks (a tick whose decision fails)."""

    def __init__(self, inner: Any, pool: str, ticks: set[int]) -> None:
        self.inner, self.pool, self.ticks = inner, pool, ticks
        self.name, self.section, self.Params = inner.name, inner.section, inner.Params

    def initial_state(self) -> Any:
        return self.inner.initial_state()

    def decide(self, snap: FleetSnapshot, params: Any, state: Any, ctx: PolicyContext) -> PolicyResult[Any]:
        if ctx.pool_id == self.pool and ctx.tick_id in self.ticks:
            raise ValueError(f"flaky {ctx.pool_id} {ctx.tick_id}")
        return self.inner.decide(snap, params, state, ctx)  # type: ignore[no-any-return]


def flaky(policy: CompiledPolicy, section: str, pool: str, ticks: set[int]) -> CompiledPolicy:
    sec = policy.sections[section]
    wrapped = Section(algorithm=Flaky(sec.algorithm, pool, ticks), params=sec.params, mode=sec.mode)  # type: ignore[arg-type]
    return replace(policy, sections={**policy.sections, section: wrapped})


def shadow_of(name: str) -> Shadow:
    data = builtin_policy(name).document.model_dump(mode="json")
    data["metadata"].update(name="default", version=7)
    data["spec"]["mode"] = "shadow"
    return Shadow.of(compile_policy(PolicyDocument.model_validate(data)))


def outcome_bits(out: Any) -> Any:
    if out is None or isinstance(out, Exception):
        return repr(out)
    return [decision_bytes(d) for d in out]


def test_shard_decide_many_equals_decide_one_by_one() -> None:
    rows, pools = records(200, 16)
    base = builtin_policy("default")
    shadow = shadow_of("classic")
    tick_of = [(BASE_TS_MS + (s + 1) * 1000) // 1000 for s in range(16)]
    policy = flaky(base, "routing", pools[1], {tick_of[s] for s in (2, 3, 4, 8, 9)})
    shadow = replace(shadow, runner=flaky(shadow.runner, "admission", pools[2], {tick_of[5], tick_of[6]}))
    one, many = Shard(0), Shard(0)
    rng = np.random.default_rng(2)
    seen: set[str] = set()
    for s in range(16):
        ts = BASE_TS_MS + (s + 1) * 1000
        cut = cut_at(rows, ts)
        for shard in (one, many):
            for logical in INPUTS:
                shard.add(logical, rows[logical][shard.read[logical] : cut[logical]])
        batch = [*pools, "ghost"]
        batch = [batch[i] for i in rng.permutation(len(batch))]
        if s % 5 == 3:
            batch = batch[: len(batch) // 2]  # part of the boundary now, the rest again below
        ticks = [Tick(ts_ms=ts, tick_id=ts // 1000, pool_id=p) for p in batch]
        active = shadow if s % 7 != 6 else None
        a: list[Any] = []
        for t in ticks:
            try:
                out: Any = one.decide(t, cut, policy)
            except Exception as exc:
                out = exc
            a.append(out)
        a_shadow = []
        for t, out in zip(ticks, a, strict=True):
            if out and not isinstance(out, Exception):
                try:
                    a_shadow.append(outcome_bits(one.decide_shadow(t, active)))
                except Exception as exc:
                    a_shadow.append(repr(exc))
        b = many.decide_many(ticks, cut, policy)
        decided = [t for t, out in zip(ticks, b, strict=True) if out and not isinstance(out, Exception)]
        b_shadow = [outcome_bits(x) for x in many.decide_shadow_many(decided, active)]
        assert [outcome_bits(x) for x in a] == [outcome_bits(x) for x in b], s
        assert a_shadow == b_shadow, s
        assert encode(one.checkpoint_value()) == encode(many.checkpoint_value()), s
        # The same ticks again: duplicates (None) but for pools without data (nothing remembered).
        again = many.decide_many(ticks, cut, policy)
        assert again == [() if x == () else None for x in b]
        assert [outcome_bits(one.decide(t, cut, policy)) for t in ticks] == [outcome_bits(x) for x in again]
        assert encode(one.checkpoint_value()) == encode(many.checkpoint_value()), s
        for out in b:
            if isinstance(out, Exception):
                seen.add("failed")
            elif out is None:
                seen.add("duplicate")
            elif out == ():
                seen.add("no-data")
            else:
                seen.add("decided")
                seen.update(d.body.kind for d in out if isinstance(d, Decision))
    assert {"failed", "no-data", "decided", "breaker", "routing"} <= seen, seen


def test_shard_decide_many_with_one_tick_per_pool_and_nothing_folded_yet() -> None:
    rows, pools = records(48, 3)
    policy = builtin_policy("default")
    one, many = Shard(0), Shard(0)
    ts = BASE_TS_MS + 3000
    cut = cut_at(rows, ts)
    for shard in (one, many):
        for logical in INPUTS:
            shard.add(logical, rows[logical][: cut[logical]])
    ticks = [Tick(ts_ms=ts, tick_id=ts // 1000, pool_id=p) for p in pools]
    a = [one.decide(t, cut, policy) for t in ticks]
    b = many.decide_many(ticks, cut, policy)
    assert [outcome_bits(x) for x in a] == [outcome_bits(x) for x in b]
    assert encode(one.checkpoint_value()) == encode(many.checkpoint_value())
    assert many.decide_many([], cut, policy) == []


def test_the_decider_decides_a_boundarys_ticks_in_batches_as_it_did_one_by_one() -> None:
    """``Decider.decide_ready`` with every tick kind held in two shards' queues (boundaries with a
    cut header, a tick without one, a duplicate record, a skipped record, a troubled pool, a tick
    whose decision raises) stages the same decisions in the same order, counts the same outcomes and
    leaves the shards as deciding each tick with ``Shard.decide`` in queue order (troubled first)."""
    from fleetloop.daemon.runtime.partition import HeldTick
    from tests.support.runtime_harness import Rig, on_rig

    rows, pools = records(160, 8)
    base = builtin_policy("default")
    policy = flaky(base, "batching", pools[3], {(BASE_TS_MS + 5000) // 1000})

    class Consumer:
        def highwater(self, tp: Any) -> None:
            return None  # unknown: a tick without a cut waits max_tick_hold_s (long past here)

    staged: list[bytes] = []

    class Publisher:
        async def stage(self, decisions: Any, shadow: Any = ()) -> None:
            staged.extend(decision_bytes(d) for d in (*shadow, *decisions))

        async def settle(self) -> bool:  # a tripping pool's decisions, acknowledged at once
            return True

    async def check(r: Rig) -> None:
        decider = r.decider()
        failed = 0
        reference = {p: Shard(p) for p in (0, 1)}
        expected: list[bytes] = []
        halves = {0: pools[0::2], 1: pools[1::2]}  # each shard its own pools (one input stream: a test)
        offset = {0: 0, 1: 0}
        for s in range(8):
            ts = BASE_TS_MS + (s + 1) * 1000
            cut = cut_at(rows, ts)
            queues: dict[int, list[HeldTick]] = {}
            for p in (0, 1):
                shard = (r.parts[p] if p in r.parts else r.own(p)).shard
                for sh in (shard, reference[p]):
                    for logical in INPUTS:
                        sh.add(logical, rows[logical][sh.read[logical] : cut[logical]])
                ticks = [Tick(ts_ms=ts, tick_id=ts // 1000, pool_id=q) for q in halves[p]]
                held = [HeldTick(offset[p] + k, t, ts, dict(cut), None, 0.0) for k, t in enumerate(ticks)]
                if s == 2 and p == 0:  # a duplicate record of the boundary's first tick, then a skipped one
                    held.insert(3, replace(held[0], offset=-1))
                    held.append(HeldTick(-1, ticks[1], ts, None, "outage", 0.0))
                if s == 4 and p == 1:  # a tick without a cut header (its cut from its record time)
                    held[-1] = replace(held[-1], cut=None)
                for k, h in enumerate(held):
                    held[k] = replace(h, offset=offset[p] + k)
                offset[p] += len(held)
                queues[p] = held
                r.parts[p].held = list(held)
            # The reference: troubled ticks of each shard's head boundary first, then the queue in order.
            troubled = {p: reference[p].troubled(queues[p][0].cut or {}) for p in (0, 1)}
            early: set[tuple[int, int]] = set()
            order = [
                (p, h)
                for p in (0, 1)
                for h in queues[p]
                if h.tick is not None
                and h.skipped is None
                and h.cut == queues[p][0].cut
                and h.tick.pool_id in troubled[p]
            ]
            order += [(p, h) for p in (0, 1) for h in queues[p]]
            for p, h in order:
                if (p, h.offset) in early:
                    continue
                early.add((p, h.offset))
                assert h.tick is not None
                if h.skipped is not None:
                    reference[p].skip(h.tick)
                    continue
                try:
                    out = reference[p].decide(
                        h.tick, h.cut or reference[p].cut_by_time(h.timestamp_ms), policy
                    )
                except Exception:
                    failed += 1
                    continue
                if out:
                    expected.extend(decision_bytes(d) for d in out)
            await decider.decide_ready()
            assert staged == expected, s
            assert r.stats.ticks_failed == failed, s
            for p in (0, 1):
                assert r.parts[p].held == []
                assert r.parts[p].shard.ticks_at == offset[p]
                reference[p].ticks_at = offset[p]
                assert encode(r.parts[p].shard.checkpoint_value()) == encode(
                    reference[p].checkpoint_value()
                ), s
        assert failed >= 1
        assert r.stats.ticks_duplicate >= 1
        assert r.stats.ticks_skipped >= 0

    on_rig(check, consumer=Consumer(), publisher=Publisher(), policy=policy)
