"""Replay: recompute recorded decisions from recorded inputs, exactly (pure; the I/O is in command.py).

Every published decision carries the tick and the input offsets it was computed from. Replay walks
the recorded ticks in order; before each, it folds every input partition up to the recorded offset
(never past it), then runs the engine on that tick. With the recorded policy the result must be
the same bytes as the recorded decisions: the model folds commutatively across partitions and in
offset order within one, and the engine is a pure function, so any difference is a bug or a
change in code. With another policy (``--policy``) the same cut points give a what-if: what that
policy would have decided, tick by tick, from exactly the same information.

Ticks before ``from_ms`` are replayed to rebuild the model and policy state but not compared.
Limits: replay starts its model from the first record it is given; a live daemon that started
later than that (or restarted and warmed up from fewer records) saw a shorter history, so the
first ticks after such a start can differ until windows and breaker backoffs have turned over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.daemon.decide.engine import Engine, envelope_of
from fleetloop.daemon.model.fleet import FleetModel, snapshot
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

    @property
    def exact(self) -> bool:
        return self.different == 0 and self.missing == 0 and self.extra == 0


def group_ticks(decisions: Sequence[Decision]) -> list[RecordedTick]:
    """Group a decision log (in log order) into ticks, keyed by (tick id, pool, offsets)."""
    groups: dict[tuple[int, str, tuple[tuple[str, int], ...]], list[Decision]] = {}
    order: list[tuple[int, str, tuple[tuple[str, int], ...]]] = []
    for d in decisions:
        pool = getattr(d.body, "pool_id", "")
        key = (d.tick_id, pool, tuple(sorted(d.input_offsets.items())))
        if key not in groups:
            groups[key] = []
            order.append(key)
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


def replay_ticks(
    ticks: Sequence[RecordedTick],
    inputs: Mapping[str, Sequence[tuple[int, NodeTelemetry | RequestOutcome]]],
    policy: CompiledPolicy,
    *,
    from_ms: int = 0,
    to_ms: int | None = None,
) -> ReplayReport:
    """Replay ``ticks`` over ``inputs`` ('logical-topic:partition' -> [(offset, record)] in offset order)."""
    model = FleetModel()
    engine = Engine(policy)
    env = envelope_of(policy)
    cursors = dict.fromkeys(inputs, 0)
    report = ReplayReport()
    for rt in ticks:
        if to_ms is not None and rt.tick.ts_ms > to_ms:
            break
        for part, upto in sorted(rt.input_offsets.items()):
            records = inputs.get(part, ())
            i = cursors.get(part, 0)
            while i < len(records) and records[i][0] < upto:
                rec = records[i][1]
                if isinstance(rec, NodeTelemetry):
                    model.fold_telemetry(rec)
                else:
                    model.fold_outcome(rec)
                i += 1
            cursors[part] = i
        snap = snapshot(model, rt.tick.ts_ms, window_ms=env.window_ms, stale_after_ms=env.stale_after_ms)
        result = engine.tick(snap, rt.tick, rt.input_offsets)
        report.ticks_replayed += 1
        if rt.tick.ts_ms < from_ms:
            continue
        report.ticks_compared += 1
        recorded = {d.key: decision_bytes(d) for d in rt.decisions}
        produced = {d.key: decision_bytes(d) for d in result.decisions}
        report.breaker_opens_recorded += sum(1 for d in rt.decisions if _is_open(d))
        report.breaker_opens_replayed += sum(1 for d in result.decisions if _is_open(d))
        for key in sorted(set(recorded) | set(produced)):
            kind = key.split("/", 1)[0]
            if key not in produced:
                report.missing += 1
            elif key not in recorded:
                report.extra += 1
            elif recorded[key] == produced[key]:
                report.identical += 1
                report.decisions_compared += 1
                continue
            else:
                report.different += 1
            report.decisions_compared += 1
            report.changed_by_kind[kind] = report.changed_by_kind.get(kind, 0) + 1
            if report.first_difference is None:
                report.first_difference = {
                    "tick_id": str(rt.tick.tick_id),
                    "key": key,
                    "recorded": recorded.get(key, b"").decode(),
                    "replayed": produced.get(key, b"").decode(),
                }
    return report


def logical_inputs(partition_key: str) -> bool:
    return partition_key.split(":", 1)[0] in (TELEMETRY, REQUESTS)
