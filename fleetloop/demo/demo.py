"""``fleetloop demo``: the whole loop, for real, in about a minute.

It starts the embedded broker (unless ``--bootstrap-servers`` names one), creates the topics,
runs the daemon, and runs a simulated fleet against it over Kafka in real time: serving nodes
publish NodeTelemetry every second, a router sends agent tasks to nodes by the weights, breakers
and thresholds the daemon publishes on ``control.state``, and publishes every call's outcome.
A third of the way in, one GPU degrades (30x slower): its calls time out, its breaker opens and
traffic moves to the healthy nodes. A malformed record is injected too, to show it land in the
dead-letter topic while the loop goes on. The demo ends with a summary table (or ``--json``).

``--verify-replay``: halfway through, the demo also publishes its policy again as a new version
(a policy change the daemon activates from the next tick), and at the end replays its own window
from the recorded topics, as ``fleetloop replay`` does, printing ``replay: N decisions, M differ``.
M must be 0 (each tick replayed under the policy it was decided with); otherwise the exit code is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rich.console import Console
from rich.table import Table

from fleetloop import clock, term
from fleetloop.daemon import observability
from fleetloop.daemon.brokers import BrokerStartError, ensure_topics, probe_capabilities, start_broker
from fleetloop.daemon.cli_common import UsageError, connection_from, policy_from, quiet_client_logs
from fleetloop.daemon.observe.decode import Door
from fleetloop.daemon.replay.command import Progress, replay_topics
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.daemon.service.http import HttpServer, make_app
from fleetloop.daemon.service.live import LiveView, add_routes, ledger_of
from fleetloop.demo.wire import print_wire, run_wire
from fleetloop.kafka_security import Bootstrap, bootstrap_arg, connect, error_text, shown
from fleetloop.policies.registry import CompiledPolicy, compile_policy
from fleetloop.schemas import Decision
from fleetloop.schemas.policy import PolicyDocument
from fleetloop.schemas.topics import POLICY, REQUESTS, STATE, TELEMETRY, topic_name
from fleetloop.sim.builder import pool, two_tenant_scenario
from fleetloop.sim.fleet import FleetSim
from fleetloop.sim.scenario import Scenario, parse_scenario

STEP_S = 0.1  # advance the simulated fleet in steps of this much wall time
PROGRESS_EVERY_S = 5.0
DEGRADED_NODE = "chat-l40s/2"


def demo_scenario(seconds: int) -> Scenario:
    """A small llama-8b pool serving copilot-style tasks; one GPU degrades a third of the way in."""
    return parse_scenario(
        two_tenant_scenario(
            "demo-degraded-gpu",
            description="fleetloop demo: four L40S nodes, copilot tasks, one GPU degrades",
            seed=7,
            duration_s=seconds,
            slo={"ttft_ms": 2000, "tbt_ms": 100},
            pools=[pool("chat-l40s", "llama-8b", "L40S", 4, cold_start_s=45)],
            faults=[{"at_s": max(5, seconds // 3), "kind": "degrade", "node": DEGRADED_NODE, "factor": 30.0}],
        ),
        "<demo scenario>",
    )


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the daemon and a simulated fleet over Kafka, end to end")
    p.add_argument("--seconds", type=int, default=60, help="how long the fleet sends work (default 60)")
    bootstrap_arg(p, required=False)
    p.add_argument("--policy", metavar="FILE", help="policy document (default: the built-in default)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    p.add_argument(
        "--wire",
        action="store_true",
        help="every part its own process: daemon, HTTP fleet (fleetloop fleet), fleetloop scrape",
    )
    p.add_argument(
        "--wire-telemetry-only",
        action="store_true",
        help="with --wire: agents publish no outcomes, so the daemon sees scraped vLLM metrics only",
    )
    p.add_argument(
        "--verify-replay",
        action="store_true",
        help="apply a new policy version halfway, then replay the demo's own window and print "
        "'replay: N decisions, M differ' (exit 1 unless M is 0)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=0,
        metavar="PORT",
        help="port of the live page and probes on 127.0.0.1 (default 0: any free port; the URL is printed; "
        "not with --wire)",
    )
    p.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if not 10 <= args.seconds <= 3600:
        raise UsageError(f"fleetloop demo: --seconds must be between 10 and 3600, got {args.seconds}")
    if args.wire or args.wire_telemetry_only:
        if args.verify_replay:
            raise UsageError("fleetloop demo: --verify-replay runs the in-process demo; drop --wire")
        return _cmd_wire(args)
    policy = policy_from(args.policy)

    observability.configure(level="warning")
    observability.setup_telemetry()
    quiet_client_logs()
    err = term.console(stderr=True)
    external = connection_from(args) if args.bootstrap_servers else None
    with _broker(external, err) as (bootstrap, kind, idempotent):
        result = asyncio.run(
            _demo(args, policy=policy, bootstrap=bootstrap, kind=kind, idempotent=idempotent, err=err)
        )
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        _print_summary(result)
    replayed = result.get("replay")
    if replayed is not None and not args.json:
        sys.stdout.write(f"replay: {replayed['decisions']} decisions, {replayed['differ']} differ\n")
    if replayed is not None and (replayed["differ"] or not replayed["decisions"]):
        return 1
    return 0 if result["tasks"]["succeeded"] > 0 else 1


def bumped(policy: CompiledPolicy) -> CompiledPolicy:
    """``policy`` again as the next version: what ``--verify-replay`` applies halfway."""
    data = policy.document.model_dump(mode="json")
    data["metadata"]["version"] = policy.stamp.version + 1
    data["metadata"]["description"] = (
        f"fleetloop demo --verify-replay: v{policy.stamp.version} again, applied halfway"
    )
    return compile_policy(PolicyDocument.model_validate(data))


def _cmd_wire(args: argparse.Namespace) -> int:
    if args.policy:
        raise UsageError("fleetloop demo: --wire runs the daemon with its default policy; drop --policy")
    if args.bootstrap_servers and not isinstance(connection_from(args), str):
        raise UsageError(
            "fleetloop demo: --wire starts its parts over PLAINTEXT only; drop the TLS/SASL flags "
            "(or run `fleetloop run`, `fleet` and `scrape` yourself, each with them)"
        )
    quiet_client_logs()
    err = term.console(stderr=True)
    with _broker(args.bootstrap_servers, err) as (bootstrap, _kind, _idempotent):
        assert isinstance(bootstrap, str)
        result = asyncio.run(
            run_wire(
                demo_scenario(args.seconds),
                bootstrap=bootstrap,
                degraded_node=DEGRADED_NODE,
                telemetry_only=args.wire_telemetry_only,
                err=err,
            )
        )
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        print_wire(result)
    tasks = (result["fleet"].get("tasks") or {}).get("succeeded") or 0
    return 0 if tasks > 0 else 1


@contextlib.contextmanager
def _broker(bootstrap: Bootstrap | None, err: Console) -> Iterator[tuple[Bootstrap, str, bool | None]]:
    if bootstrap:
        yield bootstrap, "external", None
        return
    err.print("[bold]fleetloop demo[/bold]: starting the embedded broker (Tansu) on loopback ...")
    try:
        broker = start_broker("tansu")
    except BrokerStartError as exc:
        raise UsageError(f"fleetloop demo: {exc}".splitlines()[0]) from None
    try:
        yield broker.bootstrap_servers, "tansu (embedded)", broker.capabilities.idempotent_producer
    finally:
        broker.stop()


async def _demo(
    args: argparse.Namespace,
    *,
    policy: CompiledPolicy,
    bootstrap: Bootstrap,
    kind: str,
    idempotent: bool | None,
    err: Console,
) -> dict[str, Any]:
    prefix = f"demo-{uuid.uuid4().hex[:8]}"
    try:
        await ensure_topics(bootstrap, prefix)
        if idempotent is None:
            idempotent = (await probe_capabilities(bootstrap)).idempotent_producer
    except Exception as exc:  # one line for the user, whatever the client raised
        raise UsageError(
            f"fleetloop demo: cannot use Kafka at {shown(bootstrap)}: {error_text(exc)}"
        ) from None
    err.print(f"broker {kind} at {shown(bootstrap)}, topics under prefix [cyan]{prefix}[/cyan]")
    holder: list[Daemon] = []
    view = LiveView()
    daemon = Daemon(
        DaemonConfig(
            bootstrap_servers=bootstrap,
            policy=policy,
            prefix=prefix,
            group_id=f"{prefix}-fleetloop",
            idempotence=idempotent,
        ),
        on_decisions=view.record,
    )
    holder.append(daemon)
    view.ledger = ledger_of(daemon)
    server = HttpServer(make_app(lambda: daemon.health, add_routes(view)), port=args.http_port)
    try:
        await server.start()
    except OSError as exc:
        raise UsageError(
            f"fleetloop demo: cannot serve the live page on 127.0.0.1:{args.http_port}: {exc.strerror or exc}"
        ) from None
    url = f"http://127.0.0.1:{server.port}/"
    err.print(f"live page: [link={url}]{url}[/link]  (probes /healthz /readyz, metrics /metrics)")
    stop = asyncio.Event()
    daemon_task = asyncio.create_task(daemon.run(stop), name="daemon")
    try:
        async with asyncio.timeout(60):
            await daemon.ready.wait()
        err.print(
            f"daemon running: policy [bold]{policy.stamp.name}[/bold] v{policy.stamp.version} "
            f"(hash {policy.stamp.hash}), tick {policy.tick_ms} ms"
        )
        change = bumped(policy) if args.verify_replay else None
        fleet = await _run_fleet(args.seconds, bootstrap, prefix, daemon, err, change=change)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await daemon_task
        await server.stop()
    s = fleet["summary"]
    replay: dict[str, Any] | None = None
    if args.verify_replay:
        active = daemon.active_record()
        err.print("replaying the demo's window from the recorded topics ...")
        report, _, _ = await replay_topics(
            bootstrap, prefix, Door(), progress=Progress(enabled=not args.json)
        )
        replay = {
            "decisions": report.decisions_compared,
            "differ": report.different + report.missing + report.extra,
            "ticks": report.ticks_compared,
            "ticks_by_policy": dict(sorted(report.ticks_by_policy.items())),
            "policy_change": {
                "to_version": active.version,
                "hash": active.hash,
                "from_tick_id": active.from_tick_id,
            },
            "first_difference": report.first_difference,
        }
    return {
        "scenario": "demo-degraded-gpu",
        "seconds": args.seconds,
        "broker": {"kind": kind, "bootstrap_servers": shown(bootstrap), "topic_prefix": prefix},
        "live_page": url,
        "policy": {"name": policy.stamp.name, "version": policy.stamp.version, "hash": policy.stamp.hash},
        "tasks": s["tasks"],
        "cost": s["cost"],
        "latency": s["latency"],
        "requests": s["requests"],
        "decisions_published": daemon.stats.decisions_published,
        "decisions_applied": fleet["applied"],
        "ticks_decided": daemon.stats.ticks_decided,
        "breaker_opens": daemon.stats.breaker_opens,
        "breaker_opened_nodes": fleet["opened_nodes"],
        "deadletter": daemon.stats.dead_letters,
        "events_in": daemon.stats.events_in,
        "degraded_node": DEGRADED_NODE,
        "weight_of_degraded_node_at_end": fleet["degraded_weight"],
        **({"replay": replay} if replay is not None else {}),
    }


async def _run_fleet(
    seconds: int,
    bootstrap: Bootstrap,
    prefix: str,
    daemon: Daemon,
    err: Console,
    *,
    change: CompiledPolicy | None = None,
) -> dict[str, Any]:
    """Drive the simulated fleet in real time over Kafka until the work is done or time is up."""
    sim = FleetSim(demo_scenario(seconds), seed=7, start_ms=clock.wall_ms())
    producer = AIOKafkaProducer(**connect(bootstrap), acks="all", linger_ms=5)
    state = AIOKafkaConsumer(**connect(bootstrap), enable_auto_commit=False)
    await producer.start()
    await state.start()
    state.assign([TopicPartition(topic_name(prefix, STATE), 0)])
    await state.seek_to_beginning()
    t_tel, t_req = topic_name(prefix, TELEMETRY), topic_name(prefix, REQUESTS)
    applied = 0
    opened: list[str] = []
    degraded_weight: float | None = None
    injected = False
    start_s = clock.monotonic_s()
    next_progress = PROGRESS_EVERY_S
    drain_deadline_s = seconds + 50.0  # every task meets its deadline by then
    try:
        while True:
            elapsed = clock.monotonic_s() - start_s
            emitted = sim.advance_to(clock.wall_ms())
            for t in emitted.telemetry:
                await producer.send(
                    t_tel, value=orjson.dumps(t.model_dump(mode="json")), key=t.pool_id.encode()
                )
            for o in emitted.outcomes:
                await producer.send(
                    t_req, value=orjson.dumps(o.model_dump(mode="json")), key=o.pool_id.encode()
                )
            if not injected and elapsed >= seconds / 2:
                injected = True
                await producer.send(
                    t_tel, value=b'{"node_id": "chat-l40s/9", "queue_depth": "lots"}', key=b"chat-l40s"
                )
                err.print(
                    "[yellow]injected a malformed telemetry record[/yellow] (bound for the dead-letter topic)"
                )
                if change is not None:
                    doc = orjson.dumps(change.document.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
                    await producer.send(topic_name(prefix, POLICY), value=doc, key=change.stamp.name.encode())
                    err.print(
                        f"[yellow]applied {change.stamp.name} v{change.stamp.version}[/yellow] "
                        f"(hash {change.stamp.hash}) to control.policy: a policy change mid-run"
                    )
            batch = await state.getmany(timeout_ms=0)
            decisions = [
                Decision.model_validate_json(r.value) for rs in batch.values() for r in rs if r.value
            ]
            if decisions:
                sim.apply(decisions)
                applied += len(decisions)
                for d in decisions:
                    b = d.body
                    if b.kind == "breaker" and b.state == "open" and b.node_id not in opened:
                        opened.append(b.node_id)
                        why = ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in sorted(b.inputs.items()))
                        err.print(
                            f"[red]breaker OPEN[/red] {b.node_id} {clock.monotonic_s() - start_s:.0f}s in "
                            f"({b.reason}: {why})"
                        )
                    if b.kind == "routing" and DEGRADED_NODE in b.weights:
                        degraded_weight = b.weights[DEGRADED_NODE]
            if elapsed >= next_progress:
                next_progress += PROGRESS_EVERY_S
                _progress(
                    err,
                    elapsed=elapsed,
                    seconds=seconds,
                    s=sim.report().summary,
                    daemon=daemon,
                    weight=degraded_weight,
                )
            if (elapsed >= seconds and sim.done) or elapsed >= drain_deadline_s:
                break
            await asyncio.sleep(STEP_S)
        await producer.flush()
    finally:
        await state.stop()
        await producer.stop()
    return {
        "summary": sim.report().summary,
        "applied": applied,
        "opened_nodes": opened,
        "degraded_weight": degraded_weight,
    }


def _progress(
    err: Console, *, elapsed: float, seconds: int, s: dict[str, Any], daemon: Daemon, weight: float | None
) -> None:
    tasks, lat = s["tasks"], s["latency"]
    p99 = lat.get("ttft_p99_ms")
    phase = "sending" if elapsed < seconds else "draining"
    w = f"{weight:.2f}" if weight is not None else "-"
    err.print(
        f"[dim]{elapsed:4.0f}s[/dim] {phase:8} ok {tasks['succeeded']:4d} failed {tasks['failed']:3d} "
        f"TTFT p99 {'-' if p99 is None else round(p99):>5} ms  "
        f"decisions {daemon.stats.decisions_published:5d}  "
        f"{DEGRADED_NODE} weight {w}",
        soft_wrap=True,
    )


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.4f}{unit}" if abs(v) < 1 else f"{v:,.1f}{unit}"
    return f"{v}{unit}"


def _print_summary(r: dict[str, Any]) -> None:
    out = term.console()
    t = Table(
        title=f"fleetloop demo — {r['scenario']}, {r['seconds']} s on {r['broker']['kind']}",
        show_header=False,
    )
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    tasks, cost, lat = r["tasks"], r["cost"], r["latency"]
    rows = [
        ("tasks started", tasks["started"]),
        ("tasks succeeded", tasks["succeeded"]),
        ("tasks failed", tasks["failed"]),
        ("tasks still in flight at the end", tasks["started"] - tasks["succeeded"] - tasks["failed"]),
        ("success rate", f"{tasks['success_rate']:.1%}" if tasks["success_rate"] is not None else "-"),
        ("fleet cost", _fmt(cost["total_usd"], " USD")),
        ("cost per successful task", _fmt(cost["per_successful_task_usd"], " USD")),
        ("TTFT p50 / p99", f"{_fmt(lat['ttft_p50_ms'])} / {_fmt(lat['ttft_p99_ms'])} ms"),
        ("decisions published", r["decisions_published"]),
        ("breaker openings", f"{r['breaker_opens']} ({', '.join(r['breaker_opened_nodes']) or 'none'})"),
        (f"weight of {r['degraded_node']} at the end", _fmt(r["weight_of_degraded_node_at_end"])),
        ("dead letters", r["deadletter"]),
        ("records consumed by the daemon", r["events_in"]),
        ("policy", f"{r['policy']['name']} v{r['policy']['version']} ({r['policy']['hash']})"),
    ]
    replay = r.get("replay")
    if replay is not None:
        change = replay["policy_change"]
        per = ", ".join(str(n) for n in replay["ticks_by_policy"].values())
        rows.append(
            (
                "policy change (--verify-replay)",
                f"v{change['to_version']} ({change['hash']}) from tick {change['from_tick_id']}",
            )
        )
        rows.append(("ticks replayed, per policy", f"{replay['ticks']} ({per})"))
    for k, v in rows:
        t.add_row(k, str(v))
    out.print(t)
