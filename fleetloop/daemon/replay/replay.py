"""Replay: recompute recorded decisions from recorded inputs, exactly (pure; the I/O is in command.py).

Every published decision carries the tick and the cut it was computed from: the input offsets of
its shard (one partition index of the pool-keyed topics, :mod:`fleetloop.core.shard`). Replay
walks the recorded ticks in order with one shard per partition; before each, it folds that shard's
partitions up to the recorded offsets (never past them), then decides the tick with the policy
the decision is stamped with (so a window spanning a policy change follows it). With the recorded
policies the result must be the same bytes as the recorded decisions: a shard's state is a function
of its records and ticks only, so restarts, rebalances and how the daemon batched its reads leave
no trace. A tick recorded twice (republished after a crash between publish and commit) is the same
bytes twice and is replayed once. With another policy (``--policy``) the same cut points give a
what-if: what that policy would have decided, tick by tick, from exactly the same information.

The window (:class:`Window`) is given by event time, by input offsets per partition (a tick is in
it once its cut has passed the ``from`` offset, and until its cut passes the ``to`` offset), or by
the decision log's own offsets. Ticks before the window are replayed to rebuild the model and
policy state but not compared; ticks after it are not replayed.
Limits: replay starts its shards from the first record it is given; a daemon whose consumer group
started on topics that already held history (its first start, without a checkpoint) warmed up from
``warmup_records`` of it, so its first ticks can differ from a replay from the beginning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from fleetloop.core.shard import Row, Shard
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.policies.registry import CompiledPolicy
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.schemas.topics import REQUESTS, TELEMETRY


@dataclass(frozen=True, slots=True)
class RecordedTick:
    """One tick of the decision log: its tick, input offsets, and the decisions published."""

    tick: Tick
    input_offsets: Mapping[str, int]
    policy_hash: str
    decisions: tuple[Decision, ...]
    log_offset: int = -1  # the offset of its first decision on control.decisions (-1: unknown)


@dataclass(frozen=True, slots=True)
class Window:
    """Which recorded ticks are compared. ``from_cuts`` / ``to_cuts``: 'logical-topic:partition' ->
    a record's offset; a tick of that partition is compared once it has folded the ``from`` record
    (its cut, the next offset not folded, is above it) and replayed while it has folded nothing
    after the ``to`` record (its cut is at most that offset + 1). ``from_log`` / ``to_log``:
    control.decisions offsets of a tick's first decision, inclusive."""

    from_ms: int = 0
    to_ms: int | None = None
    from_cuts: Mapping[str, int] = field(default_factory=dict)
    to_cuts: Mapping[str, int] = field(default_factory=dict)
    from_log: int | None = None
    to_log: int | None = None

    def before(self, rt: RecordedTick) -> bool:
        if rt.tick.ts_ms < self.from_ms:
            return True
        if any(k in rt.input_offsets and rt.input_offsets[k] <= v for k, v in self.from_cuts.items()):
            return True
        return self.from_log is not None and rt.log_offset < self.from_log

    def after(self, rt: RecordedTick) -> bool:
        if self.to_ms is not None and rt.tick.ts_ms > self.to_ms:
            return True
        if any(k in rt.input_offsets and rt.input_offsets[k] > v + 1 for k, v in self.to_cuts.items()):
            return True
        return self.to_log is not None and rt.log_offset > self.to_log

    def reversed_(self) -> str | None:
        """Why no tick can be in the window, when its bounds already say so; else None."""
        if self.to_ms is not None and self.to_ms < self.from_ms:
            return "from is after to"
        for k in sorted(set(self.from_cuts) & set(self.to_cuts)):
            if self.to_cuts[k] < self.from_cuts[k]:
                return f"{k}: from offset {self.from_cuts[k]} is after to offset {self.to_cuts[k]}"
        if self.from_log is not None and self.to_log is not None and self.to_log < self.from_log:
            return f"control.decisions: from offset {self.from_log} is after to offset {self.to_log}"
        return None


@dataclass(slots=True)
class ReplayReport:
    ticks_replayed: int = 0
    ticks_compared: int = 0
    decisions_compared: int = 0
    identical: int = 0
    different: int = 0
    missing: int = 0  # recorded but not produced
    extra: int = 0  # produced but not recorded
    changed_by_kind: dict[str, int] = field(default_factory=dict)
    first_difference: dict[str, str] | None = None
    breaker_opens_recorded: int = 0
    breaker_opens_replayed: int = 0
    ticks_by_policy: dict[str, int] = field(default_factory=dict)  # compared ticks per recorded hash
    # The compared ticks per recorded policy hash, in the order their first tick was compared.
    stretches: dict[str, Stretch] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return self.different == 0 and self.missing == 0 and self.extra == 0


@dataclass(slots=True)
class Stretch:
    """The compared ticks recorded under one policy (by hash): which ticks, how they were judged
    (``exact``: replayed with that very policy and compared byte for byte, stamps included;
    ``what-if``: decided by another policy and compared without stamps) and what came out."""

    name: str
    version: int
    hash: str
    mode: str
    first_tick: int
    last_tick: int
    ticks: int = 0
    decisions_compared: int = 0
    identical: int = 0
    different: int = 0
    missing: int = 0
    extra: int = 0

    @property
    def changed(self) -> int:
        return self.different + self.missing + self.extra

    @property
    def verdict(self) -> str:
        """``byte-identical`` or ``DIFFERENT`` (exact), ``N decisions would change`` (what-if)."""
        if self.mode == "exact":
            return "byte-identical" if self.changed == 0 else "DIFFERENT"
        return f"{self.changed} decision{'s' if self.changed != 1 else ''} would change"

    @property
    def label(self) -> str:
        stamp = (self.name, self.version, self.hash)
        return stretch_label(stamp, self.first_tick, self.last_tick, self.ticks)

    def as_json(self) -> dict[str, Any]:
        return {
            "from_tick": self.first_tick,
            "to_tick": self.last_tick,
            "ticks": self.ticks,
            "policy": {"name": self.name, "version": self.version, "hash": self.hash},
            "mode": self.mode,
            "decisions_compared": self.decisions_compared,
            "identical": self.identical,
            "different": self.different,
            "missing": self.missing,
            "extra": self.extra,
            "verdict": self.verdict,
        }


def stretch_label(stamp: tuple[str, int, str], first: int, last: int, ticks: int) -> str:
    """How replay and policy compare name a stretch (``stamp``: name, version, hash):
    ``ticks A-B: NAME vN (HASH), K ticks``."""
    name, version, hash_ = stamp
    return f"ticks {first}-{last}: {name} v{version} ({hash_}), {ticks} tick{'s' if ticks != 1 else ''}"


def group_ticks(decisions: Sequence[Decision], offsets: Sequence[int] | None = None) -> list[RecordedTick]:
    """Group a decision log (in log order) into ticks, keyed by (tick id, pool, offsets);
    ``offsets``: each decision's offset on control.decisions, when known."""
    groups: dict[tuple[int, str, tuple[tuple[str, int], ...]], list[Decision]] = {}
    order: list[tuple[int, str, tuple[tuple[str, int], ...]]] = []
    first_at: dict[tuple[int, str, tuple[tuple[str, int], ...]], int] = {}
    for i, d in enumerate(decisions):
        pool = getattr(d.body, "pool_id", "")
        key = (d.tick_id, pool, tuple(sorted(d.input_offsets.items())))
        if key not in groups:
            groups[key] = []
            order.append(key)
            first_at[key] = offsets[i] if offsets is not None else -1
        groups[key].append(d)
    out = []
    for key in order:
        ds = groups[key]
        first = ds[0]
        out.append(
            RecordedTick(
                tick=Tick(ts_ms=first.ts_ms, tick_id=first.tick_id, pool_id=key[1]),
                input_offsets=dict(key[2]),
                policy_hash=first.policy.hash,
                decisions=tuple(ds),
                log_offset=first_at[key],
            )
        )
    return out


def _is_open(d: Decision) -> bool:
    b = d.body
    return (
        b.kind == "breaker"
        and b.state == "open"
        and b.enforced
        and b.reason in ("consecutive-failures", "probe-failed")
    )


def _partition_of(offsets: Mapping[str, int]) -> int:
    parts = {int(k.rsplit(":", 1)[1]) for k in offsets if logical_inputs(k)}
    return parts.pop() if len(parts) == 1 else -1


def replay_ticks(
    ticks: Sequence[RecordedTick],
    inputs: Mapping[str, Sequence[tuple[int, NodeTelemetry | RequestOutcome | None]]],
    policy: CompiledPolicy | Mapping[str, CompiledPolicy],
    *,
    from_ms: int = 0,
    to_ms: int | None = None,
    compare_stamps: bool = True,
    window: Window | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    judged: Callable[[RecordedTick], bool] | None = None,
) -> ReplayReport:
    """Replay ``ticks`` over ``inputs`` ('logical-topic:partition' -> [(offset, record)] in offset
    order; record None: refused at the door, its offset passed but nothing folded, as in the daemon).

    ``policy``: one policy for every tick (a what-if), or the recorded policies by hash (each tick
    is decided with the policy its decisions are stamped with). ``compare_stamps=False`` (a
    what-if) compares decisions without their policy stamp (name, version, hash, mode): a candidate
    that only bumps the version then changes nothing, instead of every decision. ``window``
    (default: ``from_ms``..``to_ms``) picks the ticks compared, and ``judged`` (default: every
    one) those of them this replay compares (the others are replayed for the state they leave and
    not counted); ``on_progress(done, total)`` is called every few hundred ticks. The compared
    ticks are tallied per recorded policy as well (``stretches``), judged ``exact`` when stamps are
    compared and ``what-if`` when not."""
    if window is None:
        window = Window(from_ms=from_ms, to_ms=to_ms)
    as_bytes = decision_bytes if compare_stamps else unstamped_bytes
    mode = "exact" if compare_stamps else "what-if"
    shards: dict[int, Shard] = {}
    report = ReplayReport()
    seen: set[tuple[int, str, tuple[tuple[str, int], ...]]] = set()
    cursors: dict[str, int] = {}
    for n, rt in enumerate(ticks):
        if on_progress is not None and n % 256 == 0:
            on_progress(n, len(ticks))
        if window.after(rt):
            continue  # its shard's later ticks are after it too; other shards go on
        key = (rt.tick.tick_id, rt.tick.pool_id, tuple(sorted(rt.input_offsets.items())))
        if key in seen:
            continue
        seen.add(key)
        p = _partition_of(rt.input_offsets)
        shard = shards.get(p)
        if shard is None:
            shard = shards[p] = Shard(p)
        cut = _fold_to_cut(shard, rt.input_offsets, inputs, cursors)
        produced = shard.decide(rt.tick, cut, _policy_of(rt, policy)) or ()
        report.ticks_replayed += 1
        if window.before(rt) or (judged is not None and not judged(rt)):
            continue
        _compare_tick(report, rt, produced, as_bytes=as_bytes, mode=mode)
    return report


def _fold_to_cut(
    shard: Shard,
    input_offsets: Mapping[str, int],
    inputs: Mapping[str, Sequence[tuple[int, NodeTelemetry | RequestOutcome | None]]],
    cursors: dict[str, int],
) -> dict[str, int]:
    """Fold into ``shard`` each partition's records from its cursor up to the tick's recorded offset
    (never past it), moving the cursors; the tick's cut by logical topic."""
    cut: dict[str, int] = {}
    for part, upto in sorted(input_offsets.items()):
        logical = part.rsplit(":", 1)[0]
        records = inputs.get(part, ())
        i = j = cursors.get(part, 0)
        while j < len(records) and records[j][0] < upto:
            j += 1
        shard.add(logical, (Row(off, 0, rec) for off, rec in records[i:j]))
        cursors[part] = j
        cut[logical] = upto
    return cut


def _policy_of(rt: RecordedTick, policy: CompiledPolicy | Mapping[str, CompiledPolicy]) -> CompiledPolicy:
    """The policy that decides ``rt``: the one given, or the one its decisions are stamped with
    (KeyError when that one is not among those given)."""
    chosen = policy if isinstance(policy, CompiledPolicy) else policy.get(rt.policy_hash)
    if chosen is None:
        raise KeyError(rt.policy_hash)
    return chosen


def _stretch_of(report: ReplayReport, rt: RecordedTick, mode: str) -> Stretch:
    """The stretch of ``rt``'s recorded policy, opened at its first compared tick, with ``rt`` counted."""
    stretch = report.stretches.get(rt.policy_hash)
    if stretch is None:
        stamp = rt.decisions[0].policy
        stretch = report.stretches[rt.policy_hash] = Stretch(
            stamp.name, stamp.version, stamp.hash, mode, rt.tick.tick_id, rt.tick.tick_id
        )
    stretch.ticks += 1
    stretch.first_tick = min(stretch.first_tick, rt.tick.tick_id)
    stretch.last_tick = max(stretch.last_tick, rt.tick.tick_id)
    return stretch


def _compare_tick(
    report: ReplayReport,
    rt: RecordedTick,
    produced_ds: Sequence[Decision],
    *,
    as_bytes: Callable[[Decision], bytes],
    mode: str,
) -> None:
    """Judge one compared tick: its decisions as recorded against those replayed, key by key, tallied
    in ``report`` and in its policy's stretch (the first difference kept)."""
    report.ticks_compared += 1
    report.ticks_by_policy[rt.policy_hash] = report.ticks_by_policy.get(rt.policy_hash, 0) + 1
    stretch = _stretch_of(report, rt, mode)
    recorded = {d.key: as_bytes(d) for d in rt.decisions}
    produced = {d.key: as_bytes(d) for d in produced_ds}
    report.breaker_opens_recorded += sum(1 for d in recorded_unique(rt.decisions) if _is_open(d))
    report.breaker_opens_replayed += sum(1 for d in produced_ds if _is_open(d))
    for k in sorted(set(recorded) | set(produced)):
        kind = k.split("/", 1)[0]
        stretch.decisions_compared += 1
        if k not in produced:
            report.missing += 1
            stretch.missing += 1
        elif k not in recorded:
            report.extra += 1
            stretch.extra += 1
        elif recorded[k] == produced[k]:
            report.identical += 1
            stretch.identical += 1
            report.decisions_compared += 1
            continue
        else:
            report.different += 1
            stretch.different += 1
        report.decisions_compared += 1
        report.changed_by_kind[kind] = report.changed_by_kind.get(kind, 0) + 1
        if report.first_difference is None:
            report.first_difference = {
                "tick_id": str(rt.tick.tick_id),
                "key": k,
                "recorded": recorded.get(k, b"").decode(),
                "replayed": produced.get(k, b"").decode(),
            }


class UnknownPolicy(LookupError):
    """A tick to replay exactly whose recorded policy is not among those given."""

    def __init__(self, rt: RecordedTick) -> None:
        super().__init__(rt.policy_hash)
        self.policy_hash = rt.policy_hash
        self.tick_id = rt.tick.tick_id


def replay_window(
    ticks: Sequence[RecordedTick],
    inputs: Mapping[str, Sequence[tuple[int, NodeTelemetry | RequestOutcome | None]]],
    known: Mapping[str, CompiledPolicy],
    window: Window,
    *,
    policy: CompiledPolicy | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[ReplayReport, str]:
    """Replay the window and judge each stretch of compared ticks by the policy it was recorded
    under: (report, mode), mode ``exact``, ``what-if`` or ``mixed``.

    Without ``policy``, every tick is decided with the policy it is stamped with (``known``: hash
    -> policy) and every stretch is exact. With ``policy`` (``fleetloop replay --policy FILE``),
    a stretch recorded under that very document (the same hash) is exact and one recorded under
    another is a what-if, whatever the first tick of the log or of the window was:

    - exact stretches: the ticks are decided with the recorded policies (``policy`` among them),
      from the state the recorded run had, and compared byte for byte, stamps included: any
      difference is a fault of the replay or the record;
    - what-if stretches: every tick (before the window too) is decided with ``policy``, the state
      its own decisions leave, and compared without stamps: what would have changed had it been
      in force throughout.

    A window with both kinds is replayed twice, once each way, so neither verdict rests on state
    the other kind of decision left. Raises :class:`UnknownPolicy` for a tick that must be
    replayed exactly and whose policy is not known."""
    live = [rt for rt in ticks if not window.after(rt)]
    compared = [rt for rt in live if not window.before(rt)]
    if policy is None:
        for rt in live:
            if rt.policy_hash not in known:
                raise UnknownPolicy(rt)
        return replay_ticks(ticks, inputs, known, window=window, on_progress=on_progress), "exact"
    mine = policy.stamp.hash
    reports: list[ReplayReport] = []
    if any(rt.policy_hash == mine for rt in compared):
        exact_ids = {id(rt) for rt in compared if rt.policy_hash == mine}
        last = max(i for i, rt in enumerate(ticks) if id(rt) in exact_ids)
        head = ticks[: last + 1]
        recorded = {**known, mine: policy}
        for rt in head:
            if rt.policy_hash not in recorded and not window.after(rt):
                raise UnknownPolicy(rt)
        reports.append(
            replay_ticks(
                head,
                inputs,
                recorded,
                window=window,
                on_progress=on_progress,
                judged=lambda rt: rt.policy_hash == mine,
            )
        )
    if any(rt.policy_hash != mine for rt in compared) or not reports:
        reports.append(
            replay_ticks(
                ticks,
                inputs,
                policy,
                compare_stamps=False,
                window=window,
                on_progress=on_progress,
                judged=lambda rt: rt.policy_hash != mine,
            )
        )
    report = merged(reports)
    modes = {s.mode for s in report.stretches.values()}
    mode = "mixed" if len(modes) > 1 else modes.pop() if modes else "what-if"
    return report, mode


def merged(reports: Sequence[ReplayReport]) -> ReplayReport:
    """One report of replays that compared disjoint ticks of one window (the first difference of
    the first report that has one; stretches in the order of their first tick)."""
    out = ReplayReport()
    for r in reports:
        out.ticks_replayed = max(out.ticks_replayed, r.ticks_replayed)
        out.ticks_compared += r.ticks_compared
        out.decisions_compared += r.decisions_compared
        out.identical += r.identical
        out.different += r.different
        out.missing += r.missing
        out.extra += r.extra
        out.breaker_opens_recorded += r.breaker_opens_recorded
        out.breaker_opens_replayed += r.breaker_opens_replayed
        for kind, n in r.changed_by_kind.items():
            out.changed_by_kind[kind] = out.changed_by_kind.get(kind, 0) + n
        for h, n in r.ticks_by_policy.items():
            out.ticks_by_policy[h] = out.ticks_by_policy.get(h, 0) + n
        out.stretches.update(r.stretches)
        out.first_difference = out.first_difference or r.first_difference
    out.stretches = dict(sorted(out.stretches.items(), key=lambda kv: (kv[1].first_tick, kv[0])))
    return out


def reproduced(report: ReplayReport) -> bool | None:
    """Whether every exact stretch is byte-identical (None: no stretch was judged exact)."""
    exact = [s for s in report.stretches.values() if s.mode == "exact"]
    return all(s.changed == 0 for s in exact) if exact else None


def unstamped_bytes(decision: Decision) -> bytes:
    """A decision's bytes without its policy stamp: what it decided, not which policy said so."""
    return orjson.dumps(decision.model_dump(mode="json", exclude={"policy"}), option=orjson.OPT_SORT_KEYS)


def recorded_unique(decisions: Sequence[Decision]) -> list[Decision]:
    """One decision per key (a tick republished after a crash holds each decision twice)."""
    return list({d.key: d for d in decisions}.values())


def logical_inputs(partition_key: str) -> bool:
    return partition_key.split(":", 1)[0] in (TELEMETRY, REQUESTS)
