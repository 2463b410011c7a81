"""cache-aware: normalized scorers combined by weight, prefix affinity, per-priority weights, spill-over."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from fleetloop.policies.base import NodeView
from fleetloop.policies.memory import PoolMemory
from fleetloop.policies.prefill import prefill_ms, prompt_tokens_within
from fleetloop.policies.routing.cache_aware import CacheAware, CacheAwareParams
from fleetloop.policies.slo import Slo, SloBook
from fleetloop.schemas.decisions import RoutingDecision
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.oracles.cache_aware import combine, components
from tests.policies.snapshots import NOW_MS, POOL, ctx, node, snapshot


def decide(
    views: list[NodeView], state: PoolMemory | None = None, now_ms: int = NOW_MS, **params: Any
) -> tuple[RoutingDecision, PoolMemory]:
    snap = snapshot(views, now_ms=now_ms)
    result = CacheAware().decide(snap, CacheAwareParams(**params), state or {}, ctx(snap))
    (d,) = result.decisions
    assert isinstance(d, RoutingDecision)
    return d, result.state


@pytest.mark.parametrize(
    ("views", "params", "expected"),
    [
        # identical idle nodes share evenly
        ([node("a"), node("b")], {}, {"a": 0.5, "b": 0.5}),
        # queue 4 halves s_queue (weight 2 of 7.25): S = 1 - 2 * 0.5 / 7.25 = 0.862 against 1;
        # alpha 1 gives 1 : 0.862
        ([node("a"), node("b", queue_depth=4)], {"alpha": 1.0}, {"a": 0.537037, "b": 0.462963}),
        # only the queue scorer weighs: S = 0.5 against 1, alpha 4: 1 : 1/16
        (
            [node("a"), node("b", queue_depth=4)],
            {"w_running": 0, "w_tokens": 0, "w_kv": 0, "w_hbm": 0, "w_speed": 0},
            {"a": 0.941176, "b": 0.058824},
        ),
        # only the tokens scorer: one batch of queued prompt tokens halves it
        (
            [node("a"), node("b", queued_prompt_tokens=8192)],
            {"w_queue": 0, "w_running": 0, "w_kv": 0, "w_hbm": 0, "w_speed": 0, "alpha": 1.0},
            {"a": 0.666667, "b": 0.333333},
        ),
        # only KV headroom
        (
            [node("a", kv_cache_used_frac=0.5), node("b", kv_cache_used_frac=0.0)],
            {"w_queue": 0, "w_running": 0, "w_tokens": 0, "w_hbm": 0, "w_speed": 0, "alpha": 1.0},
            {"a": 0.333333, "b": 0.666667},
        ),
        # cold, loading, draining and stale nodes get nothing
        (
            [
                node("a", queue_depth=50),
                node("b", weights_state="cold"),
                node("c", weights_state="loading"),
                node("d", draining=True),
                node("e", stale=True, age_ms=9000),
            ],
            {},
            {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0, "e": 0.0},
        ),
        # silent for more than silent_after_ms, though not stale yet: scores 0
        ([node("a"), node("b", age_ms=3500)], {}, {"a": 1.0, "b": 0.0}),
    ],
)
def test_decision_table(views: list[NodeView], params: dict[str, Any], expected: dict[str, float]) -> None:
    d, _ = decide(views, **params)
    assert d.weights == expected
    assert d.reason == "cache-aware"
    assert d.picker == "weighted-random"


def test_all_stale_share_evenly_and_nothing_warm_gives_zero() -> None:
    d, _ = decide([node("a", stale=True), node("b", stale=True), node("c", weights_state="cold")])
    assert d.weights == {"a": 0.5, "b": 0.5, "c": 0.0}
    assert d.reason == "all-stale"
    d, _ = decide([node("a", weights_state="cold"), node("b", draining=True)])
    assert d.weights == {"a": 0.0, "b": 0.0}
    assert d.reason == "no-warm-node"


def test_prefix_affinity_best_holder_first_and_saturated_or_failing_holders_dropped() -> None:
    d, _ = decide(
        [
            node("a", hot_prefixes=("p1", "p2"), running_requests=8),
            node("b", hot_prefixes=("p1",)),
            node("c", hot_prefixes=("p3",), queue_depth=200, running_requests=256, kv_cache_used_frac=1.0),
            node("d", hot_prefixes=("p4",), consecutive_failures=1),
            node("e"),
        ]
    )
    assert d.prefix_affinity == {"p1": ("b", "a"), "p2": ("a",)}
    assert d.inputs["hot_prefixes"] == 2.0


def test_slow_holder_loses_affinity_and_share_and_memory_keeps_it_slow() -> None:
    views = [node(n, tbt_p50_ms=20.0) for n in ("a", "b", "c")] + [
        node("d", tbt_p50_ms=160.0, hot_prefixes=("p",))
    ]
    d, state = decide(views)
    assert "p" not in d.prefix_affinity
    assert d.weights["d"] < d.weights["a"] / 3
    # The next tick brings no step time for anyone: the remembered figures still say d is slow.
    quiet = [node(v.node_id, hot_prefixes=v.hot_prefixes) for v in views]
    d2, state2 = decide(quiet, state=state, now_ms=NOW_MS + 1000)
    assert d2.weights["d"] < d2.weights["a"] / 3
    assert "p" not in d2.prefix_affinity
    # ... until the memory expires.
    d3, state3 = decide(quiet, state=state2, now_ms=NOW_MS + 25_000)
    assert d3.weights["d"] == pytest.approx(d3.weights["a"], abs=1e-6)
    assert d3.prefix_affinity == {"p": ("d",)}
    assert state3.figures() == {}


def test_priority_zero_avoids_nodes_nearest_saturation() -> None:
    full = {"queue_depth": 40, "running_requests": 64, "queued_prompt_tokens": 80_000}
    views = [node("a"), node("b", kv_cache_used_frac=0.95, **full)]
    d, _ = decide(views)
    assert d.weights["b"] > 0
    assert d.by_priority["0"] == {"a": 1.0, "b": 0.0}
    # when every node is near saturation priority 0 still gets somewhere to go
    d, _ = decide([node("a", kv_cache_used_frac=0.9, **full), views[1]])
    assert sum(d.by_priority["0"].values()) == pytest.approx(1.0, abs=1e-5)
    assert all(w > 0 for w in d.by_priority["0"].values())


def test_spill_to_other_pools_with_headroom_best_first() -> None:
    views = [
        node("a", pool_id="p", queue_depth=30),
        node("b", pool_id="q", ok_w=3),
        node("c", pool_id="r", running_requests=16, ok_w=3),
        node("d", pool_id="s", queue_depth=100, running_requests=200, kv_cache_used_frac=1.0, ok_w=3),
        node("e", pool_id="t", weights_state="cold", ok_w=3),
    ]
    d, _ = decide(views)
    assert d.spill_to == ("q", "r")
    assert d.inputs["spill_pools"] == 2.0


def _spill(views: list[NodeView], models: dict[str, str] | None = None) -> tuple[str, ...]:
    snap = snapshot(views, pool_fields={p: {"model": m} for p, m in (models or {}).items()})
    result = CacheAware().decide(snap, CacheAwareParams(), {}, ctx(snap))
    (d,) = result.decisions
    assert isinstance(d, RoutingDecision)
    return d.spill_to


@pytest.mark.parametrize(
    ("views", "models", "expected"),
    [
        # the deciding pool's model first (r), then other models' pools (q; the router sends them
        # only calls that accept their model, and only a call that would queue here)
        (
            [node("a", pool_id="p"), node("b", pool_id="q", ok_w=2), node("c", pool_id="r", ok_w=2)],
            {"q": "qwen-72b"},
            ("r", "q"),
        ),
        # ... even when the other model's pool has more headroom
        (
            [
                node("a", pool_id="p"),
                node("b", pool_id="q", ok_w=2),
                node("c", pool_id="r", ok_w=2, queue_depth=2),
            ],
            {"q": "qwen-72b"},
            ("r", "q"),
        ),
        # and another model's pool below spill_min_headroom stays out as well
        (
            [
                node("a", pool_id="p"),
                node("b", pool_id="q", ok_w=4, queue_depth=100, running_requests=200, kv_cache_used_frac=1.0),
                node("c", pool_id="r", ok_w=2),
            ],
            {"q": "qwen-72b"},
            ("r",),
        ),
        # a pool no call completed on in the window (telemetry only) is never a target, however idle
        (
            [node("a", pool_id="p"), node("b", pool_id="q"), node("c", pool_id="r", ok_w=1, queue_depth=3)],
            {},
            ("r",),
        ),
        # a node with failed calls only is not proven either
        ([node("a", pool_id="p"), node("b", pool_id="q", failures_w=5)], {}, ()),
        # idle unproven nodes do not lift a real pool's rank: q's one proven node is busier than r's
        (
            [
                node("a", pool_id="p"),
                node("b", pool_id="q", ok_w=4, queue_depth=4),
                *[node(f"q-inv{i}", pool_id="q") for i in range(20)],
                node("c", pool_id="r", ok_w=4, queue_depth=2),
            ],
            {},
            ("r", "q"),
        ),
        # a proven pool below spill_min_headroom (counted over its proven nodes) stays out
        (
            [
                node("a", pool_id="p"),
                node("b", pool_id="q", ok_w=4, queue_depth=100, running_requests=200, kv_cache_used_frac=1.0),
                *[node(f"q-inv{i}", pool_id="q") for i in range(20)],
            ],
            {},
            (),
        ),
    ],
)
def test_spill_own_model_first_and_proven_nodes_only(
    views: list[NodeView], models: dict[str, str], expected: tuple[str, ...]
) -> None:
    assert _spill(views, models) == expected


def test_spill_list_is_the_same_with_a_flood_of_invented_idle_pools() -> None:
    """Found by the fuzz bench: invented pools (valid telemetry, same model, never served) used to rank first
    and crowd the engine's 8-pool cap out of the real pools."""
    real = [node("a", pool_id="p", queue_depth=8)] + [
        node(f"r{i}", pool_id=f"real-{i}", ok_w=2, queue_depth=i % 3) for i in range(10)
    ]
    invented = [node(f"fp-{i}/0", pool_id=f"fp-{i}") for i in range(300)]
    assert _spill(real + invented) == _spill(real)
    assert len(_spill(real)) == 10


def test_components_are_normalized() -> None:
    pool = (node("a", hbm_free_gib=10.0), node("b", hbm_free_gib=40.0))
    parts = components(pool[0], pool, CacheAwareParams())
    assert parts["hbm"] == 0.25
    assert all(0.0 <= v <= 1.0 for v in parts.values())


def test_param_validation() -> None:
    with pytest.raises(ValidationError):
        CacheAwareParams(w_queue=0, w_running=0, w_tokens=0, w_kv=0, w_hbm=0, w_speed=0)
    with pytest.raises(ValidationError):
        CacheAwareParams(alpha_by_priority={"gold": 4.0})
    with pytest.raises(ValidationError):
        CacheAwareParams(min_score_by_priority={"0": 1.5})
    with pytest.raises(ValidationError):
        CacheAwareParams(alpha=0.1)
    with pytest.raises(ValidationError):
        CacheAwareParams.model_validate({"picker": "fastest"})


@pytest.mark.parametrize("picker", [None, "least-outstanding", "round-robin", "least-request-p2c"])
def test_the_decision_names_the_picker_the_policy_sets(picker: str | None) -> None:
    """The router picks among the weighted nodes as the decision says: weighted-random unless the
    policy's ``picker`` names another of the router's pickers."""
    snap = snapshot([node("a"), node("b", queue_depth=3)])
    params = CacheAwareParams() if picker is None else CacheAwareParams.model_validate({"picker": picker})
    (d,) = CacheAware().decide(snap, params, {}, ctx(snap)).decisions
    assert isinstance(d, RoutingDecision)
    assert d.picker == (picker or "weighted-random")


loads = st.fixed_dictionaries(
    {
        "queue_depth": st.integers(min_value=0, max_value=500),
        "running_requests": st.integers(min_value=0, max_value=256),
        "queued_prompt_tokens": st.integers(min_value=0, max_value=200_000),
        "kv_cache_used_frac": st.floats(min_value=0.0, max_value=1.0),
        "hbm_free_gib": st.floats(min_value=0.0, max_value=100.0),
        "tbt_p50_ms": st.none() | st.floats(min_value=1.0, max_value=5000.0),
    }
)


@settings(max_examples=60, deadline=None)
@given(st.lists(loads, min_size=1, max_size=12))
def test_property_weights_non_negative_sum_to_one_scores_in_unit_interval(
    specs: list[dict[str, Any]],
) -> None:
    views = [node(f"n{i:02d}", **s) for i, s in enumerate(specs)]
    d, _ = decide(views)
    assert all(w >= 0 for w in d.weights.values())
    assert sum(d.weights.values()) == pytest.approx(1.0, abs=1e-5)
    for ws in d.by_priority.values():
        assert sum(ws.values()) == pytest.approx(1.0, abs=1e-5)
    params = CacheAwareParams()
    for v in views:
        assert 0.0 <= combine(components(v, tuple(views), params), params) <= 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=300), min_size=2, max_size=12), st.sampled_from(
    ["queue_depth", "running_requests"]
))  # fmt: skip
def test_property_more_load_never_more_weight(levels: list[int], field: str) -> None:
    d, _ = decide([node(f"n{i:02d}", **{field: q}) for i, q in enumerate(levels)])
    pairs = sorted((q, d.weights[f"n{i:02d}"]) for i, q in enumerate(levels))
    for (q1, w1), (q2, w2) in itertools.pairwise(pairs):
        if q1 < q2:
            assert w1 >= w2


@settings(max_examples=30, deadline=None)
@given(st.lists(loads, min_size=1, max_size=8))
def test_property_idempotent_for_the_same_tick(specs: list[dict[str, Any]]) -> None:
    views = [node(f"n{i:02d}", hot_prefixes=(f"x{i % 3}",), **s) for i, s in enumerate(specs)]
    first = decide(views)
    assert decide(views) == first


@pytest.mark.parametrize(
    ("model", "gpu", "gpus", "expected"),
    [
        # (gpus x HBM x 0.9 - 2 x params) / KV bytes per token, BF16:
        # llama-70b on one MI300X: (172.8e9 - 141.2e9) / 327,680 = 96,435 tokens (a 100k prompt fits no node)
        ("llama-70b", "MI300X", 1, 96_435),
        # on two H200s: (253.8e9 - 141.2e9) / 327,680 = 343,627
        ("llama-70b", "H200", 2, 343_627),
        # llama-8b on one L40S: (43.2e9 - 16.06e9) / 131,072 = 207,061
        ("llama-8b", "L40S", 1, 207_061),
        # an unknown GPU or model: no figure (the router then takes the pool to hold any prompt)
        ("llama-8b", "TPU", 1, None),
        ("mistral-7b", "H100", 1, None),
    ],
)
def test_the_pools_longest_prompt_comes_from_its_nodes_kv_cache(
    model: str, gpu: str, gpus: int, expected: int | None
) -> None:
    views = [
        node("a", model=model, gpu_type=gpu, gpu_count=gpus),
        node("b", model=model, gpu_type=gpu, gpu_count=gpus),
    ]
    snap = snapshot(views, pool_fields={"p": {"model": model, "gpu_type": gpu}})
    (d,) = CacheAware().decide(snap, CacheAwareParams(), {}, ctx(snap)).decisions
    assert isinstance(d, RoutingDecision)
    assert d.max_prompt_tokens == expected


def test_a_pool_of_mixed_tensor_parallel_degrees_is_held_to_its_smallest_node() -> None:
    views = [
        node("a", model="llama-70b", gpu_type="H200", gpu_count=2),
        node("b", model="llama-70b", gpu_type="H200", gpu_count=4),
    ]
    snap = snapshot(views, pool_fields={"p": {"model": "llama-70b", "gpu_type": "H200"}})
    (d,) = CacheAware().decide(snap, CacheAwareParams(), {}, ctx(snap)).decisions
    assert isinstance(d, RoutingDecision)
    assert d.max_prompt_tokens == 343_627


@pytest.mark.parametrize(
    ("model", "gpu", "gpus", "ms"),
    [("llama-8b", "A100", 1, 800.0), ("llama-8b", "H100", 1, 800.0), ("llama-70b", "MI300X", 1, 5000.0),
     ("llama-70b", "H200", 2, 5000.0), ("llama-70b", "H100", 8, 50.0), ("llama-8b", "L40S", 1, 600_000.0)],
)  # fmt: skip
def test_the_prefill_figure_is_the_longest_prompt_within_the_time(
    model: str, gpu: str, gpus: int, ms: float
) -> None:
    n = prompt_tokens_within(model, gpu, gpus, ms)
    assert n is not None
    assert n > 0
    within, over = prefill_ms(model, gpu, gpus, n), prefill_ms(model, gpu, gpus, n + 1)
    assert within is not None
    assert over is not None
    assert within <= ms < over


def test_the_prefill_figure_is_unknown_for_an_unknown_part_or_no_time() -> None:
    assert prompt_tokens_within("llama-8b", "TPU", 1, 800.0) is None
    assert prompt_tokens_within("mistral-7b", "H100", 1, 800.0) is None
    assert prompt_tokens_within("llama-8b", "H100", 0, 800.0) is None
    assert prompt_tokens_within("llama-8b", "H100", 1, 0.0) is None
    assert prompt_tokens_within("llama-8b", "H100", 1, math.nan) is None


def test_the_pools_prefill_figure_follows_each_class_slo_and_its_slowest_node() -> None:
    # llama-8b on A100s: an 800 ms SLO by default, 2 s for priority 2, 400 ms for priority 1 on this pool
    book = SloBook(
        default=Slo(800.0, 50.0),
        by_priority={2: Slo(2000.0, 100.0)},
        by_pool={(1, POOL): Slo(400.0, 50.0)},
    )
    views = [
        node("a", model="llama-8b", gpu_type="A100", gpu_count=2),
        node("b", model="llama-8b", gpu_type="A100", gpu_count=1),
    ]
    snap = snapshot(views, pool_fields={POOL: {"model": "llama-8b", "gpu_type": "A100"}})
    (d,) = CacheAware().decide(snap, CacheAwareParams(), {}, ctx(snap, slo=book)).decisions
    assert isinstance(d, RoutingDecision)
    one = {ms: prompt_tokens_within("llama-8b", "A100", 1, ms) for ms in (400.0, 800.0, 2000.0)}
    want = {str(p): one[800.0] for p in range(10)} | {"1": one[400.0], "2": one[2000.0]}
    assert d.slo_prompt_tokens == want
    assert one[400.0] < one[800.0] < one[2000.0] == 15_503  # and the node with one GPU sets it
    # an unknown GPU: no figure at all, and the field stays unset (older readers see the same record)
    views = [node("a", model="llama-8b", gpu_type="TPU", gpu_count=1)]
    snap = snapshot(views, pool_fields={POOL: {"model": "llama-8b", "gpu_type": "TPU"}})
    (d,) = CacheAware().decide(snap, CacheAwareParams(), {}, ctx(snap, slo=book)).decisions
    assert isinstance(d, RoutingDecision)
    assert d.slo_prompt_tokens == {}
    assert "slo_prompt_tokens" not in d.model_fields_set
