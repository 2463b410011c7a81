"""The router library's pick against decision tables, and its properties (fleetloop/router/pick.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from fleetloop.router import Endpoint, Router
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    BreakerDecision,
    Decision,
    PolicyStamp,
    RetryBudgetDecision,
    RoutingDecision,
)
from hypothesis import given, settings
from hypothesis import strategies as st

STAMP = PolicyStamp(name="t", version=1, hash="0" * 16, mode="enforce")
SHADOW = PolicyStamp(name="t", version=1, hash="0" * 16, mode="shadow")


def env(body: Any, tick: int = 1, stamp: PolicyStamp = STAMP) -> Decision:
    return Decision(ts_ms=1000 + tick, tick_id=tick, policy=stamp, body=body)


def routing(pool: str, weights: dict[str, float], tick: int = 1, **kw: Any) -> Decision:
    return env(RoutingDecision(entity=f"pool/{pool}", reason="r", pool_id=pool, weights=weights, **kw), tick)


def breaker(node: str, state: str = "open", *, enforced: bool = True, tick: int = 1) -> Decision:
    pool = node.split("/", maxsplit=1)[0]
    body = BreakerDecision(
        entity=node,
        reason="r",
        pool_id=pool,
        node_id=node,
        state=state,
        enforced=enforced,  # type: ignore[arg-type]
    )
    return env(body, tick)


def admission(pool: str, tick: int = 1, **kw: Any) -> Decision:
    kw.setdefault("max_queue_depth", {})
    return env(AdmissionDecision(entity=f"pool/{pool}", reason="r", pool_id=pool, **kw), tick)


def budget(pool: str, allowed: int, tenant: str | None = None, tick: int = 1) -> Decision:
    body = RetryBudgetDecision(
        entity=f"pool/{pool}" + (f"/{tenant}" if tenant else ""),
        reason="r",
        pool_id=pool,
        tenant_id=tenant,
        retry_ratio=0.1,
        min_retries_per_s=1.0,
        retries_allowed_now=allowed,
    )
    return env(body, tick)


class World:
    """Endpoints in pools, and a router over them."""

    def __init__(self, pools: dict[str, int], models: dict[str, list[str]] | None = None, seed: int = 0):
        self.eps: dict[str, Endpoint] = {}
        self.members: dict[str, list[Endpoint]] = {}
        for pool, n in sorted(pools.items()):
            self.members[pool] = []
            for i in range(n):
                ep = Endpoint(node_id=f"{pool}/{i}", pool_id=pool)
                self.eps[ep.node_id] = ep
                self.members[pool].append(ep)
        by_model = {m: tuple(ps) for m, ps in (models or {"m": sorted(pools)}).items()}
        self.router: Router[Endpoint] = Router(
            by_model, np.random.default_rng(seed), members=self.members, nodes=self.eps
        )

    def apply(self, *ds: Decision, now: float = 0.0) -> list[Decision]:
        return self.router.apply(ds, now)

    def pick(self, priority: int = 0, digest: str | None = None, now: float = 1.0, **kw: Any) -> str:
        kw.setdefault("new_task", False)
        kw.setdefault("budget_ms", 10_000)
        r = self.router.pick(tuple(kw.pop("models", ("m",))), priority, digest, now_s=now, **kw)
        where = f"{r.reason}:{r.node.node_id}" if r.node is not None else f"{r.reason}:{r.pool_id}"
        return where if r.routed_from is None else f"{where}<{r.routed_from}"  # moved from that pool


AFF1 = {"d": ("p/1",)}
AFF10 = {"d": ("p/1", "p/0")}

# -- decision tables ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decisions", "priority", "digest", "expected"),
    [
        # only weighted nodes are picked
        ([routing("p", {"p/0": 0.0, "p/1": 1.0, "p/2": 0.0})], 0, None, "primary:p/1"),
        # by-priority weights win for their class, plain weights for the others
        ([routing("p", {"p/0": 1.0}, by_priority={"2": {"p/2": 1.0}})], 2, None, "primary:p/2"),
        ([routing("p", {"p/0": 1.0}, by_priority={"2": {"p/2": 1.0}})], 1, None, "primary:p/0"),
        # an enforced open breaker ejects; a detected-only or half-open one does not
        ([routing("p", {"p/0": 0.5, "p/1": 0.5}), breaker("p/0")], 0, None, "primary:p/1"),
        ([routing("p", {"p/0": 1.0}), breaker("p/0", enforced=False)], 0, None, "primary:p/0"),
        ([routing("p", {"p/0": 1.0}), breaker("p/0", "half_open")], 0, None, "primary:p/0"),
        # prefix affinity: the first holder that is eligible
        ([routing("p", {"p/0": 0.5, "p/1": 0.5, "p/2": 0.0}, prefix_affinity=AFF1)], 0, "d", "primary:p/1"),
        (
            [routing("p", {"p/0": 0.5, "p/1": 0.5}, prefix_affinity=AFF10), breaker("p/1")],
            0,
            "d",
            "primary:p/0",
        ),
        ([routing("p", {"p/0": 1.0, "p/1": 0.0}, prefix_affinity=AFF10)], 0, "d", "primary:p/0"),
        # a fresh decision whose every weighted node is ejected: plain round robin over the healthy rest
        ([routing("p", {"p/0": 1.0}), breaker("p/0")], 0, None, "primary:p/1"),
        # shed by queue depth; a later call of a task is judged by max_queue_depth only
        ([routing("p", {"p/0": 1.0}), admission("p", max_queue_depth={"0": 5})], 0, None, "shed:p"),
        ([routing("p", {"p/0": 1.0}), admission("p", max_queue_depth={"1": 5})], 0, None, "primary:p/0"),
        # stale (older tick) decisions are dropped; shadow ones never act
        ([routing("p", {"p/1": 1.0}, tick=5), routing("p", {"p/0": 1.0}, tick=4)], 0, None, "primary:p/1"),
        (
            [routing("p", {"p/1": 1.0}), env(routing("p", {"p/0": 1.0}).body, 9, SHADOW)],
            0,
            None,
            "primary:p/1",
        ),
    ],
)
def test_pick_table(decisions: list[Decision], priority: int, digest: str | None, expected: str) -> None:
    w = World({"p": 3})
    w.eps["p/0"].queue_depth = 5
    w.apply(*decisions)
    assert w.pick(priority, digest) == expected


def test_spill_over_and_model_fallback() -> None:
    w = World({"a": 2, "b": 2, "c": 2}, models={"big": ["a"], "mid": ["b"], "small": ["c"]})
    full = admission("a", max_queue_depth={"0": 1})
    w.eps["a/0"].queue_depth = 3
    w.apply(routing("a", {"a/0": 1.0}, spill_to=("b",)), routing("b", {"b/1": 1.0}), full)
    # b serves another model the call accepts: it takes what a would shed (step 6: model spill)
    assert w.pick(models=("big", "mid")) == "model-spill:b/1<a"
    assert w.pick(models=("big",)) == "shed:a"  # spill only to pools serving an acceptable model
    # without spill_to the call is shed in its own pool
    w.apply(routing("a", {"a/0": 1.0}, tick=2))
    assert w.pick(models=("big", "mid")) == "shed:a"
    # no routable node in the preferred model's pools: the next model's pools
    w.apply(routing("a", {"a/0": 1.0}, tick=3), breaker("a/0"), breaker("a/1"))
    w.members["a"].clear()
    w.members["b"].clear()
    w.apply(routing("b", {}, tick=3))
    w.router.fleet_changed()
    assert w.pick(models=("big", "mid", "small")) == "model-fallback:c/0"


def test_a_call_that_would_queue_goes_to_another_models_spill_pool() -> None:
    """Step 6: a call admitted on a node with calls queued goes to a pool of another model it
    accepts, named in spill_to, whose picked node has none queued and whose admission sets no
    new-task outstanding limit; never to a same-model pool, never for a one-model call."""
    w = World({"a": 1, "b": 1, "c": 1}, models={"big": ["a", "b"], "small": ["c"]})
    w.apply(
        routing("a", {"a/0": 1.0}, spill_to=("b", "c")),
        routing("b", {"b/0": 1.0}, spill_to=("a", "c")),
        routing("c", {"c/0": 1.0}),
    )
    two = ("big", "small")
    assert sorted(w.pick(models=two) for _ in range(2)) == ["primary:a/0", "primary:b/0"]  # nothing queued
    w.eps["a/0"].queue_depth = 1
    w.eps["b/0"].queue_depth = 1
    # the same model's spill pool takes only what would be shed: only c takes it
    assert sorted(w.pick(models=two) for _ in range(2)) == ["model-spill:c/0<a", "model-spill:c/0<b"]
    assert w.pick(models=("big",)) in ("primary:a/0", "primary:b/0")  # one model: never leaves it
    w.eps["c/0"].queue_depth = 1
    assert w.pick(models=two).startswith("primary:")  # c would queue it too
    w.eps["c/0"].queue_depth = 0
    w.apply(admission("c", new_task_max_outstanding={"2": 16}))
    # limits on c's own low-class first calls do not keep a moved call out
    assert w.pick(models=two).startswith("model-spill:c/0<")
    w.apply(admission("c", tick=2, max_queue_depth={"0": 0}))
    assert w.pick(models=two).startswith("primary:")  # c's admission refuses it
    w.apply(admission("c", tick=3))
    assert w.pick(models=two).startswith("model-spill:c/0<")  # moved from a or b, and says which
    # not offered in spill_to: stays
    w.apply(routing("a", {"a/0": 1.0}, tick=4), routing("b", {"b/0": 1.0}, tick=4))
    assert sorted(w.pick(models=two) for _ in range(2)) == ["primary:a/0", "primary:b/0"]


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        # one pool of the model holds the prompt: every call of it goes there, whatever the split
        (2_000, ["primary:b/0"] * 6),
        # both hold it, or its size is unknown: the capacity split between the pools, as without limits
        (500, ["primary:a/0", "primary:b/0"] * 3),
        (0, ["primary:a/0", "primary:b/0"] * 3),
        # no pool of an acceptable model holds it: nothing is left out (it fails where it lands)
        (9_000, ["primary:a/0", "primary:b/0"] * 3),
    ],
)
def test_a_prompt_goes_only_to_pools_whose_nodes_hold_it(prompt: int, expected: list[str]) -> None:
    w = World({"a": 1, "b": 1}, models={"big": ["a", "b"]})
    w.apply(
        routing("a", {"a/0": 1.0}, max_prompt_tokens=1_000),
        routing("b", {"b/0": 1.0}, max_prompt_tokens=5_000),
    )
    assert [w.pick(models=("big",), prompt_tokens=prompt) for _ in range(6)] == expected


def test_a_prompt_no_pool_of_the_preferred_model_holds_goes_to_the_next_model() -> None:
    w = World({"a": 1, "b": 1, "c": 1}, models={"big": ["a"], "mid": ["b"], "small": ["c"]})
    w.apply(
        routing("a", {"a/0": 1.0}, max_prompt_tokens=1_000),
        routing("b", {"b/0": 1.0}),  # no figure: holds any prompt
        routing("c", {"c/0": 1.0}, max_prompt_tokens=100_000),
    )
    assert w.pick(models=("big", "mid", "small"), prompt_tokens=2_000) == "primary:b/0"
    assert w.pick(models=("big", "small"), prompt_tokens=2_000) == "primary:c/0"
    assert w.pick(models=("big", "small"), prompt_tokens=500) == "primary:a/0"  # the preferred model first
    # spill-over never sends a prompt to a pool that cannot hold it: a (full) spills to b only
    # what b holds, and sheds the rest in its own pool
    w.apply(
        routing("a", {"a/0": 1.0}, tick=2, spill_to=("b",), max_prompt_tokens=2_000),
        routing("b", {"b/0": 1.0}, tick=2, max_prompt_tokens=1_500),
        admission("a", max_queue_depth={"0": 1}),
    )
    w.eps["a/0"].queue_depth = 3
    assert w.pick(models=("big", "mid"), prompt_tokens=1_200) == "model-spill:b/0<a"
    assert w.pick(models=("big", "mid"), prompt_tokens=1_800) == "shed:a"
    assert w.pick(models=("big", "mid", "small"), prompt_tokens=3_000) == "primary:c/0"


def test_first_call_of_a_task_has_its_own_limits() -> None:
    w = World({"p": 1})
    w.eps["p/0"].queue_depth = 2
    w.eps["p/0"].running = 10
    w.apply(
        routing("p", {"p/0": 1.0}),
        admission(
            "p", max_queue_depth={"2": 8}, new_task_max_queue_depth={"2": 2}, max_outstanding={"2": 20}
        ),
    )
    assert w.pick(2, new_task=True) == "shed:p"
    assert w.pick(2, new_task=False) == "primary:p/0"
    w.eps["p/0"].running = 18
    assert w.pick(2, new_task=False) == "shed:p"


def test_budget_below_threshold_is_shed() -> None:
    w = World({"p": 1})
    w.apply(routing("p", {"p/0": 1.0}), admission("p", reject_if_budget_below_ms=500))
    assert w.pick(1, budget_ms=499) == "shed:p"
    assert w.pick(1, budget_ms=500) == "primary:p/0"


def test_a_call_with_no_deadline_is_never_shed_for_its_budget() -> None:
    """Budget 0 is "no deadline" (``x-fleetloop-budget-ms`` unset, an embedder that has none): such
    a call is not shed for a budget it does not have, or every call of such an integration would be."""
    w = World({"p": 1})
    w.apply(routing("p", {"p/0": 1.0}), admission("p", reject_if_budget_below_ms=500))
    assert [w.pick(p, budget_ms=0) for p in (0, 1, 2)] == ["primary:p/0"] * 3
    assert w.pick(2, budget_ms=1) == "shed:p"


def test_protected_classes_are_never_shed_for_their_budget() -> None:
    """The envelope floors a protected class's queue limits; its budget threshold is not a way
    around that. The engine names the classes (``budget_protected_priority``); a record without the
    field, from an older daemon, protects priority 0 as the envelope's default does."""
    w = World({"p": 1})
    w.apply(routing("p", {"p/0": 1.0}), admission("p", reject_if_budget_below_ms=500))
    assert w.pick(0, budget_ms=100) == "primary:p/0"
    assert w.pick(1, budget_ms=100) == "shed:p"
    w.apply(admission("p", tick=2, reject_if_budget_below_ms=500, budget_protected_priority=1))
    assert [w.pick(p, budget_ms=100) for p in (0, 1, 2)] == ["primary:p/0", "primary:p/0", "shed:p"]
    w.apply(admission("p", tick=3, reject_if_budget_below_ms=500, budget_protected_priority=-1))
    assert w.pick(0, budget_ms=100) == "shed:p"
    # the queue limits still shed a protected class
    w.apply(admission("p", tick=4, reject_if_budget_below_ms=500, max_queue_depth={"0": 2}))
    w.eps["p/0"].queue_depth = 2
    assert w.pick(0, budget_ms=100) == "shed:p"


def test_fail_static_then_plain_round_robin() -> None:
    w = World({"p": 3})
    w.apply(routing("p", {"p/2": 1.0}), breaker("p/0"), now=0.0)
    assert [w.pick(now=29.0) for _ in range(3)] == ["primary:p/2"] * 3  # last known good state
    # past the TTL: plain round robin over live, warm, non-draining members, every decision ignored
    w.eps["p/1"].warm = False
    assert [w.pick(now=31.0) for _ in range(4)] == ["primary:p/0", "primary:p/2"] * 2
    # a fresh decision ends it
    w.apply(routing("p", {"p/1": 1.0}, tick=2), now=40.0)
    w.eps["p/1"].warm = True
    assert w.pick(now=41.0) == "primary:p/1"


def test_no_decision_ever_is_plain_round_robin() -> None:
    w = World({"p": 2})
    assert [w.pick() for _ in range(3)] == ["primary:p/0", "primary:p/1", "primary:p/0"]


def test_draining_needs_fleet_changed_to_take_effect_before_the_next_decision() -> None:
    w = World({"p": 2})
    w.apply(routing("p", {"p/0": 1.0, "p/1": 1.0}, picker="round-robin"))
    w.eps["p/0"].draining = True
    w.router.fleet_changed()
    assert {w.pick() for _ in range(4)} == {"primary:p/1"}


def test_smooth_weighted_round_robin_is_nginx_sequence() -> None:
    w = World({"p": 3})
    w.apply(routing("p", {"p/0": 5.0, "p/1": 1.0, "p/2": 1.0}, picker="round-robin"))
    seq = [w.pick().split("/")[1] for _ in range(7)]
    assert seq == ["0", "0", "1", "0", "2", "0", "0"]


def test_least_request_p2c_takes_the_less_loaded() -> None:
    w = World({"p": 2})
    w.apply(routing("p", {"p/0": 0.5, "p/1": 0.5}, picker="least-request-p2c"))
    for _ in range(5):
        w.router.started("p/0")
    assert {w.pick() for _ in range(20)} == {"primary:p/1"}
    for _ in range(10):
        w.router.started("p/1")
    assert {w.pick() for _ in range(20)} == {"primary:p/0"}


@pytest.mark.parametrize(
    ("weights", "outstanding", "expected"),
    [
        # idle equal nodes: the first in id order (no draw)
        ({"p/0": 1.0, "p/1": 1.0, "p/2": 1.0}, {}, "p/0"),
        # one call out on p/0: (1 + 1) / 1 against (0 + 1) / 1
        ({"p/0": 1.0, "p/1": 1.0, "p/2": 1.0}, {"p/0": 1}, "p/1"),
        # twice the weight holds twice the calls before it is passed over: 3/2 < 2/1,
        # then 4/2 = 2/1 (a tie: id order), then 5/2 > 2/1
        ({"p/0": 2.0, "p/1": 1.0}, {"p/0": 2, "p/1": 1}, "p/0"),
        ({"p/0": 2.0, "p/1": 1.0}, {"p/0": 3, "p/1": 1}, "p/0"),
        ({"p/0": 2.0, "p/1": 1.0}, {"p/0": 4, "p/1": 1}, "p/1"),
        # a slow node holds its calls: passed over however heavy its weight (the cascade case)
        ({"p/0": 0.4, "p/1": 0.3, "p/2": 0.3}, {"p/0": 6, "p/1": 2, "p/2": 2}, "p/1"),
        # the heaviest idle node takes the next call, a zero weight none
        ({"p/0": 0.2, "p/1": 0.0, "p/2": 0.8}, {}, "p/2"),
        ({"p/0": 0.2, "p/1": 0.0, "p/2": 0.8}, {"p/2": 3}, "p/0"),
    ],
)
def test_least_outstanding_decision_table(
    weights: dict[str, float], outstanding: dict[str, int], expected: str
) -> None:
    """The fewest of this router's outstanding calls per unit of weight, (outstanding + 1) / w,
    ties to the first node in id order (HAProxy's ``balance leastconn`` over weighted servers)."""
    w = World({"p": len(weights)})
    w.apply(routing("p", weights, picker="least-outstanding"))
    for node, k in outstanding.items():
        for _ in range(k):
            w.router.started(node)
    assert w.pick() == f"primary:{expected}"


def test_least_outstanding_spreads_a_ticks_calls_and_follows_finished_calls() -> None:
    """Ten calls of one tick over ten equal idle nodes land once each (a weighted draw puts two of
    the first four on one node half the time); a call that ends frees its node for the next."""
    w = World({"p": 10})
    w.apply(routing("p", {f"p/{i}": 0.1 for i in range(10)}, picker="least-outstanding"))
    got = []
    for _ in range(10):
        node = w.pick().split(":")[1]
        w.router.started(node)
        got.append(node)
    assert sorted(got) == sorted(f"p/{i}" for i in range(10))
    w.router.finished("p/7")
    assert w.pick() == "primary:p/7"


def test_retry_budget_tenant_first_and_reset_by_each_decision() -> None:
    w = World({"p": 1})
    r = w.router
    assert r.allow_retry("p", "t", now_s=1.0)  # no budget published: retries are not limited here
    w.apply(routing("p", {"p/0": 1.0}), budget("p", 2), budget("p", 0, tenant="gold"))
    assert [r.allow_retry("p", "free", now_s=1.0) for _ in range(3)] == [True, True, False]
    assert not r.allow_retry("p", "gold", now_s=1.0)
    w.apply(budget("p", 1, tick=2))
    assert [r.allow_retry("p", "free", now_s=1.0) for _ in range(2)] == [True, False]
    # failing static (no routing fresher than the TTL): the held budget is as old, and refuses nothing
    assert [r.allow_retry("p", "free", now_s=31.0) for _ in range(3)] == [True] * 3


def test_apply_reports_what_it_accepted() -> None:
    w = World({"p": 1})
    a = routing("p", {"p/0": 1.0}, tick=3)
    assert w.apply(a, routing("p", {"p/0": 1.0}, tick=2), a) == [a, a]
    assert w.router.state.dropped_stale == 1


def test_fail_static_bounds() -> None:
    with pytest.raises(ValueError, match="fail_static_s"):
        Router({}, np.random.default_rng(0), fail_static_s=0.0)


# -- properties -----------------------------------------------------------------------------------

node_weights = st.lists(st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0, 3.0]), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    weights=node_weights,
    ejected=st.sets(st.integers(0, 11)),
    draining=st.sets(st.integers(0, 11)),
    picker=st.sampled_from(["weighted-random", "round-robin", "least-request-p2c", "least-outstanding"]),
    affinity=st.lists(st.integers(0, 11), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_never_picks_an_ejected_node_while_a_healthy_one_exists(
    weights: list[float], ejected: set[int], draining: set[int], picker: str, affinity: list[int], seed: int
) -> None:
    n = len(weights)
    w = World({"p": n}, seed=seed)
    for i in draining & set(range(n)):
        w.eps[f"p/{i}"].draining = True
    w.apply(
        routing(
            "p",
            {f"p/{i}": x for i, x in enumerate(weights)},
            picker=picker,
            prefix_affinity={"d": tuple(f"p/{i}" for i in affinity)},
        ),
        *(breaker(f"p/{i}") for i in sorted(ejected) if i < n),
    )
    healthy = {f"p/{i}" for i in range(n) if i not in ejected and i not in draining}
    for digest in (None, "d") * 10:
        got = w.pick(digest=digest).split(":")[1]
        if healthy:
            assert got in healthy
        else:
            assert got in {f"p/{i}" for i in range(n) if i not in draining} or got == "p"


@settings(max_examples=25, deadline=None)
@given(weights=st.lists(st.floats(0.05, 10.0), min_size=2, max_size=8), seed=st.integers(0, 2**16))
def test_weighted_random_follows_weights_within_sampling_error(weights: list[float], seed: int) -> None:
    n, draws = len(weights), 4000
    w = World({"p": n}, seed=seed)
    w.apply(routing("p", {f"p/{i}": x for i, x in enumerate(weights)}))
    counts = dict.fromkeys(range(n), 0)
    for _ in range(draws):
        counts[int(w.pick().split("/")[1])] += 1
    total = sum(weights)
    for i, x in enumerate(weights):
        p = x / total
        sigma = math.sqrt(draws * p * (1 - p))
        assert abs(counts[i] - draws * p) <= 5 * sigma + 1, (i, counts[i], draws * p)


@settings(max_examples=50, deadline=None)
@given(weights=st.lists(st.integers(1, 9), min_size=2, max_size=8))
def test_round_robin_gives_each_node_exactly_its_share_per_cycle(weights: list[int]) -> None:
    w = World({"p": len(weights)})
    w.apply(routing("p", {f"p/{i}": float(x) for i, x in enumerate(weights)}, picker="round-robin"))
    counts = dict.fromkeys(range(len(weights)), 0)
    for _ in range(sum(weights) * 3):
        counts[int(w.pick().split("/")[1])] += 1
    assert counts == {i: 3 * x for i, x in enumerate(weights)}


def test_cached_and_uncached_picks_agree() -> None:
    """The derived-state cache is an optimisation only: same seed, same picks, with or without it."""

    def run(cache: bool) -> list[str]:
        w = World({"p": 6}, seed=3)
        w.router._cache = cache
        out = []
        for t in range(1, 40):
            if t % 7 == 0:
                w.apply(breaker(f"p/{t % 6}", "open" if t % 2 else "closed", tick=t))
            if t % 5 == 0:
                w.apply(routing("p", {f"p/{i}": float((i + t) % 4) for i in range(6)}, tick=t))
            if t == 1:
                w.apply(routing("p", {f"p/{i}": 1.0 for i in range(6)}))
            out += [w.pick(priority=t % 3, digest=None) for _ in range(5)]
        return out

    assert run(True) == run(False)


def test_weights_are_sorted_once_per_decision_not_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator calls pick millions of times at fleet scale: a pool's eligible nodes and their
    cumulative weights are derived once per routing or breaker decision, then reused by every call."""
    import fleetloop.router.pick as pick_module

    w = World({"p": 32, "q": 32})
    w.apply(
        routing("p", {f"p/{i}": 1.0 + i for i in range(32)}), routing("q", {f"q/{i}": 1.0 for i in range(32)})
    )
    sorts = 0
    real_sorted = sorted

    def counting_sorted(*args: Any, **kw: Any) -> Any:
        nonlocal sorts
        sorts += 1
        return real_sorted(*args, **kw)

    monkeypatch.setattr(pick_module, "sorted", counting_sorted, raising=False)
    for _ in range(1000):
        w.pick()
    assert sorts == 2  # one per pool (both pools of the model are weighed for each call)
    w.apply(routing("p", {f"p/{i}": 1.0 for i in range(32)}, tick=2))
    for _ in range(1000):
        w.pick()
    assert sorts == 4  # the new decision: each pool derived once more (the version is router-wide)


# -- pools of one model share its calls by routable capacity ----------------------------------------


def _split(w: World, calls: int) -> dict[str, int]:
    got: dict[str, int] = {}
    for _ in range(calls):
        pool = w.pick(new_task=True).split(":")[1].split("/")[0]
        got[pool] = got.get(pool, 0) + 1
    return got


def test_pools_of_one_model_split_calls_by_routable_capacity() -> None:
    w = World({"a": 2, "b": 2})
    w.router.capacity_of = lambda e: 3.0 if e.pool_id == "b" else 1.0
    w.apply(routing("a", {"a/0": 1.0, "a/1": 1.0}), routing("b", {"b/0": 1.0, "b/1": 1.0}))
    assert _split(w, 4000) == {"a": 1000, "b": 3000}  # smooth weighted round robin: exact shares


def test_pool_share_follows_the_published_weights_and_breakers() -> None:
    w = World({"a": 4, "b": 4})
    w.apply(
        routing("a", {f"a/{i}": 1.0 for i in range(4)}),
        routing("b", {"b/0": 1.0, "b/1": 1.0, "b/2": 0.0}),
        breaker("b/1"),
    )
    assert _split(w, 5000) == {"a": 4000, "b": 1000}


def test_a_pool_with_nothing_routable_takes_no_calls() -> None:
    w = World({"a": 2, "b": 2})
    for ep in w.members["a"]:
        ep.draining = True
    assert _split(w, 100) == {"b": 100}


def test_the_simulators_router_is_this_library() -> None:
    from pathlib import Path

    from fleetloop.sim.fleet import FleetSim
    from fleetloop.sim.scenario import load_scenario

    root = Path(__file__).resolve().parents[2]
    sim = FleetSim(load_scenario(root / "scenarios" / "steady-chat.yaml"), seed=1)
    assert type(sim.router) is Router


@pytest.mark.parametrize(
    ("queued", "running", "new_task", "admitted"),
    [
        (0, 40, True, True),  # nothing queued: admitted into the batch at once, max_outstanding only
        (0, 40, False, True),
        (1, 40, True, False),  # calls waiting: a first call meets its own, tighter limit
        (1, 40, False, True),  # a later call of a task under way: max_outstanding (64)
        (0, 70, True, False),  # max_outstanding binds every call
        (1, 70, False, False),
    ],
)
def test_a_first_call_meets_its_outstanding_limit_only_on_a_node_with_calls_queued(
    queued: int, running: int, new_task: bool, admitted: bool
) -> None:
    """Step 5: a node with nothing queued admits a first call into its running batch at once (it
    costs the batch some time between tokens); shed, the first call is a lost task. So the new-task
    outstanding limit binds only while calls wait."""
    w = World({"p": 1})
    w.apply(
        routing("p", {"p/0": 1.0}),
        admission("p", new_task_max_outstanding={"2": 16}, max_outstanding={"2": 64}),
    )
    w.eps["p/0"].queue_depth = queued
    w.eps["p/0"].running = running
    got = w.pick(priority=2, new_task=new_task)
    assert got == ("primary:p/0" if admitted else "shed:p"), (queued, running, new_task)


# -- step 5b: prefill fit ---------------------------------------------------------------------------


def _prefill_world(
    *, slow: dict[str, int] | None, fast: dict[str, int] | None, spill: tuple[str, ...] = ("fast",)
) -> World:
    """Two pools of model m: "slow" prefills 1,000 tokens of a priority-0 call within its SLO, "fast"
    5,000 (unless a figure is given); "other" serves model n and would fit anything."""
    w = World({"fast": 1, "slow": 1, "other": 1}, models={"m": ["slow", "fast"], "n": ["other"]})
    w.apply(
        routing("slow", {"slow/0": 1.0}, spill_to=spill, **({"slo_prompt_tokens": slow} if slow else {})),
        routing("fast", {"fast/0": 1.0}, **({"slo_prompt_tokens": fast} if fast else {})),
        routing("other", {"other/0": 1.0}, slo_prompt_tokens={"0": 10**9}),
    )
    return w


FIG_SLOW, FIG_FAST = {"0": 1_000, "2": 4_000}, {"0": 5_000, "2": 20_000}


@pytest.mark.parametrize(
    ("case", "prompt", "priority", "expected"),
    [
        # beyond the slow pool's figure, within the fast one's: every call ends on the fast pool
        ("base", 2_000, 0, ["prefill-fit:fast/0", "primary:fast/0"] * 2),
        # within both figures, or beyond both: the capacity split, nothing moved
        ("base", 1_000, 0, ["primary:slow/0", "primary:fast/0"] * 2),
        ("base", 6_000, 0, ["primary:slow/0", "primary:fast/0"] * 2),
        # the class's own figure: priority 2 has a looser SLO, so 2,000 tokens fit the slow pool
        ("base", 2_000, 2, ["primary:slow/0", "primary:fast/0"] * 2),
        # a class without a figure moves nothing
        ("base", 2_000, 1, ["primary:slow/0", "primary:fast/0"] * 2),
        # an unknown prompt size moves nothing
        ("base", 0, 0, ["primary:slow/0", "primary:fast/0"] * 2),
        # the fast pool is not in the slow pool's spill_to (no room there): it stays
        ("no-room", 2_000, 0, ["primary:slow/0", "primary:fast/0"] * 2),
        # the fast pool's picked node has a call queued: a wait there is not a saving
        ("queued", 2_000, 0, ["primary:slow/0", "primary:fast/0"] * 2),
        # the fast pool's admission sheds it: it stays where it was admitted
        ("shed", 2_000, 0, ["primary:slow/0", "shed:fast"] * 2),
        # a figure unknown on either side moves nothing
        ("slow-unknown", 2_000, 0, ["primary:slow/0", "primary:fast/0"] * 2),
        ("fast-unknown", 2_000, 0, ["primary:slow/0", "primary:fast/0"] * 2),
        # another model's pool never takes a call for its prefill (that is step 6's, for a queue)
        ("other-model", 2_000, 0, ["primary:slow/0", "primary:fast/0"] * 2),
    ],
)
def test_prefill_fit_decision_table(case: str, prompt: int, priority: int, expected: list[str]) -> None:
    slow = None if case == "slow-unknown" else FIG_SLOW
    fast = None if case == "fast-unknown" else FIG_FAST
    spill = {"no-room": (), "other-model": ("other",)}.get(case, ("fast",))
    w = _prefill_world(slow=slow, fast=fast, spill=spill)
    if case == "queued":
        w.eps["fast/0"].queue_depth = 1
    if case == "shed":
        w.apply(admission("fast", max_outstanding={"0": 0}, tick=2))
    got = [w.pick(priority, models=("m", "n"), prompt_tokens=prompt) for _ in range(4)]
    assert got == expected


def test_prefill_fit_waits_for_a_fresh_decision_and_names_no_pool_it_moved_from() -> None:
    w = _prefill_world(slow=FIG_SLOW, fast=FIG_FAST)
    r = w.router.pick(("m",), 0, None, new_task=False, budget_ms=10_000, now_s=1.0, prompt_tokens=2_000)
    assert (r.reason, r.pool_id, r.routed_from) == ("prefill-fit", "fast", None)  # the call belongs there
    # past fail_static_s the slow pool's decision no longer speaks: plain round robin, nothing moved
    late = [w.pick(models=("m",), prompt_tokens=2_000, now=31.0) for _ in range(4)]
    assert "prefill-fit:fast/0" not in late
