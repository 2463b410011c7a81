"""One run of one arm: the fleet, its control plane, the arm's router, the agents; figures out.

In the bench's process: :class:`LiveFleet` (every node's HTTP server on loopback at
``base + i`` for node ``i``, the scenario's faults, the worker manager following ``control.state``)
and, for a peer arm whose router keeps a worker list, the endpoint list (the serving nodes, as
Kubernetes service discovery would give them). Child processes: the daemon (``fleetloop run``
with the arm's built-in policy), ``fleetloop scrape`` of every node slot's vLLM ``/metrics``, the
router, ``fleetloop actuate`` for a fleetloop arm, and the agents split over ``agent_procs``
processes (:mod:`fleetloop.bench.stack.agents_proc`).

Cost is what every node cost from the moment load began to the moment the last agent finished,
billed as the simulator bills (booting, serving, draining). Lag is reported three ways: how late
the fleet's node events fired (the emulator), the fleet's event loop and the agents' event loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from fleetloop.bench.stack.arms import Arm, Launch, Slots, WorkerApi
from fleetloop.bench.stack.procs import Procs, fleetloop_argv, free_port, spawn, start_answering, stop
from fleetloop.daemon.brokers import delete_topics, ensure_topics
from fleetloop.daemon.cli_common import UsageError
from fleetloop.edges.actuate.worker_list.mapping import plan
from fleetloop.edges.fleet.agents import AgentStats
from fleetloop.edges.fleet.command import follow_state
from fleetloop.edges.fleet.live import LiveFleet, _Lag, probe_loop_lag
from fleetloop.policies.registry import builtin_policy_path
from fleetloop.schemas.topics import STATE, topic_name
from fleetloop.sim.scenario import Scenario

SAMPLE_S = 1.0
TTFT_WINDOW_S = 5  # the timeline's TTFT p50 is over the calls of the last 5 s
PROGRESS_EVERY_S = 10.0
ENDPOINTS_EVERY_S = 0.5
ROUTING_WAIT_S = 60.0
SETTLE_S = 3.0  # after the router (and its actuator) start, before load: their first passes and checks
AGENT_START_S = 60.0
PORT_RANGE = (20_000, 30_000)  # below Linux's ephemeral ports (32768-60999): no outgoing socket takes one


@dataclass(frozen=True, slots=True)
class RunSpec:
    scenario: Scenario
    arm: Arm
    run: int  # 1-based repeat
    seed: int  # the workload's: the same for every arm of one repeat
    seconds: float
    drain_s: float
    bootstrap: str
    agent_procs: int


@dataclass(slots=True)
class _Progress:
    ok: dict[int, int] = field(default_factory=dict)
    failed: dict[int, int] = field(default_factory=dict)
    in_flight: dict[int, int] = field(default_factory=dict)


SPARE_SLOTS = 16


def slot_count(scenario: Scenario) -> int:
    """Node slots of the pool: its ceiling and 16 more (a node added after another left, or in the
    place of a crashed one, has a new id). Every slot is scraped each second, so not more."""
    return scenario.pools[0].hi_nodes + SPARE_SLOTS


def port_block(n: int) -> int:
    """A base port whose next ``n`` ports are free now, below the ephemeral range (the search starts
    at a place of this process's own, so two benches on one machine seldom look at the same block)."""
    lo, hi = PORT_RANGE
    span = (hi - lo) // n
    first = os.getpid() % span
    for i in range(span):
        base = lo + ((first + i) % span) * n
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise UsageError(f"fleetloop bench stack: no {n} free ports in a row in {PORT_RANGE}")


async def endpoints(fleet: LiveFleet, api: WorkerApi, stop_ev: asyncio.Event, log: list[str]) -> None:
    """A peer router's worker list kept at the serving nodes (Kubernetes service discovery over
    ready pods): adds first, then removals, every half second."""
    while not stop_ev.is_set():
        want = set(fleet.serving_urls().values())
        try:
            present = await api.list_workers()
            steps = plan({u: (u in want, "ready") for u in want | present}, present)
            for action, url, _ in sorted(steps, key=lambda s: s[0] != "add"):
                await (api.add_worker(url) if action == "add" else api.remove_worker(url))
        except Exception as exc:  # a failed pass is retried; the first reasons are kept
            if len(log) < 20:
                log.append(f"{fleet.t():.1f}s {exc}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_ev.wait(), ENDPOINTS_EVERY_S)


async def _wait_routing(fleet: LiveFleet, pool_id: str, procs: Procs) -> None:
    """Until the daemon's first routing decision for the pool reached the fleet: an actuator
    started before it holds no state and falls back to every mapped slot (fail static)."""
    deadline = fleet.t() + ROUTING_WAIT_S
    while fleet.router.state.routing_fresh(pool_id, fleet.t(), fleet.router.fail_static_s) is None:
        for name in ("daemon", "scrape"):
            if procs[name].returncode is not None:
                raise UsageError(f"fleetloop bench stack: {name} exited ({procs[name].returncode})")
        if fleet.t() > deadline:
            raise UsageError(f"fleetloop bench stack: no routing from the daemon within {ROUTING_WAIT_S:g} s")
        await asyncio.sleep(0.2)


async def _control_plane(
    spec: RunSpec, *, fleet: LiveFleet, slots: Slots, prefix: str, logdir: Path, procs: Procs
) -> list[str]:
    """The daemon on the arm's policy and the scraper over every slot; returns the common flags."""
    pool = spec.scenario.pools[0]
    node = fleet.specs[pool.id]
    kv_gib = node.kv_capacity_tokens * node.kv_bytes_per_token / 2**30
    common = ["--bootstrap-servers", spec.bootstrap, "--topic-prefix", prefix]
    policy = builtin_policy_path(spec.arm.policy)
    procs["daemon"] = await spawn(
        fleetloop_argv("run", *common, "--group-id", f"{prefix}-d", "--policy", str(policy)), logdir, "daemon"
    )
    targets = ",".join(f"{nid}={url}" for nid, url in slots.urls.items())
    procs["scrape"] = await spawn(
        fleetloop_argv(
            "scrape", "--runtime", "vllm", "--pool", pool.id, "--target", targets, *common,
            "--gpu-type", pool.gpu, "--gpu-count", str(node.gpus), "--usd-per-h", f"{node.usd_per_h:.4f}",
            "--kv-gib", f"{kv_gib:.3f}", "--interval-s", "1", "--engine", pool.engine,
        ),
        logdir,
        "scrape",
    )  # fmt: skip
    return common


async def _agents(
    spec: RunSpec, fleet: LiveFleet, router_url: str, logdir: Path, procs: Procs
) -> list[asyncio.subprocess.Process]:
    doc = spec.scenario.model_dump(mode="json", exclude_none=True)
    kids = []
    for k in range(spec.agent_procs):
        f = logdir / f"agents{k}.json"
        f.write_text(json.dumps({
            "scenario": doc, "seed": spec.seed * 1000 + k, "router_url": router_url, "t0": fleet.t0,
            "rate_scale": 1.0 / spec.agent_procs, "seconds": spec.seconds, "drain_s": spec.drain_s,
        }))  # fmt: skip
        p = await spawn(
            [sys.executable, "-m", "fleetloop.bench.stack.agents_proc", str(f)],
            logdir, f"agents{k}", stdin=True, stdout=True,
        )  # fmt: skip
        procs[f"agents{k}"] = p
        kids.append(p)
    for k, p in enumerate(kids):
        assert p.stdout is not None
        async with asyncio.timeout(AGENT_START_S):
            line = await p.stdout.readline()
        if not line or json.loads(line).get("type") != "ready":
            tail = (logdir / f"agents{k}.log").read_text(errors="replace")[-400:]
            raise UsageError(f"fleetloop bench stack: agents process {k} did not start: {tail!r}")
    return kids


async def _read(
    k: int, p: asyncio.subprocess.Process, progress: _Progress, results: dict[int, dict[str, Any]]
) -> None:
    assert p.stdout is not None
    while line := await p.stdout.readline():
        msg = json.loads(line)
        if msg["type"] == "progress":
            progress.ok[k], progress.failed[k] = msg["ok"], msg["failed"]
            progress.in_flight[k] = msg["in_flight"]
        elif msg["type"] == "result":
            results[k] = msg


async def run_arm(spec: RunSpec, err: Console) -> dict[str, Any]:
    arm, scenario = spec.arm, spec.scenario
    pool = scenario.pools[0]
    logdir = Path(tempfile.mkdtemp(prefix=f"fleetloop-stack-{arm.name}-r{spec.run}-"))
    n_slots = slot_count(scenario)
    base = port_block(n_slots)
    fleet = LiveFleet(scenario, seed=spec.seed, base_port=base)
    await fleet.start(faults=False)
    slots = Slots(
        pool.id, pool.model, {f"{pool.id}/{i}": f"http://127.0.0.1:{base + i}" for i in range(n_slots)}
    )
    prefix = f"stack-{uuid.uuid4().hex[:8]}"
    procs: Procs = {}
    stop_ev = asyncio.Event()
    bg: list[asyncio.Task[Any]] = []
    loop_lag = _Lag()
    bad_state = [0]
    endpoint_errors: list[str] = []
    nodes_tl: dict[str, list[int]] = {"provisioned": [], "serving": []}
    results: dict[int, dict[str, Any]] = {}
    progress = _Progress()
    start_t = end_t = 0.0
    try:
        await ensure_topics(spec.bootstrap, prefix)
        common = await _control_plane(
            spec, fleet=fleet, slots=slots, prefix=prefix, logdir=logdir, procs=procs
        )
        bg.append(
            asyncio.create_task(
                follow_state(fleet, spec.bootstrap, topic_name(prefix, STATE), stop_ev, bad_state)
            )
        )
        log_port = free_port(socket.SOCK_DGRAM) if arm.router.wants_log_port(arm.fleetloop) else None

        def launch(port: int) -> Launch:
            return Launch(
                port, fleet.serving_urls(), slots, logdir, log_port,
                fleetloop=arm.fleetloop, bootstrap=spec.bootstrap, topic_prefix=prefix,
            )  # fmt: skip

        if arm.fleetloop:  # the router's actuator (or fleetloop inside it) starts from fresh routing
            await _wait_routing(fleet, pool.id, procs)
        port = await start_answering(
            "router", lambda p: arm.router.argv(launch(p)), arm.router.probe, logdir, procs,
            env=arm.router.env(launch(0)),
        )  # fmt: skip
        router_url = f"http://127.0.0.1:{port}"
        if arm.fleetloop:
            act = arm.router.actuator(launch(port), router_url)
            if act is not None:
                procs["actuate"] = await spawn(fleetloop_argv(*act, *common), logdir, "actuate")
        else:
            api = arm.router.worker_api(router_url)
            if api is not None:
                bg.append(asyncio.create_task(endpoints(fleet, api, stop_ev, endpoint_errors)))
        await asyncio.sleep(SETTLE_S)
        kids = await _agents(spec, fleet, router_url, logdir, procs)
        readers = [asyncio.create_task(_read(k, p, progress, results)) for k, p in enumerate(kids)]
        start_t = fleet.t() + 0.5
        for p in kids:
            assert p.stdin is not None
            p.stdin.write((json.dumps({"start_t": start_t}) + "\n").encode())
            await p.stdin.drain()
        fleet.schedule_faults(at=start_t)
        bg.append(asyncio.create_task(probe_loop_lag(loop_lag, stop_ev)))
        bg.append(asyncio.create_task(_sample_nodes(fleet, start_t, nodes_tl, stop_ev)))
        bg.append(
            asyncio.create_task(
                _progress(spec, fleet=fleet, start_t=start_t, pr=progress, err=err, stop_ev=stop_ev)
            )
        )
        async with asyncio.timeout(spec.seconds + spec.drain_s + AGENT_START_S):
            await asyncio.gather(*readers)
        end_t = max((r["end_t"] for r in results.values()), default=fleet.t())
        missing = [k for k in range(len(kids)) if k not in results]
        if missing:
            tail = (logdir / f"agents{missing[0]}.log").read_text(errors="replace")[-600:]
            raise UsageError(
                f"fleetloop bench stack: agents process {missing[0]} ended without a result: {tail!r}"
            )
        early = [n for n, p in procs.items() if p.returncode is not None and not n.startswith("agents")]
        for name in early:
            err.print(
                f"[red]  {arm.name}: {name} exited early ({procs[name].returncode}); logs {logdir}[/red]"
            )
    finally:
        stop_ev.set()
        for t in bg:
            t.cancel()
        await asyncio.gather(*bg, return_exceptions=True)
        # all at once: each may take its grace period to finish (the daemon writes a checkpoint)
        await asyncio.gather(*(stop(p) for p in procs.values()))
        await fleet.stop()
        with contextlib.suppress(Exception):
            await delete_topics(spec.bootstrap, prefix)
    return _figures(
        spec, fleet=fleet, results=results, start_t=start_t, end_t=end_t, nodes_tl=nodes_tl,
        loop_lag=loop_lag, logdir=logdir, n_slots=n_slots, endpoint_errors=endpoint_errors,
    )  # fmt: skip


async def _sample_nodes(
    fleet: LiveFleet, start_t: float, tl: dict[str, list[int]], stop_ev: asyncio.Event
) -> None:
    k = 1
    while not stop_ev.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_ev.wait(), max(0.0, start_t + k * SAMPLE_S - fleet.t()))
        c = fleet.counts()
        tl["provisioned"].append(c["provisioned"])
        tl["serving"].append(c["serving"])
        k += 1


async def _progress(
    spec: RunSpec, *, fleet: LiveFleet, start_t: float, pr: _Progress, err: Console, stop_ev: asyncio.Event
) -> None:
    while not stop_ev.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_ev.wait(), PROGRESS_EVERY_S)
        if stop_ev.is_set():
            return
        c = fleet.counts()
        lag = fleet.lag_report()
        err.print(
            f"[dim]  {spec.arm.name} r{spec.run} {fleet.t() - start_t:5.0f}s[/dim]"
            f" nodes {c['serving']} serving / {c['provisioned']} billed,"
            f" tasks ok {sum(pr.ok.values())} failed {sum(pr.failed.values())}"
            f" in flight {sum(pr.in_flight.values())}, emulator lag p99 {lag['p99_ms']} ms",
            soft_wrap=True,
        )


def _merge_timeline(results: dict[int, dict[str, Any]], nodes_tl: dict[str, list[int]]) -> dict[str, Any]:
    n = max([len(r["ok_tasks"]) for r in results.values()] + [0])

    def col(key: str) -> list[int]:
        return [sum(r[key][min(i, len(r[key]) - 1)] for r in results.values() if r[key]) for i in range(n)]

    p50: list[float | None] = []
    for i in range(n):  # over the last TTFT_WINDOW_S seconds: a second alone holds a few calls
        lo = max(0, i + 1 - TTFT_WINDOW_S)
        v = sorted(x for r in results.values() for sec in r["ttft"][lo : i + 1] for x in sec)
        p50.append(v[len(v) // 2] if v else None)
    m = len(nodes_tl["provisioned"])
    return {
        "t": [float(i + 1) for i in range(n)],
        "ok_tasks": col("ok_tasks"),
        "failed_calls": col("failed_calls"),
        "ttft_p50": p50,
        "nodes_provisioned": [nodes_tl["provisioned"][min(i, m - 1)] if m else None for i in range(n)],
        "nodes_serving": [nodes_tl["serving"][min(i, m - 1)] if m else None for i in range(n)],
    }


def _figures(
    spec: RunSpec,
    *,
    fleet: LiveFleet,
    results: dict[int, dict[str, Any]],
    start_t: float,
    end_t: float,
    nodes_tl: dict[str, list[int]],
    loop_lag: _Lag,
    logdir: Path,
    n_slots: int,
    endpoint_errors: list[str],
) -> dict[str, Any]:
    stats = AgentStats()
    for r in results.values():
        stats.add(AgentStats(**r["stats"]))
    s = stats.summary()
    ok = s["tasks"]["succeeded"]
    wall_s = max(0.0, end_t - start_t)
    cost = fleet.cost_usd(start_t, end_t)
    agent_lag = [r["loop_lag"]["p99_ms"] for r in results.values() if r["loop_lag"]["p99_ms"] is not None]
    provisioned = len(fleet.live)
    return {
        "arm": spec.arm.name,
        "run": spec.run,
        "seed": spec.seed,
        **s,
        "cost_usd": round(cost, 6),
        "cost_per_successful_task_usd": round(cost / ok, 7) if ok else None,
        "wall_s": round(wall_s, 1),
        "nodes": {
            "provisioned_total": provisioned,
            "peak_billed": max(nodes_tl["provisioned"], default=0),
            "node_hours": round(cost / fleet.specs[spec.scenario.pools[0].id].usd_per_h, 4),
            "beyond_slots": max(0, provisioned - n_slots),  # unseen by the scraper and the routers
        },
        "realtime_lag": {
            "node_events": fleet.lag_report(),
            "event_loop": loop_lag.report(),
            "agents_loop_p99_ms": max(agent_lag, default=None),
        },
        "faults": [{**f, "t_s": round(f["t_s"] - start_t, 1)} for f in fleet.fault_log],
        # Why the node count moved: each change of the accepted autoscale target or its reason.
        "autoscale": [
            {"t_s": round(t - start_t, 1), "desired": n, "reason": why}
            for t, _, n, why in fleet.autoscale_log
        ],
        "timeline": _merge_timeline(results, nodes_tl),
        "endpoint_errors": endpoint_errors,
        "logs": str(logdir),
    }
