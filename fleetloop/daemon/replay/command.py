"""``fleetloop replay``: read the recorded topics and replay them (see :mod:`.replay`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from fleetloop.daemon.cli_common import UsageError, bootstrap_arg, connection_from, quiet_client_logs
from fleetloop.daemon.replay.replay import ReplayReport, group_ticks, replay_ticks
from fleetloop.kafka_security import Bootstrap, connect, shown
from fleetloop.policies.registry import (
    CompiledPolicy,
    PolicyError,
    builtin_policy,
    compile_policy,
    load_policy,
    parse_document,
)
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.schemas.topics import DECISIONS, POLICY, POLICY_ACTIVE, REQUESTS, TELEMETRY, topic_name


def register(sub: Any) -> None:
    p = sub.add_parser("replay", help="recompute recorded decisions from recorded inputs, or a what-if")
    bootstrap_arg(p, required=True)
    p.add_argument(
        "--from", dest="from_", default="beginning", metavar="TIME", help="compare ticks from here"
    )
    p.add_argument("--to", default="end", metavar="TIME", help="stop after ticks at this time")
    p.add_argument(
        "--policy", metavar="FILE", help="what-if: decide with this policy instead of the recorded one"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_replay)


def parse_time(text: str, *, default: int | None, verb: str = "replay") -> int | None:
    """``beginning``/``end``, epoch milliseconds, or an ISO-8601 time with a zone."""
    if text in ("beginning", "end"):
        return default
    if text.isdigit():
        return int(text)
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"fleetloop {verb}: cannot read time {text!r} (epoch ms, ISO-8601, beginning, end)"
        ) from None
    if dt.tzinfo is None:
        raise UsageError(f"fleetloop {verb}: time {text!r} needs a zone, e.g. {text}Z or {text}+00:00")
    return int(dt.timestamp() * 1000)


def cmd_replay(args: argparse.Namespace) -> int:
    quiet_client_logs()
    from_ms = parse_time(args.from_, default=0) or 0
    to_ms = parse_time(args.to, default=None)
    if to_ms is not None and to_ms < from_ms:
        raise UsageError(f"fleetloop replay: --from {args.from_} is after --to {args.to}: an empty window")
    what_if = load_policy(args.policy) if args.policy else None
    report, policy, mode = asyncio.run(_replay(args, what_if, from_ms, to_ms))
    if report.ticks_compared == 0:
        raise UsageError(
            f"fleetloop replay: no recorded tick between --from {args.from_} and --to {args.to} "
            f"({report.ticks_replayed} ticks replayed before it): nothing to compare"
        )
    if args.json:
        sys.stdout.write(json.dumps(_as_json(report, policy, mode)) + "\n")
    else:
        _print(report, policy, mode)
    if mode == "exact" and not report.exact:
        return 1
    return 0


async def read_topic(bootstrap: Bootstrap, topic: str) -> dict[int, list[Any]]:
    """Every record of ``topic`` up to its end offsets now, by partition, in offset order."""
    admin = AIOKafkaAdminClient(**connect(bootstrap))
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    partitions = [p["partition"] for t in described if t["error_code"] == 0 for p in t["partitions"]]
    if not partitions:
        raise UsageError(f"fleetloop replay: topic {topic!r} does not exist at {shown(bootstrap)}")
    consumer = AIOKafkaConsumer(**connect(bootstrap), enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out: dict[int, list[Any]] = {tp.partition: [] for tp in tps}
        # The embedded broker's ListOffsets can lag its fetch high-water mark: take the larger.
        batch = await consumer.getmany(timeout_ms=500)
        while True:
            for tp, records in batch.items():
                out[tp.partition].extend(records)
            for tp in tps:
                end[tp] = max(end[tp], consumer.highwater(tp) or 0)
            if not [tp for tp in tps if await consumer.position(tp) < end[tp]]:
                break
            batch = await consumer.getmany(timeout_ms=500)
        return out
    finally:
        await consumer.stop()


async def _replay(
    args: argparse.Namespace, what_if: CompiledPolicy | None, from_ms: int, to_ms: int | None
) -> tuple[ReplayReport, CompiledPolicy, str]:
    bootstrap, prefix = connection_from(args), args.topic_prefix
    try:
        decided = await read_topic(bootstrap, topic_name(prefix, DECISIONS))
        raw_inputs = {
            logical: await read_topic(bootstrap, topic_name(prefix, logical))
            for logical in (TELEMETRY, REQUESTS)
        }
        policies = await read_topic(bootstrap, topic_name(prefix, POLICY))
        try:
            actives = await read_topic(bootstrap, topic_name(prefix, POLICY_ACTIVE))
        except UsageError:
            actives = {}  # written by daemons since policy lifecycle; older deployments lack it
    except UsageError:
        raise
    except Exception as exc:  # one line for the user, whatever the client raised
        raise UsageError(
            f"fleetloop replay: cannot read from {shown(bootstrap)}: {type(exc).__name__}: {exc}"
        ) from None
    decisions = [Decision.model_validate_json(r.value) for rs in decided.values() for r in rs if r.value]
    ticks = group_ticks(decisions)
    if not ticks:
        raise UsageError(f"fleetloop replay: no recorded decisions on {topic_name(prefix, DECISIONS)}")
    inputs: dict[str, list[tuple[int, NodeTelemetry | RequestOutcome]]] = {}
    models: dict[str, type[NodeTelemetry] | type[RequestOutcome]] = {
        TELEMETRY: NodeTelemetry,
        REQUESTS: RequestOutcome,
    }
    for logical, parts in raw_inputs.items():
        for partition, records in parts.items():
            rows: list[tuple[int, NodeTelemetry | RequestOutcome]] = []
            for r in records:
                try:
                    rows.append((r.offset, models[logical].model_validate_json(r.value or b"")))
                except ValidationError:
                    continue  # the daemon dead-lettered it too: it never reached the model
            inputs[f"{logical}:{partition}"] = rows
    if what_if is not None:
        # The recorded policy itself, given as a file, is an exact replay, not a what-if.
        mode = "exact" if what_if.stamp.hash == ticks[0].policy_hash else "what-if"
        report = replay_ticks(
            ticks, inputs, what_if, from_ms=from_ms, to_ms=to_ms, compare_stamps=mode == "exact"
        )
        return report, what_if, mode
    known = _known_policies([r for rs in (*policies.values(), *actives.values()) for r in rs])
    for rt in ticks:
        if rt.policy_hash not in known:
            raise UsageError(
                f"fleetloop replay: the recorded policy (hash {rt.policy_hash}, tick {rt.tick.tick_id}) "
                "is neither built in nor on control.policy; pass it with --policy FILE"
            )
    last = known[ticks[-1].policy_hash]
    return replay_ticks(ticks, inputs, known, from_ms=from_ms, to_ms=to_ms), last, "exact"


def _known_policies(records: list[Any]) -> dict[str, CompiledPolicy]:
    """Every policy a recorded decision can be stamped with: built-in ones, control.policy's, and
    those a daemon activated (control.policy.active keeps their documents, also a ``run --policy``
    file's, after control.policy has compacted)."""
    candidates = [builtin_policy(name) for name in ("default", "none", "classic")]
    for r in records:
        try:
            data = json.loads(r.value)
            docs = [a["document"] for a in data["history"]] if "history" in data else [data]
            candidates.extend(compile_policy(parse_document(d)) for d in docs)
        except (PolicyError, ValueError, KeyError, TypeError):
            continue
    return {c.stamp.hash: c for c in candidates}


def _as_json(r: ReplayReport, policy: CompiledPolicy, mode: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "policy": {"name": policy.stamp.name, "version": policy.stamp.version, "hash": policy.stamp.hash},
        "ticks_replayed": r.ticks_replayed,
        "ticks_compared": r.ticks_compared,
        "decisions_compared": r.decisions_compared,
        "identical": r.identical,
        "different": r.different,
        "missing": r.missing,
        "extra": r.extra,
        "exact": r.exact,
        "changed_by_kind": dict(sorted(r.changed_by_kind.items())),
        "breaker_opens": {"recorded": r.breaker_opens_recorded, "replayed": r.breaker_opens_replayed},
        "first_difference": r.first_difference,
    }


def _print(r: ReplayReport, policy: CompiledPolicy, mode: str) -> None:
    out = Console(highlight=False)
    verdict = (
        ("[green]byte-identical[/green]" if r.exact else "[red]DIFFERENT[/red]")
        if mode == "exact"
        else f"{r.different + r.missing + r.extra} decisions would change"
    )
    t = Table(
        title=f"fleetloop replay ({mode}, policy {policy.stamp.name} v{policy.stamp.version}): {verdict}"
    )
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    for k, v in (
        ("ticks replayed / compared", f"{r.ticks_replayed} / {r.ticks_compared}"),
        ("decisions compared", r.decisions_compared),
        ("identical", r.identical),
        ("different / missing / extra", f"{r.different} / {r.missing} / {r.extra}"),
        ("breaker openings recorded / replayed", f"{r.breaker_opens_recorded} / {r.breaker_opens_replayed}"),
    ):
        t.add_row(k, str(v))
    for kind, n in sorted(r.changed_by_kind.items()):
        t.add_row(f"  changed {kind}", str(n))
    out.print(t)
    if r.first_difference:
        out.print(f"first difference at tick {r.first_difference['tick_id']}, {r.first_difference['key']}:")
        out.print(f"  recorded {r.first_difference['recorded'][:400]}")
        out.print(f"  replayed {r.first_difference['replayed'][:400]}")
