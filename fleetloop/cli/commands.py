"""Subcommands of the runtime: ``run`` and ``policy`` (``replay`` and ``demo`` have their own modules).

Each handler returns an exit code; problems a user can fix raise :class:`UsageError` (one line).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from typing import Any

from pydantic_core import to_jsonable_python

from fleetloop import clock
from fleetloop.daemon import lifecycle, observability
from fleetloop.daemon.brokers import TopicLayoutError, ensure_topics, probe_capabilities
from fleetloop.daemon.brokers.admin import missing_topics
from fleetloop.daemon.cli_common import (
    UsageError,
    connection_from,
    door_from,
    held_client_logs,
    log_args,
    policy_from,
)
from fleetloop.daemon.observability import logger
from fleetloop.daemon.observe.decode import Door
from fleetloop.daemon.replay import compare_command
from fleetloop.daemon.service.health import TaskDied
from fleetloop.kafka_security import Bootstrap, bootstrap_arg, error_text, shown
from fleetloop.policies.envelope import Envelope
from fleetloop.policies.registry import CompiledPolicy, PolicyError, load_policy
from fleetloop.schemas.topics import TOPICS
from fleetloop.topic_layout import require_topics


def register(sub: Any) -> None:
    """``run`` and the ``policy`` group."""
    _register_run(sub)
    _register_policy(sub)


def _register_run(sub: Any) -> None:
    """``run``, its flags in the order ``--help`` lists them."""
    run = sub.add_parser("run", help="run the daemon (the sidecar control loop)")
    bootstrap_arg(run, required=True)
    _role_args(run)
    _pacing_args(run)
    _http_args(run)
    _door_args(run)
    log_args(run)
    run.set_defaults(handler=cmd_run)


def _role_args(run: argparse.ArgumentParser) -> None:
    """What this instance is: its policy, its group, whether it ticks, how it produces, and whether it
    creates the topics."""
    run.add_argument(
        "--policy", metavar="FILE", help="initial policy document (default: the built-in default)"
    )
    run.add_argument(
        "--group-id", default="fleetloop", help="consumer group (instances in one group split pools)"
    )
    run.add_argument("--no-ticker", action="store_true", help="do not publish ticks (another instance does)")
    run.add_argument(
        "--idempotence",
        choices=("auto", "on", "off"),
        default="auto",
        help="idempotent producer: auto probes the broker (the embedded one lacks it)",
    )
    run.add_argument(
        "--create-topics",
        action="store_true",
        help="create any missing topic of the registry first (existing ones are checked either way: "
        "exit 2 naming a topic with the wrong partition count or cleanup policy)",
    )


def _pacing_args(run: argparse.ArgumentParser) -> None:
    """How much work the loop takes on, how often it checkpoints, how long a silent member keeps its
    partitions, and how long to wait for missing topics."""
    run.add_argument(
        "--overload-max-ticks",
        type=int,
        default=2,
        metavar="N",
        help="a pool with N boundaries published and not yet decided gets no new tick; the ones held "
        "back go out as skipped ('overload: ...') and the newest is decided next (default 2; 0: decide "
        "every boundary however late)",
    )
    run.add_argument(
        "--checkpoint-interval-s",
        type=float,
        default=5.0,
        metavar="S",
        help="checkpoint each changed shard to control.checkpoint at most this often (default 5)",
    )
    run.add_argument(
        "--checkpoint-cpu-share",
        type=float,
        default=0.05,
        metavar="SHARE",
        help="when checkpoints are costly, checkpoint less often so their encoding uses about this "
        "share of one core (default 0.05; 0: every --checkpoint-interval-s)",
    )
    run.add_argument(
        "--checkpoint-max-stretch",
        type=float,
        default=6.0,
        metavar="X",
        help="... at most this many times --checkpoint-interval-s apart: a longer gap is more records a "
        "new owner folds forward after a restart or a rebalance (default 6)",
    )
    run.add_argument(
        "--session-timeout-s",
        type=float,
        default=6.0,
        metavar="S",
        help="the consumer group's session timeout: a member not heard from this long loses its "
        "partitions (default 6; longer for large fleets on a busy machine, whose heartbeats come late; "
        "failover after a crash takes about this long)",
    )
    run.add_argument(
        "--rebalance-timeout-s",
        type=float,
        default=60.0,
        metavar="S",
        help="how long the group waits in a rebalance for every member to join again; a member first "
        "checkpoints the shards it gives up, seconds at fleet scale (default 60; at least the session "
        "timeout)",
    )
    run.add_argument(
        "--group-instance-id",
        default=None,
        metavar="NAME",
        help="static group membership: this instance's name, stable across its restarts and unique in "
        "the group; a restart within --session-timeout-s keeps its partitions without a rebalance "
        "(default: none, every join and leave rebalances)",
    )
    run.add_argument(
        "--state-refresh-s",
        type=float,
        default=10.0,
        metavar="S",
        help="control.state gets each key's desired state when it changes, and every key again at "
        "least this often (default 10; 0: every decision every tick, the old form)",
    )
    run.add_argument(
        "--wait-for-topics",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for missing topics (default 0: exit 2 at once naming them)",
    )


def _http_args(run: argparse.ArgumentParser) -> None:
    """The optional HTTP face: health, metrics and the live page."""
    run.add_argument(
        "--http-port",
        type=int,
        metavar="PORT",
        help="serve /healthz, /readyz, /metrics and the live page / on this port (default: no HTTP server)",
    )
    run.add_argument(
        "--http-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the HTTP server binds (default 127.0.0.1: loopback only)",
    )


def _door_args(run: argparse.ArgumentParser) -> None:
    """Which input records the door lets in."""
    run.add_argument(
        "--event-time-window",
        default="600,30",
        metavar="PAST_S,FUTURE_S",
        help="accept a record's event time only this far before / after its broker timestamp "
        "(default 600,30; 'off' accepts any)",
    )
    run.add_argument(
        "--max-record-bytes",
        type=int,
        default=Door().max_record_bytes,
        metavar="N",
        help=f"refuse input records larger than this (default {Door().max_record_bytes})",
    )


def _register_policy(sub: Any) -> None:
    """The ``policy`` group: validate, the lifecycle commands, compare, diff (in that order)."""
    pol = sub.add_parser("policy", help="validate, apply, diff, roll back policy documents; status")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True, parser_class=type(pol))
    _add_validate(pol_sub)
    lifecycle.register(pol_sub)
    compare_command.register(pol_sub)
    _add_diff(pol_sub)


def _add_validate(pol_sub: Any) -> None:
    v = pol_sub.add_parser(
        "validate",
        help="check documents; exit 2 naming the first problem of each bad one",
        description="Check policy documents: each valid one is printed with its name, version and hash.",
        epilog="exit status: 0 every document is valid; 2 at least one is not (each bad one named on "
        "stderr, or in --json); the others are still checked.",
    )
    v.add_argument("files", nargs="+", metavar="FILE", help="a policy document (YAML); several may be given")
    v.add_argument("--json", action="store_true", help="print one JSON object: per-file results and counts")
    v.set_defaults(handler=cmd_policy_validate)


def _add_diff(pol_sub: Any) -> None:
    d = pol_sub.add_parser(
        "diff",
        help="what changes between two documents (exit 1 when they differ)",
        description="What takes effect differently under NEW than under OLD: each section's params and "
        "the envelope are compared with the algorithm's defaults filled in, so a default written out "
        "or left out is no change; a value changed from or to its default says '(default X)'.",
        epilog="exit status, as diff(1): 0 no changes; 1 the documents differ (under 'set -e' a "
        "difference stops the script: 'fleetloop policy diff OLD NEW || [ $? -eq 1 ]' shows it and "
        "still stops on 2); "
        "2 a document cannot be read or is invalid.",
    )
    d.add_argument("old", metavar="OLD", help="the policy document before (YAML), e.g. the one in force")
    d.add_argument("new", metavar="NEW", help="the policy document after (YAML)")
    d.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"old", "new", "changes": [{"path", "old", "new", "default"?}]}',
    )
    d.set_defaults(handler=cmd_policy_diff)


# -- run ----------------------------------------------------------------------------------------
# The daemon's runtime and HTTP face are imported inside run's functions: this module also serves
# policy validate and diff, which need neither.


def cmd_run(args: argparse.Namespace) -> int:
    if not 0.05 <= args.checkpoint_interval_s <= 3600:
        raise UsageError("fleetloop run: --checkpoint-interval-s must be between 0.05 and 3600")
    if not 0 <= args.overload_max_ticks <= 1_000_000:
        raise UsageError("fleetloop run: --overload-max-ticks must be between 0 and 1000000")
    if not 0.0 <= args.checkpoint_cpu_share <= 1.0:
        raise UsageError("fleetloop run: --checkpoint-cpu-share must be between 0 and 1")
    if not 1.0 <= args.checkpoint_max_stretch <= 1000.0:
        raise UsageError("fleetloop run: --checkpoint-max-stretch must be between 1 and 1000")
    if not 1.0 <= args.session_timeout_s <= 300.0:
        raise UsageError("fleetloop run: --session-timeout-s must be between 1 and 300")
    if not 1.0 <= args.rebalance_timeout_s <= 3600.0:
        raise UsageError("fleetloop run: --rebalance-timeout-s must be between 1 and 3600")
    if args.group_instance_id is not None and not 0 < len(args.group_instance_id) <= 249:
        raise UsageError("fleetloop run: --group-instance-id must be 1 to 249 characters")
    if not (args.state_refresh_s == 0 or 1.0 <= args.state_refresh_s <= 3600.0):
        raise UsageError("fleetloop run: --state-refresh-s must be 0 or between 1 and 3600")
    if args.http_port is not None and not 0 <= args.http_port <= 65535:
        raise UsageError(f"fleetloop run: --http-port {args.http_port} is not a port (0..65535)")
    if args.wait_for_topics < 0:
        raise UsageError("fleetloop run: --wait-for-topics must be >= 0")
    args.door = door_from(args.event_time_window, args.max_record_bytes)
    conn = connection_from(args)
    policy = policy_from(args.policy)
    observability.configure(level=args.log_level, fmt=args.log_format)
    observability.setup_telemetry()
    try:
        return asyncio.run(_run(args, policy, conn))
    except UsageError as exc:
        if args.log_format != "json":
            raise
        # Under --log-format json even the last word is one JSON line.
        observability.logger("fleetloop.run").error(str(exc), exit_code=2)
        return 2
    finally:
        observability.shutdown()


async def _wait_for_topics(conn: Bootstrap, prefix: str, wait_s: float) -> None:
    """Exit 2 naming the missing topics, or wait up to ``wait_s`` for them (logged, bounded); then
    check their partition counts and cleanup policies (TopicLayoutError)."""
    log = logger("fleetloop.run")
    started = clock.monotonic_s()
    while True:
        missing = await missing_topics(conn, prefix)
        if not missing:
            await require_topics(conn, prefix, sorted(TOPICS), cleanup=True)
            return
        waited = clock.monotonic_s() - started
        if waited >= wait_s:
            after = f" after waiting {wait_s:g} s" if wait_s else ""
            raise UsageError(
                f"fleetloop run: topics missing at {shown(conn)}{after}: {', '.join(missing)} "
                "(create them with --create-topics, or wait with --wait-for-topics SECONDS)"
            )
        log.warning(
            "topics missing; waiting",
            missing=missing,
            waited_s=round(waited, 1),
            wait_for_topics_s=wait_s,
            ratelimit_key="topics",
        )
        await asyncio.sleep(min(1.0, wait_s - waited))


async def _run(args: argparse.Namespace, policy: CompiledPolicy, conn: Bootstrap) -> int:
    from fleetloop.daemon.runtime import Daemon  # noqa: PLC0415 - run only, not policy
    from fleetloop.daemon.service.live import LiveView, add_routes  # noqa: PLC0415 - run only, not policy

    log = logger("fleetloop.run")
    holder: list[Daemon] = []
    view = LiveView()
    server = None
    if args.http_port is not None:
        from fleetloop.daemon.service.http import HttpServer, make_app  # noqa: PLC0415 - run only, not policy

        server = HttpServer(
            make_app(lambda: holder[0].health if holder else None, add_routes(view)),
            host=args.http_host,
            port=args.http_port,
        )
        try:
            await server.start()
        except OSError as exc:
            raise UsageError(
                f"fleetloop run: cannot serve HTTP on {args.http_host}:{args.http_port}: "
                f"{exc.strerror or exc}"
            ) from None
        log.info(
            "http serving",
            url=f"http://{args.http_host}:{server.port}/",
            endpoints="/ /healthz /readyz /metrics",
        )
    try:
        return await _run_daemon(args, policy, conn, holder, view if server else None)
    finally:
        if server is not None:
            await server.stop()


async def _run_daemon(
    args: argparse.Namespace,
    policy: CompiledPolicy,
    conn: Bootstrap,
    holder: list[Any],
    view: Any = None,
) -> int:
    from fleetloop.daemon.runtime import Daemon, DaemonConfig  # noqa: PLC0415 - run only, not policy

    log = logger("fleetloop.run")
    try:
        with held_client_logs():  # an unreachable broker is one line, not the client's log first
            if args.create_topics:
                await ensure_topics(conn, args.topic_prefix)
            else:
                await _wait_for_topics(conn, args.topic_prefix, args.wait_for_topics)
            idempotence = args.idempotence == "on"
            if args.idempotence == "auto":
                idempotence = (await probe_capabilities(conn)).idempotent_producer
    except UsageError:
        raise
    except TopicLayoutError as exc:
        raise UsageError(f"fleetloop run: {exc}") from None
    except Exception as exc:
        raise UsageError(f"fleetloop run: cannot reach Kafka at {shown(conn)}: {error_text(exc)}") from None
    daemon = Daemon(
        DaemonConfig(
            bootstrap_servers=conn,
            policy=policy,
            prefix=args.topic_prefix,
            group_id=args.group_id,
            run_ticker=not args.no_ticker,
            idempotence=idempotence,
            checkpoint_interval_s=args.checkpoint_interval_s,
            checkpoint_cpu_share=args.checkpoint_cpu_share,
            checkpoint_max_stretch=args.checkpoint_max_stretch,
            session_timeout_s=args.session_timeout_s,
            group_instance_id=args.group_instance_id or None,
            rebalance_timeout_s=args.rebalance_timeout_s,
            state_refresh_s=args.state_refresh_s,
            overload_max_ticks=args.overload_max_ticks,
            door=args.door,
        ),
        on_decisions=view.record if view is not None else None,
    )
    holder.append(daemon)
    if view is not None:
        from fleetloop.daemon.service.live import ledger_of  # noqa: PLC0415 - run only, not policy

        view.ledger = ledger_of(daemon)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await daemon.run(stop)
    except TaskDied as died:
        # One line that names the task and why; a non-zero exit so a supervisor restarts us.
        log.error("task died; exiting", task=died.task, reason=died.reason, exit_code=1)
        return 1
    return 0


# -- policy -------------------------------------------------------------------------------------


def cmd_policy_validate(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    bad = 0
    for f in args.files:
        try:
            p = load_policy(f)
        except PolicyError as exc:
            bad += 1
            results.append({"file": f, "ok": False, "error": str(exc)})
            if not args.json:
                sys.stderr.write(f"invalid  {exc}\n")
            continue
        results.append(
            {"file": f, "ok": True, "name": p.stamp.name, "version": p.stamp.version, "hash": p.stamp.hash}
        )
        if not args.json:
            sys.stdout.write(f"valid    {f}  {p.stamp.name} v{p.stamp.version}  hash {p.stamp.hash}\n")
    if args.json:
        sys.stdout.write(json.dumps({"files": results, "valid": len(results) - bad, "invalid": bad}) + "\n")
    return 2 if bad else 0


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def effective(policy: CompiledPolicy) -> tuple[dict[str, Any], dict[str, Any]]:
    """The document as it takes effect, flattened: each section's ``params`` (and the envelope) as
    its compiled ``Params`` model, defaults filled; and each of those paths' default value."""
    doc = policy.document.model_dump(mode="json")
    models = {f"{name}.params": s.params for name, s in policy.sections.items()}
    models["envelope"] = Envelope.model_validate(policy.document.spec.envelope)
    defaults: dict[str, Any] = {}
    for where, params in models.items():
        section, _, key = where.partition(".")
        if key:
            doc["spec"][section][key] = params.model_dump(mode="json")
        else:
            doc["spec"][section] = params.model_dump(mode="json")
        for name, field in type(params).model_fields.items():
            if not field.is_required():
                value = to_jsonable_python(field.get_default(call_default_factory=True))
                defaults.update(flatten(value, f"spec.{where}.{name}"))
    return flatten(doc), defaults


_NONE = object()


def cmd_policy_diff(args: argparse.Namespace) -> int:
    old, new = load_policy(args.old), load_policy(args.new)
    # Effective values: a default written out or left out is no change.
    (a, a_default), (b, b_default) = effective(old), effective(new)
    changes: list[dict[str, Any]] = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) == b.get(k):
            continue
        if (k not in b and a_default.get(k, _NONE) == a[k]) or (
            k not in a and b_default.get(k, _NONE) == b[k]
        ):
            continue  # the section's algorithm changed (its type line says so); this one was a default
        c: dict[str, Any] = {"path": k, "old": a.get(k), "new": b.get(k)}
        default = b_default.get(k, a_default.get(k))
        if (k in a_default or k in b_default) and default in (c["old"], c["new"]):
            c["default"] = default
        changes.append(c)
    if args.json:
        sys.stdout.write(json.dumps({"old": args.old, "new": args.new, "changes": changes}) + "\n")
    else:
        if not changes:
            sys.stdout.write("no changes\n")
        width = max((len(str(c["path"])) for c in changes), default=0)
        for c in changes:
            note = f" (default {c['default']!r})" if "default" in c else ""
            sys.stdout.write(f"{c['path']:<{width}}  {c['old']!r} -> {c['new']!r}{note}\n")
    return 1 if changes else 0
