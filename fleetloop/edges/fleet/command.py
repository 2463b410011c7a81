"""``fleetloop fleet``: a scenario's serving nodes in real time behind real sockets.

::

    fleetloop fleet --scenario FILE [--bootstrap-servers HOST:PORT] [--topic-prefix P]
                    [--base-port N] [--seconds S] [--scale K] [--seed N] [--no-agents]
                    [--nodes-file PATH] [--json]

Every node of the scenario's pools listens on loopback (``--base-port`` + i, or free ports) and
speaks vLLM's OpenAI API and ``/metrics`` (:mod:`fleetloop.edges.fleet.server`). With a broker,
the worker manager follows ``control.state`` and the agents' request outcomes go to
``fleet.requests``; without one the fleet runs open loop. ``--scale K`` multiplies every pool's
node counts and every workload's arrival rate by K (the same load per node on a K-times-larger
fleet). ``--no-agents`` serves only (for an outside load generator or router); ``--nodes-file``
writes ``{node_id: base_url}`` as JSON once every initial node listens, and again at the end.
The run ends after the scenario's ``duration_s`` (or ``--seconds``) plus a drain for tasks in
flight, or on SIGINT/SIGTERM, with a table (or ``--json``): tasks (started, succeeded, failed and
unfinished, i.e. still in flight at the end; the success rate is over tasks started, as the
simulator's), requests, latency, the fleet's real-time lag (how late node events fired:
p50/p99/max) and the event loop's own lag.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rich.console import Console
from rich.table import Table

from fleetloop import clock, term
from fleetloop.edges.cli import EdgeUsageError, connection_from, one_line_errors
from fleetloop.edges.fleet.agents import Agents
from fleetloop.edges.fleet.live import LiveFleet, _Lag, probe_loop_lag
from fleetloop.kafka_security import Bootstrap, bootstrap_arg, connect, error_text, shown
from fleetloop.schemas.decisions import Decision, decision_from_newer, refresh_s_of
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.topics import REQUESTS, STATE, topic_name
from fleetloop.sim.scenario import Scenario, ScenarioError, load_scenario
from fleetloop.topic_layout import TopicLayoutError, require_topics
from fleetloop.user_input import check_seed, output_file

PROGRESS_EVERY_S = 5.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "fleet", help="serve a scenario's nodes over HTTP (OpenAI API, vLLM /metrics) in real time"
    )
    p.add_argument("--scenario", required=True, metavar="FILE", help="scenario file (scenarios/README.md)")
    bootstrap_arg(p, required=False)
    p.add_argument("--base-port", type=int, default=0, help="first node's port (default 0: free ports)")
    p.add_argument(
        "--seconds", type=float, help="how long agents send work (default: the scenario's duration_s)"
    )
    p.add_argument(
        "--drain-s", type=float, default=30.0, help="wait this long for tasks in flight at the end"
    )
    p.add_argument("--scale", type=int, default=1, help="multiply node counts and arrival rates (default 1)")
    p.add_argument("--seed", type=int, help="seed (default: the scenario's)")
    p.add_argument("--no-agents", action="store_true", help="serve only; send no work")
    p.add_argument(
        "--no-outcomes",
        action="store_true",
        help="agents publish no request outcomes (fleetloop then sees only scraped telemetry)",
    )
    p.add_argument("--nodes-file", metavar="PATH", help="write {node_id: base_url} JSON here")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of a table")
    p.set_defaults(handler=cmd_fleet)


def scaled(s: Scenario, k: int) -> Scenario:
    """The scenario with every pool's node counts and every workload's arrival rate times ``k``."""
    if k == 1:
        return s
    pools = [
        p.model_copy(
            update={
                "nodes": p.nodes * k,
                "min_nodes": p.min_nodes * k,
                "max_nodes": p.max_nodes * k if p.max_nodes is not None else None,
            }
        )
        for p in s.pools
    ]
    work = [w.model_copy(update={"rate_per_s": w.rate_per_s * k}) for w in s.workload]
    return s.model_copy(update={"pools": pools, "workload": work})


@one_line_errors
def cmd_fleet(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        raise EdgeUsageError(f"fleetloop fleet: {exc}") from None
    if not 1 <= args.scale <= 64:
        raise EdgeUsageError(f"fleetloop fleet: --scale must be in [1, 64], got {args.scale}")
    if not 0 <= args.base_port <= 65000:
        raise EdgeUsageError(f"fleetloop fleet: --base-port must be in [0, 65000], got {args.base_port}")
    seconds = args.seconds if args.seconds is not None else scenario.duration_s
    if not 0 < seconds <= 86_400:
        raise EdgeUsageError(f"fleetloop fleet: --seconds must be in (0, 86400], got {seconds}")
    if not 0 <= args.drain_s <= 3600:  # NaN too
        raise EdgeUsageError(f"fleetloop fleet: --drain-s must be in [0, 3600], got {args.drain_s}")
    check_seed(args.seed, prog="fleetloop fleet")
    if args.nodes_file:  # before any node starts: not a traceback once they listen
        output_file(args.nodes_file, flag="--nodes-file", prog="fleetloop fleet")
    scenario = scaled(scenario, args.scale)
    result = asyncio.run(_run(args, scenario, seconds))
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        _print(result)
    return 0


async def follow_state(
    fleet: LiveFleet, bootstrap: Bootstrap, topic: str, stop: asyncio.Event, bad: list[int]
) -> None:
    """The worker manager's input: ``control.state`` from its beginning into :meth:`LiveFleet.apply`
    until ``stop``; a record that does not parse is counted in ``bad[0]``."""
    consumer = AIOKafkaConsumer(**connect(bootstrap), enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            # By form: a change-only daemon's records keep routing fresh that much longer.
            decisions: dict[float, list[Decision]] = {}
            for rs in batch.values():
                for r in rs:
                    if not r.value:
                        continue
                    try:
                        d = decision_from_newer(r.value)  # a newer daemon's state is still followed
                    except ValueError:
                        bad[0] += 1
                        continue
                    if d is not None:
                        decisions.setdefault(refresh_s_of(r.headers), []).append(d)
            for refresh_s, ds in decisions.items():
                fleet.apply(ds, refresh_s)
    finally:
        await consumer.stop()


@dataclass(slots=True)
class _Wires:
    """What a run holds open beside the fleet: the producer (with a broker), the background tasks,
    the outcomes waiting to be sent, the count of unreadable state records and the loop's lag."""

    outbox: asyncio.Queue[RequestOutcome] = field(default_factory=asyncio.Queue)
    loop_lag: _Lag = field(default_factory=_Lag)
    producer: AIOKafkaProducer | None = None
    background: list[asyncio.Task[Any]] = field(default_factory=list)
    bad_state: list[int] = field(default_factory=lambda: [0])


async def _run(args: argparse.Namespace, scenario: Scenario, seconds: float) -> dict[str, Any]:
    err = term.console(stderr=True)
    seed = args.seed if args.seed is not None else scenario.seed
    fleet = LiveFleet(scenario, seed=seed, base_port=args.base_port)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    wires = _Wires()
    await _listen(fleet)
    try:
        conn = connection_from(args) if args.bootstrap_servers else None
        if conn is not None:
            await _connect(args, conn, fleet, stop, wires)
        wires.background.append(asyncio.create_task(probe_loop_lag(wires.loop_lag, stop)))
        urls = fleet.urls()
        if args.nodes_file:
            _write_atomic(Path(args.nodes_file), urls)
        err.print(_banner(scenario, urls, seconds, conn, wires.producer))
        publish = wires.outbox.put_nowait if wires.producer is not None and not args.no_outcomes else None
        agents = None if args.no_agents else Agents(fleet, publish=publish)
        wires.background.append(asyncio.create_task(_progress(fleet, agents, stop, err, wires.loop_lag)))
        await _serve(agents, stop, seconds, args.drain_s)
        stop.set()
        await _drain(wires)
    finally:
        await _close(fleet, wires, stop, args.nodes_file)
    return _result(args, scenario, seed=seed, seconds=seconds, fleet=fleet, wires=wires, agents=agents)


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


async def _listen(fleet: LiveFleet) -> None:
    """Every initial node listens, or none does and the run ends in one line."""
    try:
        await fleet.start()
    except OSError as exc:
        await fleet.stop()
        raise EdgeUsageError(f"fleetloop fleet: cannot listen: {exc}") from None


async def _connect(
    args: argparse.Namespace, conn: Bootstrap, fleet: LiveFleet, stop: asyncio.Event, wires: _Wires
) -> None:
    """With a broker: check the topics, start the producer, then follow control.state into the fleet
    and send the agents' outcomes to fleet.requests in the background."""
    wires.producer = AIOKafkaProducer(**connect(conn), acks="all", linger_ms=5)
    # Once, before the state consumer or the first send names a topic (which would
    # auto-create a missing one).
    read_write = [STATE] if args.no_outcomes else [STATE, REQUESTS]
    try:
        async with asyncio.timeout(30):
            await require_topics(conn, args.topic_prefix, read_write, cleanup=True)
            await wires.producer.start()
    except TopicLayoutError as exc:
        raise EdgeUsageError(f"fleetloop fleet: {exc}") from None
    except Exception as exc:
        where = shown(conn)
        raise EdgeUsageError(f"fleetloop fleet: cannot use Kafka at {where}: {error_text(exc)}") from None
    wires.background.append(
        asyncio.create_task(
            follow_state(fleet, conn, topic_name(args.topic_prefix, STATE), stop, wires.bad_state)
        )
    )
    wires.background.append(
        asyncio.create_task(_send(wires.producer, topic_name(args.topic_prefix, REQUESTS), wires.outbox))
    )


def _banner(
    scenario: Scenario,
    urls: dict[str, str],
    seconds: float,
    conn: Bootstrap | None,
    producer: AIOKafkaProducer | None,
) -> str:
    return (
        f"[bold]fleetloop fleet[/bold]: {scenario.name}, {len(urls)} node(s) on loopback "
        f"({min(urls.values(), default='-')} ...), {seconds:g} s"
        + (
            f", control.state and fleet.requests on {shown(conn) if conn is not None else '-'}"
            if producer
            else ", open loop"
        )
    )


async def _serve(agents: Agents | None, stop: asyncio.Event, seconds: float, drain_s: float) -> None:
    """Until the agents are done (``seconds`` of work from now, then the drain) or, serving only,
    ``seconds`` pass; a signal ends either early. The agents' window starts when they do, not when
    the fleet started listening: setting up (the nodes, the broker, the HTTP client) took part of a
    short window on a loaded machine, all of it at times, and the run started no task."""
    if agents is not None:
        work = asyncio.create_task(agents.run(agents.fleet.t() + seconds, drain_s))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not work.done():
            work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
    else:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)


async def _drain(wires: _Wires) -> None:
    """The outcomes still queued are sent and acknowledged."""
    while not wires.outbox.empty():
        await asyncio.sleep(0.05)
    if wires.producer is not None:
        await wires.producer.flush()


async def _close(fleet: LiveFleet, wires: _Wires, stop: asyncio.Event, nodes_file: str | None) -> None:
    """However the run ended: the background tasks stop, the nodes file names every node the run
    had, the nodes stop listening, the producer closes."""
    stop.set()
    for t in wires.background:
        t.cancel()
    await asyncio.gather(*wires.background, return_exceptions=True)
    if nodes_file:
        with contextlib.suppress(OSError):
            _write_atomic(Path(nodes_file), fleet.all_urls())
    await fleet.stop()
    if wires.producer is not None:
        await wires.producer.stop()


def _result(
    args: argparse.Namespace,
    scenario: Scenario,
    *,
    seed: int,
    seconds: float,
    fleet: LiveFleet,
    wires: _Wires,
    agents: Agents | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "scenario": scenario.name,
        "seed": seed,
        "seconds": seconds,
        "scale": args.scale,
        "start_wall_ms": fleet.start_wall_ms,
        "nodes": {"provisioned": len(fleet.live), "table": fleet.node_table()},
        "realtime_lag": {"node_events": fleet.lag_report(), "event_loop": wires.loop_lag.report()},
        "decisions_applied": fleet.decisions_applied,
        "bad_state_records": wires.bad_state[0],
        "aborted_by_disconnect": fleet.aborted,
        "faults": fleet.fault_log,
        "wall_s": round(fleet.t(), 3) if fleet.loop else 0.0,
    }
    if agents is not None:
        out.update(agents.stats.summary())
    return out


def _write_atomic(path: Path, urls: dict[str, str]) -> None:
    """Readers polling for the file never see half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(urls, indent=1) + "\n")
    os.replace(tmp, path)


async def _send(producer: AIOKafkaProducer, topic: str, outbox: asyncio.Queue[RequestOutcome]) -> None:
    while True:
        o = await outbox.get()
        await producer.send(topic, value=orjson.dumps(o.model_dump(mode="json")), key=o.pool_id.encode())
        outbox.task_done()


async def _progress(
    fleet: LiveFleet, agents: Agents | None, stop: asyncio.Event, err: Console, loop_lag: _Lag
) -> None:
    started = clock.monotonic_s()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PROGRESS_EVERY_S)
        if stop.is_set():
            return
        serving = sum(1 for ln in fleet.live.values() if ln.serving)
        lag = fleet.lag_report()
        line = f"[dim]{clock.monotonic_s() - started:5.0f}s[/dim] {serving} serving"
        if agents is not None:
            s = agents.stats
            line += f"  tasks ok {s.tasks_succeeded} failed {s.tasks_failed} in flight {agents.in_flight}"
            line += f"  calls ok {s.ok} err {s.errors} timeout {s.timeouts} shed {s.shed}"
        line += f"  lag p99 {lag['p99_ms']} ms max {lag['max_ms']} ms"
        err.print(line, soft_wrap=True)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _print(r: dict[str, Any]) -> None:
    out = term.console()
    t = Table(
        title=f"fleetloop fleet — {r['scenario']}, {r['seconds']:g} s, scale {r['scale']}", show_header=False
    )
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    lag, ev = r["realtime_lag"]["node_events"], r["realtime_lag"]["event_loop"]
    rows: list[tuple[str, Any]] = [("nodes provisioned", r["nodes"]["provisioned"])]
    if "tasks" in r:
        tk, rq, la = r["tasks"], r["requests"], r["latency"]
        rows += [
            (
                "tasks started / succeeded / failed / unfinished",
                f"{tk['started']} / {tk['succeeded']} / {tk['failed']} / {tk['unfinished']}",
            ),
            ("task success (of started)", _pct(tk["success_rate"])),
            ("calls sent / ok / errors / timeouts / shed", f"{rq['sent']} / {rq['ok']} / {rq['errors']} / "
             f"{rq['timeouts']} / {rq['shed']}"),
            ("retries", rq["retries"]),
            ("TTFT p50 / p99 (client side)", f"{la['ttft_p50_ms']} / {la['ttft_p99_ms']} ms"),
        ]  # fmt: skip
    rows += [
        ("requests aborted by a disconnect", r["aborted_by_disconnect"]),
        ("decisions applied", r["decisions_applied"]),
        (
            "node-event lag p50 / p99 / max",
            f"{lag['p50_ms']} / {lag['p99_ms']} / {lag['max_ms']} ms ({lag['n']})",
        ),
        ("event-loop lag p50 / p99 / max", f"{ev['p50_ms']} / {ev['p99_ms']} / {ev['max_ms']} ms"),
        (
            "faults",
            ", ".join(f"{f['kind']}@{f['t_s']:.0f}s {'/'.join(f['nodes'])}" for f in r["faults"]) or "none",
        ),
    ]
    for k, v in rows:
        t.add_row(k, str(v))
    out.print(t)
