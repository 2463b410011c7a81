"""Change-only breaker records: which of a tick's breaker decisions a breaker publishes.

The rule (every breaker algorithm applies it through this module, so it is stated once here). A
node's breaker decision is emitted on a tick when

- its state is not ``closed`` (``open`` or ``half_open``): every tick, whatever changed, or
- its state fields (:data:`STATE_FIELDS`: ``state``, ``enforced``, ``probe_frac``, ``until_ms``,
  ``reason``, ``ejections``) differ from those of the last decision the pool's breaker emitted for
  it, or it has none (a node new to the pool, a breaker started fresh), or
- it is the node's keyframe tick: ``(tick_id + phase(node_id)) % KEYFRAME_TICKS == 0`` with
  ``phase(node_id) = crc32(node_id) % KEYFRAME_TICKS``, so about ``1 / KEYFRAME_TICKS`` of a pool's
  closed nodes are re-sent each tick, staggered, and every node at least once in any
  ``KEYFRAME_TICKS`` consecutive ticks, or
- its last record is ``KEYFRAME_TICKS`` or more ticks old (or from a later tick): only after ticks
  that were not decided (an outage past the catch-up, a tick that failed), so the newest record of a
  node in the pool is never ``KEYFRAME_TICKS`` ticks old on a tick that is decided.

Absent means "unchanged": a consumer keeps the newest breaker record per node (the router library,
:class:`fleetloop.router.state.DesiredState`, does; ``control.state`` is compacted by ``<kind>/<entity>``,
so it holds exactly that). A closed node's explanatory ``inputs`` (severity, failure streak) are
refreshed at least every ``KEYFRAME_TICKS`` ticks; its state fields are always current. Inside a tick,
the engine and the later sections (``ctx.breakers``, the ejection cap, routing's shaping) read an
absent node as closed; that is right because every node that is not closed is emitted every tick.
A breaker's memory of what it emitted is for this choice only, never read to decide: an ejection
published enforced is held to its end by the engine (``keep_held`` in
``fleetloop.core.decide.shaping``), from what the engine let out.

Why ``KEYFRAME_TICKS`` = 30 (30 s at the default 1 s tick). What a keyframe bounds is the age of the
newest record held for a closed node, nothing about its state (a state change is always emitted):

- a router or actuator that joins late reads ``control.state`` from its beginning; compaction keeps
  the newest record per ``breaker/node/<id>``, so its view equals a router's that was there all
  along, whatever K is (tested in ``tests/router/test_change_only.py``);
- a reader of recent records only (``control.decisions`` from a recent offset, the daemon's live
  page, ``bench latency``'s consumer, a router whose state was lost and that follows from "now")
  sees every node of the fleet within K ticks, and its oldest record of a live closed node is at
  most K - 1 ticks old: 30 s matches the routers' fail-static horizon (``--fail-static-s`` 30, after
  which a router stops trusting a pool's routing anyway) and the breakers' 30 s base ejection;
- a record lost downstream (a topic recreated, a consumer that skipped a range) is repaired within
  K ticks.

Against it, the cost: at K ticks a whole-fleet tick publishes ``nodes / K`` closed records beyond the
changes (about 333 at 10,000 nodes), at about 3 us each to decide and 5 us to serialize, ~2.7 ms a
tick; K = 10 would be ~8 ms, the full stream was ~80 ms. Pure: no I/O, no clock.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

from fleetloop.schemas.decisions import BreakerDecision

KEYFRAME_TICKS = 30
STATE_FIELDS: tuple[str, ...] = ("state", "enforced", "probe_frac", "until_ms", "reason", "ejections")

# The state fields of one decision, in STATE_FIELDS order.
Fields = tuple[str, bool, float, int | None, str, int]
# What a breaker remembers per node: the state fields of its last emitted record and that record's tick.
Emitted = tuple[Fields, int]

_PHASES: dict[str, int] = {}  # node id -> phase (a pure function of the id, kept)


def phase(node_id: str) -> int:
    """The node's keyframe phase: ``crc32(node_id) % KEYFRAME_TICKS`` (stable across processes)."""
    p = _PHASES.get(node_id)
    if p is None:
        if len(_PHASES) >= 1 << 20:
            _PHASES.clear()
        p = _PHASES[node_id] = zlib.crc32(node_id.encode()) % KEYFRAME_TICKS
    return p


def keyframe(node_id: str, tick_id: int) -> bool:
    """Whether ``tick_id`` is one of the node's keyframe ticks."""
    return (tick_id + phase(node_id)) % KEYFRAME_TICKS == 0


def keyframe_residue(tick_id: int) -> int:
    """The phase whose nodes are keyframed on ``tick_id``: ``keyframe(n, t)`` is
    ``phase(n) == keyframe_residue(t)``."""
    return -tick_id % KEYFRAME_TICKS


def fields_of(d: BreakerDecision) -> Fields:
    """A decision's state fields (what a change is judged on)."""
    return (d.state, d.enforced, d.probe_frac, d.until_ms, d.reason, d.ejections)


def emits(node_id: str, fields: Fields, before: Emitted | None, tick_id: int) -> bool:
    """The rule: emitted when not closed, when changed (or never emitted), on its keyframe, or when
    its last record is too old."""
    return (
        fields[0] != "closed"
        or before is None
        or fields != before[0]
        or keyframe(node_id, tick_id)
        or not 0 <= tick_id - before[1] < KEYFRAME_TICKS
    )


def change_only(
    decisions: Sequence[BreakerDecision], emitted: Mapping[str, Emitted], tick_id: int
) -> tuple[tuple[BreakerDecision, ...], dict[str, Emitted]]:
    """The decisions of one pool's tick that are emitted, and what to remember per node decided:
    an emitted decision's fields and this tick, else what was remembered (the fields are the same).
    A node not decided this tick (it left the pool) is forgotten: if it comes back, its first
    decision is emitted."""
    out: list[BreakerDecision] = []
    now: dict[str, Emitted] = {}
    for d in decisions:
        f = fields_of(d)
        node_id = d.node_id
        before = emitted.get(node_id)
        if before is None or emits(node_id, f, before, tick_id):
            out.append(d)
            now[node_id] = (f, tick_id)
        else:
            now[node_id] = before
    return tuple(out), now
