"""``fleetloop bench stack``: the same emulated fleet and agent workload behind four real routers.

::

    fleetloop bench stack --scenario FILE [--seconds N] [--arms A,B,...] [--out DIR] [--json]

Per arm, in this process: the scenario's nodes (:class:`LiveFleet`, real HTTP servers on loopback)
and its agents (the ``openai`` SDK) sending every call to ONE router URL (``Agents(router_url=)``);
the router is a real process:

- ``vllm-cache-aware`` / ``vllm-p2c``: ``vllm-router --policy cache_aware | power_of_two`` over
  the node URLs (its own health checks, retries and breaker as it ships);
- ``haproxy-classic``: HAProxy ``balance leastconn`` with ``option httpchk GET /health`` (a node
  that fails two checks leaves, two passes bring it back), no control plane;
- ``fleetloop``: the same HAProxy config, plus ``fleetloop run`` (shipped default policy with a
  fixed fleet: HAProxy cannot provision nodes) on the embedded Tansu broker, ``fleetloop scrape``
  of the nodes' vLLM ``/metrics`` into ``fleet.telemetry``, HAProxy's log into ``fleet.requests``
  and ``fleetloop actuate haproxy`` applying weights, breakers and slow start through the runtime
  API.

The scenario's faults are scheduled when the agents start (router warm-up does not eat them). Every
figure is client side: task success, priority-0 success, cost per successful task (every
provisioned node's ``usd_per_h`` x the arm's wall time / successful tasks), TTFT p50/p99, retries,
timeouts, errors; plus the emulator's real-time lag (how late node events fired, p99/max) and the
event loop's lag, so a machine too slow to emulate the fleet cannot pass for a good policy. Output:
``stack-<scenario>.md`` / ``.json`` and ``stack-<scenario>.png`` (per-second timelines overlaid)
under ``--out`` (default ``bench/results/stack``). Exit 1 when an arm finished no task successfully.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console

from fleetloop import clock, term
from fleetloop.daemon.brokers import ensure_topics, start_broker
from fleetloop.daemon.children import die_with_parent, stop_child
from fleetloop.daemon.cli_common import UsageError
from fleetloop.edges.actuate.haproxy.logs import HAPROXY_FRONTEND_SNIPPET
from fleetloop.edges.fleet.agents import Agents
from fleetloop.edges.fleet.live import LiveFleet, _Lag
from fleetloop.perf.catalog import GPU_MEMORY_UTIL, node_spec
from fleetloop.sim.scenario import Scenario, ScenarioError, load_scenario

ARMS = ("vllm-cache-aware", "vllm-p2c", "haproxy-classic", "fleetloop")
VLLM_POLICY = {"vllm-cache-aware": "cache_aware", "vllm-p2c": "power_of_two"}
DEFAULT_OUT = Path("bench/results/stack")
SAMPLE_S = 1.0
START_TIMEOUT_S = 90.0
STOP_GRACE_S = 15.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "stack", help="one emulated fleet + agent workload behind vllm-router, HAProxy, fleetloop"
    )
    p.add_argument("--scenario", required=True, metavar="FILE", help="scenario file with ONE pool")
    p.add_argument("--seconds", type=float, default=90.0, help="seconds of load per arm (default 90)")
    p.add_argument("--drain-s", type=float, default=20.0, help="wait for tasks in flight after the load")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    p.add_argument("--out", default=str(DEFAULT_OUT), metavar="DIR", help="where the table and plot go")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.set_defaults(handler=cmd_stack)


def cmd_stack(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        raise UsageError(f"fleetloop bench stack: {exc}") from None
    if len(scenario.pools) != 1 or len({m for w in scenario.workload for m in w.models}) != 1:
        raise UsageError(
            "fleetloop bench stack: the scenario must have one pool and one model (one router URL)"
        )
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise UsageError(
            f"fleetloop bench stack: unknown arm(s) {bad or args.arms!r}; choose from {','.join(ARMS)}"
        )
    if not 5 <= args.seconds <= 3600:
        raise UsageError(f"fleetloop bench stack: --seconds must be in [5, 3600], got {args.seconds}")
    missing = [b for b in _binaries(arms) if shutil.which(b) is None and not Path(b).exists()]
    if missing:
        raise UsageError(f"fleetloop bench stack: not installed: {', '.join(missing)}")
    err = term.console(stderr=True)
    # A client that gives up mid-answer makes aiohttp log a traceback per call ("Cannot write to
    # closing transport"); those calls are counted as timeouts in the table, not printed.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    results: list[dict[str, Any]] = []
    broker = None
    started_utc = datetime.fromtimestamp(clock.wall_ms() / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")
    try:
        bootstrap = None
        if "fleetloop" in arms:
            err.print("bench stack: starting the embedded broker (Tansu) on loopback ...")
            broker = start_broker("tansu")
            bootstrap = broker.bootstrap_servers
        for arm in arms:
            err.print(
                f"[bold]bench stack[/bold] {scenario.name}: arm [cyan]{arm}[/cyan], "
                f"{args.seconds:g} s of load"
            )
            r = asyncio.run(
                _arm(scenario, arm, seconds=args.seconds, drain_s=args.drain_s, bootstrap=bootstrap, err=err)
            )
            results.append(r)
            t = r["tasks"]
            err.print(
                f"  {arm}: tasks ok {t['succeeded']} failed {t['failed']} unfinished {t['unfinished']}, "
                f"TTFT p50 {r['latency']['ttft_p50_ms']} ms, "
                f"emulator lag p99 {r['realtime_lag']['node_events']['p99_ms']} ms"
            )
    finally:
        if broker is not None:
            broker.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "scenario": scenario.name,
        "scenario_file": str(args.scenario),
        "seconds": args.seconds,
        "command": "fleetloop bench stack " + " ".join(sys.argv[3:]) if len(sys.argv) > 3 else "",
        "date_utc": started_utc,
        "arms": results,
    }
    stem = out / scenario.name
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = table_markdown(doc)
    Path(f"{stem}.md").write_text(md)
    plot_timelines(doc, Path(f"{stem}.png"))
    if args.json:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        sys.stdout.write(md)
        sys.stdout.write(f"\nwritten: {stem}.md, {stem}.json, {stem}.png\n")
    dead = [r["arm"] for r in results if not r["tasks"]["succeeded"]]
    if dead:
        err.print(f"[red]bench stack: no successful task under {', '.join(dead)}[/red]")
        return 1
    return 0


def _vllm_router_bin() -> str:
    here = Path(sys.executable).parent / "vllm-router"
    return str(here) if here.exists() else "vllm-router"


def _binaries(arms: list[str]) -> list[str]:
    need = []
    if any(a in VLLM_POLICY for a in arms):
        need.append(_vllm_router_bin())
    if any(a in ("haproxy-classic", "fleetloop") for a in arms):
        need.append("haproxy")
    return need


def _free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def haproxy_config(tmp: Path, fe_port: int, log_port: int | None, servers: list[tuple[str, str]]) -> str:
    """leastconn over the nodes with HTTP health checks; with ``log_port``, the admin socket and the
    log line the fleetloop actuator reads (the fleetloop arm)."""
    timeout = "120s"
    glob = f"    stats socket {tmp}/admin.sock mode 600 level admin\n"
    if log_port is not None:
        glob += f"    log 127.0.0.1:{log_port} len 4096 local0\n"
    lines = [
        f"global\n{glob}    maxconn 4096",
        "defaults\n    mode http\n"
        + ("    log global\n" if log_port is not None else "")
        + f"    timeout connect 1s\n    timeout client {timeout}\n    timeout server {timeout}\n"
        + "    timeout queue 5s",
        f"frontend fe\n    bind 127.0.0.1:{fe_port}\n"
        + (HAPROXY_FRONTEND_SNIPPET + "\n" if log_port is not None else "")
        + "    default_backend nodes",
        "backend nodes\n    balance leastconn\n    option httpchk GET /health\n"
        + "".join(
            f"    server {name} {addr} weight 100 check inter 1s fall 2 rise 2\n" for name, addr in servers
        ),
    ]
    return "\n".join(lines) + "\n"


@dataclass
class _Timeline:
    t: list[float] = field(default_factory=list)
    ok_tasks: list[int] = field(default_factory=list)
    failed_calls: list[int] = field(default_factory=list)
    ttft_p50: list[float | None] = field(default_factory=list)


async def _sample(agents: Agents, fleet: LiveFleet, t0: float, tl: _Timeline, stop: asyncio.Event) -> None:
    seen_ttft = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)
        s = agents.stats
        new = sorted(s.ttft_ms[seen_ttft:])
        seen_ttft = len(s.ttft_ms)
        tl.t.append(round(fleet.t() - t0, 2))
        tl.ok_tasks.append(s.tasks_succeeded)
        tl.failed_calls.append(s.errors + s.timeouts + s.shed)
        tl.ttft_p50.append(round(new[len(new) // 2], 1) if new else None)


async def _probe(lag: _Lag, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(0.05)
        lag.add(loop.time() - t - 0.05)


async def _spawn(argv: list[str], logdir: Path, name: str) -> asyncio.subprocess.Process:
    with (logdir / f"{name}.log").open("wb") as log:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=die_with_parent,  # a pre-resolved libc call, no lock: see die_with_parent
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


async def _stop(proc: asyncio.subprocess.Process) -> None:
    await stop_child(proc, STOP_GRACE_S)


async def _wait_http(url: str, procs: dict[str, asyncio.subprocess.Process], logdir: Path) -> None:
    deadline = clock.monotonic_s() + START_TIMEOUT_S
    async with httpx.AsyncClient(timeout=2.0) as c:
        while clock.monotonic_s() < deadline:
            for name, p in procs.items():
                if p.returncode is not None:
                    tail = (logdir / f"{name}.log").read_text(errors="replace")[-400:]
                    raise UsageError(f"fleetloop bench stack: {name} exited ({p.returncode}): {tail!r}")
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(url)).status_code < 500:
                    return
            await asyncio.sleep(0.2)
    raise UsageError(f"fleetloop bench stack: {url} did not answer within {START_TIMEOUT_S:g} s")


# What a router's log says when its port was taken between picking it and binding it.
BIND_FAILED = ("Address already in use", "cannot bind socket")
START_ATTEMPTS = 3


async def _start_router(
    arm: str,
    urls: dict[str, str],
    servers: dict[str, str],
    logdir: Path,
    procs: dict[str, asyncio.subprocess.Process],
) -> tuple[int, int | None]:
    """The arm's router (vllm-router, or HAProxy with the fleetloop arm's log port), answering on
    the returned port. Ports are picked just before the start; another process can still take one
    before the router binds it (the fleet's, the broker's and the agents' connections use the same
    ephemeral range), so a start whose log says so is retried on fresh ports, its log kept as
    ``router-attempt<N>.log``. Any other failure is the user's to see."""
    for attempt in range(1, START_ATTEMPTS + 1):
        port = _free_port()
        log_port: int | None = None
        if arm in VLLM_POLICY:
            argv = [
                _vllm_router_bin(), "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *[urls[n] for n in sorted(urls)], "--policy", VLLM_POLICY[arm],
                "--prometheus-port", str(_free_port()),
            ]  # fmt: skip
            probe = "/health"
        else:
            addr = [(servers[n], urls[n].removeprefix("http://")) for n in sorted(urls)]
            log_port = _free_port(socket.SOCK_DGRAM) if arm == "fleetloop" else None
            (logdir / "haproxy.cfg").write_text(haproxy_config(logdir, port, log_port, addr))
            argv = ["haproxy", "-db", "-f", str(logdir / "haproxy.cfg")]
            probe = "/v1/models"
        procs["router"] = await _spawn(argv, logdir, "router")
        try:
            await _wait_http(f"http://127.0.0.1:{port}{probe}", procs, logdir)
        except UsageError:
            log = logdir / "router.log"
            bind_failed = any(m in log.read_text(errors="replace") for m in BIND_FAILED)
            if procs["router"].returncode is None or not bind_failed or attempt == START_ATTEMPTS:
                raise
            log.rename(logdir / f"router-attempt{attempt}.log")
            continue
        return port, log_port
    raise AssertionError("unreachable: the last attempt returns or raises")


def _child(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetloop.cli.main", *args]


async def _fleetloop_parts(
    scenario: Scenario,
    *,
    fleet: LiveFleet,
    servers: dict[str, str],
    bootstrap: str,
    log_port: int,
    logdir: Path,
    procs: dict[str, asyncio.subprocess.Process],
) -> None:
    prefix = f"stack-{uuid.uuid4().hex[:8]}"
    await ensure_topics(bootstrap, prefix)
    pool = scenario.pools[0]
    spec = node_spec(pool.model, pool.gpu, pool.gpus_per_node)
    kv_gib = (spec.hbm_bytes * GPU_MEMORY_UTIL - spec.model.weight_bytes) / 2**30
    policy = yaml.safe_load((Path(__file__).resolve().parents[2] / "policies" / "default.yaml").read_text())
    policy["spec"]["autoscale"] = {"type": "fixed"}  # HAProxy enables declared slots; it cannot provision
    (logdir / "policy.yaml").write_text(yaml.safe_dump(policy))
    (logdir / "backends.yaml").write_text(
        yaml.safe_dump(
            {"pools": {pool.id: {"backend": "nodes", "model": pool.model, "servers": dict(servers)}}}
        )
    )
    common = ["--bootstrap-servers", bootstrap, "--topic-prefix", prefix]
    procs["daemon"] = await _spawn(
        _child("run", *common, "--group-id", f"{prefix}-d", "--policy", str(logdir / "policy.yaml")),
        logdir,
        "daemon",
    )
    targets = ",".join(f"{nid}={url}" for nid, url in sorted(fleet.urls().items()))
    procs["scrape"] = await _spawn(
        _child(
            "scrape", "--runtime", "vllm", "--pool", pool.id, "--target", targets, *common,
            "--gpu-type", pool.gpu, "--gpu-count", str(spec.gpus), "--usd-per-h", f"{spec.usd_per_h:.4f}",
            "--kv-gib", f"{kv_gib:.3f}", "--interval-s", "1",
        ),
        logdir,
        "scrape",
    )  # fmt: skip
    procs["actuate"] = await _spawn(
        _child(
            "actuate", "haproxy", "--runtime-api", f"unix:{logdir}/admin.sock",
            "--backend-map", str(logdir / "backends.yaml"), "--log-listen", f"127.0.0.1:{log_port}",
            *common,
        ),
        logdir,
        "actuate",
    )  # fmt: skip


async def _arm(
    scenario: Scenario, arm: str, *, seconds: float, drain_s: float, bootstrap: str | None, err: Console
) -> dict[str, Any]:
    logdir = Path(tempfile.mkdtemp(prefix=f"fleetloop-stack-{arm}-"))
    fleet = LiveFleet(scenario, seed=scenario.seed)
    await fleet.start(faults=False)
    procs: dict[str, asyncio.subprocess.Process] = {}
    loop_lag, stop = _Lag(), asyncio.Event()
    bg: list[asyncio.Task[Any]] = []
    tl = _Timeline()
    t0 = 0.0
    try:
        urls = fleet.urls()
        servers = {nid: f"s{i}" for i, nid in enumerate(sorted(urls))}
        port, log_port = await _start_router(arm, urls, servers, logdir, procs)
        router_url = f"http://127.0.0.1:{port}"
        if arm == "fleetloop":
            assert bootstrap is not None
            assert log_port is not None
            await _fleetloop_parts(
                scenario, fleet=fleet, servers=servers, bootstrap=bootstrap,
                log_port=log_port, logdir=logdir, procs=procs,
            )  # fmt: skip
            await asyncio.sleep(3.0)  # the daemon's first ticks and the actuator's first pass
        agents = Agents(fleet, router_url=router_url)
        t0 = fleet.t()
        fleet.schedule_faults()
        bg.append(asyncio.create_task(_probe(loop_lag, stop)))
        bg.append(asyncio.create_task(_sample(agents, fleet, t0, tl, stop)))
        started = clock.monotonic_s()
        await agents.run(t0 + seconds, drain_s)
        wall_s = clock.monotonic_s() - started
        for name, p in procs.items():
            if p.returncode is not None:
                err.print(f"[red]  {arm}: {name} exited early ({p.returncode}); logs {logdir}[/red]")
    finally:
        stop.set()
        for t in bg:
            t.cancel()
        await asyncio.gather(*bg, return_exceptions=True)
        for name in ("actuate", "scrape", "daemon", "router"):
            if name in procs:
                await _stop(procs[name])
        await fleet.stop()
    pool = scenario.pools[0]
    usd_per_h = fleet.specs[pool.id].usd_per_h
    cost = usd_per_h * len(fleet.live) * wall_s / 3600.0
    s = agents.stats.summary()
    ok = s["tasks"]["succeeded"]
    return {
        "arm": arm,
        **s,
        "cost_usd": round(cost, 6),
        "cost_per_successful_task_usd": round(cost / ok, 7) if ok else None,
        "wall_s": round(wall_s, 1),
        "realtime_lag": {"node_events": fleet.lag_report(), "event_loop": loop_lag.report()},
        "faults": [{**f, "t_s": round(f["t_s"] - t0, 1)} for f in fleet.fault_log],  # since load began
        "timeline": {
            "t": tl.t,
            "ok_tasks": tl.ok_tasks,
            "failed_calls": tl.failed_calls,
            "ttft_p50": tl.ttft_p50,
        },
        "logs": str(logdir),
    }


def _f(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}" if not math.isinf(v) else "inf"
    return str(v)


def table_markdown(doc: dict[str, Any]) -> str:
    head = (
        "| arm | tasks ok / started | success | p0 success | $ / successful task | TTFT p50 ms | TTFT p99 ms "
        "| calls | retries | timeouts | errors | emulator lag p99 / max ms | loop lag p99 ms |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for r in doc["arms"]:
        t, q, la, lag = r["tasks"], r["requests"], r["latency"], r["realtime_lag"]
        rows.append(
            f"| {r['arm']} | {t['succeeded']} / {t['started']} | {_f(t['success_rate'], 3)} "
            f"| {_f(t['p0_success_rate'], 3)} | {_f(r['cost_per_successful_task_usd'], 6)} "
            f"| {_f(la['ttft_p50_ms'])} | {_f(la['ttft_p99_ms'])} "
            f"| {q['sent']} | {q['retries']} | {q['timeouts']} | {q['errors']} "
            f"| {_f(lag['node_events']['p99_ms'])} / {_f(lag['node_events']['max_ms'])} "
            f"| {_f(lag['event_loop']['p99_ms'])} |\n"
        )
    faults = ", ".join(
        f"{f['kind']} {'/'.join(f['nodes'])} at {f['t_s']:.0f} s"
        for f in (doc["arms"][0]["faults"] if doc["arms"] else [])
    )
    ran = ""
    if doc.get("command"):
        when = f", run {doc['date_utc']}" if doc.get("date_utc") else ""
        ran = f"\nCommand: `{doc['command']}`{when}.\n"
    return (
        f"## bench stack — {doc['scenario']} ({doc['seconds']:g} s of load per arm)\n\n"
        f"Faults: {faults or 'none'}. Cost = provisioned nodes x usd_per_h x wall time.\n\n"
        + head
        + "".join(rows)
        + ran
    )


def plot_timelines(doc: dict[str, Any], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - matplotlib loads only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after matplotlib.use('Agg'): no display

    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for r in doc["arms"]:
        tl = r["timeline"]
        t = tl["t"]
        dt = [max(1e-3, b - a) for a, b in zip([0.0, *t], t, strict=False)]  # a late sample spans more
        ok = [(b - a) / d for a, b, d in zip([0, *tl["ok_tasks"]], tl["ok_tasks"], dt, strict=False)]
        bad = [(b - a) / d for a, b, d in zip([0, *tl["failed_calls"]], tl["failed_calls"], dt, strict=False)]
        axes[0].plot(t, ok, label=r["arm"])
        axes[1].plot(t, bad, label=r["arm"])
        axes[2].plot(t, [v if v is not None else float("nan") for v in tl["ttft_p50"]], label=r["arm"])
    axes[0].set_ylabel("tasks succeeded / s")
    axes[1].set_ylabel("failed calls / s")
    axes[2].set_ylabel("TTFT p50 ms (per s)")
    axes[2].set_xlabel("seconds since load began")
    for f in doc["arms"][0]["faults"] if doc["arms"] else []:
        for ax in axes:
            ax.axvline(f["t_s"], color="grey", ls=":", lw=1)
    axes[0].legend(loc="upper left", fontsize=8)
    axes[0].set_title(f"bench stack — {doc['scenario']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
