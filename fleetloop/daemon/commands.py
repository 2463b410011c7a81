"""Subcommands of the runtime: ``run``, ``policy``, ``replay``, ``demo``.

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

import orjson

from fleetloop.daemon.cli_common import UsageError, bootstrap_arg, policy_from, quiet_client_logs
from fleetloop.policies.registry import CompiledPolicy, PolicyError, load_policy


def register(sub: Any) -> None:
    from fleetloop.daemon import demo
    from fleetloop.daemon.replay import command as replay_command

    run = sub.add_parser("run", help="run the daemon (the sidecar control loop)")
    bootstrap_arg(run, required=True)
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
        "--create-topics", action="store_true", help="create any missing topic of the registry first"
    )
    run.add_argument(
        "--checkpoint-interval-s",
        type=float,
        default=5.0,
        metavar="S",
        help="checkpoint each changed shard to control.checkpoint at most this often (default 5)",
    )
    run.add_argument("--log-format", choices=("console", "json"), default="console")
    run.set_defaults(handler=cmd_run)

    pol = sub.add_parser("policy", help="validate, apply or diff policy documents")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True, parser_class=type(pol))
    v = pol_sub.add_parser(
        "validate", help="check documents; exit 2 naming the first problem of each bad one"
    )
    v.add_argument("files", nargs="+", metavar="FILE")
    v.add_argument("--json", action="store_true")
    v.set_defaults(handler=cmd_policy_validate)
    a = pol_sub.add_parser("apply", help="validate and publish a document to control.policy")
    a.add_argument("file", metavar="FILE")
    bootstrap_arg(a, required=True)
    a.set_defaults(handler=cmd_policy_apply)
    d = pol_sub.add_parser("diff", help="what changes between two documents")
    d.add_argument("old", metavar="OLD")
    d.add_argument("new", metavar="NEW")
    d.add_argument("--json", action="store_true")
    d.set_defaults(handler=cmd_policy_diff)

    replay_command.register(sub)
    demo.register(sub)


# -- run ----------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from fleetloop.daemon import observability

    if not 0.05 <= args.checkpoint_interval_s <= 3600:
        raise UsageError("fleetloop run: --checkpoint-interval-s must be between 0.05 and 3600")
    observability.configure(fmt=args.log_format)
    policy = policy_from(args.policy)
    return asyncio.run(_run(args, policy))


async def _run(args: argparse.Namespace, policy: CompiledPolicy) -> int:
    from fleetloop.daemon.brokers import ensure_topics, probe_capabilities
    from fleetloop.daemon.runtime import Daemon, DaemonConfig

    try:
        if args.create_topics:
            await ensure_topics(args.bootstrap_servers, args.topic_prefix)
        idempotence = args.idempotence == "on"
        if args.idempotence == "auto":
            idempotence = (await probe_capabilities(args.bootstrap_servers)).idempotent_producer
    except Exception as exc:
        raise UsageError(
            f"cannot reach Kafka at {args.bootstrap_servers}: {type(exc).__name__}: {exc}"
        ) from None
    daemon = Daemon(
        DaemonConfig(
            bootstrap_servers=args.bootstrap_servers,
            policy=policy,
            prefix=args.topic_prefix,
            group_id=args.group_id,
            run_ticker=not args.no_ticker,
            idempotence=idempotence,
            checkpoint_interval_s=args.checkpoint_interval_s,
        )
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await daemon.run(stop)
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


def cmd_policy_apply(args: argparse.Namespace) -> int:
    quiet_client_logs()
    policy = load_policy(args.file)
    asyncio.run(_apply(args, policy))
    sys.stdout.write(
        f"applied  {policy.stamp.name} v{policy.stamp.version}  hash {policy.stamp.hash}"
        f"  -> {args.bootstrap_servers}\n"
    )
    return 0


async def _apply(args: argparse.Namespace, policy: CompiledPolicy) -> None:
    from aiokafka import AIOKafkaProducer

    from fleetloop.schemas.topics import POLICY, topic_name

    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap_servers, acks="all")
    try:
        await producer.start()
    except Exception as exc:
        await producer.stop()
        raise UsageError(
            f"cannot reach Kafka at {args.bootstrap_servers}: {type(exc).__name__}: {exc}"
        ) from None
    try:
        value = orjson.dumps(policy.document.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        await producer.send_and_wait(
            topic_name(args.topic_prefix, POLICY), value=value, key=policy.stamp.name.encode()
        )
    finally:
        await producer.stop()


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def cmd_policy_diff(args: argparse.Namespace) -> int:
    old, new = load_policy(args.old), load_policy(args.new)
    a = flatten(old.document.model_dump(mode="json"))
    b = flatten(new.document.model_dump(mode="json"))
    changes = [
        {"path": k, "old": a.get(k), "new": b.get(k)} for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
    ]
    if args.json:
        sys.stdout.write(json.dumps({"old": args.old, "new": args.new, "changes": changes}) + "\n")
    else:
        if not changes:
            sys.stdout.write("no changes\n")
        width = max((len(str(c["path"])) for c in changes), default=0)
        for c in changes:
            sys.stdout.write(f"{c['path']:<{width}}  {c['old']!r} -> {c['new']!r}\n")
    return 1 if changes else 0
