"""tbt-feedback: a per-pool cap on tokens per batch iteration, lowered when time between tokens nears
its SLO and raised when there is headroom (multiplicative decrease, additive increase, with bounds).

Why it works: with chunked prefill every iteration carries one token for each decoding request plus
up to ``cap - decodes`` prompt tokens, and a prompt chunk of ``c`` tokens costs ``c x 2P / F`` of
compute (llama-8b on one A100 at 55% MFU: ~94 us per token, so an 8192-token chunk stalls every
decoding stream for ~0.77 s). Lowering the cap splits prefill into more, shorter iterations: the
decoders get a token every iteration, so TBT falls roughly in proportion to the cap, while prefill
throughput is unchanged as long as an iteration stays compute bound. It does so above the GPU's ridge
point ``F / BW`` (FLOP per byte of weights read: A100 ~150, H200 ~210, MI300X ~250, H100 ~300
tokens), hence the floor of 512. The price of a small cap is TTFT: a long prompt needs more
iterations, each also paying the decode batch, so the cap rises again when TBT has headroom.

Formula, per pool and tick, with ``x = tbt / tbt_slo_ms`` where ``tbt`` is the median over the
pool's warm, fresh, not-ejected nodes of their newest TBT p99 and ``tbt_slo_ms`` the TBT of the
policy's SLO classes (``spec.slo``) for the calls the pool served in the window
(:mod:`fleetloop.policies.slo`: the strictest class served binds, since every call on a node shares
its step time)::

    x >= tighten_at:  cap = max(min_tokens, floor(cap * decrease))      reason tbt-near-slo
    x <= relax_below: cap = min(max_tokens, cap + increase_tokens)       reason tbt-headroom
    otherwise, or no node reports TBT:  cap unchanged                    reason hold / no-data

The state is the cap; it starts at ``initial_tokens``. The median over nodes (the upper one for an
even count) keeps one degraded GPU, which the breaker handles, from shrinking the whole pool's cap.

Inputs: the pool's nodes (weights state, draining, staleness, ``tbt_p99_ms``) and the breaker
decisions already taken this tick (``ctx.breakers``), the SLO (``ctx.slo``; no copy here).
Parameters (defaults, bounds): ``tighten_at`` 0.8 (0.1-2), ``relax_below`` 0.5 (0.05-2, below
``tighten_at``), ``decrease`` 0.5 (0.1-0.95, TCP-style halving), ``increase_tokens`` 512 (16-65 536
per tick), ``min_tokens`` 512
(256-1 048 576; above every catalog GPU's ridge point and at least twice vLLM's default
``max_num_seqs`` of 256, so prefill always fits beside a full decode batch), ``max_tokens`` 8192
(vLLM V1's chunked-prefill default), ``initial_tokens`` 2048 (vLLM's long-standing chunked-prefill
default, between the bounds).
Trade-offs: halving reacts within a few ticks to a TBT breach; the additive climb back is slow on
purpose (15 ticks from 512 to 8192), so a pool that breached recently keeps favouring decodes over
TTFT for a while. TBT that comes from the decode batch itself (many long contexts, memory bound)
is not fixed by any cap: the cap then rests at ``min_tokens``, which costs little because those
iterations stay compute bound; admission has to shed that load.
Failure mode: a stale TBT (telemetry lagging a tick) can halve once more than needed; the floor and
the additive recovery bound the damage. Nodes that never report TBT (idle) leave the cap unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import Field, model_validator

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult, r6
from fleetloop.policies.columns import fleet_columns
from fleetloop.policies.pool_figures import (
    EMPTY,
    distinct_pools,
    ejected_by,
    figures_of,
    inputs_ok,
    is_ident,
    mark_rows,
    pool_figures,
    pool_index,
    r6_fast,
    row_ids,
    upper_medians,
)
from fleetloop.policies.slo import Slo
from fleetloop.schemas.base import MAX_COUNT, assemble
from fleetloop.schemas.decisions import BatchingDecision


class TbtFeedbackParams(Params):
    tighten_at: float = Field(default=0.8, ge=0.1, le=2.0)
    relax_below: float = Field(default=0.5, ge=0.05, le=2.0)
    decrease: float = Field(default=0.5, ge=0.1, le=0.95)
    increase_tokens: int = Field(default=512, ge=16, le=65_536)
    min_tokens: int = Field(default=512, ge=256, le=1_048_576)
    max_tokens: int = Field(default=8192, ge=256, le=1_048_576)
    initial_tokens: int = Field(default=2048, ge=256, le=1_048_576)

    @model_validator(mode="after")
    def _ordered(self) -> TbtFeedbackParams:
        if self.relax_below >= self.tighten_at:
            raise ValueError("relax_below must be below tighten_at")
        if not self.min_tokens <= self.initial_tokens <= self.max_tokens:
            raise ValueError("need min_tokens <= initial_tokens <= max_tokens")
        return self


def pool_tbt_ms(snap: FleetSnapshot, ctx: PolicyContext) -> float | None:
    """The upper median of the newest TBT p99 over the pool's warm, fresh, not-ejected nodes.

    With no node ejected (no enforced open breaker this tick) it is the pool's figure computed for
    the whole fleet at once (:mod:`fleetloop.policies.pool_figures`); else the same rule
    (``tests.oracles.tbt_feedback.pool_tbt_ms_plain`` node by node) over the pool's rows of the snapshot's
    columns (the same values, sorted the same way), without building the pool's views."""
    ejected = {i for i, b in ctx.breakers.items() if b.enforced and b.state == "open"}
    if not ejected:
        return figures_of(snap, ctx.pool_id).tbt_upper_median
    cols = fleet_columns(snap)
    lo, hi = cols.bounds.get(ctx.pool_id, (0, 0))
    fresh = (cols.warm[lo:hi] & ~cols.stale[lo:hi]).tolist()
    tbt: list[float] = cols.floats("tbt_p99_ms")[lo:hi].tolist()  # NaN: no figure (None)
    values = [
        t
        for node_id, ok, t in zip(row_ids(snap)[lo:hi], fresh, tbt, strict=True)
        if ok and not math.isnan(t) and node_id not in ejected
    ]
    if not values:
        return None
    values.sort()
    return values[len(values) // 2]


def next_cap(params: TbtFeedbackParams, cap: int, tbt_ms: float | None, tbt_slo_ms: float) -> tuple[int, str]:
    cap = min(max(cap, params.min_tokens), params.max_tokens)
    if tbt_ms is None:
        return cap, "no-data"
    x = tbt_ms / tbt_slo_ms
    if x >= params.tighten_at:
        return max(params.min_tokens, math.floor(cap * params.decrease)), "tbt-near-slo"
    if x <= params.relax_below:
        return min(params.max_tokens, cap + params.increase_tokens), "tbt-headroom"
    return cap, "hold"


class TbtFeedback:
    name = "tbt-feedback"
    section = "batching"
    Params = TbtFeedbackParams

    def initial_state(self) -> int | None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: TbtFeedbackParams, state: int | None, ctx: PolicyContext
    ) -> PolicyResult[int]:
        cap = params.initial_tokens if state is None else state
        tbt = pool_tbt_ms(snap, ctx)
        slo = ctx.pool_slo(snap)
        new_cap, reason = next_cap(params, cap, tbt, slo.tbt_ms)
        inputs = {"previous_max_batch_tokens": float(cap), "tbt_slo_ms": r6(slo.tbt_ms)}
        if tbt is not None:
            inputs["tbt_p99_ms"] = r6(tbt)
            inputs["tbt_pressure"] = r6(tbt / slo.tbt_ms)
        decision = BatchingDecision(
            entity=f"pool/{ctx.pool_id}",
            pool_id=ctx.pool_id,
            max_batch_tokens=new_cap,
            reason=reason,
            inputs=inputs,
        )
        return PolicyResult(
            decisions=(decision,), state=new_cap, diagnostics={"max_batch_tokens": float(new_cap)}
        )

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: TbtFeedbackParams,
        states: Sequence[int | None],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[int]]:
        """Equal, element for element and bit for bit (decisions, state, diagnostics), to
        ``[self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``: the TBT
        medians of the batch at once (:func:`pool_tbt_batch`), the decisions assembled without
        validation when every part is in bounds."""
        if len(states) != len(ctxs) or not distinct_pools(ctxs):
            return [self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]
        tbts = pool_tbt_batch(snap, ctxs)
        return _decide_pools(params, states, ctxs, tbts, [c.pool_slo(snap) for c in ctxs])


def pool_tbt_batch(snap: FleetSnapshot, ctxs: Sequence[PolicyContext]) -> list[float | None]:
    """``[pool_tbt_ms(snap, c) for c in ctxs]`` for a batch of distinct pools: a pool without an
    ejected node reads the fleet-wide figure, the others one pass of the same upper medians over
    their rows with every batch pool's ejected rows left out (kept in ``snap.memo`` by those rows,
    so admission and batching share it)."""
    ejected = [ejected_by(snap, c.breakers) for c in ctxs]
    figures = pool_figures(snap)
    if not any(ejected):
        return [figures.get(c.pool_id, EMPTY).tbt_upper_median for c in ctxs]
    cols = fleet_columns(snap)
    rows = np.zeros(len(cols), dtype=np.bool_)  # the ejected rows
    pools = np.zeros(len(cols), dtype=np.bool_)  # the rows of the pools with an ejected node
    for c, e in zip(ctxs, ejected, strict=True):
        if e:
            mark_rows(snap, rows, c.pool_id, e)
            lo, hi = cols.bounds.get(c.pool_id, (0, 0))
            pools[lo:hi] = True
    key = ("tbt_upper_median_without", rows.tobytes(), pools.tobytes())
    medians: list[float | None] | None = snap.memo.get(key)
    if medians is None:
        medians = snap.memo[key] = upper_medians(cols, cols.warm & ~cols.stale & ~rows & pools)
    index = pool_index(snap)
    out: list[float | None] = []
    for c, e in zip(ctxs, ejected, strict=True):
        if not e:
            out.append(figures.get(c.pool_id, EMPTY).tbt_upper_median)
        else:
            i = index.get(c.pool_id)
            out.append(None if i is None else medians[i])
    return out


_BATCHING_FIELDS = ("entity", "reason", "inputs", "kind", "pool_id", "max_batch_tokens")
assert tuple(BatchingDecision.model_fields) == _BATCHING_FIELDS  # ``decide_pools`` lists them in order
_BATCHING_GIVEN = frozenset(("entity", "pool_id", "max_batch_tokens", "reason", "inputs"))


def _decide_pools(
    params: TbtFeedbackParams,
    states: Sequence[int | None],
    ctxs: Sequence[PolicyContext],
    tbts: Sequence[float | None],
    slos: Sequence[Slo],
) -> list[PolicyResult[int]]:
    out: list[PolicyResult[int]] = []
    for state, ctx, tbt, slo in zip(states, ctxs, tbts, slos, strict=True):
        cap = params.initial_tokens if state is None else state
        new_cap, reason = next_cap(params, cap, tbt, slo.tbt_ms)
        inputs = {"previous_max_batch_tokens": float(cap), "tbt_slo_ms": r6_fast(slo.tbt_ms)}
        if tbt is not None:
            inputs["tbt_p99_ms"] = r6_fast(tbt)
            inputs["tbt_pressure"] = r6_fast(tbt / slo.tbt_ms)
        pid = ctx.pool_id
        if (
            type(new_cap) is int
            and 0 <= new_cap <= MAX_COUNT
            and is_ident(pid)
            and inputs_ok(list(inputs.values()))
        ):
            decision = assemble(
                BatchingDecision,
                {
                    "entity": f"pool/{pid}",
                    "reason": reason,
                    "inputs": inputs,
                    "kind": "batching",
                    "pool_id": pid,
                    "max_batch_tokens": new_cap,
                },
                set(_BATCHING_GIVEN),
            )
        else:
            decision = BatchingDecision(
                entity=f"pool/{pid}", pool_id=pid, max_batch_tokens=new_cap, reason=reason, inputs=inputs
            )
        out.append(
            PolicyResult(
                decisions=(decision,), state=new_cap, diagnostics={"max_batch_tokens": float(new_cap)}
            )
        )
    return out
