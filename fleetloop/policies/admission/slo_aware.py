"""slo-aware: shed the first calls of new low-priority tasks on outstanding-work thresholds that
tighten while the pool misses its latency SLO and loses tasks, and relax when there is headroom;
priority 0 and calls of tasks already under way are never shed on outstanding work, and calls that
can no longer get a first token in time are rejected early.

Why outstanding work and not queue depth: under continuous batching a node admits every request
into its running batch until the KV cache or ``max_num_seqs`` is full, so its waiting queue stays
near zero while latency already climbs (bigger decode batches, more prefill per second). Queue
depth plus running requests moves first. The threshold is per node (the router compares the node it
picked) and by priority class, and it applies only to the first call of a task: a task at step 3
carries the spend of steps 1-2 (an autonomous workflow, hundreds of calls), and shedding its next
call throws that away, so later calls meet only the queue thresholds of a full node.

Formula, per pool and tick. The pressure is ``x = max(ttft_p99_w / ttft_slo_ms, tbt / tbt_slo_ms)``
(``ttft_p99_w`` the pool's TTFT p99 over the window, ``tbt`` the upper median of the newest TBT p99
of its warm, fresh, not-ejected nodes; a missing figure is left out; ``ttft_slo_ms``/``tbt_slo_ms``
the SLO of the policy's classes, ``spec.slo``, for the calls the pool served in the window: the
strictest class served binds, :mod:`fleetloop.policies.slo`) and the failing share is the share
of **tasks lost**, not of calls failed: ``f = tasks_lost_w / tasks_ended_w`` (tasks whose last call
ended on this pool in the window, and those of them that failed for any reason but our own
shedding: timeouts and errors with no retry left, retries the budget refused, deadlines). Why tasks
and not calls: the fleet is paid per successful task, and a timed-out call whose retry succeeds
costs latency and some GPU time, not a task. After a capacity loss (half a pool reclaimed) the
survivors queue and time calls out while the clients' retries still carry nearly every task
through; counting those calls as distress shed new tasks (each a certain loss: a shed first call's
retries meet the same thresholds) to prevent timeouts that were not losing anything. A storm that
does lose tasks shows up here within one client retry cycle (timeout x retries). Our own sheds are
not counted, so shedding does not feed itself, and neither are calls lost with a crashed or
reclaimed node (they fail whatever admission does, and their retries are exempt from the budget).
The state is a level ``L``, the new-task
outstanding limit of the least important class, starting at ``max_level``::

    no latency figure:                   L unchanged                        reason no-data
    f <  min_failure_frac:               L = min(max_level, max(L + increase, L / decrease))
                                                                            reason tasks-succeed
    x >= tighten_at (and f large):       L = max(min_level, L * decrease)   reason slo-near
    x <= relax_below:                    L = min(max_level, L + increase)   reason slo-headroom
    otherwise:                           L unchanged                        reason hold

    new_task_max_outstanding[p] = floor(L * class_spread ** (lowest - p))  for p > protect_priority
                                  (lowest = classes - 1; none for p <= protect_priority;
                                   none at all while L = max_level)
    max_queue_depth[p]          = max(2, floor(queue_depth_p0 * 0.5 ** p * L / min_level))
    new_task_max_queue_depth[p] = max(2, floor(max_queue_depth[p] * 0.75))
    reject_if_budget_below_ms   = floor(min(ttft_p50_w, reject_cap_ms))   (0 without data)

No outstanding limit at ``max_level``: the level is at its ceiling only when no task has been lost
for a while (at least ``(max_level - min_level) / increase`` ticks after a breach), and then the
outstanding work on a node is no evidence of distress: beyond ``max_num_seqs`` a node only queues,
and a queue that drains within the clients' timeouts loses nothing. The queue-depth limits (16x the
static ones there) still turn new tasks away from a node whose queue is too deep to drain in time.
A limit kept at the ceiling shed the first calls of low-priority tasks on the survivors of a mass
preemption while every task still succeeded (each shed first call a lost task: its retries meet
the same limit).

The failure gate is the KPI speaking: the fleet is paid per successful task, so latency over the SLO
while tasks still succeed does not justify losing a task; shedding starts when the miss turns into
lost tasks, and the level climbs back as soon as tasks succeed again, even if latency is still
over the SLO (long prompts keep TTFT p99 high without any
shedding curing it). It climbs back as fast as it fell: by the inverse of ``decrease`` a tick
(16 to 256 in 8 ticks), at least ``increase``. The gate reads a window, so the climb starts only
once a whole window has lost fewer than one task in twenty; from then on every tick below the
ceiling sheds new low-priority tasks (each a lost task) against a distress the gate says is over.
A pool whose nodes run near ``max_num_seqs`` in normal service (the bulk of a busy pool) sheds
every such task on a node with calls queued at any level below its running count, so an additive
climb (60 ticks from 16 to 256) kept shedding them for a minute after the losses had stopped: in
``scenarios/stress/mass-preempt-budget.yaml`` (seed 17) that was most of 1,952 tasks lost as
``retries_exhausted:shed`` after the reclaimed nodes were back, 1,511 with this climb. If the
losses return, the level falls again within a window (``decrease`` a tick).
The queue thresholds follow the same gate: at ``min_level`` (distress) they are the static
``queue-depth`` ones, which act once a node is full, and they open in proportion to the level above
it (16x at ``max_level``). A queue that drains before its calls time out costs latency, not tasks:
after a capacity loss (half a pool reclaimed) the surviving nodes queue while every call still
succeeds, and shedding new tasks there would lose them for nothing. The engine floors the thresholds
for protected classes. The budget rule rejects a call whose remaining budget (the smaller of its
client timeout and its task's deadline) is below the pool's median TTFT: it is more likely than not
to fail anyway, and rejecting it at once spends no GPU time on it.

Inputs: the pool's TTFT p50 and p99, request, failure and shed counts over the window; its nodes'
newest TBT p99 (warm, fresh, not ejected by ``ctx.breakers``) and router-observed failures; the
SLO (``ctx.slo``; no copy here). Parameters (defaults, bounds): ``tighten_at`` 0.9 (0.1-5), above
the batching knob's 0.8 so the cheaper lever (smaller prefill chunks) acts first; ``relax_below``
0.6 (0.05-5, below ``tighten_at``); ``decrease`` 0.7
(0.1-0.95, gentler than halving because a shed call can be a lost task); ``increase`` 4 (0.1-1000
requests per tick); ``min_failure_frac`` 0.05 (0-1; the share of ended tasks lost: one in twenty
is a failure rate no client retry policy hides, and below it shedding, which loses a task per shed
first call, costs more tasks than it can save);
``min_level`` 16 (1-10 000): a node decoding fewer than ~16 sequences is far below the ridge point
where decode turns compute bound (~150-300 tokens per step on the catalog GPUs), so extra requests
cost it almost nothing and shedding below that only loses work; ``max_level`` 256 (vLLM's default
``max_num_seqs``: above it requests only queue); ``class_spread`` 2 (1-16; each more important
class gets twice the room); ``queue_depth_p0`` 64 (1-100 000); ``reject_cap_ms`` 2000 (0-600 000;
0 turns early rejection off); ``classes`` 3 (1-10); ``protect_priority`` 0 (-1-9; -1 protects none).
Trade-offs: every shed first call is a task lost, so this lever buys priority-0 and in-flight work
with low-priority tasks; the routers apply the new-task outstanding limit only on a node with calls
queued (:mod:`fleetloop.router.pick` step 5: a node with none admits the call into its batch at
once, at some cost in time between tokens, and the shed would lose the task for that). Measured
over both suites when the lever was added (on the node model of that time): gpu-mix-cascade went
from +37..+78 tasks against classic to +443..+484 at 0.87x its cost (the lever there from -1,175
tasks over three seeds to -45), burst-a100-2x came 101-381 tasks closer to classic, and no row lost
a target. In a fleet where the low class is the bulk of the tasks, shedding lowers the success
rate, which the failure gate limits to real distress. The level is pool-wide; the climb back (8
ticks from 16 to 256 once a window has lost fewer than one task in twenty) keeps the pool
conservative for a few seconds after a breach, and only nodes with calls queued shed for it; a
breach that comes back soon finds the level lower again within a window (a sawtooth, not a steady
level: the window lags the losses by up to its length). In an overload that outlasts the tasks' deadlines
(burst-a100-2x) the level falls to ``min_level`` within a window of the first lost tasks (the
losses and the window's p99 lag the queue behind them). Those sheds are the overflow of the six
warm nodes the autoscaler holds at the step, not shedding that capacity could carry: with the
lever off the pool lost 894 more tasks over seeds 29-31 (queues run past the clients' 15 s wait
for a first token; the stress suite's ablation on that node model, made by ``fleetloop bench
results --only sim-stress-ablation``), while classic holds 12 warm nodes there.
It cannot tell latency from long prompts or a slow decode batch from latency shedding would cure;
``min_level`` keeps it from shedding lightly loaded nodes for it.
Failure mode: an SLO set far below what the pool can do, with calls failing for another reason (a
crashed node), pins the level at ``min_level`` and sheds new low-class tasks beyond 16 outstanding
on any node with calls queued; a missing TTFT/TBT figure holds the level, and a stale one delays
the reaction by a window. Classes at or below ``protect_priority`` are never shed on outstanding work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field, model_validator

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult, r6
from fleetloop.policies.batching.tbt_feedback import pool_tbt_batch, pool_tbt_ms
from fleetloop.policies.pool_figures import (
    EMPTY,
    distinct_pools,
    figures_of,
    inputs_ok,
    is_ident,
    pool_figures,
    r6_fast,
)
from fleetloop.policies.slo import Slo
from fleetloop.schemas.base import MAX_COUNT, assemble
from fleetloop.schemas.decisions import AdmissionDecision

MIN_QUEUE_DEPTH = 2


class SloAwareParams(Params):
    tighten_at: float = Field(default=0.9, ge=0.1, le=5.0)
    relax_below: float = Field(default=0.6, ge=0.05, le=5.0)
    decrease: float = Field(default=0.7, ge=0.1, le=0.95)
    increase: float = Field(default=4.0, ge=0.1, le=1000.0)
    min_level: float = Field(default=16.0, ge=1.0, le=10_000.0)
    max_level: float = Field(default=256.0, ge=1.0, le=100_000.0)
    class_spread: float = Field(default=2.0, ge=1.0, le=16.0)
    queue_depth_p0: int = Field(default=64, ge=1, le=100_000)
    reject_cap_ms: int = Field(default=2000, ge=0, le=600_000)
    min_failure_frac: float = Field(default=0.05, ge=0.0, le=1.0)
    classes: int = Field(default=3, ge=1, le=10)
    protect_priority: int = Field(default=0, ge=-1, le=9)

    @model_validator(mode="after")
    def _ordered(self) -> SloAwareParams:
        if self.relax_below >= self.tighten_at:
            raise ValueError("relax_below must be below tighten_at")
        if self.min_level > self.max_level:
            raise ValueError("min_level must not exceed max_level")
        return self


def pressure(slo: Slo, ttft_p99_ms: float | None, tbt_ms: float | None) -> float | None:
    parts = []
    if ttft_p99_ms is not None:
        parts.append(ttft_p99_ms / slo.ttft_ms)
    if tbt_ms is not None:
        parts.append(tbt_ms / slo.tbt_ms)
    return max(parts) if parts else None


def failure_frac(requests_w: int, failures_w: int) -> float:
    return failures_w / requests_w if requests_w > 0 else 0.0


def next_level(
    params: SloAwareParams, level: float, x: float | None, failing: float = 1.0
) -> tuple[float, str]:
    level = min(max(level, params.min_level), params.max_level)
    if x is None:
        return level, "no-data"
    if failing < params.min_failure_frac:
        # As fast as it fell (see the module docstring), at least ``increase``.
        return min(params.max_level, max(level + params.increase, level / params.decrease)), "tasks-succeed"
    if x >= params.tighten_at:
        return max(params.min_level, level * params.decrease), "slo-near"
    if x <= params.relax_below:
        return min(params.max_level, level + params.increase), "slo-headroom"
    return level, "hold"


def new_task_limits(params: SloAwareParams, level: float) -> dict[str, int]:
    """``new_task_max_outstanding`` for the classes above ``protect_priority``; none at
    ``max_level`` (no distress: see the module docstring)."""
    if level >= params.max_level:
        return {}
    lowest = params.classes - 1
    return {
        str(p): max(1, math.floor(level * params.class_spread ** (lowest - p) + 1e-9))
        for p in range(params.classes)
        if p > params.protect_priority
    }


def queue_limits(params: SloAwareParams, level: float | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """The queue-depth limits: the static ``queue-depth`` ones at ``min_level`` (distress), opened
    in proportion to the level above it (``level / min_level``; the static ones without a level)."""
    scale = 1.0 if level is None else max(1.0, level / params.min_level)
    running: dict[str, int] = {}
    new_task: dict[str, int] = {}
    for p in range(params.classes):
        depth = max(MIN_QUEUE_DEPTH, math.floor(params.queue_depth_p0 * 0.5**p * scale + 1e-9))
        running[str(p)] = depth
        new_task[str(p)] = max(MIN_QUEUE_DEPTH, math.floor(depth * 0.75))
    return running, new_task


class SloAware:
    name = "slo-aware"
    section = "admission"
    Params = SloAwareParams

    def initial_state(self) -> float | None:
        return None

    def decide(
        self, snap: FleetSnapshot, params: SloAwareParams, state: float | None, ctx: PolicyContext
    ) -> PolicyResult[float]:
        level = params.max_level if state is None else state
        pool = snap.pools.get(ctx.pool_id)
        ttft_p99 = pool.ttft_p99_ms_w if pool is not None else None
        ttft_p50 = pool.ttft_p50_ms_w if pool is not None else None
        tbt = pool_tbt_ms(snap, ctx)
        slo = ctx.pool_slo(snap)
        x = pressure(slo, ttft_p99, tbt)
        figs = figures_of(snap, ctx.pool_id)  # the pool's node figures, without its views
        lost = figs.lost_calls
        failing = failure_frac(pool.tasks_ended_w, pool.tasks_lost_w) if pool is not None else 0.0
        new_level, reason = next_level(params, level, x, failing)
        new_level = r6(new_level)
        new_task_outstanding = new_task_limits(params, new_level)
        depth, new_task_depth = queue_limits(params, new_level)
        reject_ms = math.floor(min(ttft_p50, params.reject_cap_ms)) if ttft_p50 is not None else 0
        inputs = {
            "level": new_level,
            "previous_level": r6(level),
            "failure_frac_w": r6(failing),
            "tasks_lost_w": float(pool.tasks_lost_w if pool is not None else 0),
            "tasks_ended_w": float(pool.tasks_ended_w if pool is not None else 0),
            "lost_calls_w": float(lost),
            "ttft_slo_ms": r6(slo.ttft_ms),
            "tbt_slo_ms": r6(slo.tbt_ms),
        }
        if x is not None:
            inputs["slo_pressure"] = r6(x)
        if ttft_p99 is not None:
            inputs["ttft_p99_ms_w"] = r6(ttft_p99)
        if tbt is not None:
            inputs["tbt_p99_ms"] = r6(tbt)
        inputs["max_outstanding_seen"] = float(figs.max_outstanding)
        decision = AdmissionDecision(
            entity=f"pool/{ctx.pool_id}",
            pool_id=ctx.pool_id,
            max_queue_depth=depth,
            new_task_max_queue_depth=new_task_depth,
            new_task_max_outstanding=new_task_outstanding,
            reject_if_budget_below_ms=max(0, reject_ms),
            reason=reason,
            inputs=inputs,
        )
        return PolicyResult(decisions=(decision,), state=new_level, diagnostics={"level": new_level})

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: SloAwareParams,
        states: Sequence[float | None],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[float]]:
        """Equal, element for element and bit for bit (decisions, state, diagnostics), to
        ``[self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``: the TBT
        medians of the batch at once (``pool_tbt_batch``), each level's thresholds computed once,
        the decisions assembled without validation when every part is in bounds."""
        if len(states) != len(ctxs) or not distinct_pools(ctxs):
            return [self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]
        return _decide_pools(snap, params, states, ctxs)


_ADMISSION_FIELDS = (
    "entity", "reason", "inputs", "kind", "pool_id", "max_queue_depth", "new_task_max_queue_depth",
    "reject_if_budget_below_ms", "max_outstanding", "new_task_max_outstanding", "budget_protected_priority",
)  # fmt: skip
assert (
    tuple(AdmissionDecision.model_fields) == _ADMISSION_FIELDS
)  # ``_admission_decision`` lists them in order
_ADMISSION_GIVEN = frozenset(
    ("entity", "pool_id", "max_queue_depth", "new_task_max_queue_depth", "new_task_max_outstanding",
     "reject_if_budget_below_ms", "reason", "inputs")
)  # fmt: skip


def _counts_ok(table: dict[str, int]) -> bool:
    return all(type(v) is int and 0 <= v <= MAX_COUNT for v in table.values())


def _admission_decision(  # noqa: PLR0917 - the decision's fields
    pool_id: str,
    depth: dict[str, int],
    new_task_depth: dict[str, int],
    new_task_outstanding: dict[str, int],
    reject_ms: int,
    reason: str,
    inputs: dict[str, float],
) -> AdmissionDecision:
    """``AdmissionDecision(...)`` as :meth:`SloAware.decide` builds it, assembled without
    validation when every part is valid (the tables' counts and the budget within ``NonNegInt``,
    the pool id an ``Ident``, the figures finite floats within ``Figure``), else validated."""
    if (
        type(reject_ms) is int
        and 0 <= reject_ms <= MAX_COUNT
        and is_ident(pool_id)
        and _counts_ok(depth)
        and _counts_ok(new_task_depth)
        and _counts_ok(new_task_outstanding)
        and inputs_ok(list(inputs.values()))
    ):
        values: dict[str, object] = {
            "entity": f"pool/{pool_id}",
            "reason": reason,
            "inputs": inputs,
            "kind": "admission",
            "pool_id": pool_id,
            "max_queue_depth": depth,
            "new_task_max_queue_depth": new_task_depth,
            "reject_if_budget_below_ms": reject_ms,
            "max_outstanding": {},
            "new_task_max_outstanding": new_task_outstanding,
            "budget_protected_priority": 0,
        }
        return assemble(AdmissionDecision, values, set(_ADMISSION_GIVEN))
    return AdmissionDecision(
        entity=f"pool/{pool_id}",
        pool_id=pool_id,
        max_queue_depth=depth,
        new_task_max_queue_depth=new_task_depth,
        new_task_max_outstanding=new_task_outstanding,
        reject_if_budget_below_ms=reject_ms,
        reason=reason,
        inputs=inputs,
    )


def _decide_pools(
    snap: FleetSnapshot, params: SloAwareParams, states: Sequence[float | None], ctxs: Sequence[PolicyContext]
) -> list[PolicyResult[float]]:
    tbts = pool_tbt_batch(snap, ctxs)
    figures = pool_figures(snap)
    # The thresholds are a function of the level alone: computed once per level this batch sees
    # (most pools sit at the same level), each decision given its own copies.
    tables: dict[float, tuple[dict[str, int], dict[str, int], dict[str, int]]] = {}
    out: list[PolicyResult[float]] = []
    for state, ctx, tbt in zip(states, ctxs, tbts, strict=True):
        pid = ctx.pool_id
        level = params.max_level if state is None else state
        pool = snap.pools.get(pid)
        ttft_p99 = pool.ttft_p99_ms_w if pool is not None else None
        ttft_p50 = pool.ttft_p50_ms_w if pool is not None else None
        slo = ctx.pool_slo(snap)
        x = pressure(slo, ttft_p99, tbt)
        figs = figures.get(pid, EMPTY)
        failing = failure_frac(pool.tasks_ended_w, pool.tasks_lost_w) if pool is not None else 0.0
        new_level, reason = next_level(params, level, x, failing)
        new_level = r6_fast(new_level)
        found = tables.get(new_level)
        if found is None:
            found = tables[new_level] = (*queue_limits(params, new_level), new_task_limits(params, new_level))
        depth, new_task_depth, new_task_outstanding = found
        reject_ms = math.floor(min(ttft_p50, params.reject_cap_ms)) if ttft_p50 is not None else 0
        inputs = {
            "level": new_level,
            "previous_level": r6_fast(level),
            "failure_frac_w": r6_fast(failing),
            "tasks_lost_w": float(pool.tasks_lost_w if pool is not None else 0),
            "tasks_ended_w": float(pool.tasks_ended_w if pool is not None else 0),
            "lost_calls_w": float(figs.lost_calls),
            "ttft_slo_ms": r6_fast(slo.ttft_ms),
            "tbt_slo_ms": r6_fast(slo.tbt_ms),
        }
        if x is not None:
            inputs["slo_pressure"] = r6_fast(x)
        if ttft_p99 is not None:
            inputs["ttft_p99_ms_w"] = r6_fast(ttft_p99)
        if tbt is not None:
            inputs["tbt_p99_ms"] = r6_fast(tbt)
        inputs["max_outstanding_seen"] = float(figs.max_outstanding)
        decision = _admission_decision(
            pid,
            dict(depth),
            dict(new_task_depth),
            dict(new_task_outstanding),
            max(0, reject_ms),
            reason,
            inputs,
        )
        out.append(PolicyResult(decisions=(decision,), state=new_level, diagnostics={"level": new_level}))
    return out
