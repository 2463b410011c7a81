"""A shard: the fleet model and policy state of one partition index of the pool-keyed topics.

Telemetry, request outcomes and ticks are keyed by pool on topics with the same partition count,
so partition ``p`` of each holds the same pools. The daemon keeps one :class:`Shard` per partition
index it owns and decides a pool's tick from its shard alone. That makes a decision a function of
one shard's records only, never of which other partitions the instance happens to own: two
instances decide exactly what one would, a partition that moves keeps its history (through a
checkpoint, :mod:`fleetloop.core.checkpoint`), and a partition an instance keeps across a
rebalance is not re-read.

The cut. A tick is decided from exactly the input records before its *cut* (one offset per input
topic of the shard). Records read but not yet cut stay pending, unfolded. The daemon's ticker writes
the cut into the tick record (header ``fleetloop.cut``): the longest prefix of the records it has
read whose broker timestamps are at or before the tick's boundary. A tick from elsewhere without a
cut gets the same rule from its own record timestamp, once the inputs show a record after it or
have been read to their end (documented limit: a record that reaches the broker later than the
tick it precedes can land in a different tick after a restart). So a decision depends on the
topics' contents, not on how they were fetched: the same ticks over the same records give the
same bytes in one batch or in a thousand, before or after a restart, in the daemon or in replay.

Shadow. A shadow policy (a document with ``spec.mode: shadow``) decides the same tick right after
the enforcing one, from the same folded records and the same snapshot inputs, with its own policy
state per pool (``shadow_states``). It reads the model and never writes it, and the enforcing
policy never sees its state, so the enforced decisions are the same bytes with or without a shadow.
It starts, on each pool, from the enforcing policy's state before the first tick it decides, as
``policy apply`` of the same document would: a section whose algorithm is the enforcing one's keeps
that state (open breakers and their backoff, autoscale holds), a swapped algorithm starts fresh
(:class:`~fleetloop.core.decide.engine.EngineState` is keyed by algorithm). So the shadow's
decisions differ from the enforced ones only by what the candidate changes, from its first tick: a
shadow started empty closed every breaker the enforcing policy held open and read as the
candidate's doing. A new shadow document (another hash) starts again from the enforced state.

No I/O and no clock here: the runtime feeds records and ticks in, publishes what comes out.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from fleetloop.core.checkpoint import CheckpointError
from fleetloop.core.decide.engine import EngineState, TickResult, decide, decide_many, envelope_of
from fleetloop.core.model.fleet import FleetModel, ModelConfig, snapshot
from fleetloop.policies.base import FleetSnapshot
from fleetloop.policies.registry import CompiledPolicy, compile_policy
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import Decision, PolicyStamp
from fleetloop.schemas.fast import Outcome, Telemetry
from fleetloop.schemas.policy import PolicyDocument
from fleetloop.schemas.topics import REQUESTS, TELEMETRY

INPUTS: tuple[str, ...] = (TELEMETRY, REQUESTS)
_TROUBLE = frozenset(("error", "timeout"))  # outcomes that are fresh evidence of a failing node
_EMPTY = EngineState()

Item = Telemetry | Outcome  # a wire model or its msgspec twin (fleetloop.schemas.fast)


@dataclass(frozen=True, slots=True)
class Shadow:
    """A shadow policy ready to run: ``policy`` as applied (its stamp goes on every decision, with
    mode ``shadow``), ``runner`` the same document compiled as if it enforced, so the shadow decides
    what it would decide in charge (a breaker it trips counts against its own ejection cap, its
    autoscale target is held like an enforced one) instead of only "detecting". It decides on the
    enforcing policy's ticks: its own ``tick_ms`` does not tick, it only reaches its algorithms
    (``PolicyContext.tick_ms``)."""

    policy: CompiledPolicy
    runner: CompiledPolicy
    stamp: PolicyStamp

    @classmethod
    def of(cls, policy: CompiledPolicy) -> Shadow:
        data = policy.document.model_dump(mode="json")
        data["spec"]["mode"] = "enforce"
        runner = compile_policy(PolicyDocument.model_validate(data))
        return cls(policy, runner, policy.stamp.model_copy(update={"mode": "shadow"}))


class Row(msgspec.Struct, gc=False):
    """One input record as the shard keeps it until a cut folds it (``item`` None: the door refused
    it and it was dead-lettered when read). ``key``/``value`` are the record's own bytes
    (references, not copies), kept so a record the model refuses at its cut can be dead-lettered
    as it arrived.

    A msgspec struct, one per input record: built in C (~0.1 µs against a slotted dataclass's
    ~0.3 µs), and not tracked by the cyclic collector (it refers to a record and bytes, which
    never refer back to it, so it is never part of a cycle)."""

    offset: int
    timestamp_ms: int
    item: Item | None
    key: bytes | None = None
    value: bytes | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """An input record the shard did not fold, and why: a cap of the model (``capacity-*``) or a
    fold that raised (``fold-error``). The runtime dead-letters it before the checkpoint or commit
    that covers its offset, so it is published once its cut is decided and never lost."""

    logical: str
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    reason: str


class Shard:
    """Model + policy state of partition ``partition``, with the offsets they reflect."""

    def __init__(self, partition: int, config: ModelConfig | None = None) -> None:
        self.partition = partition
        self.model = FleetModel(config)
        self.states: dict[str, EngineState] = {}  # per pool: a pool's tick touches only its own
        self.shadow_states: dict[str, EngineState] = {}  # the shadow policy's, per pool: never shared
        # Per pool, the hash of the shadow document whose state ``shadow_states`` holds ("": one
        # restored from a checkpoint that did not say, taken as the shadow in force).
        self.shadow_of: dict[str, str] = {}
        # Per pool, the enforced state before the tick just decided: where a shadow starts from.
        self._before: dict[str, EngineState] = {}
        self.folded: dict[str, int] = dict.fromkeys(INPUTS, 0)  # next input offset not folded
        self.ticks_at = 0  # next ticks offset not yet decided (or skipped)
        self.last_tick: dict[str, tuple[int, int]] = {}  # pool -> (tick id, ts_ms) decided or skipped
        self.pending: dict[str, deque[Row]] = {k: deque() for k in INPUTS}
        self.read: dict[str, int] = dict(self.folded)  # next input offset not yet read
        self.pending_pools: set[str] = set()
        # Per pool, how many pending records with a valid item it has: ``pending_pools`` after a fold
        # is its keys (the pools of the pending records) without a pass over every pending record,
        # which would cost O(backlog) at every cut: the further behind a shard, the slower it would
        # decide.
        self._pending_n: Counter[str] = Counter()
        self._snaps: dict[tuple[int, int, int, tuple[int, ...]], FleetSnapshot] = {}
        self.fold_errors = 0  # records whose folding raised: skipped, counted, dead-lettered
        # Records not folded (door, cap, fold error) since the runtime last took them; None: not kept
        # (replay, which only decides).
        self.refusals: list[Refusal] | None = None
        # Dead letters already published for this shard's records when the checkpoint was written:
        # offsets below ``lettered`` (per input and "ticks"), and ``dl_mark`` (the dead-letter
        # topic's end then; -1: unknown). A restore suppresses dead letters below these marks, and
        # those on the dead-letter topic from ``dl_mark`` on, so none is published twice.
        self.lettered: dict[str, int] = {}
        self.dl_mark = -1

    # -- input ----------------------------------------------------------------------------------

    def start_at(self, folded: Mapping[str, int], ticks_at: int) -> None:
        """Position a fresh shard (no checkpoint): its history starts at these offsets."""
        self.folded = {k: int(folded[k]) for k in INPUTS}
        self.read = dict(self.folded)
        self.ticks_at = ticks_at

    def add(self, logical: str, rows: Iterable[Row]) -> int:
        """Append records read from ``logical`` in offset order; returns how many were new."""
        queue = self.pending[logical]
        if isinstance(rows, list) and rows and rows[0].offset >= self.read[logical]:
            # The common case, a fresh batch past what was read: offsets ascend within it.
            queue.extend(rows)
            self.read[logical] = rows[-1].offset + 1
            ids = [row.item.pool_id for row in rows if row.item is not None]
            self.pending_pools.update(ids)
            self._pending_n.update(ids)
            return len(rows)
        n = 0
        for row in rows:
            if row.offset < self.read[logical]:
                continue  # already read (a re-fetch after a seek)
            queue.append(row)
            self.read[logical] = row.offset + 1
            if row.item is not None:
                self.pending_pools.add(row.item.pool_id)
                self._pending_n[row.item.pool_id] += 1
            n += 1
        return n

    def cut_by_time(self, ts_ms: int) -> dict[str, int]:
        """The longest prefix of read records with broker timestamps at or before ``ts_ms``."""
        cut: dict[str, int] = {}
        for logical in INPUTS:
            upto = self.folded[logical]
            for row in self.pending[logical]:
                if row.timestamp_ms > ts_ms:
                    break
                upto = row.offset + 1
            cut[logical] = upto
        return cut

    def seen_after(self, logical: str, ts_ms: int) -> bool:
        """True when a read record of ``logical`` has a broker timestamp after ``ts_ms`` (from the
        newest: such a record is most often among the last read)."""
        return any(row.timestamp_ms > ts_ms for row in reversed(self.pending[logical]))

    def troubled(self, cut: Mapping[str, int]) -> set[str]:
        """Pools with a failed call (error or timeout) among the records the tick at ``cut`` folds:
        the runtime decides their ticks before the other pools' of the same boundary. Reading
        only: what any pool decides does not depend on it."""
        upto = cut.get(REQUESTS, self.folded[REQUESTS])
        out: set[str] = set()
        for row in self.pending[REQUESTS]:
            if row.offset >= upto:
                break
            item = row.item
            if item is not None and item.outcome in _TROUBLE:  # type: ignore[union-attr]
                out.add(item.pool_id)
        return out

    def pools(self) -> list[str]:
        """Pools to tick: those the model holds and those with records waiting for a cut (a pool
        the model evicted or refused is not ticked again until a record of it arrives)."""
        return sorted(set(self.model.pools) | self.pending_pools)

    # -- ticks ----------------------------------------------------------------------------------

    def _fold_to(self, cut: Mapping[str, int]) -> None:
        model = self.model
        out = self.refusals
        moved = False
        for logical in INPUTS:
            upto = int(cut.get(logical, self.folded[logical]))
            queue = self.pending[logical]
            if queue and queue[0].offset < upto:
                moved = True
                if queue[-1].offset < upto:  # the whole queue (offsets ascend in it)
                    rows = list(queue)
                    queue.clear()
                else:
                    rows = []
                    popleft = queue.popleft
                    while queue and queue[0].offset < upto:
                        rows.append(popleft())
                # One batch fold per input topic: the same state and reasons as a fold per record
                # (FleetModel.fold_telemetries / fold_outcomes), at about half the cost.
                items = [row.item for row in rows]
                counts = self._pending_n
                for pool, k in Counter([item.pool_id for item in items if item is not None]).items():
                    left = counts[pool] - k
                    if left > 0:
                        counts[pool] = left
                    else:
                        del counts[pool]
                reasons = (
                    model.fold_telemetries(items)  # type: ignore[arg-type]
                    if logical == TELEMETRY
                    else model.fold_outcomes(items)  # type: ignore[arg-type]
                )
                for index, why in reasons:
                    if why.startswith("fold-error:"):
                        self.fold_errors += 1
                    if out is not None:
                        row = rows[index]
                        out.append(Refusal(logical, row.offset, row.timestamp_ms, row.key, row.value, why))
            # Never behind what was folded; never past what was read (a cut beyond the data).
            self.folded[logical] = max(self.folded[logical], min(upto, self.read[logical]))
        if moved:
            self._forget_gone()

    def fold_to(self, cut: Mapping[str, int]) -> None:
        """Fold every pending record before ``cut`` (as deciding a tick at ``cut`` does first)."""
        self._fold_to(cut)

    def step_toward(self, cut: Mapping[str, int], max_rows: int) -> dict[str, int] | None:
        """A cut on the way to ``cut`` whose fold takes at most ``max_rows`` pending records, in the
        order :meth:`_fold_to` folds them (every telemetry record before ``cut`` first, then the
        outcomes); None when folding to ``cut`` itself takes no more than ``max_rows``.

        Folding to each step in turn and then to ``cut`` leaves the shard as one fold to ``cut``:
        the same records, one batch fold per topic and step, in the same order (a batch fold is a
        fold per record, :func:`fleetloop.core.model.fleet.FleetModel.fold_telemetries`), and
        the bookkeeping after each fold drops only pools no later record of the cut brings back
        (a pool with a record still pending is kept). The daemon folds a far cut (a shard that
        skipped boundaries for overload, or caught up on minutes of records: 40 s of one 10k
        shard's records took 1.33 CPU-s) in such steps with a yield between them, so the loop, the
        group's heartbeat among its tasks, is never held for the whole fold."""
        left = max(1, max_rows)
        if sum(len(q) for q in self.pending.values()) <= left:
            return None  # everything pending fits in one step, whatever the cut
        step = dict(self.folded)
        for logical in INPUTS:
            upto = min(int(cut.get(logical, self.folded[logical])), self.read[logical])
            queue = self.pending[logical]
            if len(queue) > left and queue[left].offset < upto:
                step[logical] = queue[left].offset  # folds exactly the first ``left`` pending rows
                return step
            n = 0
            for row in queue:
                if row.offset >= upto:
                    break
                n += 1
            step[logical] = max(upto, self.folded[logical])
            left -= n
            if left <= 0 and any(
                (q := self.pending[k]) and q[0].offset < int(cut.get(k, self.folded[k]))
                for k in INPUTS[INPUTS.index(logical) + 1 :]
            ):
                return step
        return None

    def _forget_gone(self) -> None:
        """Keep per-pool bookkeeping (pools with records pending, last ticks, policy state) to the
        pools the model holds or has pending: a pool the model evicted or refused leaves it, so
        neither memory nor the ticker's work grows with every pool id ever seen."""
        pending = set(self._pending_n)  # the pools of the pending records, without a pass over them
        self.pending_pools = pending
        live = self.model.pools
        for pool in [p for p in self.last_tick if p not in live and p not in pending]:
            del self.last_tick[pool]
        for states in (self.states, self.shadow_states, self.shadow_of, self._before):
            for pool in [p for p in states if p not in live and p not in pending]:
                del states[pool]

    def fold_read(self) -> None:
        """Fold every record read so far, as the next tick's cut would (``fleetloop bench ingest``
        measures decode + fold without deciding)."""
        self._fold_to(self.read)

    def commit_offset(self, logical: str) -> int:
        """Where the consumer group may commit ``logical``: what was folded, or, in a shard that
        holds no pool and has no valid record pending, everything read (all of it door-refused and
        dead-lettered when read). Such a partition is never cut (no pool, no tick), so without this
        its garbage stayed uncommitted for good. Only the commit moves: ``folded``, and with it what
        decisions record and replay reproduce, still moves only at a cut."""
        if self.model.pools or self.pending_pools:
            return self.folded[logical]
        return self.read[logical]

    def input_offsets(self) -> dict[str, int]:
        return {f"{logical}:{self.partition}": self.folded[logical] for logical in INPUTS}

    def decide(
        self, tick: Tick, cut: Mapping[str, int], policy: CompiledPolicy
    ) -> tuple[Decision, ...] | None:
        """Fold up to ``cut`` and decide ``tick``. None for a tick already decided (a duplicate);
        an empty tuple when the shard has no data on the tick's pool."""
        last = self.last_tick.get(tick.pool_id)
        if last is not None and tick.tick_id <= last[0]:
            return None
        self._fold_to(cut)
        if tick.pool_id not in self.model.pools and tick.pool_id not in self.pending_pools:
            self.last_tick.pop(tick.pool_id, None)
            return ()  # a pool the model does not hold: nothing to decide, nothing to remember
        self.last_tick[tick.pool_id] = (tick.tick_id, tick.ts_ms)
        snap = self._snapshot(tick, policy)
        if tick.pool_id not in snap.pools:
            return ()
        state = self._before[tick.pool_id] = self.states.get(tick.pool_id, _EMPTY)
        result = decide(snap, policy, state, tick, self.input_offsets())
        self.states[tick.pool_id] = result.state
        return result.decisions

    def decide_many(
        self, ticks: Sequence[Tick], cut: Mapping[str, int], policy: CompiledPolicy
    ) -> list[tuple[Decision, ...] | Exception | None]:
        """:meth:`decide` for each of ``ticks`` in order, for ticks of one boundary (the same
        ``ts_ms``, ``tick_id`` and ``cut``, distinct pools): the same outcomes and the same shard
        afterwards, with the pools that have data decided in one :func:`decide_many`. A tick whose
        :meth:`decide` would raise gets its exception in its place (the others are decided; if the
        batch raises, its ticks are decided one by one to find it)."""
        out: list[tuple[Decision, ...] | Exception | None] = [None] * len(ticks)
        todo: list[int] = []
        folded = False
        for i, tick in enumerate(ticks):
            last = self.last_tick.get(tick.pool_id)
            if last is not None and tick.tick_id <= last[0]:
                continue  # a duplicate: None
            if not folded:
                self._fold_to(cut)  # the same cut for every tick: folding again would do nothing
                folded = True
            if tick.pool_id not in self.model.pools and tick.pool_id not in self.pending_pools:
                self.last_tick.pop(tick.pool_id, None)
                out[i] = ()
                continue
            self.last_tick[tick.pool_id] = (tick.tick_id, tick.ts_ms)
            todo.append(i)
        if not todo:
            return out
        try:
            snap = self._snapshot(ticks[todo[0]], policy)
        except Exception as exc:  # as each tick's decide would have raised
            for i in todo:
                out[i] = exc
            return out
        for i in todo:
            if ticks[i].pool_id not in snap.pools:
                out[i] = ()
        todo = [i for i in todo if ticks[i].pool_id in snap.pools]
        batch = [ticks[i] for i in todo]
        for t in batch:
            self._before[t.pool_id] = self.states.get(t.pool_id, _EMPTY)
        results = self._decide_batch(snap, policy, self.states, batch)
        for i, result in zip(todo, results, strict=True):
            if isinstance(result, Exception):
                out[i] = result
            else:
                self.states[ticks[i].pool_id] = result.state
                out[i] = result.decisions
        return out

    def _decide_batch(
        self,
        snap: FleetSnapshot,
        policy: CompiledPolicy,
        states: Mapping[str, EngineState],
        ticks: Sequence[Tick],
    ) -> list[TickResult | Exception]:
        """``decide`` of each tick from ``states`` (read only), in one :func:`decide_many`, or one by
        one when the batch raises: a tick that raises costs only itself."""
        offsets = self.input_offsets()
        try:
            return list(
                decide_many(snap, policy, [states.get(t.pool_id, _EMPTY) for t in ticks], ticks, offsets)
            )
        except Exception:
            out: list[TickResult | Exception] = []
            for t in ticks:
                try:
                    out.append(decide(snap, policy, states.get(t.pool_id, _EMPTY), t, offsets))
                except Exception as exc:
                    out.append(exc)
            return out

    def _snapshot(self, tick: Tick, policy: CompiledPolicy) -> FleetSnapshot:
        env = envelope_of(policy)
        # Pools of one shard ticking at one boundary share a cut: one snapshot serves them all (and
        # the shadow policy, unless its envelope asks for another window).
        key = (tick.ts_ms, env.window_ms, env.stale_after_ms, tuple(self.folded.values()))
        snap = self._snaps.get(key)
        if snap is None:
            if any(k[0] != key[0] or k[3] != key[3] for k in self._snaps):
                self._snaps.clear()
            snap = snapshot(
                self.model, tick.ts_ms, window_ms=env.window_ms, stale_after_ms=env.stale_after_ms
            )
            self._snaps[key] = snap
        return snap

    def decide_shadow(self, tick: Tick, shadow: Shadow | None) -> tuple[Decision, ...]:
        """Decide ``tick`` under the shadow policy, right after :meth:`decide` decided it (same cut,
        nothing folded). Its own state per pool; ``None`` (no shadow at this tick) forgets it."""
        before = self._before.pop(tick.pool_id, None)
        if shadow is None:
            self.shadow_states.pop(tick.pool_id, None)
            self.shadow_of.pop(tick.pool_id, None)
            return ()
        snap = self._snapshot(tick, shadow.runner)
        if tick.pool_id not in snap.pools:
            return ()
        state = self._shadow_start(tick.pool_id, shadow, before)
        result = decide(snap, shadow.runner, state, tick, self.input_offsets())
        self.shadow_states[tick.pool_id] = result.state
        return tuple(d.model_copy(update={"policy": shadow.stamp}) for d in result.decisions)

    def decide_shadow_many(
        self, ticks: Sequence[Tick], shadow: Shadow | None
    ) -> list[tuple[Decision, ...] | Exception]:
        """:meth:`decide_shadow` for each of ``ticks`` (one boundary, distinct pools, each just
        decided by :meth:`decide_many`), in one :func:`decide_many`; a tick whose shadow decision
        raises gets its exception in its place."""
        befores = {t.pool_id: self._before.pop(t.pool_id, None) for t in ticks}
        if shadow is None:
            for tick in ticks:
                self.shadow_states.pop(tick.pool_id, None)
                self.shadow_of.pop(tick.pool_id, None)
            return [() for _ in ticks]
        out: list[tuple[Decision, ...] | Exception] = [() for _ in ticks]
        if not ticks:
            return out
        try:
            snap = self._snapshot(ticks[0], shadow.runner)
        except Exception as exc:
            return [exc for _ in ticks]
        todo = [i for i, t in enumerate(ticks) if t.pool_id in snap.pools]
        starts = {
            ticks[i].pool_id: self._shadow_start(ticks[i].pool_id, shadow, befores[ticks[i].pool_id])
            for i in todo
        }
        results = self._decide_batch(snap, shadow.runner, starts, [ticks[i] for i in todo])
        stamp = shadow.stamp
        for i, result in zip(todo, results, strict=True):
            if isinstance(result, Exception):
                out[i] = result
            else:
                self.shadow_states[ticks[i].pool_id] = result.state
                out[i] = tuple(d.model_copy(update={"policy": stamp}) for d in result.decisions)
        return out

    def _shadow_start(self, pool_id: str, shadow: Shadow, before: EngineState | None) -> EngineState:
        """The state ``shadow`` decides ``pool_id``'s tick from: its own, or, on its first tick
        there (or a new shadow document's), the enforcing policy's state before this tick
        (``before``; without it, the state now, which is that when the tick was not decided)."""
        known = self.shadow_of.get(pool_id)
        state = self.shadow_states.get(pool_id)
        if state is not None and known in (shadow.stamp.hash, ""):
            self.shadow_of[pool_id] = shadow.stamp.hash
            return state
        self.shadow_of[pool_id] = shadow.stamp.hash
        return before if before is not None else self.states.get(pool_id, _EMPTY)

    def skip(self, tick: Tick) -> bool:
        """Record a tick published as skipped (an outage longer than the catch-up); False if old."""
        last = self.last_tick.get(tick.pool_id)
        if last is not None and tick.tick_id <= last[0]:
            return False
        self.last_tick[tick.pool_id] = (tick.tick_id, tick.ts_ms)
        return True

    # -- checkpoint -----------------------------------------------------------------------------

    def checkpoint_value(self) -> dict[str, Any]:
        """What a checkpoint holds: everything but the pending records (re-read from ``folded``)."""
        return {
            "partition": self.partition,
            "model": self.model,
            "states": {pool: self.states[pool] for pool in sorted(self.states)},
            "shadow_states": {pool: self.shadow_states[pool] for pool in sorted(self.shadow_states)},
            "shadow_of": {pool: self.shadow_of[pool] for pool in sorted(self.shadow_of)},
            "folded": dict(self.folded),
            "ticks_at": self.ticks_at,
            "last_tick": {pool: list(v) for pool, v in sorted(self.last_tick.items())},
            "lettered": dict(self.lettered),
            "dl_mark": self.dl_mark,
        }

    @classmethod
    def from_checkpoint(cls, value: Any) -> Shard:
        try:
            shard = cls(int(value["partition"]))
            model, states = value["model"], value["states"]
            if not isinstance(model, FleetModel) or not all(
                isinstance(s, EngineState) for s in states.values()
            ):
                raise CheckpointError("checkpoint does not hold a fleet model and engine states")
            shard.model, shard.states = model, {str(p): s for p, s in states.items()}
            shadow_states = value.get("shadow_states", {})  # absent in checkpoints before shadow mode
            if not all(isinstance(s, EngineState) for s in shadow_states.values()):
                raise CheckpointError("checkpoint does not hold engine states for the shadow policy")
            shard.shadow_states = {str(p): s for p, s in shadow_states.items()}
            # Checkpoints before shadows started from the enforced state do not say whose state it
            # is: "" keeps it for the shadow in force.
            shadow_of = value.get("shadow_of", dict.fromkeys(shard.shadow_states, ""))
            shard.shadow_of = {str(p): str(h) for p, h in shadow_of.items()}
            shard.start_at(value["folded"], int(value["ticks_at"]))
            shard.last_tick = {str(p): (int(v[0]), int(v[1])) for p, v in value["last_tick"].items()}
            # Checkpoints written before dead letters were tracked: everything before them was
            # published (the old runtime dead-lettered at read time, before any checkpoint).
            shard.lettered = {str(k): int(v) for k, v in value.get("lettered", {}).items()}
            shard.dl_mark = int(value.get("dl_mark", -1))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CheckpointError(f"checkpoint is malformed: {type(exc).__name__}: {exc}") from None
        return shard
