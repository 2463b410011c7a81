"""FleetSim: the simulated fleet (serving nodes, routers, GPU workers, agent clients), time-agnostic.

It serves two drivers with one core:

- the in-process runner (:mod:`fleetloop.sim.runner`) advances it in virtual time, tick by tick;
- the live demo publishes what it emits to Kafka in real time and feeds back the decisions it
  consumes.

Usage::

    sim = FleetSim(scenario, seed, start_ms=...)
    emitted = sim.advance_to(t_ms)      # the world up to event time t_ms (absolute epoch ms)
    sim.apply(decisions)                # routers and GPU workers apply desired state
    sim.inject(fault)                   # a fault, now
    sim.done, sim.report()

``advance_to`` runs a discrete-event simulation (a heap of timed events, ties broken by a kind
priority and then an insertion counter, so the order is total and deterministic) and returns the
records produced in ``(previous t, t_ms]``: telemetry every 1000 ms for every provisioned node
(cold and loading ones too) and one RequestOutcome per call attempt, each list in ``ts_ms`` order.
``advance_twins`` is the same with the records as their msgspec twins
(:mod:`fleetloop.schemas.fast`, what the daemon folds): each is the twin of the wire record
``advance_to`` builds (``TWIN.of(Model(**fields))``, the statement), built without the pydantic
model when the twin's own checks accept it (``msgspec.convert`` plus the twin's pattern and
``after`` checks), through the model otherwise (so a record the model refuses raises its error).
Randomness comes from one ``numpy.random.SeedSequence(seed)``, spawned into one stream per
component (arrivals and call sizes per workload, backoff jitter, router picks, fault targets, cold
starts), so a change in one component's draws does not shift another's. No wall clock is read here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import numpy as np

from fleetloop.perf.catalog import NodeSpec, node_spec
from fleetloop.schemas.decisions import (
    AutoscaleDecision,
    BatchingDecision,
    Decision,
)
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN, OutcomeRec, TelemetryRec, Twin
from fleetloop.schemas.requests import RequestOutcome, diverted_copy_update
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.sim import faults as faults_mod
from fleetloop.sim.accounting import Accounting
from fleetloop.sim.clients import Attempt, Task, backoff_s, draw_call, new_task, prefix_tokens
from fleetloop.sim.node import IntervalStats, Node, Req
from fleetloop.sim.router import SimRouter, kv_used_frac, sim_router
from fleetloop.sim.scenario import Fault, Pool, Scenario

TELEMETRY_S = 1.0
# Event kinds, in the order they run at one instant.
_P_NODE, _P_FAULT, _P_CLIENT, _P_ARRIVAL, _P_TELEMETRY = range(5)


@dataclass(frozen=True, slots=True)
class Emitted:
    telemetry: list[NodeTelemetry]
    outcomes: list[RequestOutcome]


@dataclass(frozen=True, slots=True)
class TwinEmitted:
    telemetry: list[TelemetryRec]
    outcomes: list[OutcomeRec]


S = TypeVar("S", bound=msgspec.Struct)


def twin_record(twin: Twin[S], accepts: Callable[[S], bool], fields: dict[str, Any]) -> S:
    """``twin.of(twin.model(**fields))`` (the statement), without building the pydantic model when
    the twin accepts ``fields`` as they are: ``msgspec.convert`` checks types and bounds (an int
    given for a float becomes that float, as pydantic's lax mode makes it), the twin's own checks
    the identifier patterns and the model's ``after`` validator (``accepts``, the twin's
    ``decoder()[1]``). Anything either refuses takes the statement's path (the model raises its own
    error for a record it refuses)."""
    try:
        rec = msgspec.convert(fields, twin.struct)
    except msgspec.ValidationError:
        return twin.of(twin.model(**fields))
    if accepts(rec):
        return rec
    return twin.of(twin.model(**fields))


_TELEMETRY_ACCEPTS = TELEMETRY_TWIN.decoder()[1]
_OUTCOME_ACCEPTS = OUTCOME_TWIN.decoder()[1]


@dataclass(frozen=True, slots=True)
class SimReport:
    """Accounting so far: ``summary`` holds tasks, cost, latency, requests, by_priority and
    nodes; ``timeline`` one row per simulated second."""

    scenario: str
    seed: int
    virtual_s: float
    summary: dict[str, Any]
    timeline: list[dict[str, float]]


@dataclass(slots=True)
class _Spike:
    factor: float
    tenant: str | None
    until: float | None


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _wpct(samples: list[tuple[float, float]], q: float) -> float | None:
    if not samples:
        return None
    s = sorted(samples)
    total = sum(w for _, w in s)
    acc = 0.0
    for v, w in s:
        acc += w
        if acc >= q * total:
            return v
    return s[-1][0]


@dataclass(slots=True)
class _Window:
    lo_ms: int = 0  # relative to start, exclusive
    hi_ms: int = 0  # relative to start, inclusive
    twins: bool = False  # records as their msgspec twins (advance_twins) or wire models
    telemetry: list[Any] = field(default_factory=list)
    outcomes: list[Any] = field(default_factory=list)


def scale_in_victims(active: Sequence[Node], drain: Sequence[str], k: int) -> list[Node]:
    """The ``k`` nodes a scale-in drains: the ones the decision names first (in its order), then
    cold before warm, newest (highest index) first. The simulator and the live fleet emulator both
    act on autoscale decisions with this one rule, so a policy sees the same fleet react in each."""
    by_id = {n.node_id: n for n in active}
    named = [by_id[i] for i in dict.fromkeys(drain) if i in by_id]
    rest = sorted(
        (n for n in active if n not in named),
        key=lambda n: (n.warm, -int(n.node_id.rsplit("/", 1)[1])),
    )
    return [*named, *rest][: max(k, 0)]


def scale_plan(members: Sequence[Node], pool: Pool, d: AutoscaleDecision) -> tuple[int, list[Node]]:
    """What an autoscale decision asks of a pool: how many nodes to provision, or which to drain.

    The decision's ``desired_nodes`` is held within the pool's ``min_nodes..hi_nodes``; it is
    compared with the pool's active nodes (alive, not draining), and a scale-in drains the nodes
    ``scale_in_victims`` picks."""
    desired = min(max(d.desired_nodes, pool.min_nodes), pool.hi_nodes)
    active = [n for n in members if n.alive and not n.draining]
    if desired > len(active):
        return desired - len(active), []
    return 0, scale_in_victims(active, d.drain, len(active) - desired)


class FleetSim:
    """The simulated world. See the module docstring."""

    def __init__(self, scenario: Scenario, seed: int, *, start_ms: int = 0) -> None:
        self.scenario = scenario
        self.seed = seed
        self.start_ms = start_ms
        self.now = 0.0
        self._advanced_ms = 0  # relative
        self._heap: list[tuple[float, int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        n_w = len(scenario.workload)
        streams = np.random.SeedSequence(seed).spawn(4 + 2 * n_w)
        self._rng_router = np.random.default_rng(streams[0])
        self._rng_backoff = np.random.default_rng(streams[1])
        self._rng_faults = np.random.default_rng(streams[2])
        self._rng_boot = np.random.default_rng(streams[3])  # cold-start draws
        self._rng_arrivals = [np.random.default_rng(streams[4 + i]) for i in range(n_w)]
        self._rng_tasks = [np.random.default_rng(streams[4 + n_w + i]) for i in range(n_w)]
        self.pools: dict[str, Pool] = {p.id: p for p in scenario.pools}
        self.specs: dict[str, NodeSpec] = {
            p.id: node_spec(p.model, p.gpu, p.gpus_per_node, p.precision) for p in scenario.pools
        }
        pools_by_model: dict[str, tuple[str, ...]] = {}
        for p in sorted(scenario.pools, key=lambda p: p.id):
            pools_by_model[p.model] = (*pools_by_model.get(p.model, ()), p.id)
        self.nodes: dict[str, Node] = {}
        self._retired: list[Node] = []
        self._members: dict[str, list[Node]] = {p: [] for p in sorted(self.pools)}
        self.router: SimRouter = sim_router(pools_by_model, self._rng_router, self._members, self.nodes)
        self._next_index: dict[str, int] = dict.fromkeys(self.pools, 0)
        self._max_batch: dict[str, int] = {
            p.id: p.runtime.max_batch_tokens(p.gpu, self.specs[p.id].gpu.hbm_gib * 1e9)
            for p in scenario.pools
        }
        self.acct = Accounting(slo_ttft_ms=float(scenario.slo.ttft_ms))
        self.tasks_active: dict[int, Task] = {}
        self._task_seq = 0
        self._rid = 0
        self.orphans = 0  # requests that ran on after their non-streaming client left
        self.failed_by: dict[str, int] = {}  # "<cause>:<last attempt's outcome>" -> failed tasks
        self._priority = {t.id: t.priority for t in scenario.tenants}
        self._spikes: list[_Spike] = []
        self._arrival_version = [0] * n_w
        self._window = _Window()
        self.timeline: list[dict[str, float]] = []
        self._tl_ttft: list[float] = []
        self._tl_last: dict[str, float] = {}
        self._last_decision_count = 0
        self.fault_log: list[tuple[float, str, tuple[str, ...]]] = []
        for pool_id in sorted(self.pools):
            for _ in range(self.pools[pool_id].nodes):
                self._provision(pool_id, warm=True)
        for i in range(n_w):
            self._schedule_arrival(i)
        for f in scenario.faults:
            self._push(f.at_s, _P_FAULT, self._fire_fault, (f,))
        self._push(TELEMETRY_S, _P_TELEMETRY, self._telemetry, ())

    # -- the event loop -----------------------------------------------------------------------------

    def _push(self, t: float, prio: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, prio, self._seq, fn, args))

    def _schedule_node(self, t: float, node: Node, version: int) -> None:
        self._push(t, _P_NODE, self._node_event, (node, version))

    def _node_event(self, node: Node, version: int) -> None:
        node.on_event(self.now, version)
        if node.draining and node.alive and node.idle:
            self._remove(node)

    def advance_to(self, t_ms: int) -> Emitted:
        """Run the world up to event time ``t_ms`` (absolute epoch ms) and return what it emitted."""
        w = self._advance(t_ms, twins=False)
        return Emitted(telemetry=w.telemetry, outcomes=w.outcomes)

    def advance_twins(self, t_ms: int) -> TwinEmitted:
        """:meth:`advance_to` with the records as their msgspec twins (see the module docstring)."""
        w = self._advance(t_ms, twins=True)
        return TwinEmitted(telemetry=w.telemetry, outcomes=w.outcomes)

    def _advance(self, t_ms: int, *, twins: bool) -> _Window:
        rel_ms = t_ms - self.start_ms
        if rel_ms < self._advanced_ms:
            raise ValueError(f"advance_to({t_ms}) goes back in time (at {self.start_ms + self._advanced_ms})")
        limit = rel_ms / 1000.0
        self._window = _Window(lo_ms=self._advanced_ms, hi_ms=rel_ms, twins=twins)
        heap = self._heap
        while heap and heap[0][0] <= limit:
            t, _, _, fn, args = heapq.heappop(heap)
            self.now = max(self.now, t)
            fn(*args)
        self.now = max(self.now, limit)
        self._advanced_ms = rel_ms
        return self._window

    def _ts(self) -> int:
        w = self._window
        rel = math.ceil(self.now * 1000.0 - 1e-6)
        return self.start_ms + min(w.hi_ms, max(w.lo_ms + 1, rel))

    @property
    def done(self) -> bool:
        """Arrivals are over and every task has succeeded or failed."""
        return self.now >= self.scenario.duration_s and not self.tasks_active

    # -- GPU workers -------------------------------------------------------------------------------

    def _provision(self, pool_id: str, *, warm: bool) -> Node:
        idx = self._next_index[pool_id]
        self._next_index[pool_id] = idx + 1
        node = Node(
            f"{pool_id}/{idx}",
            pool_id,
            self.specs[pool_id],
            self,
            self._schedule_node,
            now=self.now,
            warm=warm,
            max_batch_tokens=self._max_batch[pool_id],
            runtime=self.pools[pool_id].runtime,
        )
        self.nodes[node.node_id] = node
        self._members[pool_id].append(node)
        self.router.fleet_changed()
        if not warm:
            self._boot(node)
        return node

    def _boot(self, node: Node) -> None:
        node.boot += 1
        to_loading, to_warm = self.pools[node.pool_id].boot_times(self._rng_boot)
        node.weights_state = "cold"
        self._push(self.now + to_loading, _P_NODE, self._weights, (node, node.boot, "loading"))
        self._push(self.now + to_warm, _P_NODE, self._weights, (node, node.boot, "warm"))

    def _weights(self, node: Node, boot: int, state: str) -> None:
        if node.alive and node.boot == boot:
            node.set_weights_state(state, self.now)

    def _remove(self, node: Node) -> None:
        node.alive = False
        node.removed_at = self.now
        node.version += 1
        members = self._members[node.pool_id]
        if node in members:
            members.remove(node)
        self.nodes.pop(node.node_id, None)
        self._retired.append(node)
        self.router.fleet_changed()

    def pool_nodes(self, pool_id: str) -> Sequence[Node]:
        return tuple(self._members.get(pool_id, ()))

    def node(self, node_id: str) -> Node | None:
        n = self.nodes.get(node_id)
        return n if n is not None and n.alive else None

    def _autoscale(self, d: AutoscaleDecision) -> None:
        pool = self.pools.get(d.pool_id)
        if pool is None:
            return
        add, victims = scale_plan(self._members[d.pool_id], pool, d)
        for _ in range(add):
            self._provision(d.pool_id, warm=False)
        for n in victims:
            n.draining = True
            self.router.fleet_changed()
            if n.idle:
                self._remove(n)

    def _batching(self, d: BatchingDecision) -> None:
        if d.pool_id not in self.pools or d.max_batch_tokens <= 0:
            return
        self._max_batch[d.pool_id] = d.max_batch_tokens
        for n in self._members[d.pool_id]:
            n.max_batch_tokens = d.max_batch_tokens

    # -- desired state in ----------------------------------------------------------------------------

    def apply(self, decisions: Iterable[Decision]) -> None:
        """Routers and GPU workers apply desired state: enforced decisions only, newest per key
        (the router library keeps that rule; the GPU workers act on what it accepted)."""
        for d in self.router.apply(decisions, self.now):
            body = d.body
            if isinstance(body, AutoscaleDecision):
                self._autoscale(body)
            elif isinstance(body, BatchingDecision):
                self._batching(body)

    # -- faults --------------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        """Apply a fault now (the demo's live injection); scenario faults fire at their ``at_s``."""
        self._fire_fault(fault)

    def _fire_fault(self, fault: Fault) -> None:
        hit = faults_mod.fire(self, fault, self._rng_faults)
        self.fault_log.append((self.now, fault.kind, tuple(hit)))

    def crash_node(self, node: Node, *, comes_back: bool) -> None:
        node.crash(self.now, keep_alive=comes_back)
        if comes_back:
            node.degrade = 1.0
            self.router.node_replaced(node.node_id)  # its prefix cache is gone with the host
            self._boot(node)
        else:
            members = self._members[node.pool_id]
            if node in members:
                members.remove(node)
            # Stays in self.nodes: routers keep sending to it until the control plane zeroes it.

    def degrade_node(self, node: Node, factor: float, until: float | None) -> None:
        node.degrade_gen += 1
        node.set_degrade(factor, self.now)
        if until is not None:
            self._push(until, _P_FAULT, self._restore, (node, node.degrade_gen))

    def _restore(self, node: Node, gen: int) -> None:
        if node.alive and node.degrade_gen == gen:
            node.set_degrade(1.0, self.now)

    def spike(self, factor: float, tenant: str | None, until: float | None) -> None:
        s = _Spike(factor, tenant, until)
        self._spikes.append(s)
        self._respike(tenant)
        if until is not None:
            self._push(until, _P_FAULT, self._unspike, (s,))

    def _unspike(self, s: _Spike) -> None:
        if s in self._spikes:
            self._spikes.remove(s)
            self._respike(s.tenant)

    def _respike(self, tenant: str | None) -> None:
        for i, w in enumerate(self.scenario.workload):
            if tenant is None or w.tenant == tenant:
                self._arrival_version[i] += 1
                self._schedule_arrival(i)

    # -- clients -------------------------------------------------------------------------------------

    def _rate(self, i: int) -> float:
        w = self.scenario.workload[i]
        factor = 1.0
        for s in self._spikes:
            if s.tenant is None or s.tenant == w.tenant:
                factor *= s.factor
        return w.rate_per_s * factor

    def _schedule_arrival(self, i: int) -> None:
        t = self.now + float(self._rng_arrivals[i].exponential(1.0 / self._rate(i)))
        if t < self.scenario.duration_s:
            self._push(t, _P_ARRIVAL, self._arrival, (i, self._arrival_version[i]))

    def _arrival(self, i: int, version: int) -> None:
        if version != self._arrival_version[i]:
            return
        w = self.scenario.workload[i]
        self._task_seq += 1
        task = new_task(
            self._task_seq,
            workload_index=i,
            w=w,
            priority=self._priority[w.tenant],
            now=self.now,
            rng=self._rng_tasks[i],
        )
        self.tasks_active[task.seq] = task
        self.acct.task_started(task)
        self._start_call(task)
        self._schedule_arrival(i)

    def _start_call(self, task: Task) -> None:
        draw_call(task, self._rng_tasks[task.workload])
        task.call_t = self.now
        self._send(task, 0)

    def _send(self, task: Task, attempt_no: int) -> None:
        if task.outcome is not None:
            return
        now = self.now
        w = task.spec
        budget_s = max(0.0, min(w.client.timeout_s, task.deadline_t - now))
        budget_ms = int(budget_s * 1000.0)
        new = task.step == 0
        route = self.router.pick(
            w.models,
            task.priority,
            task.prefix_digest,
            new_task=new,
            budget_ms=budget_ms,
            now_s=now,
            prompt_tokens=task.prompt,
            prefix_tokens=prefix_tokens(task),
        )
        pool_id = route.pool_id or sorted(self.pools)[0]
        model = self.pools[pool_id].model if pool_id in self.pools else w.models[0]
        node = route.node
        att = Attempt(task, attempt_no, pool_id, node.node_id if node else None, model, now, budget_ms)
        att.routed_from = route.routed_from
        task.attempt = att
        if node is None:
            self._failed(att, "shed")
            return
        self.router.started(node.node_id)
        if not node.alive:
            self._failed(att, "error")  # a crashed node: connection refused
            return
        self._rid += 1
        req = Req(self._rid, task.prompt, task.output, task.prefix_digest, prefix_tokens(task), owner=att)
        att.req = req
        api_s = node.runtime.api_s
        if api_s > 0.0:  # HTTP, tokenization and the hop to the engine core: the node sees it later
            node.inbound += 1
            self._push(now + api_s, _P_NODE, self._deliver, (att, node, req))
        else:
            node.submit(req, now)
        if not att.done:
            self._push(min(now + w.client.timeout_s, task.deadline_t), _P_CLIENT, self._timer, (att,))

    def _deliver(self, att: Attempt, node: Node, req: Req) -> None:
        """The request reaches the engine ``api_s`` after the client sent it (the runtime profile's
        per-request cost outside the GPU loop). A streaming client that left meanwhile took it with
        it; a non-streaming one's request runs on as an orphan; a node that died refuses it."""
        node.inbound -= 1
        if att.done and att.task.spec.client.stream:
            if node.draining and node.alive and node.idle:
                self._remove(node)
            return
        if not node.alive:
            if not att.done:
                self._failed(att, "error")
            return
        node.submit(req, self.now)
        if att.done and node.abandon(req):
            self.orphans += 1

    def _timer(self, att: Attempt) -> None:
        if att.done:
            return
        task = att.task
        node = self.nodes.get(att.node_id) if att.node_id else None
        if self.now >= task.deadline_t - 1e-9:
            self._give_up(att, node)
            self._failed(att, "timeout", final=True)
        elif att.ttft_s is not None and task.spec.client.stream:
            self._push(task.deadline_t, _P_CLIENT, self._timer, (att,))  # streaming: only the deadline now
        else:
            self._give_up(att, node)
            self._failed(att, "timeout")

    def _give_up(self, att: Attempt, node: Node | None) -> None:
        """The client stops waiting. A streaming client's disconnect aborts the request on the engine;
        a non-streaming client's does not (the engine cannot see it), so the request runs on."""
        if node is None or att.req is None:
            return
        if att.task.spec.client.stream:
            node.cancel(att.req, self.now)
        elif node.abandon(att.req):
            self.orphans += 1

    # NodeListener
    def on_first_token(self, req: Req, t: float) -> None:
        att = req.owner
        assert isinstance(att, Attempt)
        if not att.done:
            att.ttft_s = t - att.sent_t

    def on_finish(self, req: Req, t: float) -> None:
        att = req.owner
        assert isinstance(att, Attempt)
        if not att.done:
            self._ok(att)

    def on_lost(self, req: Req, t: float) -> None:
        att = req.owner
        assert isinstance(att, Attempt)
        if not att.done:
            self._failed(att, "error")

    def on_waste(self, req: Req, usd: float) -> None:
        att = req.owner
        assert isinstance(att, Attempt)
        self.acct.waste(att.task.priority, usd)

    def _close(self, att: Attempt) -> None:
        att.done = True
        if att.node_id is not None:
            self.router.finished(att.node_id)

    def _emit(
        self, att: Attempt, outcome: str, cost: float, task_outcome: str | None, kind: str = "ok"
    ) -> None:
        task = att.task
        req = att.req
        ttft_ms = att.ttft_s * 1000.0 if att.ttft_s is not None else None
        if outcome == "ok" and ttft_ms is not None:
            self._tl_ttft.append(ttft_ms)
        self.acct.attempt(task, kind, cost, ttft_ms, att.attempt)
        generated = 0
        if req is not None:
            generated = task.output if outcome == "ok" else min(task.output, req.generated)
        fields: dict[str, Any] = {
            "ts_ms": self._ts(),
            "request_id": f"{task.task_id}.{task.step}",
            "attempt": min(att.attempt, 100),
            "workflow_id": task.task_id,
            "step_index": task.step,
            "workflow_spend_usd": round(task.spend_usd, 9),
            "tenant_id": task.tenant_id,
            "priority": task.priority,
            "latency_budget_ms": att.budget_ms,
            "pool_id": att.pool_id,
            "node_id": att.node_id,
            "model": att.model,
            "prompt_tokens": task.prompt,
            "cached_prompt_tokens": min(req.cached, task.prompt) if req is not None else 0,
            "output_tokens": generated,
            "prefix_digest": task.prefix_digest,
            "ttft_ms": round(ttft_ms, 3) if ttft_ms is not None else None,
            "e2e_ms": round((self.now - att.sent_t) * 1000.0, 3),
            "outcome": outcome,
            "cost_usd": round(cost, 9),
            "task_outcome": task_outcome,
        }
        copy: dict[str, Any] | None = None
        if att.routed_from is not None:
            fields["routed_from"] = att.routed_from
            if outcome != "shed":  # the copy a router publishes beside it (diverted_copy)
                copy = {**fields, **diverted_copy_update(att.pool_id, att.routed_from)}
        w = self._window
        for rec in (fields,) if copy is None else (fields, copy):
            if w.twins:
                w.outcomes.append(twin_record(OUTCOME_TWIN, _OUTCOME_ACCEPTS, rec))
            else:
                w.outcomes.append(RequestOutcome(**rec))
        task.spend_usd += cost

    def _ok(self, att: Attempt) -> None:
        self._close(att)
        task = att.task
        cost = att.req.cost if att.req is not None else 0.0
        last = task.last_call
        self._emit(att, "ok", cost, "succeeded" if last else None)
        first_token_t = att.sent_t + att.ttft_s if att.ttft_s is not None else self.now
        self.acct.call_completed(task.priority, (first_token_t - task.call_t) * 1000.0)
        if last:
            self._finish_task(task, succeeded=True)
        else:
            task.step += 1
            self._start_call(task)

    def _failed(self, att: Attempt, kind: str, *, final: bool = False) -> None:
        self._close(att)
        task = att.task
        req = att.req
        cost = 0.0
        if req is not None:
            cost = req.reported_cost if (req.cancelled or req.orphaned) else req.cost
        retry_at: float | None = None
        client = task.spec.client
        cause = "deadline"
        if not final:
            cause = "retries_exhausted"
            if att.attempt < client.max_retries:
                wait = backoff_s(self._rng_backoff, client.backoff_s, client.backoff_max_s, att.attempt)
                t = self.now + wait
                if t >= task.deadline_t:
                    cause = "deadline"
                elif not self.router.allow_retry(att.pool_id, task.tenant_id, kind, now_s=self.now):
                    cause = "retry_budget"
                else:
                    retry_at = t
        outcome = kind if (kind == "shed" or retry_at is None) else "retry"
        self._emit(att, outcome, cost, None if retry_at is not None else "failed", kind)
        if retry_at is None:
            self.failed_by[f"{cause}:{kind}"] = self.failed_by.get(f"{cause}:{kind}", 0) + 1
            self.acct.call_missed(task.priority)
            self._finish_task(task, succeeded=False)
        else:
            self._push(retry_at, _P_CLIENT, self._send, (task, att.attempt + 1))

    def _finish_task(self, task: Task, *, succeeded: bool) -> None:
        task.outcome = "succeeded" if succeeded else "failed"
        self.acct.task_finished(task, succeeded)
        self.tasks_active.pop(task.seq, None)

    # -- telemetry -----------------------------------------------------------------------------------

    def _telemetry(self) -> None:
        now = self.now
        ts = self._ts()
        provisioned = warm = 0
        rate = 0.0
        for pool_id in sorted(self._members):
            pool = self.pools[pool_id]
            for node in sorted(self._members[pool_id], key=lambda n: n.node_id):
                if not node.alive:
                    continue
                stats = node.take_stats(now)
                self.acct.tbt(stats.tbt)
                fields = self._node_record(node, pool, stats, ts, now)
                w = self._window
                if w.twins:
                    w.telemetry.append(twin_record(TELEMETRY_TWIN, _TELEMETRY_ACCEPTS, fields))
                else:
                    w.telemetry.append(NodeTelemetry(**fields))
                node.last_report = now
                provisioned += 1
                warm += int(node.warm)
                rate += node.spec.usd_per_h
        self._timeline_row(provisioned, warm, rate)
        self._push(now + TELEMETRY_S, _P_TELEMETRY, self._telemetry, ())

    def _node_record(self, node: Node, pool: Pool, s: IntervalStats, ts: int, now: float) -> dict[str, Any]:
        """The fields of the node's telemetry record (a ``NodeTelemetry`` or its twin)."""
        interval_s = max(0.001, now - max(node.last_report, node.provisioned_at))
        spec = node.spec
        used = node.kv_used + node.cache_tokens
        hbm_free = spec.hbm_bytes - spec.model.weight_bytes - used * spec.model.kv_bytes_per_token
        return {
            "ts_ms": ts,
            "node_id": node.node_id,
            "pool_id": node.pool_id,
            "model": pool.model,
            "gpu_type": pool.gpu,
            "gpu_count": spec.gpus,
            "weights_state": node.weights_state,
            "draining": node.draining,
            "interval_ms": max(1, round(interval_s * 1000.0)),
            "ttft_p50_ms": _pct(s.ttft_ms, 0.5),
            "ttft_p99_ms": _pct(s.ttft_ms, 0.99),
            "tbt_p50_ms": _wpct(s.tbt, 0.5),
            "tbt_p99_ms": _wpct(s.tbt, 0.99),
            "queue_depth": node.queue_depth,
            "running_requests": node.running,
            "queued_prompt_tokens": node.queued_tokens,
            "kv_cache_used_frac": kv_used_frac(node),
            "hbm_free_gib": max(0.0, round(hbm_free / 2**30, 3)),
            "gpu_util_frac": min(1.0, round(s.busy_s / interval_s, 6)),
            "prefix_cache_hit_frac": round(s.prefix_hits / s.prefix_lookups, 6) if s.prefix_lookups else 0.0,
            "hot_prefixes": node.hot_prefixes(),
            "max_batch_tokens": node.max_batch_tokens,
            "errors": s.errors,
            "timeouts": s.timeouts,
            "preemptions": s.preemptions,
            "requests_completed": s.completed,
            "prompt_tokens": s.prompt_tokens,
            "output_tokens": s.output_tokens,
            "cost_rate_usd_per_h": spec.usd_per_h,
            "engine": pool.engine,  # the scenario's engine, as a scraper names the runtime it reads
        }

    def _timeline_row(self, provisioned: int, warm: int, rate: float) -> None:
        a = self.acct
        succeeded = sum(c.tasks_succeeded for c in a.classes.values())
        failed = sum(c.tasks_failed for c in a.classes.values())
        cur = {
            "ok": float(a.ok),
            "shed": float(a.shed),
            "retries": float(a.retries),
            "errors": float(a.errors),
            "timeouts": float(a.timeouts),
            "orphaned": float(self.orphans),
            "tasks_succeeded": float(succeeded),
            "tasks_failed": float(failed),
        }
        row: dict[str, float] = {
            "t_s": round(self.now, 3),
            "provisioned": float(provisioned),
            "warm": float(warm),
            "cost_rate_usd_per_h": round(rate, 6),
            "breakers_open": float(self.router.open_breakers()),
            "ttft_p99_ms": round(_pct(self._tl_ttft, 0.99) or 0.0, 3),
            "ttft_n": float(len(self._tl_ttft)),
        }
        for k, v in cur.items():
            row[k] = v - self._tl_last.get(k, 0.0)
        self._tl_last = cur
        self._tl_ttft = []
        self.timeline.append(row)

    # -- accounting ----------------------------------------------------------------------------------

    def total_cost_usd(self) -> float:
        total = 0.0
        for node in self._all_nodes():
            total += node.billed_s(self.now) * node.spec.usd_per_s
        return total

    def _all_nodes(self) -> list[Node]:
        seen: dict[str, Node] = {}
        for n in self.nodes.values():
            seen[n.node_id] = n
        for n in self._retired:
            seen.setdefault(n.node_id, n)
        return [seen[k] for k in sorted(seen)]

    def report(self) -> SimReport:
        total = self.total_cost_usd()
        summary = self.acct.summary(total)
        nodes = self._all_nodes()
        summary["nodes"] = {
            "provisioned_total": len(nodes),
            "peak_provisioned": int(max((r["provisioned"] for r in self.timeline), default=0)),
            "node_hours": round(sum(n.billed_s(self.now) for n in nodes) / 3600.0, 6),
        }
        summary["tasks"]["failed_by"] = dict(sorted(self.failed_by.items()))
        summary["requests"]["orphaned"] = self.orphans
        summary["faults"] = [
            {"t_s": round(t, 3), "kind": k, "nodes": list(ids)} for t, k, ids in self.fault_log
        ]
        return SimReport(
            scenario=self.scenario.name,
            seed=self.seed,
            virtual_s=round(self.now, 3),
            summary=summary,
            timeline=list(self.timeline),
        )
