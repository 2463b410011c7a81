"""llm-d's endpoint picker in the router library (fleetloop/router/epp.py): each scorer, the
prompt's blocks, the approximate prefix index, the max-score picker and the router's per-call pick
against decision tables.

Sources (llm-d/llm-d-inference-scheduler, commit 520af478): queue-scorer ``queuedepth/queue.go``
(min-max, all 1 when equal); kv-cache-utilization-scorer (``1 - usage``); prefix-cache-scorer
(``matched / total`` blocks, 0 without a block); the approximate prefix producer (16-token blocks,
at most 256, the trailing partial block hashed, nothing for a prompt shorter than one block, an LRU
per endpoint); the default profile's weights 2, 2, 3 (``config/loader/defaults.go``); max-score
picker with a random tie-break.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from fleetloop.router import Endpoint, Router
from fleetloop.router.epp import (
    DEFAULT_LRU_CAPACITY,
    EppProfile,
    EppScheduler,
    PrefixIndex,
    kv_cache_scores,
    max_score_pick,
    prefix_cache_scores,
    prompt_blocks,
    queue_scores,
)
from tests.router.test_pick import routing


@pytest.mark.parametrize(
    ("waiting", "expected"),
    [
        ([0, 0, 0], [1.0, 1.0, 1.0]),  # all equal: neutral 1 for every endpoint
        ([4, 4], [1.0, 1.0]),
        ([0, 5, 10], [1.0, 0.5, 0.0]),  # shortest 1, longest 0, linear between
        ([2, 4], [1.0, 0.0]),  # relative: one call more than the other reads 0
        ([7], [1.0]),
        ([], []),
    ],
)
def test_queue_scorer(waiting: list[int], expected: list[float]) -> None:
    assert queue_scores(waiting) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("used", "expected"),
    [([0.0, 0.25, 1.0], [1.0, 0.75, 0.0]), ([1.2, -0.1], [0.0, 1.0])],  # clipped to [0, 1]
)
def test_kv_cache_utilization_scorer(used: list[float], expected: list[float]) -> None:
    assert kv_cache_scores(used) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("matched", "total", "expected"),
    [
        ([0, 64, 128, 256], 256, [0.0, 0.25, 0.5, 1.0]),
        ([3, 0], 0, [0.0, 0.0]),  # a prompt without a block scores 0 everywhere
    ],
)
def test_prefix_cache_scorer(matched: list[int], total: int, expected: list[float]) -> None:
    assert prefix_cache_scores(matched, total) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("prompt", "prefix", "profile", "expected", "why"),
    [
        (15, 0, EppProfile(), (0, 0), "shorter than one block: not hashed"),
        (16, 0, EppProfile(), (1, 0), "one full block"),
        (17, 0, EppProfile(), (2, 0), "the trailing partial block is hashed too"),
        (3000, 1500, EppProfile(), (188, 93), "1500 // 16 = 93 full blocks inside the prefix"),
        (3000, 15, EppProfile(), (188, 0), "a prefix shorter than a block shares no block"),
        (10_000, 8_000, EppProfile(), (256, 256), "at most 256 blocks, all inside the prefix"),
        (10_000, 2_000, EppProfile(), (256, 125), "the cap cuts the call's own blocks"),
        (10_000, 0, EppProfile(max_prefix_blocks=0), (625, 0), "0: no limit"),
        (100, 64, EppProfile(block_size_tokens=32), (4, 2), "another block size"),
    ],
)
def test_prompt_blocks(
    prompt: int, prefix: int, profile: EppProfile, expected: tuple[int, int], why: str
) -> None:
    assert prompt_blocks(prompt, prefix, profile) == expected, why


def test_default_profile_is_llm_ds() -> None:
    p = EppProfile()
    assert (p.queue_weight, p.kv_cache_weight, p.prefix_cache_weight) == (2.0, 2.0, 3.0)
    assert (p.block_size_tokens, p.max_prefix_blocks) == (16, 256)
    # autoTune: the engine's KV blocks; 31,250 when the engine reports none; a set figure wins
    assert p.lru_blocks(160_000) == 10_000
    assert p.lru_blocks(0) == DEFAULT_LRU_CAPACITY == 31_250
    assert EppProfile(lru_capacity_per_server=7).lru_blocks(160_000) == 7


def test_max_score_pick_takes_the_best_without_a_draw() -> None:
    rng = np.random.default_rng(1)
    before = rng.bit_generator.state
    assert max_score_pick([1.0, 3.5, 2.0], rng) == 1
    assert rng.bit_generator.state == before


def test_max_score_pick_breaks_ties_uniformly_and_only_among_the_best() -> None:
    rng = np.random.default_rng(7)
    picks = Counter(max_score_pick([5.0, 1.0, 5.0, 5.0, 4.9], rng) for _ in range(3000))
    assert set(picks) == {0, 2, 3}
    assert all(900 < picks[i] < 1100 for i in (0, 2, 3)), picks


def test_prefix_index_matches_the_task_prefix_and_evicts_whole_groups_oldest_first() -> None:
    ix = PrefixIndex()
    ix.record("a", "t1", prefix_blocks=10, total_blocks=30, capacity_blocks=60)
    assert ix.matched("a", "t1", 10) == 10
    assert ix.matched("a", "t1", 4) == 4  # a shorter prefix matches its own blocks only
    assert ix.matched("b", "t1", 10) == 0  # only where the router sent it
    assert ix.matched("a", "t2", 10) == 0
    assert ix.matched("a", None, 10) == 0
    assert ix.held_blocks("a") == 30
    ix.record("a", "t2", prefix_blocks=10, total_blocks=30, capacity_blocks=60)
    assert ix.held_blocks("a") == 60
    ix.record("a", "t1", prefix_blocks=10, total_blocks=11, capacity_blocks=60)  # t1 used again: newest
    # 61 > 60: the oldest group (t1's first call's own 20 blocks) goes whole; t1's prefix stays
    assert ix.held_blocks("a") == 41
    assert ix.matched("a", "t1", 10) == 10
    assert ix.matched("a", "t2", 10) == 10
    ix.record("a", "t3", prefix_blocks=40, total_blocks=40, capacity_blocks=60)
    # 81 > 60: t2's prefix (the oldest now), then t2's own blocks: 51; t1, used since, stays
    assert ix.matched("a", "t2", 10) == 0
    assert ix.matched("a", "t1", 10) == 10
    assert ix.matched("a", "t3", 40) == 40
    assert ix.held_blocks("a") == 51
    ix.forget("a")
    assert ix.matched("a", "t3", 40) == 0
    assert ix.held_blocks("a") == 0


def test_prefix_index_keeps_the_longer_prefix_of_a_task() -> None:
    ix = PrefixIndex()
    ix.record("a", "t", prefix_blocks=20, total_blocks=25, capacity_blocks=1000)
    ix.record("a", "t", prefix_blocks=5, total_blocks=6, capacity_blocks=1000)  # a short call's prefix
    assert ix.matched("a", "t", 20) == 20
    assert ix.held_blocks("a") == 20 + 5 + 1


# The scheduler: weights 2 (queue), 2 (KV), 3 (prefix) on one call of a task whose prefix is 1,600 of
# 3,200 tokens (200 blocks, 100 of them the prefix: a full hit scores 0.5 of the prompt).
CALL = {"digest": "t", "prompt_tokens": 3200, "prefix_tokens": 1600}


def _pick(waiting: list[int], kv: list[float], holders: list[int], seed: int = 0) -> int:
    s = EppScheduler()
    ids = [f"p/{i}" for i in range(len(waiting))]
    for i in holders:
        s.index.record(ids[i], "t", 100, 200, 10_000)
    engine = [(u, 160_000) for u in kv]
    got = s.pick(ids, ids, waiting, engine, rng=np.random.default_rng(seed), **CALL)  # type: ignore[arg-type]
    return ids.index(got)


@pytest.mark.parametrize(
    ("waiting", "kv", "holders", "expected", "why"),
    [
        ([0, 0], [0.5, 0.5], [1], 1, "equal load: the prefix holder, 3 x 0.5 = 1.5 ahead"),
        ([0, 3], [0.2, 0.2], [1], 0, "two endpoints: the holder's longer queue reads 0, costing 2 > 1.5"),
        ([0, 1], [0.2, 0.2], [1], 0, "one call more is as bad as three: the queue score is relative"),
        ([0, 1, 2], [0.2, 0.2, 0.2], [1], 1, "three: the holder's 2 x 0.5 + 1.5 = 2.5 beats 2 x 1"),
        ([0, 0], [0.9, 0.1], [0], 1, "KV 0.9 vs 0.1 costs 2 x 0.8 = 1.6 > the hit's 1.5"),
        ([0, 0], [0.5, 0.1], [0], 0, "KV 0.5 vs 0.1 costs 0.8 < 1.5: the holder"),
        ([5, 0], [0.0, 0.0], [], 1, "no hit anywhere: the shorter queue"),
        ([0, 0], [0.3, 0.1], [], 1, "no hit, equal queues: the freer KV cache"),
    ],
)
def test_scheduler_decision_table(
    waiting: list[int], kv: list[float], holders: list[int], expected: int, why: str
) -> None:
    assert _pick(waiting, kv, holders) == expected, why


def test_scheduler_records_the_pick_and_follows_it() -> None:
    s = EppScheduler()
    ids = ["p/0", "p/1", "p/2"]
    rng = np.random.default_rng(3)
    first = s.pick(ids, ids, [0, 0, 0], [(0.0, 160_000)] * 3, rng=rng, **CALL)  # type: ignore[arg-type]
    assert s.index.matched(first, "t", 100) == 100
    for _ in range(5):  # the task's next calls: the same node, while loads stay equal
        assert s.pick(ids, ids, [0, 0, 0], [(0.0, 160_000)] * 3, rng=rng, **CALL) == first  # type: ignore[arg-type]
    other = {"digest": "u", "prompt_tokens": 3200, "prefix_tokens": 1600}
    picked = s.pick(ids, ids, [0, 0, 0], [(0.0, 160_000)] * 3, rng=rng, **other)  # type: ignore[arg-type]
    assert s.index.matched(picked, "u", 100) == 100
    assert s.index.held_blocks(first) == 200 * 6 - 100 * 5  # one prefix group, six calls' own blocks


def _router(n: int, seed: int = 0) -> tuple[Router[Endpoint], dict[str, Endpoint]]:
    eps = {f"p/{i}": Endpoint(node_id=f"p/{i}", pool_id="p", kv_capacity_tokens=160_000) for i in range(n)}
    r: Router[Endpoint] = Router(
        {"m": ("p",)}, np.random.default_rng(seed), members={"p": list(eps.values())}, nodes=eps
    )
    return r, eps


def _call(r: Router[Endpoint], digest: str | None, prompt: int = 3200, prefix: int = 1600) -> str:
    route = r.pick(
        ("m",),
        0,
        digest,
        new_task=False,
        budget_ms=1e6,
        now_s=1.0,
        prompt_tokens=prompt,
        prefix_tokens=prefix,
    )
    assert route.node is not None
    return route.node.node_id


def test_router_keeps_a_task_on_its_prefix_holder_until_its_queue_outweighs_the_hit() -> None:
    r, eps = _router(4)
    r.apply([routing("p", {f"p/{i}": 0.25 for i in range(4)}, picker="llm-d-epp")], 1.0)
    home = _call(r, "t")
    assert {_call(r, "t") for _ in range(10)} == {home}
    eps[home].kv_cache_used_frac = 0.7  # costs 2 x 0.7 = 1.4 of the hit's 1.5: still home
    assert _call(r, "t") == home
    eps[home].kv_cache_used_frac = 0.0
    eps[home].queue_depth = 1  # the others 0: home's queue reads 0 and costs 2 > 1.5
    assert _call(r, "t") != home


def test_router_reads_the_engine_through_engine_of() -> None:
    eps = {f"p/{i}": Endpoint(node_id=f"p/{i}", pool_id="p") for i in range(2)}
    full = {"p/0": 1.0, "p/1": 0.0}
    r: Router[Endpoint] = Router(
        {"m": ("p",)},
        np.random.default_rng(0),
        members={"p": list(eps.values())},
        nodes=eps,
        engine_of=lambda n: (full[n.node_id], 0),
    )
    r.apply([routing("p", {"p/0": 0.5, "p/1": 0.5}, picker="llm-d-epp")], 1.0)
    assert {_call(r, None) for _ in range(5)} == {"p/1"}


def test_one_node_pool_still_teaches_the_index() -> None:
    r, _ = _router(2)
    r.apply([routing("p", {"p/0": 1.0, "p/1": 0.0}, picker="llm-d-epp")], 1.0)
    assert _call(r, "t") == "p/0"  # the only candidate, recorded as the EPP records every pick
    r.apply([routing("p", {"p/0": 0.5, "p/1": 0.5}, picker="llm-d-epp", tick=2)], 2.0)
    assert {_call(r, "t") for _ in range(5)} == {"p/0"}


def test_llm_d_picker_spreads_tasks_without_prefixes_by_queue() -> None:
    r, eps = _router(3, seed=5)
    r.apply([routing("p", {f"p/{i}": 1 / 3 for i in range(3)}, picker="llm-d-epp")], 1.0)
    eps["p/0"].queue_depth = 2
    eps["p/1"].queue_depth = 2
    assert {_call(r, None, 500, 0) for _ in range(5)} == {"p/2"}
