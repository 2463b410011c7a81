"""The decision engine: one frozen input per tick boundary, one result out per pool
(docs/architecture.md).

``decide_many(snapshot, policy, states, ticks, input_offsets) -> [TickResult]`` decides the ticks of
one boundary (one per pool, sharing ``ts_ms`` and ``tick_id``); ``decide`` is a batch of one. It runs
the policy's algorithms in a fixed order (breaker, routing, admission, retry budget, autoscale,
batching), each section for every pool before the next, applies the safety envelope
(:mod:`fleetloop.core.decide.shaping`) and stamps every decision with the policy, the tick and the
input offsets. It is pure: the same inputs give the same decisions, byte for byte, which is what
replay checks. Randomness, were an algorithm to need it, comes from a generator seeded by (tick id,
pool id). The daemon, its replay and the simulator all decide through here.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import BaseModel, TypeAdapter

from fleetloop.core.decide.shaping import (
    NO_DRAINS,
    PoolDrains,
    cap_ejections,
    hold,
    hold_drains,
    keep_held,
    pool_is_silent,
    settle_autoscale,
    shape_admission,
    shape_routing,
)
from fleetloop.policies.base import FleetSnapshot, PolicyContext, PolicyResult
from fleetloop.policies.envelope import Envelope
from fleetloop.policies.registry import CompiledPolicy, Section
from fleetloop.schemas.control import Tick
from fleetloop.schemas.decisions import (
    AdmissionDecision,
    AutoscaleDecision,
    BreakerDecision,
    Decision,
    DecisionBody,
    Offset,
    PolicyStamp,
    RoutingDecision,
)
from fleetloop.schemas.policy import SECTIONS, Mode

ORDER: tuple[str, ...] = ("breaker", "routing", "admission", "retry_budget", "autoscale", "batching")
assert sorted(ORDER) == sorted(SECTIONS)


@dataclass(frozen=True, slots=True)
class EngineState:
    """Each algorithm's state, per section and pool. Keyed also by algorithm name, so a policy
    change that swaps an algorithm starts it fresh while unchanged sections keep their state."""

    algorithms: Mapping[tuple[str, str, str], Any] = field(default_factory=dict)  # (section, name, pool)
    # The last autoscale target the engine let out, per pool: what a silent pool is frozen at.
    autoscale_held: Mapping[str, int] = field(default_factory=dict)
    # Per pool, the ejections the engine let out enforced at the pool's last tick (node -> until_ms):
    # held to their end, not judged again (``shaping.cap_ejections``, rule 3: no flapping).
    ejections_held: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)
    # Per pool, the drain list the engine let out at the pool's last tick, in the order asked: held
    # until each node is gone or taken back (``shaping.keep_draining``).
    drains_held: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Per pool, for each node on its drain list, the event time its grace counts from (put on the
    # list, or last seen leaving): a node still ready a grace later is taken back
    # (``shaping.keep_draining``, rule 3). Absent from a checkpoint written before: counted from the
    # first tick after its restore.
    drains_since: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # Per pool, the nodes the grace took back, each with the pool's target at its take-back: not
    # named again while the target is not below it (``shaping.keep_draining``, rule 1).
    drains_taken: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def pool_drains(self) -> dict[str, PoolDrains]:
        """The held drain lists, per pool, as :func:`shaping.keep_draining` reads them."""
        pools = sorted(set(self.drains_held) | set(self.drains_taken))
        since, taken = self.drains_since, self.drains_taken
        return {p: PoolDrains(self.drains_held.get(p, ()), since.get(p, {}), taken.get(p, {})) for p in pools}


def _drain_fields(
    drains: Mapping[str, PoolDrains],
) -> tuple[dict[str, tuple[str, ...]], dict[str, Mapping[str, int]], dict[str, Mapping[str, int]]]:
    """:attr:`EngineState.drains_held`, ``drains_since`` and ``drains_taken`` of the held lists."""
    listed = {p: d.listed for p, d in drains.items() if d.listed}
    since = {p: d.since for p, d in drains.items() if d.since}
    taken = {p: d.taken for p, d in drains.items() if d.taken}
    return listed, since, taken


_EMPTY = EngineState()
_DECISION_FIELDS = ("ts_ms", "tick_id", "policy", "input_offsets", "body")
assert tuple(Decision.model_fields) == _DECISION_FIELDS
_OFFSETS: TypeAdapter[dict[str, int]] = TypeAdapter(dict[str, Offset])


@dataclass(frozen=True, slots=True)
class TickResult:
    decisions: tuple[Decision, ...]
    state: EngineState
    diagnostics: Mapping[str, float]


_ENVELOPES: dict[str, Envelope] = {}


def envelope_of(policy: CompiledPolicy) -> Envelope:
    """The policy's envelope, validated once per document (keyed by its content hash)."""
    env = _ENVELOPES.get(policy.stamp.hash)
    if env is None:
        env = Envelope.model_validate(policy.document.spec.envelope)
        if len(_ENVELOPES) >= 64:
            _ENVELOPES.clear()
        _ENVELOPES[policy.stamp.hash] = env
    return env


# Diagnostics keys built once, and one fields set shared by every decision wrapper built here. A
# frozen model never changes its fields set in place (``model_copy`` copies it before adding the
# updated names), and a set per decision is one more object for the cyclic collector to track
# (docs/decisions/core.md: a whole-fleet tick's young-generation collections).
_DIAG_KEYS: dict[str, dict[str, str]] = {}  # section -> diagnostic name -> its key
_FIELDS_SET = set(_DECISION_FIELDS)
_new_decision = Decision.__new__
# The model's ``__dict__`` and slots set through their descriptors, as ``assemble`` sets them:
# ``object.__setattr__`` looks each name up along the class's MRO first, a third of a wrapper's cost
# at 5,000 a tick.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _diag_keys(section: str) -> dict[str, str]:
    """The section's diagnostic keys by name (``{section}.{name}``), filled by :func:`_diag_key`."""
    keys = _DIAG_KEYS.get(section)
    if keys is None:
        keys = _DIAG_KEYS[section] = {}
    return keys


def _diag_key(section: str, k: str) -> str:
    keys = _diag_keys(section)
    key = keys.get(k)
    if key is None:
        if len(keys) >= 4096:  # names come from algorithms: bounded, whatever they report
            keys.clear()
        key = keys[k] = f"{section}.{k}"
    return key


def decide(
    snap: FleetSnapshot,
    policy: CompiledPolicy,
    state: EngineState,
    tick: Tick,
    input_offsets: Mapping[str, int] | None = None,
) -> TickResult:
    """Decide for ``tick.pool_id`` as of ``snap.now_ms`` (== ``tick.ts_ms``): :func:`decide_many`
    of this one tick."""
    return decide_many(snap, policy, (state,), (tick,), input_offsets)[0]


@dataclass(slots=True)
class _Batch:
    """One boundary's ticks while they are decided, in pool-id order: per pool its context, its
    shaped breaker decisions so far (the context reads them), its sections' new states and
    diagnostics, its shaped decisions per section with the section's mode, and its held autoscale
    targets and ejections."""

    snap: FleetSnapshot
    policy: CompiledPolicy
    env: Envelope
    pool_ids: list[str]
    states: list[EngineState]
    tick_id: int
    breakers: list[dict[str, BreakerDecision]]
    ctxs: list[PolicyContext]
    produced_states: list[list[Any]]
    diagnostics: list[dict[str, float]]
    bodies: list[list[tuple[Mode, list[DecisionBody]]]]
    held: list[dict[str, int]]
    ejected: list[dict[str, Mapping[str, int | None]]]
    drains: list[dict[str, PoolDrains]]

    def context(self, j: int) -> PolicyContext:
        """Pool ``j``'s context, fresh: the same as a kept one until its generator is drawn from."""
        policy = self.policy
        pool_id = self.pool_ids[j]
        return PolicyContext(
            now_ms=self.snap.now_ms,
            tick_id=self.tick_id,
            tick_ms=policy.tick_ms,
            pool_id=pool_id,
            seed=(self.tick_id, zlib.crc32(pool_id.encode())),
            breakers=self.breakers[j],
            slo=policy.slo,
            draining=self.drains[j].get(pool_id, NO_DRAINS).listed,
        )


def decide_many(
    snap: FleetSnapshot,
    policy: CompiledPolicy,
    states: Sequence[EngineState],
    ticks: Sequence[Tick],
    input_offsets: Mapping[str, int] | None = None,
) -> list[TickResult]:
    """Decide the ticks of one boundary: one per pool (distinct pool ids), all with the same
    ``ts_ms`` and ``tick_id``, pool ``ticks[i].pool_id`` from ``states[i]``; the results in the
    order of ``ticks``.

    Section by section in :data:`ORDER` over the whole batch: each section's algorithm decides
    every pool in one call (its ``decide_pools``, :class:`fleetloop.policies.base.BatchAlgorithm`,
    given the pools in pool-id order) when it has one and the batch holds several pools, else in a
    loop of its ``decide`` (:func:`_run_section`); the
    envelope then shapes that section's decisions (:func:`_shape_section`). A pool's breaker
    decisions, shaped, are what its later sections read in their context. The stamps and offsets
    are validated once per batch and the decision wrappers are built without a call each. Pure:
    the states given are not changed; if any pool's tick raises, the whole call raises (the caller
    may then decide the ticks one by one to isolate it)."""
    n = len(ticks)
    if len(states) != n:
        raise ValueError(f"decide_many: {len(states)} states for {n} ticks")
    if n == 0:
        return []
    ts_ms, tick_id = ticks[0].ts_ms, ticks[0].tick_id
    order = sorted(range(n), key=lambda i: ticks[i].pool_id)
    pool_ids = [ticks[i].pool_id for i in order]
    for t in ticks:
        if t.ts_ms != ts_ms or t.tick_id != tick_id:
            raise ValueError("decide_many: the ticks of one batch share ts_ms and tick_id")
    if len(set(pool_ids)) != n:
        raise ValueError("decide_many: one tick per pool")
    pool_states = [states[i] for i in order]
    batch = _Batch(
        snap=snap,
        policy=policy,
        env=envelope_of(policy),
        pool_ids=pool_ids,
        states=pool_states,
        tick_id=tick_id,
        breakers=[{} for _ in range(n)],
        ctxs=[],
        produced_states=[[] for _ in range(n)],
        diagnostics=[{} for _ in range(n)],
        bodies=[[] for _ in range(n)],
        held=[dict(st.autoscale_held) for st in pool_states],
        ejected=[dict(st.ejections_held) for st in pool_states],
        drains=[st.pool_drains() if st.drains_held or st.drains_taken else {} for st in pool_states],
    )
    batch.ctxs = [batch.context(j) for j in range(n)]
    for section in ORDER:
        sec = policy.sections[section]
        _shape_section(batch, section, sec, _run_section(batch, section, sec))
    offsets = _OFFSETS.validate_python(dict(sorted((input_offsets or {}).items())))
    results = _results(batch, ts_ms, offsets)
    out: list[TickResult | None] = [None] * n
    for j, result in enumerate(results):
        out[order[j]] = result
    return [r for r in out if r is not None]


def _run_section(batch: _Batch, section: str, sec: Section) -> list[PolicyResult[Any]]:
    """Every pool's result of the section's algorithm: in one ``decide_pools`` call if it has one
    and there are several pools, else one ``decide`` per pool (each from its state, or the
    algorithm's initial one). A batch of one runs ``decide``: a batch form reads fleet-wide
    figures for every pool at once, which costs more than the per-pool form for one pool (the
    policies' tests hold the two forms equal)."""
    algorithm = sec.algorithm
    name = algorithm.name
    algo_states: list[Any] = []
    for j, st in enumerate(batch.states):
        algo_state = st.algorithms.get((section, name, batch.pool_ids[j]))
        algo_states.append(algorithm.initial_state() if algo_state is None else algo_state)
    ctxs = batch.ctxs
    for j, ctx in enumerate(ctxs):
        if ctx._rng:  # a context whose generator was drawn from is replaced by a fresh one
            ctxs[j] = batch.context(j)
    many = getattr(algorithm, "decide_pools", None)
    if many is not None and len(ctxs) > 1:
        results = list(many(batch.snap, sec.params, algo_states, list(ctxs)))
        if len(results) != len(ctxs):
            raise ValueError(f"{section}: decide_pools returned {len(results)} results for {len(ctxs)} pools")
        return results
    decide_one = algorithm.decide
    params = sec.params
    return [decide_one(batch.snap, params, s, c) for s, c in zip(algo_states, ctxs, strict=True)]


def _shape_section(batch: _Batch, section: str, sec: Section, results: list[PolicyResult[Any]]) -> None:
    """Keep each pool's new state and diagnostics, and its decisions shaped by the envelope: the
    breakers' (disarmed in shadow mode; the ejection cap where an enforced one is open; the
    enforced ejections held for the pool's next tick), routing (for every pool at once, after the
    loop: a decision left with no node to route to is dropped), admission and autoscale (a silent
    pool's target frozen, another's step-limited; an enforced target held)."""
    snap, env, mode = batch.snap, batch.env, sec.mode
    diag_keys = _diag_keys(section)
    to_route: list[tuple[list[DecisionBody], int]] = []  # where each routing decision goes
    route_items: list[tuple[RoutingDecision, Mapping[str, BreakerDecision]]] = []
    for j, result in enumerate(results):
        batch.produced_states[j].append(result.state)
        if result.diagnostics:
            diag = batch.diagnostics[j]
            for k, v in result.diagnostics.items():
                diag[diag_keys.get(k) or _diag_key(section, k)] = float(v)
        pool_id = batch.pool_ids[j]
        shaped: list[DecisionBody]
        if section == "breaker":
            shaped = cast("list[DecisionBody]", _shape_breakers(batch, j, result, shadow=mode == "shadow"))
        elif section == "routing":
            shaped = list(result.decisions)  # shaped for the whole batch below
            for i, d in enumerate(shaped):
                if isinstance(d, RoutingDecision):
                    to_route.append((shaped, i))
                    route_items.append((d, batch.breakers[j]))
        elif section == "admission":
            shaped = [
                shape_admission(d, env) if isinstance(d, AdmissionDecision) else d for d in result.decisions
            ]
        elif section == "autoscale":
            silent = pool_is_silent(snap, pool_id)
            held, drains = batch.held[j], batch.drains[j]
            shaped = []
            for d in result.decisions:
                if isinstance(d, AutoscaleDecision):
                    # Frozen (silent), held (unknown) or nothing, its drain list held: settle_autoscale.
                    settled = settle_autoscale(
                        d, snap, env, held.get(d.pool_id), silent, drains.get(d.pool_id, NO_DRAINS)
                    )
                    if settled is None:
                        continue
                    d, kept_drains = settled
                    if mode == "enforce":
                        held[d.pool_id] = d.desired_nodes
                        hold_drains(drains, d.pool_id, kept_drains)
                shaped.append(d)
        else:
            shaped = list(result.decisions)
        batch.bodies[j].append((mode, shaped))
    if route_items:
        dropped: dict[int, tuple[list[DecisionBody], list[int]]] = {}
        for (routed, i), shaped_d in zip(to_route, shape_routing(route_items, snap, env), strict=True):
            if shaped_d is None:  # nothing to route to: no decision
                dropped.setdefault(id(routed), (routed, []))[1].append(i)
            else:
                routed[i] = shaped_d
        for routed, at in dropped.values():
            for i in reversed(at):
                del routed[i]


def _shape_breakers(
    batch: _Batch, j: int, result: PolicyResult[Any], *, shadow: bool
) -> list[BreakerDecision]:
    """Pool ``j``'s breaker decisions shaped (other bodies a breaker algorithm gave are dropped),
    its enforced ejections held for its next tick, and the shaped decisions kept in its context."""
    pool_id = batch.pool_ids[j]
    shaped: list[BreakerDecision] = []
    capped = False
    for d in result.decisions:
        if isinstance(d, BreakerDecision):
            if d.state != "closed":
                if shadow:
                    d = d.model_copy(update={"enforced": False})
                elif d.enforced and d.state == "open":
                    capped = True
            shaped.append(d)
    ejected = batch.ejected[j]
    if not shadow and ejected.get(pool_id):
        shaped = keep_held(shaped, batch.snap, pool_id, ejected.get(pool_id))
        capped = any(d.state == "open" and d.enforced for d in shaped)
    if capped:
        shaped = cap_ejections(shaped, batch.snap, pool_id, batch.env, ejected.get(pool_id))
    hold(ejected, pool_id, shaped)
    batch.breakers[j].update({d.node_id: d for d in shaped})
    return shaped


def _results(batch: _Batch, ts_ms: int, offsets: dict[str, int]) -> list[TickResult]:
    """Each pool's result, in pool-id order: its decisions stamped with the section's mode, its
    states (this policy's algorithms only: a swapped algorithm's state goes), diagnostics and
    held targets and ejections."""
    policy = batch.policy
    ps = policy.stamp
    stamps: dict[Mode, PolicyStamp] = {}
    live = {(s, policy.sections[s].algorithm.name) for s in ORDER}
    keys_of = [(s, policy.sections[s].algorithm.name) for s in ORDER]
    tick_id = batch.tick_id
    out: list[TickResult] = []
    for j, pid in enumerate(batch.pool_ids):
        decisions: list[Decision] = []
        append = decisions.append
        for sec_mode, section_bodies in batch.bodies[j]:
            if not section_bodies:
                continue
            stamp = stamps.get(sec_mode)
            if stamp is None:
                stamp = stamps[sec_mode] = PolicyStamp(
                    name=ps.name, version=ps.version, hash=ps.hash, mode=sec_mode
                )
            for body in section_bodies:
                # ``assemble`` of one ``Decision`` (the same ``__dict__``, fields and extras), inlined
                # (a call per wrapper was ~6% of its cost, at 5,000 a tick), its fields set shared.
                m = _new_decision(Decision)
                _set_dict(
                    m,
                    {
                        "ts_ms": ts_ms,
                        "tick_id": tick_id,
                        "policy": stamp,
                        "input_offsets": offsets,
                        "body": body,
                    },
                )
                _set_fields_set(m, _FIELDS_SET)
                _set_extra(m, None)
                _set_private(m, None)
                append(m)
        new_states = dict(batch.states[j].algorithms)
        for (section, name), st in zip(keys_of, batch.produced_states[j], strict=True):
            new_states[(section, name, pid)] = st
        if len(new_states) == len(keys_of):  # the pool's own states only (every key set just above)
            kept = new_states
        else:
            kept = {k: v for k, v in new_states.items() if (k[0], k[1]) in live}
        diag = batch.diagnostics[j]
        diag["decisions"] = float(len(decisions))
        out.append(
            TickResult(
                decisions=tuple(decisions),
                state=EngineState(kept, batch.held[j], batch.ejected[j], *_drain_fields(batch.drains[j])),
                diagnostics=diag,
            )
        )
    return out


class Engine:
    """A convenience holder for ``(policy, state)`` around :func:`decide_many`; still no I/O.

    State is kept per pool: a pool's tick reads and replaces only its own algorithms' states, so a
    whole-fleet tick costs the sum of its pools, not pools squared."""

    def __init__(self, policy: CompiledPolicy) -> None:
        self.policy = policy
        self.pools: dict[str, EngineState] = {}

    @property
    def state(self) -> EngineState:
        """Every pool's states in one :class:`EngineState` (for inspection; ``tick`` does not use it)."""
        merged: dict[tuple[str, str, str], Any] = {}
        held: dict[str, int] = {}
        ejected: dict[str, Mapping[str, int | None]] = {}
        drains: dict[str, PoolDrains] = {}
        for pool_id in sorted(self.pools):
            merged.update(self.pools[pool_id].algorithms)
            held.update(self.pools[pool_id].autoscale_held)
            ejected.update(self.pools[pool_id].ejections_held)
            drains.update(self.pools[pool_id].pool_drains())
        return EngineState(merged, held, ejected, *_drain_fields(drains))

    def retain(self, pools: Collection[str]) -> int:
        """Forget the state of every pool not in ``pools`` (the model evicted it); returns how many."""
        gone = [p for p in self.pools if p not in pools]
        for p in gone:
            del self.pools[p]
        return len(gone)

    @property
    def envelope(self) -> Envelope:
        return envelope_of(self.policy)

    def set_policy(self, policy: CompiledPolicy) -> None:
        self.policy = policy

    def tick(
        self, snap: FleetSnapshot, tick: Tick, input_offsets: Mapping[str, int] | None = None
    ) -> TickResult:
        return self.tick_many(snap, (tick,), input_offsets)[0]

    def tick_many(
        self, snap: FleetSnapshot, ticks: Sequence[Tick], input_offsets: Mapping[str, int] | None = None
    ) -> list[TickResult]:
        """:meth:`tick` for each of ``ticks`` (one boundary, one tick per pool) in one
        :func:`decide_many`; the results in the order of ``ticks``."""
        pools = self.pools
        results = decide_many(
            snap, self.policy, [pools.get(t.pool_id, _EMPTY) for t in ticks], ticks, input_offsets
        )
        for t, result in zip(ticks, results, strict=True):
            pools[t.pool_id] = result.state
        return results
