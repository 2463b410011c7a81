"""``fleetloop policy apply|status|rollback``: change what a running daemon group decides with.

The daemon publishes the policy it *activated* (name, version, hash, the tick it decides from, and
the last few activations' documents) to the compacted ``control.policy.active``, keyed by consumer
group. These commands read that record first, after checking (creating nothing) that the topics they
read and write exist with one partition each (one line and exit 2 otherwise):

- ``apply FILE`` refuses, with one line and exit 2, an invalid document, a version not newer than
  the active one, or another name than the group runs (``--other-name`` publishes it anyway, for a
  group that follows that name); otherwise it publishes to ``control.policy`` and waits (bounded,
  ``--wait-s``) until the daemon reports the activation, then prints the tick it took effect
  from. A daemon that refuses the document is reported with its reason (exit 1), as is silence.
- ``status`` prints the active policy and its recent history.
- ``rollback [--to VERSION]`` publishes an earlier document's content as a new version (active + 1),
  so versions stay monotonic and the rollback is itself a recorded change.

Shadow mode: ``apply`` of a document with ``spec.mode: shadow`` publishes it under the key
``<name>/shadow``; the daemon runs it beside the enforcing policy (decisions on ``control.shadow``)
instead of replacing it. It is held to the same rules against the shadow in force (a newer version,
the group's name). ``status`` shows it; ``remove-shadow`` publishes a tombstone on that key and waits
until the daemon stops running it. ``fleetloop policy compare`` reports how its decisions differ.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError

from fleetloop import clock
from fleetloop.daemon.cli_common import UsageError, connection_from, quiet_client_logs
from fleetloop.daemon.runtime import read_active
from fleetloop.kafka_security import Bootstrap, bootstrap_arg, connect, error_text, shown
from fleetloop.policies.registry import CompiledPolicy, compile_policy, document_hash, load_policy
from fleetloop.schemas.control import ActivePolicy
from fleetloop.schemas.policy import PolicyDocument
from fleetloop.schemas.topics import POLICY, POLICY_ACTIVE, topic_name
from fleetloop.topic_layout import TopicLayoutError, require_topics


def register(pol_sub: Any) -> None:
    a = pol_sub.add_parser(
        "apply", help="publish a newer document to control.policy and wait until the daemon activates it"
    )
    a.add_argument("file", metavar="FILE")
    _common(a)
    a.add_argument(
        "--other-name", action="store_true", help="publish a document of another name than the group runs"
    )
    a.set_defaults(handler=cmd_apply)
    s = pol_sub.add_parser("status", help="the policy a daemon group has activated, and its history")
    _common(s, wait=False)
    s.set_defaults(handler=cmd_status)
    r = pol_sub.add_parser("rollback", help="publish an earlier document's content as a new version")
    r.add_argument(
        "--to", type=int, metavar="VERSION", help="the version to go back to (default: the previous one)"
    )
    _common(r)
    r.set_defaults(handler=cmd_rollback)
    rs = pol_sub.add_parser("remove-shadow", help="stop the shadow policy a daemon group runs")
    _common(rs)
    rs.set_defaults(handler=cmd_remove_shadow)


def _common(p: argparse.ArgumentParser, *, wait: bool = True) -> None:
    bootstrap_arg(p, required=True)
    p.add_argument("--group-id", default="fleetloop", help="the daemon's consumer group (default fleetloop)")
    if wait:
        p.add_argument(
            "--wait-s",
            type=float,
            default=30.0,
            metavar="S",
            help="seconds to wait for the daemon to take the change (default 30)",
        )
    p.add_argument("--json", action="store_true")


async def _require(conn: Bootstrap, prefix: str, verb: str, logicals: list[str]) -> None:
    """The topics a verb reads or writes exist with one partition each, checked creating nothing:
    a consumer's or producer's first Metadata request for a missing topic would make an
    auto-creating broker create it with its own default partition count (4 on Tansu), and a daemon
    started on that topic later reads partition 0 only."""
    try:
        await require_topics(conn, prefix, logicals)
    except TopicLayoutError as exc:
        raise UsageError(f"fleetloop policy {verb}: {exc}") from None
    except KafkaError as exc:
        raise UsageError(
            f"fleetloop policy: cannot reach Kafka at {shown(conn)}: {error_text(exc)}"
        ) from None


async def _active(conn: Bootstrap, prefix: str, group: str) -> ActivePolicy | None:
    consumer = AIOKafkaConsumer(**connect(conn), enable_auto_commit=False)
    try:
        await consumer.start()
    except Exception as exc:
        await consumer.stop()
        raise UsageError(
            f"fleetloop policy: cannot reach Kafka at {shown(conn)}: {error_text(exc)}"
        ) from None
    try:
        return await read_active(consumer, topic_name(prefix, POLICY_ACTIVE), group)
    finally:
        await consumer.stop()


def _is_shadow(policy: CompiledPolicy) -> bool:
    return policy.document.spec.mode == "shadow"


def _check(policy: CompiledPolicy, active: ActivePolicy | None, other_name: bool, verb: str) -> None:
    if active is None:
        return
    s = policy.stamp
    if s.name != active.name and not other_name:
        raise UsageError(
            f"fleetloop policy {verb}: refused: group {active.group} runs {active.name!r}, this document "
            f"is {s.name!r} (--other-name to publish it anyway)"
        )
    if _is_shadow(policy):
        current = active.shadow_document
        if s.name == active.name and current is not None and s.version <= current.metadata.version:
            raise UsageError(
                f"fleetloop policy {verb}: refused: shadow {s.name} v{s.version} is not newer than the "
                f"shadow in force v{current.metadata.version} (hash {document_hash(current)})"
            )
        return
    if s.name == active.name and s.version <= active.version:
        raise UsageError(
            f"fleetloop policy {verb}: refused: {s.name} v{s.version} is not newer than the active "
            f"v{active.version} (hash {active.hash})"
        )


async def _publish_and_wait(
    args: argparse.Namespace, conn: Bootstrap, policy: CompiledPolicy, before: ActivePolicy | None
) -> tuple[int, dict[str, Any]]:
    producer = AIOKafkaProducer(**connect(conn), acks="all")
    try:
        await producer.start()
    except Exception as exc:
        await producer.stop()
        raise UsageError(
            f"fleetloop policy: cannot reach Kafka at {shown(conn)}: {error_text(exc)}"
        ) from None
    topic = topic_name(args.topic_prefix, POLICY)
    shadow = _is_shadow(policy)
    key = f"{policy.stamp.name}/shadow" if shadow else policy.stamp.name
    try:
        value = orjson.dumps(policy.document.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        meta = await producer.send_and_wait(topic, value=value, key=key.encode())
    except KafkaError as exc:
        hint = ""
        if isinstance(exc, TopicAuthorizationFailedError):
            hint = " (this principal may not write it: see SECURITY.md, ACLs)"
        raise UsageError(
            f"fleetloop policy apply: cannot write {topic} at {shown(conn)}: {error_text(exc)}{hint}"
        ) from None
    finally:
        await producer.stop()
    s = policy.stamp
    out: dict[str, Any] = {
        "name": s.name,
        "version": s.version,
        "hash": s.hash,
        "offset": meta.offset,
        "group": args.group_id,
        "mode": "shadow" if shadow else "enforce",
        "activated": False,
    }
    deadline = clock.monotonic_s() + args.wait_s
    refused_before = before.refused if before is not None else 0
    while clock.monotonic_s() < deadline:
        active = await _active(conn, args.topic_prefix, args.group_id)
        if active is not None and not shadow and active.hash == s.hash:
            out.update(activated=True, from_tick_id=active.from_tick_id, from_ts_ms=active.from_ts_ms)
            return 0, out
        current = active.shadow_document if active is not None else None
        if active is not None and shadow and current is not None and document_hash(current) == s.hash:
            from_ts = active.shadow[-1].from_ts_ms
            tick_ms = active.history[-1].document.spec.tick_ms if active.history else policy.tick_ms
            out.update(activated=True, from_tick_id=from_ts // tick_ms, from_ts_ms=from_ts)
            return 0, out
        if active is not None and active.considered_offset >= meta.offset and active.refused > refused_before:
            out["refused"] = active.last_refusal
            return 1, out
        await asyncio.sleep(0.5)
    out["error"] = f"not activated within {args.wait_s:g} s (is a daemon of group {args.group_id} running?)"
    return 1, out


def _report(code: int, out: dict[str, Any], as_json: bool, verb: str, command: str) -> int:
    """The outcome on one line: ``verb`` ("applied") on success on stdout; a refusal or a timeout on
    stderr under the command's name ("fleetloop policy apply: ..."), never read as a success."""
    if as_json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        return code
    what = f"{out['name']} v{out['version']}  hash {out['hash']}"
    if out.get("mode") == "shadow":
        what = f"shadow {what}"
    if out.get("activated"):
        sys.stdout.write(f"{verb}  {what}  active from tick {out['from_tick_id']} (group {out['group']})\n")
    elif "refused" in out:
        sys.stderr.write(f"fleetloop policy {command}: the daemon refused {what}: {out['refused']}\n")
    else:
        where = f"at offset {out['offset']}"
        sys.stderr.write(f"fleetloop policy {command}: published {what} {where}; {out['error']}\n")
    return code


def cmd_apply(args: argparse.Namespace) -> int:
    quiet_client_logs()
    policy = load_policy(args.file)  # an invalid document: PolicyError, one line, exit 2
    _positive(args.wait_s)
    conn = connection_from(args)

    async def go() -> tuple[int, dict[str, Any]]:
        await _require(conn, args.topic_prefix, "apply", [POLICY_ACTIVE, POLICY])
        before = await _active(conn, args.topic_prefix, args.group_id)
        _check(policy, before, args.other_name, "apply")
        return await _publish_and_wait(args, conn, policy, before)

    code, out = asyncio.run(go())
    return _report(code, out, args.json, "applied", "apply")


def cmd_rollback(args: argparse.Namespace) -> int:
    quiet_client_logs()
    _positive(args.wait_s)
    conn = connection_from(args)

    async def go() -> tuple[int, dict[str, Any]]:
        await _require(conn, args.topic_prefix, "rollback", [POLICY_ACTIVE, POLICY])
        active = await _active(conn, args.topic_prefix, args.group_id)
        if active is None:
            raise UsageError(f"fleetloop policy rollback: group {args.group_id} has no active policy")
        docs = [a.document for a in active.history if a.document.metadata.name == active.name]
        earlier = [d for d in docs if d.metadata.version < active.version]
        if args.to is not None:
            earlier = [d for d in earlier if d.metadata.version == args.to]
        if not earlier:
            known = ", ".join(f"v{d.metadata.version}" for d in docs) or "none"
            want = f"v{args.to}" if args.to is not None else "an earlier version"
            raise UsageError(
                f"fleetloop policy rollback: {want} is not among the recent activations ({known})"
            )
        old = earlier[-1]
        data = old.model_dump(mode="json")
        data["metadata"]["version"] = active.version + 1
        data["metadata"]["description"] = f"rollback of v{active.version} to v{old.metadata.version}"
        policy = compile_policy(PolicyDocument.model_validate(data))
        return await _publish_and_wait(args, conn, policy, active)

    code, out = asyncio.run(go())
    return _report(code, out, args.json, "rolled back", "rollback")


def cmd_remove_shadow(args: argparse.Namespace) -> int:
    quiet_client_logs()
    _positive(args.wait_s)
    conn = connection_from(args)

    async def go() -> tuple[int, dict[str, Any]]:
        await _require(conn, args.topic_prefix, "remove-shadow", [POLICY_ACTIVE, POLICY])
        active = await _active(conn, args.topic_prefix, args.group_id)
        current = active.shadow_document if active is not None else None
        if active is None or current is None:
            raise UsageError(f"fleetloop policy remove-shadow: group {args.group_id} runs no shadow policy")
        producer = AIOKafkaProducer(**connect(conn), acks="all")
        try:
            await producer.start()
            topic = topic_name(args.topic_prefix, POLICY)
            meta = await producer.send_and_wait(topic, value=None, key=f"{active.name}/shadow".encode())
        except KafkaError as exc:
            raise UsageError(
                f"fleetloop policy remove-shadow: cannot write at {shown(conn)}: {error_text(exc)}"
            ) from None
        finally:
            await producer.stop()
        out: dict[str, Any] = {
            "name": current.metadata.name,
            "version": current.metadata.version,
            "hash": document_hash(current),
            "offset": meta.offset,
            "group": args.group_id,
            "removed": False,
        }
        deadline = clock.monotonic_s() + args.wait_s
        while clock.monotonic_s() < deadline:
            now = await _active(conn, args.topic_prefix, args.group_id)
            if now is not None and now.shadow_document is None:
                tick_ms = now.history[-1].document.spec.tick_ms if now.history else 1000
                out.update(removed=True, from_tick_id=now.shadow[-1].from_ts_ms // tick_ms)
                return 0, out
            await asyncio.sleep(0.5)
        out["error"] = f"not removed within {args.wait_s:g} s (is a daemon of group {args.group_id} running?)"
        return 1, out

    code, out = asyncio.run(go())
    if args.json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    elif code == 0:
        sys.stdout.write(
            f"removed shadow {out['name']} v{out['version']}  hash {out['hash']}  "
            f"from tick {out['from_tick_id']} (group {out['group']})\n"
        )
    else:
        sys.stderr.write(
            f"fleetloop policy remove-shadow: published at offset {out['offset']}; {out['error']}\n"
        )
    return code


def cmd_status(args: argparse.Namespace) -> int:
    quiet_client_logs()
    conn = connection_from(args)

    async def go() -> ActivePolicy | None:
        await _require(conn, args.topic_prefix, "status", [POLICY_ACTIVE])
        return await _active(conn, args.topic_prefix, args.group_id)

    active = asyncio.run(go())
    if active is None:
        raise UsageError(f"fleetloop policy status: group {args.group_id} has no active policy")
    if args.json:
        sys.stdout.write(active.model_dump_json() + "\n")
        return 0
    sys.stdout.write(
        f"group {active.group}: {active.name} v{active.version}  hash {active.hash}  "
        f"active from tick {active.from_tick_id}\n"
        + _shadow_line(active)
        + f"refused documents: {active.refused}"
        + (f" (last: {active.last_refusal})" if active.last_refusal else "")
        + "\nhistory (oldest first):\n"
    )
    for a in active.history:
        p = compile_policy(a.document)
        tick = a.from_ts_ms // p.tick_ms
        sys.stdout.write(f"  v{p.stamp.version}  hash {p.stamp.hash}  from tick {tick}\n")
    return 0


def _shadow_line(active: ActivePolicy) -> str:
    doc = active.shadow_document
    if doc is None:
        return "shadow: none\n"
    tick_ms = active.history[-1].document.spec.tick_ms if active.history else doc.spec.tick_ms
    return (
        f"shadow: {doc.metadata.name} v{doc.metadata.version}  hash {document_hash(doc)}  "
        f"from tick {active.shadow[-1].from_ts_ms // tick_ms}  (decisions on control.shadow)\n"
    )


def _positive(wait_s: float) -> None:
    if not 0 < wait_s <= 3600:
        raise UsageError("fleetloop policy: --wait-s must be in (0, 3600]")
