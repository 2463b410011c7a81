"""LiveFleet: the simulator's serving nodes in real time, each behind its own HTTP server.

One implementation of the physics: every node is a :class:`fleetloop.sim.node.Node`, unchanged;
what differs from the simulator is only who calls it. Its ``schedule(t, node, version)`` callbacks
become ``loop.call_at`` on the asyncio clock, its ``submit`` / ``cancel`` come from HTTP handlers
(:mod:`fleetloop.edges.fleet.server`), and its listener resolves the handlers' futures. Time is
seconds since the fleet started on the event loop's monotonic clock; a callback that fires late
is run at the time it actually fires, and how late it was is the fleet's **real-time lag**
(:meth:`LiveFleet.lag_report`).

The worker manager lives here too: :meth:`LiveFleet.apply` takes desired state from
``control.state`` (enforced decisions only; per key, a decision older by ``tick_id`` than the one
held is dropped) and obeys autoscale targets (new nodes start cold: they listen only after the
pool's cold start, Pool.boot_times; surplus nodes drain: they refuse new calls with 503, finish what they
hold, then close) and batching caps (``max_batch_tokens`` of every node of the pool). Routing,
breaker, admission and retry-budget decisions go to the fleet's client-side router (the router
library :mod:`fleetloop.router`, bound to the nodes by :func:`fleetloop.sim.router.sim_router`),
which the emulated agents use to pick a node until a real router takes that place. When
``control.state`` goes quiet nothing changes (fail static); the router falls back to round robin
after its own TTL.

Faults (:meth:`LiveFleet.inject`, and the scenario's at their ``at_s``): ``degrade`` slows a live
node's iterations, ``crash`` kills it (its server stops listening; clients get connection errors),
``preempt`` loses its work and restarts it cold, ``load_spike`` multiplies the agents' arrival rates.

Python API (stable; ``bench stack`` builds on it)::

    fleet = LiveFleet(scenario, seed=7, base_port=0)     # 0: free loopback ports
    await fleet.start()                                   # initial nodes warm and listening
    fleet.urls()                                          # {node_id: "http://127.0.0.1:PORT"}
    fleet.apply(decisions)                                # desired state in
    fleet.inject(fault)                                   # a fault, now
    fleet.lag_report()                                    # real-time lag figures
    await fleet.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

from fleetloop import clock
from fleetloop.edges.fleet.metrics import VllmMetrics
from fleetloop.edges.fleet.server import LOOPBACK, LiveNode, Pending, build_app
from fleetloop.perf.catalog import DEFAULT_MAX_BATCH_TOKENS, NodeSpec, node_spec
from fleetloop.schemas.decisions import (
    AutoscaleDecision,
    BatchingDecision,
    Decision,
)
from fleetloop.sim import faults as faults_mod
from fleetloop.sim.fleet import scale_plan
from fleetloop.sim.node import Node, Req
from fleetloop.sim.router import SimRouter, sim_router
from fleetloop.sim.scenario import Fault, Pool, Scenario

LAG_SAMPLES = 20_000
# How long closing a node's server waits for calls still in its handlers (aiohttp's default: 60 s a
# node). A node is closed when it is removed (drained: none left), crashes (its calls fail with it)
# or the fleet stops, whose engines stop first: a call still waiting then can never finish, and
# every node holding one (an orphan a client gave up on, a call on a slow node) held the stop for
# minutes.
CLOSE_WAIT_S = 1.0


@dataclass(slots=True)
class _Lag:
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=LAG_SAMPLES))
    n: int = 0
    worst_s: float = 0.0

    def add(self, late_s: float) -> None:
        late_s = max(0.0, late_s)
        self.samples.append(late_s)
        self.n += 1
        self.worst_s = max(self.worst_s, late_s)

    def report(self) -> dict[str, float | int | None]:
        if not self.samples:
            return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
        arr = np.fromiter(self.samples, dtype=float)
        return {
            "n": self.n,
            "p50_ms": round(float(np.quantile(arr, 0.5)) * 1000.0, 3),
            "p99_ms": round(float(np.quantile(arr, 0.99)) * 1000.0, 3),
            "max_ms": round(self.worst_s * 1000.0, 3),
        }


LOOP_PROBE_S = 0.05


async def probe_loop_lag(lag: _Lag, stop: asyncio.Event) -> None:
    """How late the event loop wakes a 50 ms sleep, into ``lag``, until ``stop``."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(LOOP_PROBE_S)
        lag.add(loop.time() - t - LOOP_PROBE_S)


class LiveFleet:
    """See the module docstring. ``now`` is refreshed before faults fire (the fault protocol reads it)."""

    def __init__(
        self, scenario: Scenario, *, seed: int, base_port: int = 0, start_wall_ms: int | None = None
    ):
        self.scenario = scenario
        self.seed = seed
        self.base_port = base_port
        self._next_port = base_port
        self.loop: asyncio.AbstractEventLoop | None = None
        self.t0 = 0.0
        self.start_wall_ms = start_wall_ms if start_wall_ms is not None else clock.wall_ms()
        self.now = 0.0
        streams = np.random.SeedSequence(seed).spawn(4)
        self.rng_router = np.random.default_rng(streams[0])
        self.rng_faults = np.random.default_rng(streams[1])
        self.rng_agents = streams[2]  # the agents spawn their own streams from it
        self.rng_boot = np.random.default_rng(streams[3])  # cold-start draws (Pool.boot_times)
        self.pools: dict[str, Pool] = {p.id: p for p in scenario.pools}
        self.specs: dict[str, NodeSpec] = {
            p.id: node_spec(p.model, p.gpu, p.gpus_per_node) for p in scenario.pools
        }
        pools_by_model: dict[str, tuple[str, ...]] = {}
        for p in sorted(scenario.pools, key=lambda p: p.id):
            pools_by_model[p.model] = (*pools_by_model.get(p.model, ()), p.id)
        self.nodes: dict[str, Node] = {}
        self.live: dict[str, LiveNode] = {}
        self._members: dict[str, list[Node]] = {p: [] for p in sorted(self.pools)}
        self.router: SimRouter = sim_router(pools_by_model, self.rng_router, self._members, self.nodes)
        self._next_index: dict[str, int] = dict.fromkeys(self.pools, 0)
        self._max_batch: dict[str, int] = dict.fromkeys(self.pools, DEFAULT_MAX_BATCH_TOKENS)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.spike_factor: dict[str | None, float] = {}  # tenant (None: all) -> product of active spikes
        self.on_spike: Callable[[], None] | None = None  # the agents redraw their arrivals
        self.lag = _Lag()
        self.fault_log: list[dict[str, Any]] = []
        # Every autoscale decision the worker manager accepted whose target or reason differs from
        # the pool's last one: (time, pool, desired nodes, reason), what a run's record shows of why
        # its node count moved (or held).
        self.autoscale_log: list[tuple[float, str, int, str]] = []
        self._autoscale_last: dict[str, tuple[int, str]] = {}  # pool -> its last (target, reason)
        self.decisions_applied = 0
        self.waste_usd = 0.0
        self.aborted = 0
        self._stopping = False

    # -- time ---------------------------------------------------------------------------------------

    def t(self) -> float:
        """Seconds since :meth:`start` on the event loop's clock."""
        assert self.loop is not None, "LiveFleet.start() first"
        return self.loop.time() - self.t0

    def wall_ms(self, t: float | None = None) -> int:
        return self.start_wall_ms + round((self.t() if t is None else t) * 1000.0)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        assert self.loop is not None
        self.loop.call_at(self.t0 + t, self._timed, t, fn, args)

    def _timed(self, t: float, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self._stopping:
            return
        self.lag.add(self.t() - t)
        fn(*args)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self, *, faults: bool = True) -> None:
        """Provision and listen; ``faults=False`` leaves the scenario's faults to
        :meth:`schedule_faults` (a harness that starts a router first counts from when load begins)."""
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.start_wall_ms = clock.wall_ms()
        for pool_id in sorted(self.pools):
            for _ in range(self.pools[pool_id].nodes):
                ln = self._provision(pool_id, warm=True)
                await self._listen(ln)
        if faults:
            self.schedule_faults()

    def schedule_faults(self, *, at: float | None = None, kinds: Sequence[str] | None = None) -> None:
        """The scenario's faults at their ``at_s`` counted from ``at`` (fleet time; default now),
        only those of ``kinds`` when given."""
        now = self.t() if at is None else at
        for f in self.scenario.faults:
            if kinds is None or f.kind in kinds:
                self._at(now + f.at_s, self.inject, f)

    def start_clock(self, t0: float) -> None:
        """Share another fleet's clock without serving: ``t0`` is that fleet's start on the event
        loop's monotonic clock (``CLOCK_MONOTONIC``, the same in every process of the machine). For
        agents run in a process of their own (:mod:`fleetloop.bench.stack`): they read fleet time
        and the load spikes' rate factors, scheduled here with ``schedule_faults(kinds=...)``."""
        self.loop = asyncio.get_running_loop()
        self.t0 = t0

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for ln in list(self.live.values()):
            await self._close(ln)

    def urls(self) -> dict[str, str]:
        """Every node that is listening now (serving or draining): node id -> base URL."""
        return {nid: ln.url for nid, ln in sorted(self.live.items()) if ln.runner is not None}

    def all_urls(self) -> dict[str, str]:
        """Every node ever provisioned with its (possibly not yet open) base URL."""
        return {nid: ln.url for nid, ln in sorted(self.live.items()) if ln.port}

    def _port(self) -> int:
        if self.base_port == 0:
            return 0
        p = self._next_port
        self._next_port += 1
        return p

    def _provision(self, pool_id: str, *, warm: bool) -> LiveNode:
        idx = self._next_index[pool_id]
        self._next_index[pool_id] = idx + 1
        pool = self.pools[pool_id]
        node = Node(
            f"{pool_id}/{idx}",
            pool_id,
            self.specs[pool_id],
            self,
            self._schedule_node,
            now=self.t(),
            warm=warm,
            max_batch_tokens=self._max_batch[pool_id],
        )
        ln = LiveNode(node, pool.model, VllmMetrics(node, pool.model, start_s=self.wall_ms() / 1000.0))
        ln.port = self._port()
        self.nodes[node.node_id] = node
        self.live[node.node_id] = ln
        self._members[pool_id].append(node)
        self.router.fleet_changed()
        if not warm:
            self._boot(ln)
        return ln

    def _boot(self, ln: LiveNode) -> None:
        node = ln.node
        node.boot += 1
        node.weights_state = "cold"
        ln.state = "cold"
        to_loading, to_warm = self.pools[node.pool_id].boot_times(self.rng_boot)
        now = self.t()
        self._at(now + to_loading, self._weights, ln, node.boot, "loading")
        self._at(now + to_warm, self._weights, ln, node.boot, "warm")

    def _weights(self, ln: LiveNode, boot: int, state: str) -> None:
        node = ln.node
        if not node.alive or node.boot != boot:
            return
        node.set_weights_state(state, self.t())
        if state == "warm":
            self.router.fleet_changed()
            self._spawn(self._listen(ln))

    async def _listen(self, ln: LiveNode) -> None:
        if ln.runner is None:
            runner = web.AppRunner(
                build_app(self, ln), access_log=None, handle_signals=False, shutdown_timeout=CLOSE_WAIT_S
            )
            await runner.setup()
            site = web.TCPSite(runner, LOOPBACK, ln.port, reuse_address=True)
            await site.start()
            if ln.port == 0:
                ln.port = int(runner.addresses[0][1])
            ln.runner = runner
        if ln.node.alive and not ln.node.draining:
            ln.state = "serving"

    async def _close(self, ln: LiveNode) -> None:
        runner, ln.runner = ln.runner, None
        if runner is not None:
            await runner.cleanup()

    # -- the engine's inputs (from HTTP handlers) ----------------------------------------------------

    def submit(self, ln: LiveNode, req: Req) -> None:
        ln.node.submit(req, self.t())

    def abort(self, ln: LiveNode, req: Req) -> None:
        """A streaming client went away: stop spending on its request."""
        if req.state not in ("done", "new") and not req.cancelled:
            self.aborted += 1
            ln.node.cancel(req, self.t())

    def maybe_retire(self, ln: LiveNode) -> None:
        node = ln.node
        if node.draining and node.alive and node.idle and ln.inflight == 0:
            self._remove(ln)

    # -- the node's callbacks ---------------------------------------------------------------------------

    def _schedule_node(self, t: float, node: Node, version: int) -> None:
        self._at(t, self._node_event, node, version)

    def _node_event(self, node: Node, version: int) -> None:
        node.on_event(self.t(), version)
        ln = self.live.get(node.node_id)
        if ln is not None:
            self.maybe_retire(ln)

    # NodeListener
    def on_first_token(self, req: Req, t: float) -> None:
        p = req.owner
        if isinstance(p, Pending) and not p.first.done():
            p.first.set_result(t)

    def on_finish(self, req: Req, t: float) -> None:
        p = req.owner
        if isinstance(p, Pending):
            if not p.done.done():
                p.done.set_result("finished")
            p.metrics.observe_e2e(max(0.0, t - req.submit_t))

    def on_lost(self, req: Req, t: float) -> None:
        p = req.owner
        if isinstance(p, Pending) and not p.done.done():
            p.done.set_result("lost")

    def on_waste(self, req: Req, usd: float) -> None:
        self.waste_usd += usd

    # -- desired state in (the worker manager, and the agents' router) --------------------------------

    def apply(self, decisions: Iterable[Decision], refresh_s: float = 0.0) -> None:
        """Enforced decisions only, newest per key (by tick id): the router library keeps that rule
        and takes routing, breaker, admission and retry-budget state; the worker manager acts on
        the autoscale and batching decisions it accepted. ``refresh_s``: their form on
        ``control.state`` (:meth:`fleetloop.router.state.DesiredState.accept`)."""
        for d in self.router.apply(decisions, self.t(), refresh_s):
            self.decisions_applied += 1
            body = d.body
            if isinstance(body, AutoscaleDecision):
                self._autoscale(body)
            elif isinstance(body, BatchingDecision):
                self._batching(body)

    def _autoscale(self, d: AutoscaleDecision) -> None:
        pool = self.pools.get(d.pool_id)
        if pool is None:
            return
        if self._autoscale_last.get(d.pool_id) != (d.desired_nodes, d.reason):
            self._autoscale_last[d.pool_id] = (d.desired_nodes, d.reason)
            self.autoscale_log.append((round(self.t(), 3), d.pool_id, d.desired_nodes, d.reason))
        add, victims = scale_plan(self._members[d.pool_id], pool, d)
        for _ in range(add):
            self._provision(d.pool_id, warm=False)
        if not victims:
            return
        for n in victims:
            n.draining = True
            ln = self.live[n.node_id]
            ln.state = "draining"
            self.maybe_retire(ln)
        self.router.fleet_changed()

    def _batching(self, d: BatchingDecision) -> None:
        if d.pool_id not in self.pools or d.max_batch_tokens <= 0:
            return
        self._max_batch[d.pool_id] = d.max_batch_tokens
        for n in self._members[d.pool_id]:
            n.max_batch_tokens = d.max_batch_tokens

    def _remove(self, ln: LiveNode) -> None:
        node = ln.node
        node.alive = False
        node.removed_at = self.t()
        node.version += 1
        ln.state = "stopped"
        members = self._members[node.pool_id]
        if node in members:
            members.remove(node)
        self.nodes.pop(node.node_id, None)
        self.router.fleet_changed()
        self._spawn(self._close(ln))

    # -- faults (fleetloop.sim.faults.FaultTarget) -----------------------------------------------------

    def inject(self, fault: Fault) -> None:
        self.now = self.t()
        hit = faults_mod.fire(self, fault, self.rng_faults)
        self.fault_log.append({"t_s": round(self.now, 3), "kind": fault.kind, "nodes": hit})

    def pool_nodes(self, pool_id: str) -> Sequence[Node]:
        return tuple(self._members.get(pool_id, ()))

    def node(self, node_id: str) -> Node | None:
        n = self.nodes.get(node_id)
        return n if n is not None and n.alive else None

    def crash_node(self, node: Node, *, comes_back: bool) -> None:
        ln = self.live[node.node_id]
        node.crash(self.t(), keep_alive=comes_back)
        ln.state = "stopped"
        self._spawn(self._close(ln))
        if comes_back:
            node.degrade = 1.0
            self._boot(ln)
        else:
            members = self._members[node.pool_id]
            if node in members:
                members.remove(node)
            self.router.fleet_changed()
            # Stays in self.nodes: the router keeps sending to it (connection refused) until the
            # control plane zeroes it.

    def degrade_node(self, node: Node, factor: float, until: float | None) -> None:
        node.degrade_gen += 1
        node.set_degrade(factor, self.t())
        if until is not None:
            self._at(until, self._restore, node, node.degrade_gen)

    def _restore(self, node: Node, gen: int) -> None:
        if node.alive and node.degrade_gen == gen:
            node.set_degrade(1.0, self.t())

    def spike(self, factor: float, tenant: str | None, until: float | None) -> None:
        self.spike_factor[tenant] = self.spike_factor.get(tenant, 1.0) * factor
        if self.on_spike is not None:
            self.on_spike()
        if until is not None:
            self._at(until, self._unspike, factor, tenant)

    def _unspike(self, factor: float, tenant: str | None) -> None:
        self.spike_factor[tenant] = self.spike_factor.get(tenant, 1.0) / factor
        if self.on_spike is not None:
            self.on_spike()

    def rate_factor(self, tenant: str) -> float:
        return self.spike_factor.get(None, 1.0) * self.spike_factor.get(tenant, 1.0)

    # -- figures ----------------------------------------------------------------------------------------

    def lag_report(self) -> dict[str, float | int | None]:
        return self.lag.report()

    def cost_usd(self, start: float, end: float) -> float:
        """What every node ever provisioned cost within ``[start, end]`` (fleet time), billed as the
        simulator bills (:meth:`fleetloop.sim.node.Node.billed_s`)."""
        return sum(ln.node.billed_s(end, start) * ln.node.spec.usd_per_s for ln in self.live.values())

    def counts(self) -> dict[str, int]:
        """Nodes now: provisioned (billed: booting, serving or draining) and serving."""
        billed = sum(1 for ln in self.live.values() if ln.node.alive)
        return {"provisioned": billed, "serving": sum(1 for ln in self.live.values() if ln.serving)}

    def serving_urls(self) -> dict[str, str]:
        """The nodes a ready-endpoint list would hold now (serving: warm, listening, not draining)."""
        return {nid: ln.url for nid, ln in sorted(self.live.items()) if ln.serving and ln.runner is not None}

    def node_table(self) -> list[dict[str, Any]]:
        return [
            {
                "node_id": nid,
                "url": ln.url,
                "state": ln.state,
                "weights": ln.node.weights_state,
                "degrade": ln.node.degrade,
                "running": ln.node.running,
                "waiting": ln.node.queue_depth,
            }
            for nid, ln in sorted(self.live.items())
        ]
