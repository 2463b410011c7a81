"""cache-aware's ``decide_pools`` (every pool of a batch at once) equals the loop of its ``decide``: the
same decisions (bytes and fields set), states (bit for bit) and diagnostics, tick after tick with
each form's state carried, on the bench fleet, on fleets that misbehave (hostile values, nodes that
join, leave, go cold, drain, go silent), on odd small fleets, and on generated sequences."""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from fleetloop.policies.base import FleetSnapshot, NodeView, PolicyContext, PolicyResult
from fleetloop.policies.memory import PoolMemory
from fleetloop.policies.routing import cache_aware
from fleetloop.policies.routing.cache_aware import CacheAware, CacheAwareParams
from fleetloop.policies.routing.cache_aware import batch as ca_batch
from fleetloop.policies.slo import DEFAULT_BOOK, Slo, SloBook
from fleetloop.schemas.decisions import RoutingDecision
from pydantic import ValidationError
from tests.oracles import cache_aware as ca_oracle
from tests.policies.snapshots import NOW_MS, node, pool, snapshot
from tests.support.bench_fleet import bench_snapshots
from tests.support.perturbed import perturbed_snapshots

ALGO = CacheAware()
# A memory grows (doubling its slots) on ticks 0, 1, 2, 4, 8 and 16 of a run where every node
# reports a step time each tick; from tick 1 on (a memory with a slot) the batch grows it too, so a
# short run of 8 ticks has 7 batched ones and 3 that grow (1, 2, 4).
TICKS = 8

# Parameters that make the rarer branches common: a class floor most nodes miss, a class with its
# own alpha and one without, affinity for every scoring node, a short memory (slots freed often).
EDGY = CacheAwareParams(
    alpha=1.0,
    alpha_by_priority={"0": 16.0, "2": 0.5},
    min_score_by_priority={"0": 0.9, "1": 0.99, "3": 0.0},
    affinity_keep_frac=0.0,
    affinity_min_speed=0.0,
    speed_memory_ms=3_000,
    silent_after_ms=1_500,
    spill_min_headroom=0.0,
    picker="least-outstanding",
)
# Bounds met exactly: the best node is at its own keep line; idle nodes score exactly 1.0, the
# class floor; a class whose alpha is the pools' alpha.
EXACT = CacheAwareParams(
    affinity_keep_frac=1.0, min_score_by_priority={"0": 1.0}, alpha_by_priority={"0": 6.0, "1": 4.0}
)
PARAMS = [CacheAwareParams(), EDGY, EXACT]
PARAM_IDS = ["default", "edgy", "exact"]


def contexts(snap: FleetSnapshot, pool_ids: Iterable[str], tick_id: int = 1) -> list[PolicyContext]:
    """On odd ticks the SLO book names the first pool (a class of its own), so the batch's
    per-pool prefill figures are remembered per pool there and per model and GPU otherwise."""
    ids = list(pool_ids)
    book = DEFAULT_BOOK
    if ids and tick_id % 2:
        book = SloBook(default=Slo(800.0, 50.0), by_pool={(1, ids[0]): Slo(300.0, 40.0)})
    return [
        PolicyContext(
            now_ms=snap.now_ms, tick_id=tick_id, tick_ms=1000, pool_id=p, seed=(tick_id, k), slo=book
        )
        for k, p in enumerate(ids)
    ]


def state_bits(state: Any) -> Any:
    assert isinstance(state, PoolMemory)
    return (
        state.node_ids,
        state.ts.dtype.str,
        state.ts.shape,
        state.ts.tobytes(),
        state.vals.dtype.str,
        state.vals.shape,
        state.vals.tobytes(),
    )


def same(a: PolicyResult[Any], b: PolicyResult[Any]) -> None:
    assert [d.model_dump_json() for d in a.decisions] == [d.model_dump_json() for d in b.decisions]
    assert [d.model_fields_set for d in a.decisions] == [d.model_fields_set for d in b.decisions]
    assert [type(d) for d in a.decisions] == [type(d) for d in b.decisions]
    assert a.decisions == b.decisions
    for x, y in zip(a.decisions, b.decisions, strict=True):
        if isinstance(x, RoutingDecision) and isinstance(y, RoutingDecision):
            # Tuples stay tuples, floats floats, in the same key order (JSON would not show it all).
            assert list(x.weights.items()) == list(y.weights.items())
            assert {k: list(v.items()) for k, v in x.by_priority.items()} == {
                k: list(v.items()) for k, v in y.by_priority.items()
            }
            assert list(x.prefix_affinity.items()) == list(y.prefix_affinity.items())
            assert [type(v) for v in x.prefix_affinity.values()] == [
                type(v) for v in y.prefix_affinity.values()
            ]
            assert [v.hex() for v in x.weights.values()] == [v.hex() for v in y.weights.values()]
            assert [v.hex() for v in x.inputs.values()] == [v.hex() for v in y.inputs.values()]
            assert type(x.spill_to) is type(y.spill_to)
            assert list(x.slo_prompt_tokens.items()) == list(y.slo_prompt_tokens.items())
    assert list(a.diagnostics) == list(b.diagnostics)
    assert [float(v).hex() for v in a.diagnostics.values()] == [
        float(v).hex() for v in b.diagnostics.values()
    ]
    assert state_bits(a.state) == state_bits(b.state)


class Chains:
    """The loop of ``decide`` and ``decide_pools``, each carrying its own states, compared per tick;
    counts the pools ``decide_pools`` left to the per-pool form (to show the batch path was taken)."""

    def __init__(self, params: CacheAwareParams, monkeypatch: pytest.MonkeyPatch) -> None:
        self.params = params
        self.plain: dict[str, Any] = {}
        self.fast: dict[str, Any] = {}
        self.batched = 0
        self.pools = 0
        self.refused = 0
        self._inside = False
        self._left = 0
        decide = ca_batch.decide_pool

        def counting(*args: Any) -> Any:
            if self._inside:
                self._left += 1
            return decide(*args)

        monkeypatch.setattr(ca_batch, "decide_pool", counting)

    def tick(self, snap: FleetSnapshot, pool_ids: Sequence[str], tick_id: int = 1) -> list[PolicyResult[Any]]:
        ctxs = contexts(snap, pool_ids, tick_id)
        plain: list[PolicyResult[Any]] = []
        refused: list[PolicyContext] = []
        for c in ctxs:
            try:
                plain.append(
                    ALGO.decide(snap, self.params, self.plain.get(c.pool_id, ALGO.initial_state()), c)
                )
            except ValidationError:  # a figure out of the schema's bounds (NaN from a view)
                refused.append(c)
        if refused:
            # Whatever a pool's ``decide`` refuses, the batch refuses too; the others are decided
            # without it (as an engine that retries a refused batch pool by pool would).
            for c in refused:
                with pytest.raises(ValidationError):
                    ALGO.decide_pools(
                        snap, self.params, [self.fast.get(c.pool_id, ALGO.initial_state())], [c]
                    )
            ctxs = [c for c in ctxs if c not in refused]
            pool_ids = [c.pool_id for c in ctxs]
            self.refused += len(refused)
        # A fresh snapshot of the same content would do as well; the shared one checks the memos too.
        self._inside, self._left = True, 0
        fast = ALGO.decide_pools(
            snap, self.params, [self.fast.get(p, ALGO.initial_state()) for p in pool_ids], ctxs
        )
        self._inside = False
        assert len(fast) == len(plain)
        for c, a, b in zip(ctxs, plain, fast, strict=True):
            same(a, b)
            self.plain[c.pool_id], self.fast[c.pool_id] = a.state, b.state
        self.pools += len(ctxs)
        self.batched += len(ctxs) - self._left
        return fast


@pytest.mark.parametrize("params", PARAMS, ids=PARAM_IDS)
def test_bench_fleet_many_ticks(params: CacheAwareParams, monkeypatch: pytest.MonkeyPatch) -> None:
    chains = Chains(params, monkeypatch)
    seen_affinity = seen_spill = seen_classes = 0
    for k, snap in enumerate(bench_snapshots(700, 30)):
        results = chains.tick(snap, sorted(snap.pools), k)
        for r in results:
            (d,) = r.decisions
            assert isinstance(d, RoutingDecision)
            seen_affinity += bool(d.prefix_affinity)
            seen_spill += bool(d.spill_to)
            seen_classes += bool(d.by_priority)
    # Every pool is batched but on the first tick (its memory holds no node yet), the ticks whose
    # memories grow (1, 2, 4, 8, 16 with the default 20 s memory) included.
    n_pools = chains.pools // 30
    assert chains.batched == chains.pools - n_pools, (chains.batched, chains.pools)
    assert seen_affinity
    assert seen_spill
    assert seen_classes


@pytest.mark.parametrize("params", PARAMS, ids=PARAM_IDS)
def test_misbehaving_fleet(params: CacheAwareParams, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes cycle cold/loading/warm, drain, go silent and are forgotten, lose or zero their step
    times, report huge queues and no free HBM; a pool goes silent, another joins late."""
    chains = Chains(params, monkeypatch)
    reasons: set[str] = set()
    for k, snap in enumerate(perturbed_snapshots(320, 45)):
        for r in chains.tick(snap, sorted(snap.pools), k):
            reasons.update(d.reason for d in r.decisions)
    assert chains.batched > 0.3 * chains.pools, (chains.batched, chains.pools)
    assert "cache-aware" in reasons


def test_a_subset_of_pools_in_any_batch_and_pools_without_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine may hand any subset of pools (a shard), including pools the snapshot does not hold
    and pools with no node; the order is the batch's own."""
    chains = Chains(CacheAwareParams(), monkeypatch)
    for k, snap in enumerate(bench_snapshots(300, 24, seed=3)):
        pools = sorted(snap.pools)
        batch = [p for i, p in enumerate(pools) if (i + k) % 3] + ["no-such-pool"]
        chains.tick(snap, batch, k)
    assert chains.batched > 0


def _hostile(rng: np.random.Generator, node_id: str, pool_id: str, gpus: int) -> NodeView:
    """A node with values from grids that hold hostile ones (what a view can carry)."""
    tbt = rng.choice([None, 0.0, -0.0, 5e-324, 1.0, 2.0, 2.0, 30.0, 1e308, 1e308])
    return node(
        node_id,
        pool_id=pool_id,
        weights_state=str(rng.choice(["warm"] * 6 + ["cold", "loading"])),
        draining=bool(rng.random() < 0.05),
        stale=bool(rng.random() < 0.05),
        age_ms=int(rng.choice([0, 0, 1000, 1500, 2999, 3000, 3001, 10**15])),
        queue_depth=int(rng.choice([0, 1, 4, 10**9, 10**15])),
        running_requests=int(rng.choice([0, 16, 10**12])),
        queued_prompt_tokens=int(rng.choice([0, 8192, 10**12])),
        max_batch_tokens=int(rng.choice([0, 1, 8192])),
        kv_cache_used_frac=float(rng.choice([0.0, 0.5, 1.0, -0.0])),
        hbm_free_gib=float(rng.choice([0.0, -0.0, 1e-300, 0.5, 1.0, 3.0, 7.5, 1e6, 1e308])),
        tbt_p50_ms=None if tbt is None else float(tbt),
        hot_prefixes=tuple(f"d{x}" for x in rng.choice(12, size=int(rng.integers(0, 5)))),
        consecutive_failures=int(rng.choice([0, 0, 1])),
        ok_w=int(rng.choice([0, 1, 5])),
        gpu_count=gpus if rng.random() < 0.9 else int(rng.choice([1, 2, 8])),
    )


@pytest.mark.parametrize("seed", range(24))
def test_generated_hostile_sequences(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """-0.0, 5e-324, 1e308, far-future ages, huge queues, equal scores (ties), pools of one node,
    several models, nodes that join, leave and come back (with the same id or a new one), time that
    stands still, steps back or jumps past the memory; state carried."""
    rng = np.random.default_rng(seed)
    params = PARAMS[seed % 3]
    chains = Chains(params, monkeypatch)
    n_pools = int(rng.integers(1, 7))
    members = {f"pool-{p}": [f"n{p}-{j}" for j in range(int(rng.integers(1, 9)))] for p in range(n_pools)}
    models = {
        p: {"model": ["llama-8b", "llama-70b"][i % 2], "gpu_type": "H100"} for i, p in enumerate(members)
    }
    now = NOW_MS
    for k in range(24):
        now += int(rng.choice([1000] * 12 + [0, -500, 25_000]))
        if rng.random() < 0.2:  # a node leaves, or joins (new or back)
            ids = members[str(rng.choice(sorted(members)))]
            if len(ids) > 1 and rng.random() < 0.5:
                ids.pop(int(rng.integers(len(ids))))
            else:
                ids.append(f"x{k}" if rng.random() < 0.5 else f"n0-{k % 3}")
        views = [
            _hostile(rng, n, p, 4 if i % 2 else 1)
            for i, (p, ids) in enumerate(members.items())
            for n in dict.fromkeys(ids)
        ]
        snap = snapshot(views, now_ms=now, pool_fields=models)
        chains.tick(snap, sorted(snap.pools), k)
    assert chains.pools


def test_far_future_now_and_timestamps(monkeypatch: pytest.MonkeyPatch) -> None:
    chains = Chains(CacheAwareParams(), monkeypatch)
    nows = [NOW_MS, 2**62, *(2**62 + 1000 * k for k in range(1, 8)), 2**62 + 7000, NOW_MS, 2**63 - 1]
    for k, now in enumerate(nows):
        views = [node(f"n{i}", tbt_p50_ms=10.0 + i, hot_prefixes=("a", "b")) for i in range(5)]
        snap = snapshot(views, now_ms=now)
        chains.tick(snap, ["p"], k)
    assert chains.batched > 0


def test_a_hundred_thousand_new_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """25,000 node ids in four large pools for six ticks (batched once their memories stop growing),
    then 25,000 new ids on each of three ticks (100,000 ids in all; a pool whose nodes all changed
    has its memory rebuilt by ``decide``), then the second set again."""
    chains = Chains(CacheAwareParams(), monkeypatch)
    for k in range(10):
        gen = (0, 0, 0, 0, 0, 0, 1, 2, 3, 1)[k]
        views = [
            node(
                f"g{gen}-{i:05d}",
                pool_id=f"p{i % 4}",
                tbt_p50_ms=20.0 + i % 7,
                queue_depth=i % 5,
                hot_prefixes=(f"x{i % 13}",),
                ok_w=1,
            )
            for i in range(25_000)
        ]
        chains.tick(snapshot(views, now_ms=NOW_MS + 1000 * k), ["p0", "p1", "p2", "p3"], k)
    assert chains.batched > 0


@pytest.mark.parametrize(
    "fleet",
    [
        [node("a")],  # one pool, one node
        [node("a", hot_prefixes=("x",)), node("b", pool_id="q", tbt_p50_ms=3.0)],
        [node("a", stale=True, age_ms=9000), node("b", stale=True, age_ms=9000)],  # all stale
        [node("a", draining=True), node("b", draining=True)],  # all draining
        [node("a", weights_state="cold"), node("b", weights_state="loading")],  # nothing warm
        [node("a", kv_cache_used_frac=1.0, queue_depth=10**15, running_requests=10**15)] * 1,
        [node(f"n{i}", tbt_p50_ms=2.0, hot_prefixes=("s",)) for i in range(9)],  # every score equal
    ],
    ids=["one-node", "two-pools", "all-stale", "all-draining", "none-warm", "saturated", "ties"],
)
def test_odd_fleets(fleet: list[NodeView], monkeypatch: pytest.MonkeyPatch) -> None:
    chains = Chains(CacheAwareParams(), monkeypatch)
    for k in range(TICKS):
        views = [replace(v, tbt_p50_ms=(v.tbt_p50_ms or 1.0) * (1 + k % 2)) for v in fleet]
        snap = snapshot(views, now_ms=NOW_MS + 1000 * k, pool_fields={"empty": {}})
        chains.tick(snap, [*sorted(snap.pools), "missing"], k)
    # Batched wherever a node scores (the others take ``decide``'s even split or nothing).
    assert (chains.batched > 0) == any(v.warm and not v.stale for v in fleet)


def test_several_models_and_spill_over(monkeypatch: pytest.MonkeyPatch) -> None:
    views = [
        node(f"{p}-n{j}", pool_id=p, ok_w=j % 2, queue_depth=(j * 7 + len(p)) % 9, tbt_p50_ms=10.0 + j)
        for p in ("a", "b", "c", "d", "e", "f")
        for j in range(5)
    ]
    models = {p: {"model": "m1" if p in "abcd" else "m2"} for p in "abcdef"}
    chains = Chains(CacheAwareParams(spill_min_headroom=0.3), monkeypatch)
    spilled = []
    for k in range(TICKS):
        snap = snapshot(views, now_ms=NOW_MS + 1000 * k, pool_fields=models)
        spilled += [r.decisions[0].spill_to for r in chains.tick(snap, sorted(snap.pools), k)]  # type: ignore[union-attr]
    assert any(len(s) >= 2 for s in spilled)
    assert chains.batched > 0


def test_pools_listing_nodes_out_of_id_order_and_duplicate_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot of views lists a pool's nodes as its ``PoolView`` does: out of node-id order, the
    pool is left to ``decide`` (whose dicts are in node-id order); a pool named twice in a batch is
    decided twice, from its own state each time."""
    views = [node(n, tbt_p50_ms=t, hot_prefixes=("h",)) for n, t in (("b", 1.0), ("a", 2.0), ("c", 3.0))]
    pools = {"p": replace(pool("p", ()), node_ids=("b", "a", "c"))}
    chains = Chains(CacheAwareParams(), monkeypatch)
    for k in range(TICKS):
        snap = snapshot(views, now_ms=NOW_MS + 1000 * k, pools=pools)
        chains.tick(snap, ["p"], k)
    assert chains.batched == 0
    snap = snapshot(views, now_ms=NOW_MS)
    state = ALGO.decide(snap, CacheAwareParams(), ALGO.initial_state(), contexts(snap, ["p"])[0]).state
    ctxs = contexts(snap, ["p", "p"])
    got = ALGO.decide_pools(snap, CacheAwareParams(), [state, state], ctxs)
    for c, r in zip(ctxs, got, strict=True):
        same(ALGO.decide(snap, CacheAwareParams(), state, c), r)


def test_older_checkpoint_with_zero_and_negative_step_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step times of 0.0, -0.0 and below 0 (never remembered now, but an older checkpoint may hold
    them) stay in the memory for 20 s: medians among signed zeros are left to ``decide``."""
    views = [node(f"n{i}", tbt_p50_ms=None if i % 2 else 4.0, hot_prefixes=("h",)) for i in range(5)]
    old = {
        "n0": ((NOW_MS - 3000, 0.0), (NOW_MS - 2000, -0.0)),
        "n1": ((NOW_MS - 3000, -0.0), (NOW_MS - 2000, 0.0), (NOW_MS - 1000, -0.0)),
        "n2": ((NOW_MS - 1000, -3.0),),
        "n3": ((NOW_MS - 1000, 0.0),),
    }
    for params in PARAMS:
        chains = Chains(params, monkeypatch)
        chains.plain["p"] = chains.fast["p"] = old
        for k in range(24):  # the zeros are forgotten after 20 s; then the pool is batched again
            chains.tick(snapshot(views, now_ms=NOW_MS + 1000 * k), ["p"], k)
        assert 0 < chains.batched < chains.pools


def test_older_checkpoint_state_and_the_state_pickles() -> None:
    views = [node(f"n{i}", tbt_p50_ms=5.0 + i) for i in range(4)]
    snap = snapshot(views, now_ms=NOW_MS)
    old = {"n0": ((NOW_MS - 2000, 4.0),), "n3": ((NOW_MS - 1000, 9.0), (NOW_MS - 500, 1.0))}
    ctxs = contexts(snap, ["p"])
    (fast,) = ALGO.decide_pools(snap, CacheAwareParams(), [old], ctxs)
    same(ALGO.decide(snap, CacheAwareParams(), old, ctxs[0]), fast)
    # The batch's state is a pool's rows of a fleet-wide array: it pickles as the pool's own.
    snap2 = snapshot(views, now_ms=NOW_MS + 1000)
    (fast2,) = ALGO.decide_pools(snap2, CacheAwareParams(), [fast.state], contexts(snap2, ["p"]))
    back = pickle.loads(pickle.dumps(fast2.state))
    assert state_bits(back) == state_bits(fast2.state)
    assert len(pickle.dumps(fast2.state)) < 4096


def test_one_state_per_pool() -> None:
    snap = snapshot([node("a")])
    with pytest.raises(ValueError, match="states"):
        ALGO.decide_pools(snap, CacheAwareParams(), [], contexts(snap, ["p"]))


def test_batch_of_nothing() -> None:
    assert ALGO.decide_pools(snapshot([]), CacheAwareParams(), [], []) == []


def test_fleet_headroom_sums_are_the_per_pool_sums() -> None:
    """``fleet_headroom``'s per-pool means (sums over masked rows) equal the plain form's."""
    for snap in perturbed_snapshots(200, 12, seed=5):
        for params in PARAMS:
            fast = cache_aware.fleet_headroom(snap, params)
            plain = ca_oracle.fleet_headroom_plain(snap, params)
            assert {k: None if v is None else v.hex() for k, v in fast.items()} == {
                k: None if v is None else v.hex() for k, v in plain.items()
            }


@pytest.mark.parametrize("first", [True, False])
def test_a_nan_score_among_others_is_left_to_decide(first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN figure (a view can hold one; the schema refuses it) makes a NaN score: ``decide``'s
    ``max`` skips it unless it comes first, its powers and sums leave it out; the batch leaves such a
    pool to ``decide``."""
    views = [node(f"n{i}", tbt_p50_ms=10.0 + i, hot_prefixes=("h",)) for i in range(4)]
    views[0 if first else 2] = replace(views[0 if first else 2], kv_cache_used_frac=float("nan"))
    chains = Chains(CacheAwareParams(), monkeypatch)
    for k in range(TICKS):
        chains.tick(snapshot(views, now_ms=NOW_MS + 1000 * k), ["p"], k)
    assert chains.refused == (TICKS if first else 0)


def _memory(ids: Sequence[str], rows: Sequence[Sequence[tuple[int, float]]], slots: int) -> PoolMemory:
    ts = np.full((len(ids), slots), -1, dtype=np.int64)
    vals = np.full((len(ids), slots, 1), np.nan)
    for r, obs in enumerate(rows):
        for k, (t, v) in enumerate(obs):
            ts[r, k], vals[r, k, 0] = t, v
    return PoolMemory(tuple(ids), ts, vals)


@pytest.mark.parametrize("slots", [1, 2, 4, 5])
def test_memories_that_grow_beside_ones_that_do_not(slots: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools of one slot count in one batch: one whose memory must grow (a row to write and no free
    slot: all its slots hold figures younger than the memory), one with a free slot in every row
    (expired, or empty), one whose full row does not write (no step time, or a cold node), and one
    whose memory grows in a row that sits among rows with free slots. Each equals ``decide``'s, bit
    for bit, the grown ones twice as wide, then again on the next tick with the states carried."""
    now = NOW_MS
    full = [(now - 1000 * (k + 1), 10.0 + k) for k in range(slots)]
    expired = [(now - 25_000, 3.0), *full[1:]]
    views = [
        *(node(f"a{i}", pool_id="a", tbt_p50_ms=12.0 + i, hot_prefixes=("h",)) for i in range(3)),
        *(node(f"b{i}", pool_id="b", tbt_p50_ms=9.0 + i, hot_prefixes=("h", "k")) for i in range(3)),
        node("c0", pool_id="c", tbt_p50_ms=None),
        node("c1", pool_id="c", weights_state="cold", tbt_p50_ms=7.0),
        node("c2", pool_id="c", tbt_p50_ms=6.0),
        *(node(f"d{i}", pool_id="d", tbt_p50_ms=5.0 + i) for i in range(4)),
    ]
    states = {
        "a": _memory(["a0", "a1", "a2"], [full, full, full[:-1]], slots),
        "b": _memory(["b0", "b1", "b2"], [expired, [], full[:-1]], slots),
        "c": _memory(["c0", "c1", "c2"], [full, full, []], slots),
        "d": _memory(["d0", "d1", "d2", "d3"], [[], expired, full, []], slots),
    }
    chains = Chains(CacheAwareParams(), monkeypatch)
    chains.plain, chains.fast = dict(states), dict(states)
    for k in range(3):
        chains.tick(snapshot(views, now_ms=now + 1000 * k), ["a", "b", "c", "d"], k)
        if k == 0:
            widths = {p: chains.fast[p].ts.shape[1] for p in "abcd"}
            grows = 2 * slots
            assert widths == {"a": grows, "b": slots, "c": slots, "d": grows}, widths
    assert chains.batched == chains.pools


def test_bench_fleet_in_batches_of_a_few_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon hands a shard's pools in batches (at most 64); each batch works on its own pools'
    rows. Batches of 7 pools in an order that changes every tick, a pool with no node and one the
    snapshot lacks among them: the same as the loop, and every pool batched after the first tick."""
    chains = Chains(CacheAwareParams(), monkeypatch)
    rng = np.random.default_rng(11)
    first = 0
    for k, snap in enumerate(bench_snapshots(400, 20, seed=5)):
        pools = [str(p) for p in rng.permutation(sorted(snap.pools))]
        for a in range(0, len(pools), 7):
            chains.tick(snap, [*pools[a : a + 7], "no-such-pool"] if a == 7 else pools[a : a + 7], k)
        if k == 0:
            first = chains.pools
    assert chains.batched == chains.pools - first - 19, (chains.batched, chains.pools, first)


@pytest.mark.parametrize("params", PARAMS, ids=PARAM_IDS)
def test_misbehaving_fleet_in_batches_of_a_few_pools(
    params: CacheAwareParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The perturbed fleet (stale, draining, cold, silent and late nodes and pools) in batches of 2
    pools, in an order that changes every tick."""
    chains = Chains(params, monkeypatch)
    rng = np.random.default_rng(3)
    for k, snap in enumerate(perturbed_snapshots(320, 30)):
        pools = [str(p) for p in rng.permutation(sorted(snap.pools))]
        for a in range(0, len(pools), 2):
            chains.tick(snap, pools[a : a + 2], k)
    assert chains.batched > 0.3 * chains.pools, (chains.batched, chains.pools)
