"""``fleetloop replay``: read the recorded topics and replay them (see :mod:`.replay`).

The window's ends (``--from``, ``--to``) are a time, or offsets: ``TOPIC:PARTITION:OFFSET``
(repeatable; ``fleet.telemetry``, ``fleet.requests`` or ``control.decisions``, with or without the
topic prefix) or ``group:NAME``, a consumer group's committed offsets on the input topics (``--to
group:fleetloop``: up to what the daemon group has decided and committed). Inputs pass the same door
as in ``fleetloop run`` (record size, event-time window around the broker timestamp), so a record
the daemon dead-lettered is not folded in replay either. Progress goes to stderr every few seconds
on long windows (not with ``--json``).

What is judged, and how, comes from the window's own ticks, stretch by stretch: the compared ticks
recorded under one policy (name, version, hash) are a stretch, and the header lists each as
``ticks A-B: NAME vN (HASH), K ticks, MODE: VERDICT``.

- Without ``--policy``, every tick is decided with the policy it is stamped with; every stretch is
  exact and must be byte-identical.
- With ``--policy FILE``, a stretch recorded under that very document (the same hash: name, version
  and content) is exact: replayed with the recorded policies from the recorded run's state, compared
  byte for byte, stamps included. A stretch recorded under any other policy is a what-if: the file
  decides every tick (before the window too) and its decisions are compared without their stamps,
  so "0 decisions would change" means the file decides what was decided there (a rollback's new
  version of old content, say). A window with both is replayed twice, once each way, so neither
  verdict rests on state the other left; the mode is then ``mixed``.

Exit 1 when an exact stretch differs; a what-if's changes are its answer, not a failure (exit 0).
``--json`` adds ``stretches`` (each one's ticks, policy, mode, counts and verdict) and
``reproduced`` (every exact stretch byte-identical; null when no stretch was exact) to the totals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from rich.table import Table

from fleetloop import clock, term
from fleetloop.daemon.cli_common import UsageError, connection_from, door_from, quiet_client_logs
from fleetloop.daemon.observe.decode import Door, decode_batch
from fleetloop.daemon.replay.replay import (
    ReplayReport,
    UnknownPolicy,
    Window,
    group_ticks,
    replay_window,
    reproduced,
)
from fleetloop.kafka_security import Bootstrap, bootstrap_arg, connect, error_text, shown
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
from fleetloop.topic_layout import TopicLayoutError, TopicMissingError, require_topics

WINDOW_HELP = (
    "TIME (epoch ms, ISO-8601 with a zone, 'beginning', 'end'), or TOPIC:PARTITION:OFFSET "
    "(repeatable; fleet.telemetry, fleet.requests or control.decisions), or group:NAME (a consumer "
    "group's committed offsets on the input topics)"
)
OFFSET_TOPICS = (TELEMETRY, REQUESTS, DECISIONS)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="recompute recorded decisions from recorded inputs, or a what-if",
        description="Replay the recorded ticks of a window and compare with the decision log. "
        "A window end is " + WINDOW_HELP + ". --from TOPIC:P:O compares the ticks of partition P "
        "that folded record O and later; --to TOPIC:P:O stops each partition's ticks after the last "
        "that folded nothing beyond record O; --to group:fleetloop replays up to what the daemon "
        "group committed. A reversed or empty window is an error (exit 2).",
    )
    bootstrap_arg(p, required=True)
    p.add_argument(
        "--from",
        dest="from_",
        action="append",
        metavar="WHEN",
        help="compare ticks from here (default beginning): " + WINDOW_HELP,
    )
    p.add_argument(
        "--to", action="append", metavar="WHEN", help="stop after ticks here (default end): " + WINDOW_HELP
    )
    p.add_argument(
        "--policy",
        metavar="FILE",
        help="judge the window against this document: stretches recorded under it (the same hash) are "
        "replayed exactly, the others are a what-if decided by it",
    )
    p.add_argument(
        "--event-time-window",
        default="600,30",
        metavar="PAST_S,FUTURE_S",
        help="the daemon's door: inputs whose event time lies outside this window around their "
        "broker timestamp are not folded, as the daemon dead-lettered them (default 600,30, as "
        "fleetloop run; 'off' folds every record)",
    )
    p.add_argument(
        "--max-record-bytes",
        type=int,
        default=Door().max_record_bytes,
        metavar="N",
        help=f"the daemon's record size bound (default {Door().max_record_bytes}, as fleetloop run)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout; no progress lines")
    p.set_defaults(handler=cmd_replay)


@dataclass(slots=True)
class End:
    """One end of the window as given: a time, and/or offsets and groups (resolved on the broker)."""

    text: str
    time_ms: int | None = None
    offsets: dict[str, int] = field(default_factory=dict)  # 'logical:partition' -> offset
    groups: list[str] = field(default_factory=list)


_OFFSET = re.compile(r"^(?P<topic>[^:]+):(?P<partition>-?\d+):(?P<offset>-?\d+)$")


def _looks_like_time(text: str) -> bool:
    if text in ("beginning", "end") or text.isdigit():
        return True
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def parse_end(values: list[str] | str | None, side: str, prefix: str) -> End:
    """Read ``--from``/``--to`` values: one time, or any number of offsets and ``group:NAME``."""
    if values is None:
        values = []
    elif isinstance(values, str):  # FLEETLOOP_FROM from the environment
        values = [v for v in values.split(",") if v]
    end = End(" ".join(values) or ("beginning" if side == "from" else "end"))
    times = 0
    for raw in values:
        text = raw.strip()
        if text.startswith("group:"):
            name = text[len("group:") :]
            if not name:
                raise UsageError(f"fleetloop replay: --{side} {raw!r}: group:NAME needs a group name")
            end.groups.append(name)
            continue
        m = None if _looks_like_time(text) else _OFFSET.match(text)
        if m is None:
            if not _looks_like_time(text):
                raise UsageError(
                    f"fleetloop replay: --{side} {raw!r}: not a time, TOPIC:PARTITION:OFFSET or group:NAME"
                )
            times += 1
            end.time_ms = parse_time(text, default=None)
            continue
        topic = m["topic"]
        if prefix and topic.startswith(prefix + "."):
            topic = topic[len(prefix) + 1 :]
        if topic not in OFFSET_TOPICS:
            raise UsageError(
                f"fleetloop replay: --{side} {raw!r}: offsets name "
                f"{', '.join(OFFSET_TOPICS)}, not {m['topic']!r}"
            )
        partition, offset = int(m["partition"]), int(m["offset"])
        if partition < 0 or offset < 0:
            raise UsageError(f"fleetloop replay: --{side} {raw!r}: partition and offset must be >= 0")
        key = f"{topic}:{partition}"
        if key in end.offsets:
            raise UsageError(f"fleetloop replay: --{side} names {key} twice")
        end.offsets[key] = offset
    if times > 1 or (times and (end.offsets or end.groups)):
        raise UsageError(
            f"fleetloop replay: --{side}: give one time, or offsets and groups, not both ({end.text})"
        )
    return end


def window_of(start: End, stop: End, committed: dict[str, dict[str, int]]) -> Window:
    """The replay window of two resolved ends; ``committed``: group -> 'logical:p' -> next offset."""
    from_cuts = {k: v for k, v in start.offsets.items() if not k.startswith(DECISIONS)}
    to_cuts = {k: v for k, v in stop.offsets.items() if not k.startswith(DECISIONS)}
    for g in start.groups:  # from the first record the group has not taken yet
        for k, nxt in committed[g].items():
            from_cuts[k] = max(from_cuts.get(k, 0), nxt)
    for g in stop.groups:  # up to the last record the group has taken
        for k, nxt in committed[g].items():
            to_cuts[k] = min(to_cuts.get(k, nxt - 1), nxt - 1)
    log_from = [v for k, v in start.offsets.items() if k.startswith(DECISIONS)]
    log_to = [v for k, v in stop.offsets.items() if k.startswith(DECISIONS)]
    window = Window(
        from_ms=start.time_ms or 0,
        to_ms=stop.time_ms,
        from_cuts=from_cuts,
        to_cuts=to_cuts,
        from_log=max(log_from) if log_from else None,
        to_log=min(log_to) if log_to else None,
    )
    why = window.reversed_()
    if why is not None:
        raise UsageError(f"fleetloop replay: --from {start.text} / --to {stop.text}: an empty window ({why})")
    return window


class Progress:
    """A line on stderr every ``every_s`` seconds, once the work has taken that long (quiet runs
    print nothing); off entirely with ``--json``."""

    def __init__(self, enabled: bool, every_s: float = 2.0) -> None:
        self.enabled = enabled
        self.every_s = every_s
        self._start = clock.monotonic_s()
        self._last = self._start

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        now = clock.monotonic_s()
        if now - self._last >= self.every_s:
            self._last = now
            sys.stderr.write(f"fleetloop replay: {text} ({now - self._start:.0f} s)\n")
            sys.stderr.flush()

    def ticks(self, done: int, total: int) -> None:
        self(f"{done:,} of {total:,} ticks replayed ({100 * done / max(total, 1):.0f}%)")


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
    start = parse_end(args.from_, "from", args.topic_prefix)
    stop = parse_end(args.to, "to", args.topic_prefix)
    window_of(start, stop, {g: {} for g in (*start.groups, *stop.groups)})  # reversed times: no broker
    args.door = door_from(args.event_time_window, args.max_record_bytes, verb="replay")
    what_if = load_policy(args.policy) if args.policy else None
    progress = Progress(enabled=not args.json)
    report, policy, mode = asyncio.run(_replay(args, what_if, start, stop, progress))
    if report.ticks_compared == 0:
        raise UsageError(
            f"fleetloop replay: no recorded tick between --from {start.text} and --to {stop.text} "
            f"({report.ticks_replayed} ticks replayed before it): nothing to compare"
        )
    if args.json:
        sys.stdout.write(json.dumps(_as_json(report, policy, mode)) + "\n")
    else:
        _print(report, policy, mode, args.policy)
    return 1 if reproduced(report) is False else 0


async def read_topic(
    bootstrap: Bootstrap,
    prefix: str,
    logical: str,
    progress: Callable[[str], None] | None = None,
    *,
    verb: str = "replay",
    optional: bool = False,
) -> dict[int, list[Any]]:
    """Every record of the registry topic ``logical`` under ``prefix`` up to its end offsets now, by
    partition, in offset order.

    Checked first, creating nothing (reading or describing it by name would make an auto-creating
    broker create it: see :mod:`fleetloop.topic_layout`): a missing topic is a UsageError
    ("fleetloop VERB: topic ... does not exist"; with ``optional``, no records), and so is one with
    a partition count other than fleetloop's (a one-partition topic with more was not written by
    fleetloop, and the records past partition 0 are not the ones it decided on).
    """
    topic = topic_name(prefix, logical)
    try:
        counts = await require_topics(bootstrap, prefix, [logical], where=f" at {shown(bootstrap)}")
    except TopicMissingError as exc:
        if optional:
            return {}
        raise UsageError(f"fleetloop {verb}: {exc}") from None
    except TopicLayoutError as exc:
        raise UsageError(f"fleetloop {verb}: {exc}") from None
    partitions = range(counts[topic])
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
            if progress is not None:
                got = sum(len(v) for v in out.values())
                progress(f"reading {topic}: {got:,} of about {sum(end.values()):,} records")
            batch = await consumer.getmany(timeout_ms=500)
        return out
    finally:
        await consumer.stop()


async def _committed(bootstrap: Bootstrap, prefix: str, group: str) -> dict[str, int]:
    """A consumer group's committed offsets on the input topics: 'logical:partition' -> next offset."""
    physical = {topic_name(prefix, logical): logical for logical in (TELEMETRY, REQUESTS)}
    try:  # checked creating nothing, as read_topic does
        counts = await require_topics(
            bootstrap, prefix, [REQUESTS, TELEMETRY], where=f" at {shown(bootstrap)}"
        )
    except TopicLayoutError as exc:
        raise UsageError(f"fleetloop replay: {exc}") from None
    tps = [TopicPartition(t, p) for t in sorted(physical) for p in range(counts[t])]
    # The group's committed offsets, asked as a member would (OffsetFetch, without joining it).
    consumer = AIOKafkaConsumer(**connect(bootstrap), group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        out: dict[str, int] = {}
        for tp in sorted(tps):
            committed = await consumer.committed(tp)
            if committed is not None and committed >= 0:
                out[f"{physical[tp.topic]}:{tp.partition}"] = committed
    finally:
        await consumer.stop()
    if not out:
        raise UsageError(
            f"fleetloop replay: group:{group} has no committed offsets on "
            f"{', '.join(sorted(physical))} at {shown(bootstrap)}"
        )
    return out


async def _replay(
    args: argparse.Namespace,
    what_if: CompiledPolicy | None,
    start: End,
    stop: End,
    progress: Progress,
) -> tuple[ReplayReport, CompiledPolicy | None, str]:
    return await replay_topics(
        connection_from(args),
        args.topic_prefix,
        args.door,
        what_if=what_if,
        start=start,
        stop=stop,
        progress=progress,
    )


async def replay_topics(
    bootstrap: Bootstrap,
    prefix: str,
    door: Door,
    *,
    what_if: CompiledPolicy | None = None,
    start: End | None = None,
    stop: End | None = None,
    progress: Progress | None = None,
) -> tuple[ReplayReport, CompiledPolicy | None, str]:
    """Read the recorded topics under ``prefix`` and replay the window (the whole log by default):
    (report, ``what_if``, mode: "exact", "what-if" or "mixed"; see
    :func:`~fleetloop.daemon.replay.replay.replay_window`)."""
    start = start or End("beginning")
    stop = stop or End("end")
    progress = progress or Progress(enabled=False)
    try:
        committed = {g: await _committed(bootstrap, prefix, g) for g in (*start.groups, *stop.groups)}
        window = window_of(start, stop, committed)
        decided = await read_topic(bootstrap, prefix, DECISIONS, progress)
        raw_inputs = {
            logical: await read_topic(bootstrap, prefix, logical, progress)
            for logical in (TELEMETRY, REQUESTS)
        }
        policies = await read_topic(bootstrap, prefix, POLICY)
        # Written by daemons since policy lifecycle; older deployments lack it.
        actives = await read_topic(bootstrap, prefix, POLICY_ACTIVE, optional=True)
    except UsageError:
        raise
    except Exception as exc:  # one line for the user, whatever the client raised
        raise UsageError(
            f"fleetloop replay: cannot read from {shown(bootstrap)}: {error_text(exc)}"
        ) from None
    log = [
        (r.offset, Decision.model_validate_json(r.value)) for rs in decided.values() for r in rs if r.value
    ]
    ticks = group_ticks([d for _, d in log], [off for off, _ in log])
    if not ticks:
        raise UsageError(f"fleetloop replay: no recorded decisions on {topic_name(prefix, DECISIONS)}")
    inputs: dict[str, list[tuple[int, NodeTelemetry | RequestOutcome | None]]] = {}
    models: dict[str, type[NodeTelemetry] | type[RequestOutcome]] = {
        TELEMETRY: NodeTelemetry,
        REQUESTS: RequestOutcome,
    }
    for logical, parts in raw_inputs.items():
        for partition, records in parts.items():
            # The daemon's door: what it dead-lettered (malformed, too large, event time outside the
            # window around the broker timestamp) never reached its model, so it is not folded here.
            # A refused record keeps its offset (item None), as in the daemon's shard: a cut past it
            # reads the same input offsets.
            decoded = decode_batch(models[logical], records, door)
            good: dict[int, NodeTelemetry | RequestOutcome] = dict(
                zip(decoded.offsets, decoded.items, strict=True)
            )
            inputs[f"{logical}:{partition}"] = [(r.offset, good.get(r.offset)) for r in records]
    for key in sorted(set(window.from_cuts) | set(window.to_cuts)):
        if key not in inputs:
            raise UsageError(f"fleetloop replay: {key} is not a partition of the recorded inputs")
    known = _known_policies([r for rs in (*policies.values(), *actives.values()) for r in rs])
    try:
        report, mode = replay_window(ticks, inputs, known, window, policy=what_if, on_progress=progress.ticks)
    except UnknownPolicy as exc:
        also = ", nor the --policy file" if what_if is not None else ""
        raise UsageError(
            f"fleetloop replay: the recorded policy (hash {exc.policy_hash}, tick {exc.tick_id}) "
            f"is neither built in nor on control.policy{also}; pass it with --policy FILE"
        ) from None
    return report, what_if, mode


def _known_policies(records: list[Any]) -> dict[str, CompiledPolicy]:
    """Every policy a recorded decision can be stamped with: built-in ones, control.policy's, and
    those a daemon activated (control.policy.active keeps their documents, also a ``run --policy``
    file's, after control.policy has compacted)."""
    candidates = [builtin_policy(name) for name in ("default", "none", "classic")]
    for r in records:
        try:
            # orjson, as the daemon decodes control.policy: its depth limit makes a hostile record
            # nested past it a ValueError (skipped), where json's recursion would end the replay.
            data = orjson.loads(r.value)
            docs = [a["document"] for a in data["history"]] if "history" in data else [data]
            candidates.extend(compile_policy(parse_document(d)) for d in docs)
        except (PolicyError, ValueError, KeyError, TypeError):
            continue
    return {c.stamp.hash: c for c in candidates}


def _stamp(policy: CompiledPolicy | None) -> dict[str, Any] | None:
    if policy is None:
        return None
    return {"name": policy.stamp.name, "version": policy.stamp.version, "hash": policy.stamp.hash}


def _as_json(r: ReplayReport, policy: CompiledPolicy | None, mode: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "policy": _stamp(policy),
        "reproduced": reproduced(r),
        "stretches": [s.as_json() for s in r.stretches.values()],
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
        "ticks_by_policy": dict(sorted(r.ticks_by_policy.items())),
    }


def verdict(r: ReplayReport, mode: str) -> str:
    """The headline: exact stretches byte-identical or not, what-if stretches' changes, or both."""
    exact = reproduced(r)
    changed = sum(s.changed for s in r.stretches.values() if s.mode == "what-if")
    would = f"{changed} decision{'s' if changed != 1 else ''} would change"
    if mode == "exact":
        return "byte-identical" if exact else "DIFFERENT"
    if mode == "what-if":
        return would
    return f"{'byte-identical' if exact else 'DIFFERENT'} where exact, {would} where what-if"


def _print(r: ReplayReport, policy: CompiledPolicy | None, mode: str, path: str | None) -> None:
    out = term.console()
    if not out.is_terminal:  # a pipe or a file: wide enough that a stretch's line is not cut
        out = term.console(width=140)
    given = f" with {path} ({policy.stamp.name} v{policy.stamp.version})" if policy and path else ""
    plain = verdict(r, mode)
    shown_verdict = plain.replace("byte-identical", "[green]byte-identical[/green]").replace(
        "DIFFERENT", "[red]DIFFERENT[/red]"
    )
    out.print(f"fleetloop replay ({mode}){given}: {shown_verdict}")
    for s in r.stretches.values():
        line = f"  {s.label}, {s.mode}: {s.verdict}"
        if s.mode == "exact" and s.changed:
            line += f" ({s.changed} of {s.decisions_compared} decisions)"
        elif s.mode == "what-if" and s.decisions_compared:
            line += f" of {s.decisions_compared}"
        out.print(line, highlight=False, markup=False)
    t = Table()
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
