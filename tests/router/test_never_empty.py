"""The rotation rule every router integration keeps (fleetloop/router/state.py), as properties over
random decision streams: HAProxy's targets, the worker list of vllm-router and SGLang's router (one
mapping, one reconcile loop), and the router library's pick.

Whatever fleetloop published (a decision naming no node, weight 0 everywhere, a drain list or
breakers on every node, shadow decisions, ticks out of order, state gone stale), a pool with a node
to serve it is never left with none in rotation; an ejection is honoured only while another node of
the pool serves; stale state is plain load balancing (the router library's held shed thresholds and
retry budget lapse with it); and a fresh decision is followed exactly wherever it leaves a node in
rotation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from fleetloop.edges.actuate.haproxy.mapping import PLAIN_WEIGHT, BackendMap, PoolMap, Slot, targets
from fleetloop.edges.actuate.worker_list.mapping import WorkerMap, desired_workers
from fleetloop.router import Endpoint, Router
from fleetloop.router.state import DesiredState
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    AutoscaleDecision,
    BreakerDecision,
    Decision,
    PolicyStamp,
    RetryBudgetDecision,
    RoutingDecision,
)
from hypothesis import given, settings
from hypothesis import strategies as st

TTL = 30.0
POOLS = {"p": [f"p/{i}" for i in range(4)], "q": [f"q/{i}" for i in range(2)]}
ALL = [n for ns in POOLS.values() for n in ns]
STAMPS = {
    mode: PolicyStamp(name="t", version=1, hash="0" * 16, mode=mode)  # type: ignore[arg-type]
    for mode in ("enforce", "shadow")
}
WEIGHTS = st.sampled_from([0.0, 0.0, 1e-9, 0.05, 0.5, 1.0, 7.0])


def _wrap(body: Any, tick: int, mode: str) -> Decision:
    return Decision(ts_ms=1000 + tick, tick_id=tick, policy=STAMPS[mode], body=body)


@st.composite
def decision(draw: st.DrawFn) -> Decision:
    pool = draw(st.sampled_from(sorted(POOLS)))
    tick = draw(st.integers(1, 6))
    mode = draw(st.sampled_from(["enforce", "enforce", "enforce", "shadow"]))
    kind = draw(st.sampled_from(["routing", "routing", "breaker", "breaker", "autoscale", "limits"]))
    if kind == "routing":
        # any subset of the pool's nodes (none at all: a daemon that lost sight of them), and ids
        # no router knows
        named = draw(st.lists(st.sampled_from([*POOLS[pool], f"{pool}/ghost"]), unique=True))
        weights = {n: draw(WEIGHTS) for n in sorted(named)}
        classes = draw(st.sampled_from([{}, {"1": dict.fromkeys(named[:1], 1.0)}]))
        body: Any = RoutingDecision(
            entity=f"pool/{pool}", reason="r", pool_id=pool, weights=weights, by_priority=classes
        )
    elif kind == "breaker":
        node = draw(st.sampled_from(POOLS[pool]))
        body = BreakerDecision(
            entity=node,
            reason="r",
            pool_id=pool,
            node_id=node,
            state=draw(st.sampled_from(["open", "open", "half_open", "closed"])),
            enforced=draw(st.booleans()),
            probe_frac=0.1,
        )
    elif kind == "limits":  # shed every call of both classes, and no retry at all
        return draw(
            st.sampled_from(
                [
                    _wrap(
                        AdmissionDecision(
                            entity=f"pool/{pool}",
                            reason="r",
                            pool_id=pool,
                            max_queue_depth={"0": 0, "1": 0},
                        ),
                        tick,
                        mode,
                    ),
                    _wrap(
                        RetryBudgetDecision(
                            entity=f"pool/{pool}",
                            reason="r",
                            pool_id=pool,
                            retry_ratio=0.0,
                            min_retries_per_s=0.0,
                            retries_allowed_now=0,
                        ),
                        tick,
                        mode,
                    ),
                ]
            )
        )
    else:
        drain = draw(st.lists(st.sampled_from(POOLS[pool]), unique=True))
        body = AutoscaleDecision(
            entity=f"pool/{pool}",
            reason="r",
            pool_id=pool,
            current_nodes=len(POOLS[pool]),
            desired_nodes=len(POOLS[pool]) - len(drain),
            drain=tuple(sorted(drain)),
        )
    return _wrap(body, tick, mode)


@dataclass(frozen=True)
class Stream:
    """Decisions with their arrival times (seconds, rising), and when the actuator looks."""

    arrivals: list[tuple[float, Decision]]
    now: float

    def state(self) -> DesiredState:
        s = DesiredState()
        for at, d in self.arrivals:
            s.accept(d, at)
        return s


@st.composite
def stream(draw: st.DrawFn) -> Stream:
    ds = draw(st.lists(decision(), max_size=24))
    gaps = draw(st.lists(st.floats(0.0, 8.0), min_size=len(ds), max_size=len(ds)))
    at, arrivals = 0.0, []
    for d, g in zip(ds, gaps, strict=True):
        at += g
        arrivals.append((at, d))
    return Stream(arrivals, at + draw(st.sampled_from([0.0, 1.0, 29.0, 31.0, 120.0])))


def expected(state: DesiredState, pool: str, nodes: list[str], now: float, *, drain: bool) -> set[str] | None:
    """The nodes a fresh decision keeps in rotation, by the rule's step 2 stated independently;
    None when no fresh routing decision is held."""
    held = state.pools.get(pool)
    if held is None or held.routing is None or now - held.routing_at_s > TTL:
        return None
    drained = set(held.autoscale.drain) if drain and held.autoscale is not None else set()
    out = set()
    for n in nodes:
        w = held.routing.weights.get(n)
        b = state.breakers.get(n)
        ejected = b is not None and b.enforced and b.state == "open"
        if w is not None and w > 0 and not ejected and n not in drained:
            out.add(n)
    return out


def ejected(state: DesiredState, node: str) -> bool:
    b = state.breakers.get(node)
    return b is not None and b.enforced and b.state == "open"


BMAP = BackendMap(
    tuple(
        PoolMap(
            pool, f"be-{pool}", "m", tuple(Slot(n, pool, f"be-{pool}", f"s{i}") for i, n in enumerate(ns))
        )
        for pool, ns in sorted(POOLS.items())
    )
)
WMAP = WorkerMap({pool: {n: f"http://{n.replace('/', '-')}" for n in ns} for pool, ns in POOLS.items()})


@settings(max_examples=400, deadline=None)
@given(s=stream())
def test_haproxy_never_empties_a_backend(s: Stream) -> None:
    state = s.state()
    got = targets(state, BMAP, s.now, TTL)
    for pool in BMAP.pools:
        nodes = [slot.node_id for slot in pool.slots]
        routable = {
            slot.node_id for slot in pool.slots if got[slot].admin == "ready" and got[slot].weight > 0
        }
        assert routable, f"backend {pool.backend} emptied: {[got[x] for x in pool.slots]}"
        keep = expected(state, pool.pool_id, nodes, s.now, drain=True)
        if keep is None:  # stale or absent: plain load balancing
            assert {(got[x].admin, got[x].weight) for x in pool.slots} == {("ready", PLAIN_WEIGHT)}
        elif keep:  # the fresh decision leaves someone: followed exactly
            assert routable == keep
        for slot in pool.slots:
            if got[slot].why == "breaker-open":
                assert ejected(state, slot.node_id)
                assert routable - {slot.node_id}


@settings(max_examples=400, deadline=None)
@given(s=stream())
def test_a_worker_list_router_never_empties_a_worker_list(s: Stream) -> None:
    state = s.state()
    got = desired_workers(state, WMAP, s.now, TTL)
    for pool, by_node in WMAP.pools.items():
        present = {n for n, url in by_node.items() if got[url][0]}
        assert present, f"pool {pool} emptied: {got}"
        keep = expected(state, pool, sorted(by_node), s.now, drain=True)
        if keep is None:
            assert present == set(by_node)
        elif keep:
            assert present == keep
        else:
            # nothing left by the decision: the nodes it names are preferred, and an ejected worker
            # is present only when every one of those is ejected too
            held = state.pools[pool].routing
            assert held is not None
            named = [n for n in by_node if n in held.weights] or list(by_node)
            assert present <= set(named)
            if any(ejected(state, n) for n in present):
                assert all(ejected(state, n) for n in named)


class _Workers:
    """A router's worker list in memory, recording its smallest size per pool after every change."""

    def __init__(self, present: set[str]) -> None:
        self.workers = set(present)
        self.smallest = {pool: len(present & set(by.values())) for pool, by in WMAP.pools.items()}

    async def list_workers(self) -> set[str]:
        return set(self.workers)

    async def add_worker(self, url: str) -> None:
        self.workers.add(url)

    async def remove_worker(self, url: str) -> None:
        self.workers.discard(url)
        for pool, by in WMAP.pools.items():
            self.smallest[pool] = min(self.smallest[pool], len(self.workers & set(by.values())))

    async def close(self) -> None:
        return None


@settings(max_examples=200, deadline=None)
@given(s=stream(), start=st.sets(st.sampled_from(sorted(WMAP.urls())), min_size=0))
def test_the_worker_list_actuator_never_empties_a_pool_on_the_way(s: Stream, start: set[str]) -> None:
    """The loop ``fleetloop actuate vllm-router`` and ``sglang-router`` run, reconciling after every
    arrival of the stream from any starting list: a pool that had a worker never has none, even
    between two calls of one pass (adds go first), and each pass leaves the mapping's list."""
    import asyncio

    from fleetloop.edges.actuate.worker_list.actuator import WorkerListActuator

    api = _Workers(start)
    state = DesiredState()
    clock = {"now": 0.0}
    act = WorkerListActuator(api, WMAP, state, fail_static_s=TTL, now=lambda: clock["now"])

    async def walk() -> None:
        for at, d in [*s.arrivals, (s.now, None)]:
            clock["now"] = at
            if d is not None:
                state.accept(d, at)
            await act.reconcile()
            want = {u for u, (present, _) in desired_workers(state, WMAP, at, TTL).items() if present}
            assert api.workers == want

    asyncio.run(walk())
    for pool, by in WMAP.pools.items():
        if start & set(by.values()):
            assert api.smallest[pool] >= 1, f"pool {pool} emptied on the way"


@settings(max_examples=300, deadline=None)
@given(s=stream(), draining=st.sets(st.sampled_from(ALL)), priority=st.sampled_from([0, 1]))
def test_the_router_library_never_leaves_a_pool_without_a_node(
    s: Stream, draining: set[str], priority: int
) -> None:
    eps = {n: Endpoint(node_id=n, pool_id=n.split("/")[0], draining=n in draining) for n in ALL}
    members = {pool: [eps[n] for n in ns] for pool, ns in POOLS.items()}
    router: Router[Endpoint] = Router(
        {"m": tuple(sorted(POOLS))}, np.random.default_rng(0), members=members, nodes=eps, fail_static_s=TTL
    )
    for at, d in s.arrivals:
        router.apply([d], at)
    state = router.state
    for pool, ns in POOLS.items():
        serving = [n for n in ns if n not in draining]
        node = router.pick_node(pool, priority, None, s.now)
        if not serving:
            continue
        assert node is not None, f"pool {pool} emptied"
        assert node.node_id in serving
        fresh = state.routing_fresh(pool, s.now, TTL) is not None
        # a fresh decision (plain weights for this class) is followed exactly where it leaves a node
        # its own flag does not drain: the actuators' rotation, the drain list included
        keep = expected(state, pool, serving, s.now, drain=True)
        held = state.pools[pool].routing if pool in state.pools else None
        if keep and held is not None and not held.by_priority.get(str(priority)):
            for again in [node, *(router.pick_node(pool, priority, None, s.now) for _ in range(7))]:
                assert again is not None
                assert again.node_id in keep, (again.node_id, keep)
        if fresh and ejected(state, node.node_id):
            assert all(ejected(state, n) for n in serving)
        if not fresh:  # failing static: held shed thresholds and retry budgets are as old
            assert router.admit(pool, node, priority, new_task=True, budget_ms=10_000, now_s=s.now)
            assert router.allow_retry(pool, "t", now_s=s.now)
    if any(n not in draining for n in ALL):
        route = router.pick(("m",), priority, None, new_task=False, budget_ms=10_000, now_s=s.now)
        if route.node is None:  # only a fresh decision's own shed thresholds turn a call away
            assert route.reason == "shed", route
            assert state.routing_fresh(route.pool_id, s.now, TTL) is not None
