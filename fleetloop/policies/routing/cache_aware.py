"""cache-aware: score every node on load, memory, speed and warmth; pin a task to the node holding its
prefix; give priority 0 the nodes furthest from saturation; name the pools to spill over to.

What it does: each tick, for the tick's pool, it scores every node with six scorers, each
normalized to [0, 1] (1 = best), combines them with weights given as parameters (llm-d style:
scorers normalized, the weighting applied here, in one place, not by each scorer), turns the
combined score into traffic shares, publishes a hot-prefix map (prefix digest -> nodes that hold
it, best first) that the router honours before its weighted pick, per-priority weights, and the
ordered pools to spill over to when a call would otherwise be shed.

Formula, for each node ``i`` of the pool (``serving_i`` = warm, not draining, telemetry not stale)::

    s_queue   = 1 / (1 + queue_depth / queue_scale)
    s_running = 1 / (1 + running_requests / running_scale)
    s_tokens  = 1 / (1 + queued_prompt_tokens / max_batch_tokens)
    s_kv      = 1 - kv_cache_used_frac
    s_hbm     = hbm_free_gib / max_j(hbm_free_gib)                  (j over the pool's serving nodes)
    s_speed   = min(1, median_j(step_j) / step_i)   step = median tbt_p50_ms over speed_memory_ms
                                                     (1 when no figure yet)
    S_i       = sum_k w_k s_k / sum_k w_k                             if serving_i, else 0
    weight_i  = S_i ** alpha / sum_j S_j ** alpha
    by_priority[p]: nodes with S_i < min_score_by_priority[p] get 0 (unless that zeroes every node);
                    the rest weight S_i ** alpha_by_priority.get(p, alpha), normalized
    prefix_affinity[d] = nodes listing digest d in hot_prefixes with S_i >= affinity_keep_frac * max S,
                    s_speed >= affinity_min_speed and no failure since their last ok call,
                    sorted by S_i descending (node id breaks ties)
    headroom(pool) = mean S_i over its serving nodes
    proven(pool)   = its serving nodes that completed at least one call ok in the window (ok_w > 0,
                     router-observed outcomes, not the node's own telemetry)
    spill_to       = other pools serving the same model as this pool (PoolView.model) with a proven
                     node and spill_headroom >= spill_min_headroom, by spill_headroom descending
                     (pool id breaks ties), then the pools of other models that pass the same test,
                     ranked the same way; spill_headroom = mean S_i over the pool's proven nodes.
                     Another pool's scores are taken from the snapshot alone (its nodes' newest
                     step times stand in for the remembered medians, which are that pool's own
                     state), once per snapshot
    max_prompt_tokens = min over the pool's nodes' tensor-parallel degrees of the tokens one node's
                     KV cache holds, from the pool's model and GPU (:mod:`..prefill`; none when
                     either is unknown): the router keeps longer prompts on pools that hold them
    slo_prompt_tokens[p] = per priority class p (0-9), the longest prompt one node of the pool
                     prefills on its own within the class's TTFT SLO (``ctx.slo``, per model and
                     pool where the book says so; :func:`..prefill.prompt_tokens_within` at the
                     pool's fewest GPUs per node; none when the model or GPU is unknown): the
                     router moves a longer prompt to a pool of the same model in ``spill_to`` that
                     prefills it within the SLO (:mod:`fleetloop.router.pick`, step 5b)

Picker: a weighted random draw (``weighted-random``). Smooth weighted round robin (the router's
``round-robin``) was measured in its place (session 8) and not adopted. Within a tick the weights
are fixed and a random draw collides (k calls over n equal nodes share a node with probability
1 - n!/((n-k)! n^k): 50% for 4 calls over 10), so at light load with long prompts a call queues
behind another's prefill, the TTFT median rises over the prefill's own time and slo-predictive
keeps nodes for it; in turn, that goes away (long-prompt-light-load, 5 seeds: 0.50x -> 0.41x
classic's cost per successful task; stress geometric mean 0.688 -> 0.678). But on
cascade-degraded-gpu (an 8x slow H100, non-streaming calls) it lost priority-0 tasks against
classic on seeds 8 and 11 (-88 and -144, where the random draw wins +188 and +111), shipped pairs
meeting every target fell from 38 to 36 of 40, and burst-a100-2x lost 356 more tasks a seed on
average. Why the cascade turns (session 9): the router resets its round-robin credits whenever the
weights change, i.e. every tick, so each tick's first calls go to the top-weighted node, which is
the emptiest, and on a broken fleet the emptiest is often the broken one (seed 11: the 8x-slow H100,
its breaker left unenforced by the ejection cap, ranked first in 13 of 14 50-s windows from 600 s
and took 641 picks after 300 s against 14 under the draw, nearly all timing out). The router's
``least-outstanding`` (HAProxy ``balance leastconn``: fewest outstanding calls per unit of weight)
removes both the collisions and that herd (single seeds: long-prompt-light-load 19 and 21 0.44x and
0.38x classic; cascade 8 and 11 +215 and +102 priority-0 tasks), but costs burst-cold-nodes seed 10
nine priority-0 tasks against classic: better spread before the spike reads as less pressure, so
slo-predictive has one new 70B node warm at the spike instead of two, and a newly warm node draws
calls until it holds its weight's share (the breaker's slow-start ramp does not reach the
per-priority weights). So the draw stays.

Why a prompt limit: a prompt whose KV does not fit a node's cache fails on every node of that pool
however idle it is, and its retries fail the same way wherever the router's split sends them back
(research-long-context: llama-70b on one MI300X holds ~96k tokens, on two H200s ~344k; 100k-token
prompts sent to the MI300X pool lost their tasks after every retry). The figure is physics, not
load, so it is stated once per pool and tick and never learned from failures (a failure would cost
a task first). Failure mode: a node with FP8 KV or another memory setting holds a different
number of tokens than predicted (see :mod:`..prefill`); the router only acts on the figure while
another pool of an acceptable model holds the prompt.

Why a prefill figure per class: two pools of one model on different GPUs split its calls by
capacity, but a prompt's prefill time is its own FLOPs over the GPU's, so a long prompt on the
slower GPU misses a tight TTFT SLO on an idle node (autonomous-workflows: llama-8b with an 800 ms
SLO prefills ~7k tokens within it on an A100 and ~19k on an H100; every priority-0 call in the
TTFT p99 tail was a long prompt, or a short one queued behind it, on the A100 pool, and the p99
sat at 1.2-1.35 s, over classic's ~0.87 s). Moving only the prompts that miss for certain, only to
a pool where they can meet it, and only while that pool has room (``spill_to``) and the picked
node nothing queued, took the p99 to 0.72-0.85 s on all five seeds (classic 0.84-0.91 s) with the
same tasks, at 0.41-0.45x classic's cost per successful task (0.44-0.47x before); research-long-
context's p99 fell from 37-46 s to 30-35 s at 2-7% less cost, tasks within one of before
(``bench/results/prefill-fit-s14.md``). Moving every long prompt to the fastest pool
instead, even where it misses there too, or without the room test, concentrated research-long-
context's 30k-96k-token prompts on its H200 pool, which hit its maximum while the MI300X pool
shrank, and lost 2-6 tasks a seed to deadlines. The figure is a prediction for an idle node (the
whole prompt, no cached prefix): it overstates the prefill of a call whose prefix is cached, so it
moves a little more than needed, never less. Failure mode: a GPU slower than its datasheet
(throttled, degraded) prefills fewer tokens than its figure says, so the prompts in between stay
where they miss, as they did without the figure (the breaker and the speed score handle the node).

Spill-over rule, and why: a spilled call must be servable where it lands, so the router sends a
call only to a listed pool of a model the call accepts; the pool's own model comes first, and the
list is capped by the engine's envelope (``max_spill_pools``, 8), so whoever ranks first takes the
overflow. Another model's pools are listed for the router's model spill
(:mod:`fleetloop.router.pick`, step 6): a call that accepts that model and would be shed, or
would queue on a saturated node of this pool, goes to one of them whose picked node has nothing
queued and whose admission is not limiting new tasks. Why: on burst-cold-nodes the 70B pool's
new nodes take ~290 s to load, longer than the priority-0 copilot tasks' 180 s deadline, and
during the step its queued calls missed those deadlines while the 8B pool the tasks also accept
had room (seeds 9 and 12 lost 12 and 3 tasks against classic; ``bench/results/burst-s11.md``).
Moving calls alone is not enough: the preferred pool's autoscaler then sees less demand and
shrinks, and the other pool's room, now its only reserve, closes under the next spike
(cascade-degraded-gpu seed 7 fell from +187 to -26 tasks against classic). So each moved call's
outcome names the pool it was moved from (``routed_from``) and slo-predictive keeps sizing that
pool for it: the move bridges a cold start and does not replace capacity. Over both suites the two
together meet every burst-cold-nodes seed (+0 to +4 tasks against classic) and raise the
cascade-degraded-gpu seeds from +68..+335 to +166..+422 tasks; they cost most where another
model's pool is small (gpu-mix-cascade: 0.89 -> 0.94-0.97x classic's cost per success, its tasks
+14..+40 -> +37..+78; ``bench/results/burst-s12.md``). Since the new-task limit binds only on a
node with calls queued and the spill no longer skips a pool whose admission limits new tasks
(session 13), gpu-mix-cascade is at +443..+484 tasks and 0.87x (``bench/results/admission-s13.md``).
The price is the smaller model's answer for the calls moved, which the caller accepted by listing
it.

Telemetry alone is cheap to invent (a misconfigured scraper, or anyone who can write to the
telemetry topic): an invented pool or node reports itself idle and would rank first. Only
nodes the router has actually completed calls on (``ok_w``) count towards a pool's spill ranking,
so an unproven pool is never a spill target and unproven nodes in a real pool do not lift its
rank. Cost: a pool that served nothing in the last window (new, or idle with no traffic) is not
offered for spill until it serves a call; the router's own primary split across pools of a model
gives it its first calls.

``serving_i`` also needs telemetry younger than ``silent_after_ms``. A stale node scores 0 (stale
telemetry counts as saturated; when every warm node is stale they share evenly and the engine,
which zeroes stale nodes, fails open); a node that is not warm or is draining scores 0 (warm
weights are a gate: a cold or loading node cannot serve). ``alpha`` turns score gaps
into share gaps: with alpha 4 a node at half the score of another gets 1/16 of its share, which
moves traffic away from a filling node within one tick without sending everything to one node.

Inputs: per node ``age_ms``, ``consecutive_failures``, ``queue_depth``, ``running_requests``,
``queued_prompt_tokens``, ``max_batch_tokens``, ``kv_cache_used_frac``, ``hbm_free_gib``,
``tbt_p50_ms``, ``hot_prefixes``, ``weights_state``, ``draining``, ``stale``, ``ok_w``,
``gpu_count``; the pools' node lists, models and GPU types (for spill-over and the prompt limit).

Parameters (defaults, bounds; the reasoning behind each):

- ``w_queue`` 2.0, ``w_running`` 1.0, ``w_tokens`` 1.0, ``w_kv`` 1.0, ``w_hbm`` 0.25, ``w_speed``
  2.0 (each 0-100, at least one > 0): a waiting queue means the node is saturated (continuous
  batching admits everything until KV or ``max_num_seqs`` binds), so it weighs most together with
  a slow GPU; running requests and queued prompt tokens are the in-flight work a new call's prefill
  shares its iterations with; KV headroom predicts preemptions; HBM free (which includes the
  evictable prefix cache) weighs little so it does not fight prefix affinity.
- ``queue_scale`` 4 (>0, <=10 000): four waiting requests halve ``s_queue``.
- ``running_scale`` 16 (>0, <=10 000): sixteen sequences in flight halve ``s_running``; around
  there the prefill chunks of concurrent arrivals start to share iterations, each of which costs a
  large fraction of a second at the default 8192-token budget.
- ``s_tokens`` needs no parameter: one iteration's worth (``max_batch_tokens``) of queued prompt
  tokens halves it, since each such iteration delays a new call's first token by one iteration.
- ``alpha`` 4.0 (0.5-16), ``alpha_by_priority`` {"0": 6.0}, ``min_score_by_priority`` {"0": 0.5}
  (each score 0-1): priority 0 (the latency class) concentrates harder on good nodes and avoids
  the nodes scoring under 0.5, i.e. nearest saturation; other classes use the pool weights.
- ``affinity_keep_frac`` 0.5 (0-1): a holder keeps its prefix's calls while its score is at least
  half the best node's; below that the call takes the weighted pick and re-prefills elsewhere (a
  repeated 3 000-token prefix costs ~0.2 s of an H100x4 for llama-70b, less than queueing behind a
  saturated node).
- ``affinity_min_speed`` 0.5 (0-1): a holder stepping at less than half its pool's median speed (a
  degraded GPU, before the breaker ejects it) loses its prefixes' calls; so does a holder whose last
  call failed (a crashed node), so retries do not follow the prefix into the same hole.
- ``speed_memory_ms`` 20 000 (0-600 000): telemetry carries a step time only when an iteration ended
  in the interval; the median of the last 20 s is a steadier speed figure than the last report.
- ``silent_after_ms`` 3 000 (0-600 000): three missed one-second reports and the node scores 0,
  before the engine's stale threshold (5 s) zeroes it: a crashed node answers every call with an
  error until then.
- ``spill_min_headroom`` 0.5 (0-1): only pools whose average node is at least half free are offered
  as spill targets, so overflow does not topple the next pool.

Trade-offs: prefix affinity saves prefill compute and TTFT on every call after a task's first, but
pins a task to one node; the keep fraction releases it when that node fills. Weights are refreshed
once a tick from one-second telemetry: within a tick the router's weighted pick spreads calls, it
does not chase the least loaded node per call (that would herd). Same-model spill-over only acts
when the admission section would shed a call on the preferred pool; another model's pool also
takes a call that would queue (above), while its nodes are at least half free on average and the
node picked there has nothing queued (a call that would queue there too gains nothing from the
move) and admits it.

Failure mode: scores lag load by up to one tick plus one telemetry interval; a burst within that
time lands by the old weights. A node whose ``hot_prefixes`` is stale keeps attracting affinity
calls only while it still scores well; a node that stops reporting is zeroed (stale) by this
algorithm and the engine. If every warm node is stale they share evenly and the engine fails open.
State: the remembered step times, per node, pruned to ``speed_memory_ms`` every tick, kept as one
array per pool (:class:`fleetloop.policies.memory.PoolMemory`; a checkpoint of the older per-node
form is read and converted). Scores are computed as columns, with the same operations in the same
order as the per-node formula above (tested bit for bit): the part that depends on the snapshot
alone (the queue, running, tokens, KV and HBM scorers, each pool's ``max hbm_free_gib``) and the
spill headroom of every pool are computed once per snapshot over the whole fleet's columns
(:mod:`fleetloop.policies.columns`); each pool's tick adds its speed scorer from its own memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Self

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from fleetloop.policies.base import (
    FleetSnapshot,
    NodeView,
    Params,
    PolicyContext,
    PolicyResult,
    PoolView,
    r6,
    r6_array,
)
from fleetloop.policies.columns import FleetColumns, Floats, Ints, fleet_columns, segment_medians
from fleetloop.policies.memory import PoolMemory
from fleetloop.policies.pool_figures import records, row_ids
from fleetloop.policies.prefill import max_prompt_tokens, prompt_tokens_within
from fleetloop.policies.slo import SloBook
from fleetloop.schemas.base import MAX_FIGURE, assemble
from fleetloop.schemas.decisions import Picker, RoutingDecision

COMPONENTS: tuple[str, ...] = ("queue", "running", "tokens", "kv", "hbm", "speed")


class CacheAwareParams(Params):
    w_queue: float = Field(default=2.0, ge=0.0, le=100.0)
    w_running: float = Field(default=1.0, ge=0.0, le=100.0)
    w_tokens: float = Field(default=1.0, ge=0.0, le=100.0)
    w_kv: float = Field(default=1.0, ge=0.0, le=100.0)
    w_hbm: float = Field(default=0.25, ge=0.0, le=100.0)
    w_speed: float = Field(default=2.0, ge=0.0, le=100.0)
    queue_scale: float = Field(default=4.0, gt=0.0, le=10_000.0)
    running_scale: float = Field(default=16.0, gt=0.0, le=10_000.0)
    alpha: float = Field(default=4.0, ge=0.5, le=16.0)
    alpha_by_priority: dict[str, float] = Field(default_factory=lambda: {"0": 6.0})
    min_score_by_priority: dict[str, float] = Field(default_factory=lambda: {"0": 0.5})
    affinity_keep_frac: float = Field(default=0.5, ge=0.0, le=1.0)
    affinity_min_speed: float = Field(default=0.5, ge=0.0, le=1.0)
    speed_memory_ms: int = Field(default=20_000, ge=0, le=600_000)
    silent_after_ms: int = Field(default=3_000, ge=0, le=600_000)
    spill_min_headroom: float = Field(default=0.5, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if sum(self.component_weights().values()) <= 0:
            raise ValueError("at least one scorer weight (w_*) must be > 0")
        for name, table, lo, hi in (
            ("alpha_by_priority", self.alpha_by_priority, 0.5, 16.0),
            ("min_score_by_priority", self.min_score_by_priority, 0.0, 1.0),
        ):
            for key, value in table.items():
                if not key.isdigit():
                    raise ValueError(f"{name}: priority keys are non-negative integers, got {key!r}")
                if not lo <= value <= hi:
                    raise ValueError(f"{name}[{key}]: {value} is outside [{lo}, {hi}]")
        return self

    def component_weights(self) -> dict[str, float]:
        return {
            "queue": self.w_queue,
            "running": self.w_running,
            "tokens": self.w_tokens,
            "kv": self.w_kv,
            "hbm": self.w_hbm,
            "speed": self.w_speed,
        }


# node id -> the (ts_ms, tbt_p50_ms) figures seen within ``speed_memory_ms``, oldest first: the plain
# form (:func:`remember`); the algorithm keeps the same figures as one :class:`PoolMemory` per pool
# and still reads this form from a checkpoint written before it.
State = Mapping[str, tuple[tuple[int, float], ...]]


def as_memory(state: PoolMemory | State) -> PoolMemory:
    """The state as a :class:`PoolMemory` (converting the per-node form of older checkpoints)."""
    if isinstance(state, PoolMemory):
        return state
    ids = tuple(sorted(state))
    slots = max((len(v) for v in state.values()), default=0)
    ts = np.full((len(ids), slots), -1, dtype=np.int64)
    vals = np.full((len(ids), slots, 1), np.nan)
    for r, node_id in enumerate(ids):
        for k, (t, v) in enumerate(state[node_id]):
            ts[r, k] = t
            vals[r, k, 0] = v
    return PoolMemory(ids, ts, vals)


def remember_pool(
    state: PoolMemory | State, now: int, params: CacheAwareParams, pool: tuple[NodeView, ...]
) -> PoolMemory:
    """:func:`remember` for one pool, as arrays (what the algorithm keeps)."""
    rows: list[int] = []
    figs: list[tuple[float | None, ...]] = []
    for r, n in enumerate(pool):
        tbt = n.tbt_p50_ms
        if tbt is not None and tbt > 0 and n.weights_state == "warm" and not n.draining and not n.stale:
            rows.append(r)
            figs.append((float(tbt),))
    ids = tuple(n.node_id for n in pool)
    return as_memory(state).advance(ids, now, params.speed_memory_ms, rows, figs)


def _remember_rows(
    state: PoolMemory | State,
    now: int,
    params: CacheAwareParams,
    ids: tuple[str, ...],
    *,
    cols: FleetColumns,
    rows: slice,
) -> PoolMemory:
    """:func:`remember_pool` from the pool's rows ``rows`` of the snapshot's columns (the same
    figures: a step time > 0 of a warm node, not draining, not stale)."""
    tbt = cols.floats("tbt_p50_ms")[rows]
    with np.errstate(invalid="ignore"):
        keep = (tbt > 0) & cols.warm[rows] & ~cols.stale[rows]
    return as_memory(state).advance(
        ids, now, params.speed_memory_ms, np.flatnonzero(keep), tbt[keep][:, None]
    )


def _pool_scores(
    snap: FleetSnapshot,
    ids: Sequence[str],
    params: CacheAwareParams,
    memory: PoolMemory,
    *,
    cols: FleetColumns,
    rows: slice,
) -> tuple[dict[str, float], dict[str, float]]:
    """``_scored_columns(pool, params, pool_steps(memory))`` from the pool's rows ``rows`` of the
    snapshot's columns: the snapshot-only terms come from :func:`_fleet_load` (computed once for
    the whole fleet), the speed scorer from the memory's median array. The same doubles."""
    if not ids:
        return {}, {}
    load = _fleet_load(snap, cols, params)
    med, ok = memory.median_arrays(1)
    own = np.where(ok[:, 0], med[:, 0], np.nan)
    steps = own[load.live[rows]]
    xs = np.sort(steps[~np.isnan(steps)]).tolist()
    score, speed = _with_speed(
        params,
        load.acc[rows],
        can_serve=load.can_serve[rows],
        own=own,
        tbt_median=_median_sorted(xs) if xs else np.nan,
    )
    return dict(zip(ids, score.tolist(), strict=True)), dict(zip(ids, speed.tolist(), strict=True))


def pool_steps(memory: PoolMemory) -> dict[str, float | None]:
    """Node id -> :func:`step_ms` (the median remembered step time, or None), for the whole pool."""
    meds, oks = memory.medians(1)
    return {i: (m[0] if ok[0] else None) for i, m, ok in zip(memory.node_ids, meds, oks, strict=True)}


def serving(node: NodeView, silent_after_ms: int | None = None) -> bool:
    """Warm, not draining, not stale and, given ``silent_after_ms``, heard from within it."""
    fresh = silent_after_ms is None or node.age_ms <= silent_after_ms
    return node.warm and not node.stale and fresh


def remember(
    state: State, snap: FleetSnapshot, params: CacheAwareParams, pool: tuple[NodeView, ...] | None = None
) -> dict[str, tuple[tuple[int, float], ...]]:
    """Every serving node's step-time figures within ``speed_memory_ms`` (a node reports one only
    when an iteration ends in the interval, and a long decode run is one iteration to the books).

    With ``pool`` (as the algorithm calls it) only that pool's nodes are remembered: a pool's state
    holds its own nodes, never the whole fleet's."""
    now = snap.now_ms
    memory_ms = params.speed_memory_ms
    out: dict[str, tuple[tuple[int, float], ...]] = {}
    for n in pool if pool is not None else snap.nodes.values():
        # The memory is in ascending time (each tick appends ``now`` after dropping everything at
        # or after it): what ``0 < now - ts < memory_ms`` keeps is one slice.
        obs = state.get(n.node_id, ())
        lo, hi = 0, len(obs)
        while lo < hi and now - obs[lo][0] >= memory_ms:
            lo += 1
        while hi > lo and obs[hi - 1][0] >= now:
            hi -= 1
        kept = obs[lo:hi] if lo or hi < len(obs) else obs
        tbt = n.tbt_p50_ms
        if tbt is not None and tbt > 0 and n.weights_state == "warm" and not n.draining and not n.stale:
            kept = (*kept, (now, float(tbt)))
        if kept:
            out[n.node_id] = kept
    return out


def step_ms(memory: State, node_id: str) -> float | None:
    """The median remembered step time of a node, or None."""
    xs = sorted([v for _, v in memory.get(node_id, ())])
    return _median_sorted(xs) if xs else None


def _median_sorted(xs: list[float]) -> float:
    """``statistics.median`` of a sorted, non-empty list (the same arithmetic, less overhead)."""
    n = len(xs)
    mid = n // 2
    return xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2


@dataclass(frozen=True, slots=True)
class _PoolFigures:
    """What every node's scorers share within one pool and tick: computed once, not per node."""

    hbm_max: float
    tbt_median: float | None
    steps: Mapping[str, float | None]


def _pool_figures(pool: tuple[NodeView, ...], steps: Mapping[str, float | None]) -> _PoolFigures:
    live = [n for n in pool if serving(n)]
    hbm_max = max((n.hbm_free_gib for n in live), default=0.0)
    tbts = sorted([t for n in live if (t := steps.get(n.node_id)) is not None])
    return _PoolFigures(hbm_max, _median_sorted(tbts) if tbts else None, steps)


def _components(node: NodeView, fig: _PoolFigures, params: CacheAwareParams) -> dict[str, float]:
    own = fig.steps.get(node.node_id)
    tbt_median = fig.tbt_median
    speed = min(1.0, tbt_median / own) if tbt_median is not None and own is not None else 1.0
    batch = max(1, node.max_batch_tokens)
    hbm_max = fig.hbm_max
    return {
        "queue": 1.0 / (1.0 + max(0, node.queue_depth) / params.queue_scale),
        "running": 1.0 / (1.0 + max(0, node.running_requests) / params.running_scale),
        "tokens": 1.0 / (1.0 + max(0, node.queued_prompt_tokens) / batch),
        "kv": min(1.0, max(0.0, 1.0 - node.kv_cache_used_frac)),
        "hbm": min(1.0, max(0.0, node.hbm_free_gib / hbm_max)) if hbm_max > 0 else 1.0,
        "speed": speed,
    }


def components(
    node: NodeView, pool: tuple[NodeView, ...], params: CacheAwareParams, memory: State | None = None
) -> dict[str, float]:
    """The six normalized scorers of one node, each in [0, 1] (1 = best), against its pool."""
    memory = memory or {}
    steps = {n.node_id: step_ms(memory, n.node_id) for n in (*pool, node)}
    return _components(node, _pool_figures(pool, steps), params)


def combine(parts: Mapping[str, float], params: CacheAwareParams) -> float:
    """The weighted mean of the scorers: in [0, 1] when every scorer is."""
    weights = params.component_weights()
    total = sum(weights.values())
    return sum(weights[k] * parts[k] for k in COMPONENTS) / total


def _scored(
    pool: tuple[NodeView, ...], params: CacheAwareParams, steps: Mapping[str, float | None]
) -> tuple[dict[str, float], dict[str, float]]:
    """(node id -> combined score S_i, 0 for nodes that cannot serve; node id -> s_speed)."""
    fig = _pool_figures(pool, steps)
    scores: dict[str, float] = {}
    speeds: dict[str, float] = {}
    # ``_components`` and ``combine`` inlined (the same operations in the same order: this runs for
    # every node twice a tick).
    wq, wr, wt, wk, wh, ws = (
        params.w_queue, params.w_running, params.w_tokens, params.w_kv, params.w_hbm, params.w_speed,
    )  # fmt: skip
    total = sum(params.component_weights().values())
    queue_scale, running_scale, silent_after = (
        params.queue_scale,
        params.running_scale,
        params.silent_after_ms,
    )
    tbt_median, hbm_max, own_steps = fig.tbt_median, fig.hbm_max, fig.steps
    for n in pool:
        node_id = n.node_id
        own = own_steps.get(node_id)
        speed = min(1.0, tbt_median / own) if tbt_median is not None and own is not None else 1.0
        speeds[node_id] = speed
        if n.weights_state != "warm" or n.draining or n.stale or n.age_ms > silent_after:
            scores[node_id] = 0.0
            continue
        parts = (
            wq * (1.0 / (1.0 + max(0, n.queue_depth) / queue_scale)),
            wr * (1.0 / (1.0 + max(0, n.running_requests) / running_scale)),
            wt * (1.0 / (1.0 + max(0, n.queued_prompt_tokens) / max(1, n.max_batch_tokens))),
            wk * min(1.0, max(0.0, 1.0 - n.kv_cache_used_frac)),
            wh * (min(1.0, max(0.0, n.hbm_free_gib / hbm_max)) if hbm_max > 0 else 1.0),
            ws * speed,
        )
        scores[node_id] = sum(parts) / total
    return scores, speeds


def _scored_columns(
    pool: tuple[NodeView, ...], params: CacheAwareParams, steps: Mapping[str, float | None]
) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`_scored` over the pool's nodes as columns: the same operations on the same doubles in
    the same order (each scorer, then ``((((0 + p0) + p1) + ...) + p5) / total`` as ``sum`` adds),
    so the same bits; ``tests/policies/test_fast_paths.py`` holds it to :func:`_scored`."""
    if not pool:
        return {}, {}
    fig = _pool_figures(pool, steps)
    ids = [n.node_id for n in pool]
    if fig.tbt_median is not None:
        own = np.array([np.nan if (v := fig.steps.get(i)) is None else v for i in ids], dtype=np.float64)
    else:
        own = np.full(len(ids), np.nan)
    silent_after = params.silent_after_ms
    can_serve = np.array(
        [
            n.weights_state == "warm" and not n.draining and not n.stale and n.age_ms <= silent_after
            for n in pool
        ]
    )
    f = np.float64
    score, speed = _score_rows(
        params,
        queue=np.array([n.queue_depth for n in pool], dtype=f),
        running=np.array([n.running_requests for n in pool], dtype=f),
        tokens=np.array([n.queued_prompt_tokens for n in pool], dtype=f),
        batch=np.array([n.max_batch_tokens for n in pool], dtype=f),
        kv=np.array([n.kv_cache_used_frac for n in pool], dtype=f),
        hbm=np.array([n.hbm_free_gib for n in pool], dtype=f),
        can_serve=can_serve,
        own=own,
        tbt_median=np.nan if fig.tbt_median is None else fig.tbt_median,
        hbm_max=fig.hbm_max,
    )
    return dict(zip(ids, score.tolist(), strict=True)), dict(zip(ids, speed.tolist(), strict=True))


def _score_rows(
    params: CacheAwareParams,
    *,
    queue: Floats,
    running: Floats,
    tokens: Floats,
    batch: Floats,
    kv: Floats,
    hbm: Floats,
    can_serve: npt.NDArray[np.bool_],
    own: Floats,
    tbt_median: Floats | float,
    hbm_max: Floats | float,
) -> tuple[Floats, Floats]:
    """(S_i, s_speed) for rows of nodes, each row against its pool's ``tbt_median`` (NaN: none)
    and ``hbm_max`` (scalars for one pool, or one value per row for several pools at once). The
    operations of :func:`_scored`, elementwise, in its order, so the same doubles."""
    acc = _load_terms(
        params, queue=queue, running=running, tokens=tokens, batch=batch, kv=kv, hbm=hbm, hbm_max=hbm_max
    )
    return _with_speed(params, acc, can_serve=can_serve, own=own, tbt_median=tbt_median)


def _load_terms(
    params: CacheAwareParams,
    *,
    queue: Floats,
    running: Floats,
    tokens: Floats,
    batch: Floats,
    kv: Floats,
    hbm: Floats,
    hbm_max: Floats | float,
) -> Floats:
    """``0 + w_queue s_queue + ... + w_hbm s_hbm``: the weighted sum up to the speed scorer, added
    in :func:`_scored`'s order. It depends on the snapshot alone (not on the pool's memory)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        acc = 0.0 + params.w_queue * (1.0 / (1.0 + np.maximum(queue, 0.0) / params.queue_scale))
        acc = acc + params.w_running * (1.0 / (1.0 + np.maximum(running, 0.0) / params.running_scale))
        acc = acc + params.w_tokens * (1.0 / (1.0 + np.maximum(tokens, 0.0) / np.maximum(batch, 1.0)))
        acc = acc + params.w_kv * np.minimum(1.0, np.maximum(0.0, 1.0 - kv))
        # A node that cannot serve is not in ``hbm_max`` and may overflow here; it scores 0 later.
        hbm_term = np.where(
            hbm_max > 0, params.w_hbm * np.minimum(1.0, np.maximum(0.0, hbm / hbm_max)), params.w_hbm * 1.0
        )
        return acc + hbm_term


def _with_speed(
    params: CacheAwareParams,
    acc: Floats,
    *,
    can_serve: npt.NDArray[np.bool_],
    own: Floats,
    tbt_median: Floats | float,
) -> tuple[Floats, Floats]:
    """Add the speed scorer to :func:`_load_terms` and divide by the weights' sum: (S_i, s_speed)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        speed = np.where(np.isnan(own) | np.isnan(tbt_median), 1.0, np.minimum(1.0, tbt_median / own))
    total = sum(params.component_weights().values())
    return np.where(can_serve, (acc + params.w_speed * speed) / total, 0.0), speed


@dataclass(frozen=True, slots=True, eq=False)
class _FleetLoad:
    """The snapshot-only part of every node's score, for the whole fleet (built once per snapshot
    and params): :func:`_load_terms` against each pool's ``hbm_max``, and whether the node can serve."""

    params: CacheAwareParams
    acc: Floats
    can_serve: npt.NDArray[np.bool_]
    live: npt.NDArray[np.bool_]


def _fleet_load(snap: FleetSnapshot, cols: FleetColumns, params: CacheAwareParams) -> _FleetLoad:
    key = ("cache-aware.load", id(params))
    found: _FleetLoad | None = snap.memo.get(key)
    if found is None or found.params is not params:
        live = cols.warm & ~cols.stale
        hbm = cols.floats("hbm_free_gib")
        hbm_max: Floats = np.zeros(0)
        if len(cols):
            per_pool = np.maximum.reduceat(np.where(live, hbm, -np.inf), cols.starts)
            hbm_max = np.where(np.isneginf(per_pool), 0.0, per_pool)[cols.pool_of]
        acc = _load_terms(
            params,
            queue=cols.floats("queue_depth"),
            running=cols.floats("running_requests"),
            tokens=cols.floats("queued_prompt_tokens"),
            batch=cols.floats("max_batch_tokens"),
            kv=cols.floats("kv_cache_used_frac"),
            hbm=hbm,
            hbm_max=hbm_max,
        )
        can_serve = live & (cols.ints("age_ms") <= params.silent_after_ms)
        found = snap.memo[key] = _FleetLoad(params, acc, can_serve, live)
    return found


def pool_scores(
    snap: FleetSnapshot, pool_id: str, params: CacheAwareParams, memory: State | None = None
) -> dict[str, float]:
    """Node id -> combined score S_i for the pool's nodes; 0 for nodes that cannot serve."""
    pool = snap.pool_nodes(pool_id)
    memory = memory or {}
    return _scored(pool, params, {n.node_id: step_ms(memory, n.node_id) for n in pool})[0]


def shares(scores: Mapping[str, float], alpha: float) -> dict[str, float]:
    """``tests.oracles.policies.shares_plain`` with the quotients and their rounding as array operations
    (the same doubles: one IEEE division each, :func:`r6_array`); the powers and the sum stay Python's,
    in node order, as the plain form computes them."""
    keys = sorted(scores)
    powered = [v**alpha if v > 0 else 0.0 for v in (scores[k] for k in keys)]
    total = sum(powered)
    if not total > 0:
        return dict.fromkeys(keys, 0.0)
    return dict(zip(keys, r6_array(np.array(powered, dtype=np.float64) / total).tolist(), strict=True))


def headroom(scores: Mapping[str, float], snap: FleetSnapshot, pool_id: str) -> float | None:
    """Mean score over the pool's serving nodes; None when none can serve."""
    live = [scores[n.node_id] for n in snap.pool_nodes(pool_id) if scores[n.node_id] > 0]
    return sum(live) / len(live) if live else None


def proven(node: NodeView) -> bool:
    """The router completed at least one call on this node in the window: it exists beyond its
    own telemetry."""
    return node.ok_w > 0


def pool_max_prompt(pool: PoolView | None, gpu_counts: Iterable[int]) -> int | None:
    """The longest prompt every node of the pool holds in its KV cache
    (:func:`fleetloop.policies.prefill.max_prompt_tokens` of the pool's model and GPU at each
    tensor-parallel degree its nodes report); None without nodes or for an unknown model or GPU."""
    degrees = set(gpu_counts)
    if pool is None or not degrees:
        return None
    fits = [max_prompt_tokens(pool.model, pool.gpu_type, c) for c in sorted(degrees)]
    return None if any(f is None for f in fits) else min(f for f in fits if f is not None)


PRIORITIES = tuple(range(10))  # the schema's priority classes (``priority`` 0-9)


def pool_slo_prompt(
    pool: PoolView | None, pool_id: str, gpu_counts: Iterable[int], slo: SloBook
) -> dict[str, int]:
    """Per priority class, the longest prompt every node of the pool prefills on its own within that
    class's TTFT SLO (:func:`fleetloop.policies.prefill.prompt_tokens_within` of the pool's model and
    GPU at each tensor-parallel degree its nodes report, the smallest); empty without nodes or for an
    unknown model or GPU."""
    degrees = sorted(set(gpu_counts))
    if pool is None or not degrees:
        return {}
    out: dict[str, int] = {}
    for p in PRIORITIES:
        ms = slo.target(p, model=pool.model, pool=pool_id).ttft_ms
        fits = [prompt_tokens_within(pool.model, pool.gpu_type, c, ms) for c in degrees]
        if any(f is None for f in fits):
            return {}
        out[str(p)] = min(f for f in fits if f is not None)
    return out


def fleet_headroom(snap: FleetSnapshot, params: CacheAwareParams) -> Mapping[str, float | None]:
    """``tests.oracles.policies.fleet_headroom_plain`` for every pool at once, over the snapshot's
    fleet-wide columns (:func:`fleetloop.policies.columns.fleet_columns`): each scorer is one array
    operation over the whole fleet, each pool's step-time median one segment median, so the fleet costs
    a few dozen numpy calls instead of a few dozen per pool. The same operations on the same doubles, so
    the same bits (``tests/unit/test_fast_columns.py``); the means are Python sums over each pool's
    proven nodes in node order, as the plain form adds them."""
    key = ("cache-aware.fleet_headroom", id(params))
    memo = snap.memo.get(key)
    found: Mapping[str, float | None] | None = memo[1] if memo is not None and memo[0] is params else None
    if found is None:
        cols = fleet_columns(snap)
        out: dict[str, float | None] = dict.fromkeys(sorted(snap.pools))
        if len(cols):
            load = _fleet_load(snap, cols, params)
            tbt = cols.floats("tbt_p50_ms")
            with np.errstate(invalid="ignore"):
                step = np.where(load.live & (tbt > 0), tbt, np.nan)
            tbt_median, _ = segment_medians(step, cols.pool_of, len(cols.pool_ids))
            scores, _ = _with_speed(
                params, load.acc, can_serve=load.can_serve, own=step, tbt_median=tbt_median[cols.pool_of]
            )
            take = (scores > 0) & (cols.ints("ok_w") > 0)
            # Each pool's sum over all its rows, the others as +0.0: the same double as the sum over
            # the taken ones (adding +0.0 to a sum of values > 0 leaves it as it is).
            values = np.where(take, scores, 0.0).tolist()
            counts = np.add.reduceat(take.astype(np.int64), cols.starts).tolist()
            for pool_id, count in zip(cols.pool_ids, counts, strict=True):
                lo, hi = cols.bounds[pool_id]
                out[pool_id] = sum(values[lo:hi]) / count if count else None
        snap.memo[key] = (params, out)
        found = out
    return found


def spill_targets(snap: FleetSnapshot, params: CacheAwareParams, pool_id: str) -> tuple[str, ...]:
    """``tests.oracles.policies.spill_targets_plain`` without a pass over every pool per pool (pools
    squared per tick): the model's ranked candidates are sorted once per snapshot and model, and each
    pool drops itself from them (removing one entry keeps a sorted list sorted)."""
    own_pool = snap.pools.get(pool_id)
    model = own_pool.model if own_pool is not None else ""
    if not model:
        return ()
    ranked = _ranked(snap, params, model)
    return tuple(p for p in ranked if p != pool_id) if pool_id in ranked else ranked


def _ranked(snap: FleetSnapshot, params: CacheAwareParams, model: str) -> tuple[str, ...]:
    """The pools of ``model`` with at least ``spill_min_headroom``, by headroom descending (pool id
    breaks ties), then the other models' pools with that headroom, likewise; once per snapshot and
    model."""
    key = ("cache-aware.spill", id(params), model)
    memo = snap.memo.get(key)
    ranked: tuple[str, ...] | None = memo[1] if memo is not None and memo[0] is params else None
    if ranked is None:
        pools = snap.pools
        floor = params.spill_min_headroom
        able = sorted(
            (-h, other) for other, h in fleet_headroom(snap, params).items() if h is not None and h >= floor
        )
        ranked = tuple(p for _, p in able if pools[p].model == model) + tuple(
            p for _, p in able if pools[p].model != model
        )
        snap.memo[key] = (params, ranked)
    return ranked


class CacheAware:
    name = "cache-aware"
    section = "routing"
    Params = CacheAwareParams

    def initial_state(self) -> PoolMemory:
        return PoolMemory.empty(1)

    def decide(
        self, snap: FleetSnapshot, params: CacheAwareParams, state: PoolMemory | State, ctx: PolicyContext
    ) -> PolicyResult[PoolMemory]:
        # The pool's rows of the snapshot's columns; a node's view is read only in the rare case
        # that no node scores (the even split below).
        cols = fleet_columns(snap)
        lo, hi = cols.bounds.get(ctx.pool_id, (0, 0))
        rows = slice(lo, hi)
        ids = tuple(row_ids(snap)[lo:hi])
        memory = _remember_rows(state, snap.now_ms, params, ids, cols=cols, rows=rows)
        scores, speeds = _pool_scores(snap, ids, params, memory, cols=cols, rows=rows)
        weights = shares(scores, params.alpha)
        best = max(scores.values(), default=0.0)
        reason = "cache-aware"
        if best <= 0:
            # Every warm node is stale (saturated): even shares over them; the engine zeroes stale
            # nodes and fails open, so the router still has somewhere to send calls.
            pool = snap.pool_nodes(ctx.pool_id)
            warm = [n.node_id for n in pool if n.warm]
            weights = {n.node_id: (r6(1.0 / len(warm)) if n.node_id in warm else 0.0) for n in pool}
            reason = "all-stale" if warm else "no-warm-node"

        by_priority: dict[str, dict[str, float]] = {}
        for cls in sorted(set(params.alpha_by_priority) | set(params.min_score_by_priority), key=int):
            floor = params.min_score_by_priority.get(cls, 0.0)
            kept = {k: v for k, v in scores.items() if v >= floor and v > 0}
            if not kept:
                kept = dict(scores)
            cls_weights = shares(kept, params.alpha_by_priority.get(cls, params.alpha))
            if sum(cls_weights.values()) > 0:
                by_priority[cls] = {n: cls_weights.get(n, 0.0) for n in sorted(scores)}

        holders: dict[str, list[str]] = {}
        keep_at = params.affinity_keep_frac * best
        min_speed = params.affinity_min_speed
        # A holder keeps its prefixes' calls while it scores at least keep_at and steps at least
        # min_speed, unless its last call failed (a retry takes the weighted pick, not the same
        # node). Visiting holders best first (score descending, node id) lists every digest's holders
        # in that order already: one sort per pool instead of one per digest.
        streaks = cols.ints("consecutive_failures")[rows].tolist()
        tels = records(cols)
        for _, node_id, r in sorted(
            (-s, node_id, r)
            for r, (node_id, streak) in enumerate(zip(ids, streaks, strict=True))
            if streak <= 0 and (s := scores[node_id]) > 0 and s >= keep_at and speeds[node_id] >= min_speed
        ):
            for digest in tels[lo + r].hot_prefixes:
                holders.setdefault(digest, []).append(node_id)
        affinity = {d: tuple(held) for d, held in sorted(holders.items())}

        # Mean score over the pool's serving nodes (:func:`headroom`, in the pool's node order).
        live_scores = [v for v in scores.values() if v > 0]
        own = sum(live_scores) / len(live_scores) if live_scores else None
        spill_to = spill_targets(snap, params, ctx.pool_id)
        degrees = cols.ints("gpu_count")[rows].tolist()
        fit = pool_max_prompt(snap.pools.get(ctx.pool_id), degrees)
        slo_fit = pool_slo_prompt(snap.pools.get(ctx.pool_id), ctx.pool_id, degrees, ctx.slo)

        stale = cols.stale[rows]
        n_serving = int((cols.warm[rows] & ~stale).sum())
        decision = _routing_decision(
            ctx.pool_id,
            weights,
            reason,
            {
                "nodes": float(len(ids)),
                "serving_nodes": float(n_serving),
                "stale_nodes": float(int(stale.sum())),
                "best_score": r6(best),
                "headroom": r6(own) if own is not None else 0.0,
                "hot_prefixes": float(len(affinity)),
                "spill_pools": float(len(spill_to)),
            },
            by_priority,
            affinity,
            spill_to,
            fit,
            slo_fit,
        )
        diagnostics = {"headroom": r6(own) if own is not None else 0.0, "hot_prefixes": float(len(affinity))}
        return PolicyResult(decisions=(decision,), state=memory, diagnostics=diagnostics)

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: CacheAwareParams,
        states: Sequence[PoolMemory | State],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[PoolMemory]]:
        """Equal, element for element and bit for bit (decisions, state, diagnostics), to
        ``[self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``: every pool of
        the batch at once over the snapshot's columns (:func:`_decide_pools`)."""
        return _decide_pools(self, snap, params, states, ctxs)


# The router's per-call pick among the weighted nodes (see "Picker" above).
PICKER: Picker = "weighted-random"

_ROUTING_FIELDS = (
    "entity", "reason", "inputs", "kind", "pool_id", "weights", "picker", "by_priority", "prefix_affinity",
    "spill_to", "max_prompt_tokens", "slo_prompt_tokens",
)  # fmt: skip
assert tuple(RoutingDecision.model_fields) == _ROUTING_FIELDS  # ``_routing_decision`` lists them in order


def _within(values: Iterable[float], lo: float) -> bool:
    return all(lo <= v <= MAX_FIGURE for v in values)  # False for NaN


def _routing_decision(  # noqa: PLR0917 (the decision's fields, in order)
    pool_id: str,
    weights: dict[str, float],
    reason: str,
    inputs: dict[str, float],
    by_priority: dict[str, dict[str, float]],
    affinity: dict[str, tuple[str, ...]],
    spill_to: tuple[str, ...],
    max_prompt_tokens: int | None = None,
    slo_prompt_tokens: dict[str, int] | None = None,
) -> RoutingDecision:
    """The pool's decision, assembled without validation when every figure is within the schema's
    bounds (ids and digests come from validated telemetry, the tick and the snapshot's pools):
    validating ~50 nodes' weights, classes and prefixes costs more than computing them. Anything
    out of bounds goes through validation and fails there, as before."""
    given: dict[str, object] = {
        "entity": f"pool/{pool_id}",
        "pool_id": pool_id,
        "weights": weights,
        "reason": reason,
        "inputs": inputs,
        "by_priority": by_priority,
        "prefix_affinity": affinity,
        "spill_to": spill_to,
    }
    if max_prompt_tokens is not None:  # set only when known, as validation would record it
        given["max_prompt_tokens"] = max_prompt_tokens
    if slo_prompt_tokens:
        given["slo_prompt_tokens"] = slo_prompt_tokens
    if (
        reason
        and _within(inputs.values(), -MAX_FIGURE)
        and _within(weights.values(), 0.0)
        and all(_within(ws.values(), 0.0) for ws in by_priority.values())
    ):
        return _assembled(
            pool_id, weights, reason, inputs, by_priority, affinity, spill_to, max_prompt_tokens,
            slo_prompt_tokens or {},
        )  # fmt: skip
    return RoutingDecision.model_validate(given)


_GIVEN = frozenset(
    (
        "entity",
        "pool_id",
        "weights",
        "reason",
        "inputs",
        "by_priority",
        "prefix_affinity",
        "spill_to",
    )
)
_GIVEN_FIT = _GIVEN | {"max_prompt_tokens"}
_GIVEN_SETS = {
    (False, False): set(_GIVEN),
    (True, False): set(_GIVEN_FIT),
    (False, True): set(_GIVEN | {"slo_prompt_tokens"}),
    (True, True): set(_GIVEN_FIT | {"slo_prompt_tokens"}),
}


def _assembled(  # noqa: PLR0917 (the decision's fields, in order)
    pool_id: str,
    weights: dict[str, float],
    reason: str,
    inputs: dict[str, float],
    by_priority: dict[str, dict[str, float]],
    affinity: dict[str, tuple[str, ...]],
    spill_to: tuple[str, ...],
    max_prompt_tokens: int | None,
    slo_prompt_tokens: dict[str, int],
) -> RoutingDecision:
    """The decision of figures already known to be within the schema's bounds, not validated again
    (its fields set as validation records them: ``max_prompt_tokens`` and ``slo_prompt_tokens``
    only when known)."""
    values: dict[str, object] = {
        "entity": f"pool/{pool_id}",
        "reason": reason,
        "inputs": inputs,
        "kind": "routing",
        "pool_id": pool_id,
        "weights": weights,
        "picker": PICKER,
        "by_priority": by_priority,
        "prefix_affinity": affinity,
        "spill_to": spill_to,
        "max_prompt_tokens": max_prompt_tokens,
        "slo_prompt_tokens": slo_prompt_tokens,
    }
    given = _GIVEN_SETS[(max_prompt_tokens is not None, bool(slo_prompt_tokens))]
    return assemble(RoutingDecision, values, set(given))


# -- every pool of a batch at once ---------------------------------------------------------------


def _decide_pools(
    algo: CacheAware,
    snap: FleetSnapshot,
    params: CacheAwareParams,
    states: Sequence[PoolMemory | State],
    ctxs: Sequence[PolicyContext],
) -> list[PolicyResult[PoolMemory]]:
    """:meth:`CacheAware.decide` for every pool of the batch: segment operations over the whole
    fleet's columns instead of a few dozen small numpy calls and a few hundred dict entries per pool.

    The steady state takes the batch path: a pool whose memory holds exactly its current nodes (in
    at least one slot), whose scores are finite and not all 0. Its memory is advanced together with
    every other such pool's of the same slot count (one array for all of them; each pool's state is
    its rows of it; a memory that grows, as :meth:`PoolMemory.advance` grows it, is its rows of
    that array widened); its medians, scores, shares and
    per-priority shares are fleet-wide array operations, in :meth:`CacheAware.decide`'s order, on the
    same doubles (the powers and the sums stay Python's, in node order, as there); its prefix holders
    are grouped by C-level iteration, visiting nodes in the order ``decide`` visits them. Any other
    pool (new or departed nodes, a memory without slots, an older checkpoint's form, no node that
    scores, a score that is not finite) is decided by :meth:`CacheAware.decide` itself.
    ``tests/policies/test_cache_aware_batch.py`` holds the two equal, tick after tick."""
    if len(states) != len(ctxs):
        raise ValueError(f"decide_pools: {len(states)} states for {len(ctxs)} pools")
    cols = fleet_columns(snap)
    bounds = cols.bounds
    ids_all = row_ids(snap)
    # A snapshot table's rows are in node-id order within each pool (the order ``decide``'s dicts
    # take by sorting); a snapshot of views lists them as its pools do, so that is checked.
    ordered = cols.table is not None
    fast: dict[int, tuple[str, ...]] = {}
    groups: dict[int, list[tuple[int, int, PoolMemory]]] = {}
    seen: set[str] = set()
    for i, (state, ctx) in enumerate(zip(states, ctxs, strict=True)):
        pool_id = ctx.pool_id
        b = bounds.get(pool_id)
        if b is None or pool_id in seen or not isinstance(state, PoolMemory):
            continue
        seen.add(pool_id)
        ids = tuple(ids_all[b[0] : b[1]])
        ts, vals = state.ts, state.vals
        slots = ts.shape[1] if ts.ndim == 2 else 0
        if (
            slots == 0
            or ts.dtype != np.int64
            or vals.dtype != np.float64
            or vals.shape != (len(ids), slots, 1)
            or state.node_ids != ids
            or (not ordered and list(ids) != sorted(ids))
        ):
            continue
        fast[i] = ids
        groups.setdefault(slots, []).append((i, b[0], state))
    if not fast:
        return [algo.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]

    # The memories and their medians, every pool of a slot count at once.
    tbt = cols.floats("tbt_p50_ms")
    with np.errstate(invalid="ignore"):
        writes = (tbt > 0) & cols.warm & ~cols.stale
    own = np.full(len(cols), np.nan)
    held: dict[int, tuple[Ints, Floats, int, int]] = {}
    for slots, members in groups.items():
        held.update(_advance(snap.now_ms, params.speed_memory_ms, slots, members, tbt, writes, own))

    # The batch's pools, in the columns' order, and their rows: every array below covers those rows
    # only (the daemon decides a shard's pools 64 at a time; each call works on its own pools' rows,
    # not the whole fleet's). ``j`` is a pool's place among them, ``lo:hi`` its rows there.
    index = _pool_index(snap, cols)
    chosen = sorted(
        (index[ctxs[i].pool_id], i) for i in held if bounds[ctxs[i].pool_id][1] > bounds[ctxs[i].pool_id][0]
    )
    n_sub = len(chosen)
    firsts = np.array([bounds[ctxs[i].pool_id][0] for _, i in chosen], dtype=np.int64)
    sizes = np.array([len(fast[i]) for _, i in chosen], dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    pool_of = np.repeat(np.arange(n_sub, dtype=np.int64), sizes)
    sel = np.repeat(firsts - starts, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
    sums = _SumLayout(pool_of, starts, sizes)

    # The scores (:func:`_pool_scores` for every row; each pool's step median one segment median).
    load = _fleet_load(snap, cols, params)
    live = load.live[sel]
    own_s = own[sel]
    step = np.where(live, own_s, np.nan)
    tbt_median, _ = segment_medians(step, pool_of, n_sub)
    score, speed = _with_speed(
        params, load.acc[sel], can_serve=load.can_serve[sel], own=own_s, tbt_median=tbt_median[pool_of]
    )
    pos = score > 0
    best = np.maximum.reduceat(score, starts) if n_sub else np.zeros(0)
    # Left to ``decide``: a score that is not finite, no node that scores (the even split), a step
    # time of 0 (``decide``'s unstable sort orders it among -0.0 as it likes).
    odd = (
        (np.logical_or.reduceat(~np.isfinite(score) | (step == 0), starts) | ~(best > 0)).tolist()
        if n_sub
        else []
    )
    alpha = params.alpha
    pw = _powered(score, pos, alpha)
    total = sums(pw)
    good = (total > 0).tolist()
    # (batch index, pool id, node ids, place among the batch's pools, first row, end row there)
    items: list[tuple[int, str, tuple[str, ...], int, int, int]] = []
    for (_, i), j, lo, size in zip(chosen, range(n_sub), starts.tolist(), sizes.tolist(), strict=True):
        if good[j] and not odd[j]:
            items.append((i, ctxs[i].pool_id, fast[i], j, lo, lo + size))
    with np.errstate(divide="ignore", invalid="ignore"):
        weights_l = r6_array(pw / total[pool_of]).tolist()

    # Per priority class: shares over the rows at or above the class's floor (every row if none).
    by_priority: dict[int, dict[str, dict[str, float]]] = {i: {} for i, *_ in items}
    for cls in sorted(set(params.alpha_by_priority) | set(params.min_score_by_priority), key=int):
        if not items:
            break
        keep = (score >= params.min_score_by_priority.get(cls, 0.0)) & pos
        mask = keep | ~np.logical_or.reduceat(keep, starts)[pool_of]
        a_cls = params.alpha_by_priority.get(cls, alpha)
        pw_cls = np.where(mask, pw if a_cls == alpha else _powered(score, pos & mask, a_cls), 0.0)
        t_cls = sums(pw_cls)
        with np.errstate(divide="ignore", invalid="ignore"):
            cls_w = r6_array(pw_cls / t_cls[pool_of])
        # ``shares``' zeros when its total is not > 0; a class only where its weights' sum is > 0.
        has = ((t_cls > 0) & (sums(cls_w) > 0)).tolist()
        cls_l = cls_w.tolist()
        for i, _, ids, k, lo, hi in items:
            if has[k]:
                by_priority[i][cls] = dict(zip(ids, cls_l[lo:hi], strict=False))

    # Prefix holders: each pool's eligible rows by score descending, ties in row (node-id) order.
    with np.errstate(invalid="ignore"):
        eligible = (
            (cols.ints("consecutive_failures")[sel] <= 0)
            & pos
            & (score >= params.affinity_keep_frac * best[pool_of])
            & (speed >= params.affinity_min_speed)
        )
    er = np.flatnonzero(eligible)
    order = sel[er[np.lexsort((-score[er], pool_of[er]))]].tolist()  # the columns' rows
    cut = np.concatenate([[0], np.cumsum(np.bincount(pool_of[er], minlength=n_sub))]).tolist()
    prefixes = _hot_prefixes(snap, cols)

    # Per pool: the mean score over its serving nodes (``sum(live) / len(live)``, the live ones those
    # > 0, the others adding +0.0), the counts, the tensor-parallel degrees, rounded for the wire.
    own_l: list[float] = []
    serving_n: list[float] = []
    stale_n: list[float] = []
    g_lo: list[int] = []
    g_hi: list[int] = []
    gpus = cols.ints("gpu_count")[sel]
    if n_sub:
        with np.errstate(divide="ignore", invalid="ignore"):
            own_l = r6_array(sums(score) / np.add.reduceat(pos.astype(np.int64), starts)).tolist()
        serving_n = np.add.reduceat(live.astype(np.float64), starts).tolist()
        stale_n = np.add.reduceat(cols.stale[sel].astype(np.float64), starts).tolist()
        g_lo = np.minimum.reduceat(gpus, starts).tolist()
        g_hi = np.maximum.reduceat(gpus, starts).tolist()
    sizes_f = sizes.astype(np.float64).tolist()
    best_l = r6_array(best).tolist()
    out: list[PolicyResult[PoolMemory] | None] = [None] * len(ctxs)
    pools = snap.pools
    spill_of = _spill_targets_of(snap, params)
    fits: dict[tuple[str, str, int] | None, int | None] = {}  # pool_max_prompt by model, GPU, degree
    slo_fits: dict[tuple[str, str, int, str], dict[str, int]] = {}  # pool_slo_prompt, remembered
    for i, pool_id, ids, k, lo, hi in items:
        # ``decide``'s loop over holders, best first, each appended to its digests' lists. A plain
        # loop: on 3.11 its specialized bytecode (a ``get``, an ``append``) costs less per entry than
        # the same grouping as chained C iterators (``map(list.append, map(defaultdict.__getitem__,
        # ...))``): 5-6 against 10-11 ms for ~30,000 entries at 10,000 nodes (scratch, load ~8).
        rows = order[cut[k] : cut[k + 1]]
        holders: dict[str, list[str]] = {}
        held_by = holders.get
        for node_id, hot in zip(map(ids_all.__getitem__, rows), map(prefixes.__getitem__, rows), strict=True):
            for digest in hot:
                listed = held_by(digest)
                if listed is None:
                    holders[digest] = [node_id]
                else:
                    listed.append(node_id)
        digests = sorted(holders)
        affinity = dict(zip(digests, map(tuple, map(holders.__getitem__, digests)), strict=False))
        own_h = own_l[k]
        spill_to = spill_of(pool_id)
        if g_lo[k] == g_hi[k]:
            view = pools.get(pool_id)
            fit_key = (view.model, view.gpu_type, g_lo[k]) if view is not None else None
            if fit_key in fits:
                fit = fits[fit_key]
            else:
                fit = fits[fit_key] = pool_max_prompt(view, (g_lo[k],))
        else:
            fit = pool_max_prompt(pools.get(pool_id), gpus[lo:hi].tolist())
        slo_fit = _slo_fit(slo_fits, pools.get(pool_id), pool_id, g_lo[k], ctxs[i].slo)
        decision = _assembled(
            pool_id,
            dict(zip(ids, weights_l[lo:hi], strict=False)),
            "cache-aware",
            {
                "nodes": sizes_f[k],
                "serving_nodes": serving_n[k],
                "stale_nodes": stale_n[k],
                "best_score": best_l[k],
                "headroom": own_h,
                "hot_prefixes": float(len(affinity)),
                "spill_pools": float(len(spill_to)),
            },
            by_priority[i],
            affinity,
            spill_to,
            fit,
            slo_fit,
        )
        ts, vals, a, z = held[i]
        out[i] = PolicyResult(
            (decision,),
            PoolMemory(ids, ts[a:z], vals[a:z]),
            {"headroom": own_h, "hot_prefixes": float(len(affinity))},
        )
    return [
        found if found is not None else algo.decide(snap, params, s, c)
        for found, s, c in zip(out, states, ctxs, strict=True)
    ]


def _slo_fit(
    memo: dict[tuple[str, str, int, str], dict[str, int]],
    view: PoolView | None,
    pool_id: str,
    g_lo: int,
    slo: SloBook,
) -> dict[str, int]:
    """:func:`pool_slo_prompt` of a pool whose fewest GPUs per node are ``g_lo`` (the figure only
    grows with the degree, so the smallest degree sets the pool's), remembered per model, GPU and
    degree, and per pool only when the book names pools; a copy each."""
    if view is None:
        return {}
    key = (view.model, view.gpu_type, g_lo, pool_id if slo.by_pool else "")
    found = memo.get(key)
    if found is None:
        found = memo[key] = pool_slo_prompt(view, pool_id, (g_lo,), slo)
    return dict(found)


def _advance(  # noqa: PLR0917
    now: int,
    memory_ms: int,
    slots: int,
    members: list[tuple[int, int, PoolMemory]],
    tbt: Floats,
    writes: npt.NDArray[np.bool_],
    own: Floats,
) -> list[tuple[int, tuple[Ints, Floats, int, int]]]:
    """:func:`_remember_rows` then ``median_arrays(1)`` for pools whose memories have ``slots`` (> 0)
    slots and hold exactly their pools' nodes (``members``: batch index, first row, memory): one
    array for them all. Each pool's median step time goes to ``own`` (NaN without figures, as
    :func:`_pool_scores` has it); per pool, its rows of the new arrays.

    :meth:`PoolMemory.advance`'s operations on the concatenated rows (rows are independent; only
    whether to grow is a per-pool decision), written in place into the concatenation (a new array),
    so a state handed out is never written. A pool with a row to write and no free slot grows as
    ``advance`` grows it: ``slots`` more empty slots after its own, the figure in the first free one.
    When any pool of the group grows, the whole group's arrays are widened (a tick in a run's first
    twenty, or when the memory needs more slots): a pool that does not grow writes within its first
    ``slots`` slots (it has a free one there, the first free one) and keeps those, a view; the
    medians are the same over the wider rows (the added slots are empty: NaN, sorted last)."""
    sizes = [m.ts.shape[0] for _, _, m in members]
    first = np.cumsum(sizes) - sizes
    rows = np.repeat(np.array([lo for _, lo, _ in members], dtype=np.int64) - first, sizes) + np.arange(
        int(first[-1]) + sizes[-1]
    )
    ts = np.concatenate([m.ts for _, _, m in members])
    vals = np.concatenate([m.vals for _, _, m in members])
    v = vals[:, :, 0]  # a view: writing it writes ``vals``
    # kept = (ts >= 0) & (now - ts < memory_ms) & (ts < now). For ts >= 0 and now >= 0, ``now - ts``
    # does not overflow and is < memory_ms exactly when ts > now - memory_ms, which, when that is
    # at least -1, already implies ts >= 0: two comparisons instead of five operations.
    if now >= 0 and now - memory_ms >= -1:
        kept = (ts > now - memory_ms) & (ts < now)
    else:
        kept = (ts >= 0) & (now - ts < memory_ms) & (ts < now)
    gone = ~kept
    np.putmask(ts, gone, -1)
    np.putmask(v, gone, np.nan)
    write = writes[rows]
    grows = np.logical_or.reduceat(write & ~gone.any(axis=1), first)  # a row to write, no free slot
    width = slots
    if grows.any():
        width = 2 * slots  # ``advance`` adds max(1, slots) slots; slots > 0 here
        ts = np.concatenate([ts, np.full((len(rows), slots), -1, dtype=np.int64)], axis=1)
        vals = np.concatenate([vals, np.full((len(rows), slots, 1), np.nan)], axis=1)
        v = vals[:, :, 0]
        gone = ts < 0  # the slots not kept are -1 now (a kept one is >= 0), and the new ones
    at = np.flatnonzero(write)
    if len(at):
        slot = np.argmax(gone[at], axis=1)
        ts[at, slot] = now
        v[at, slot] = tbt[rows[at]]
    srt = np.sort(v, axis=1, kind="stable") if (v == 0).any() else np.sort(v, axis=1)
    count = width - np.isnan(v).sum(axis=1)
    r = np.arange(len(rows))
    upper = srt[r, np.minimum(count // 2, width - 1)]
    lower = srt[r, np.maximum(count - 1, 0) // 2]
    with np.errstate(over="ignore"):
        own[rows] = np.where(count >= 1, np.where(count % 2 == 1, upper, (lower + upper) / 2), np.nan)
    narrow_ts, narrow_vals = (ts[:, :slots], vals[:, :slots]) if width != slots else (ts, vals)
    return [
        (i, (ts, vals, a, a + size) if grown else (narrow_ts, narrow_vals, a, a + size))
        for (i, _, _), grown, a, size in zip(members, grows.tolist(), first.tolist(), sizes, strict=True)
    ]


def _spill_targets_of(snap: FleetSnapshot, params: CacheAwareParams) -> Callable[[str], tuple[str, ...]]:
    """:func:`spill_targets` of any pool, each model's ranking sorted once (as there) and each pool's
    own entry dropped by its position instead of a pass over the model's pools per pool."""
    pools = snap.pools
    ranked: dict[str, tuple[tuple[str, ...], dict[str, int]]] = {}

    def of(pool_id: str) -> tuple[str, ...]:
        own_pool = pools.get(pool_id)
        model = own_pool.model if own_pool is not None else ""
        if not model:
            return ()
        found = ranked.get(model)
        if found is None:
            targets = _ranked(snap, params, model)
            found = ranked[model] = (targets, {p: j for j, p in enumerate(targets)})
        targets, at = found
        j = at.get(pool_id)
        return targets if j is None else targets[:j] + targets[j + 1 :]

    return of


class _SumLayout:
    """Per pool, Python's ``sum`` of its rows' values in row order: ``0.0 + v0 + v1 + ...``, one
    addition at a time (``np.add.reduceat`` adds pairwise, which may round differently). A running
    sum along each row of the pools laid out one per row, padded with +0.0 (which changes no sum of
    values that are not -0.0, and no other sum either: ``x + 0.0`` is ``x`` but for ``x = -0.0``;
    and the running sum, from +0.0, is never -0.0). Rows grouped by pool: ``pool_of`` of each row,
    ``starts`` and ``sizes`` of each pool."""

    __slots__ = ("at", "n", "pool_of", "width")

    def __init__(self, pool_of: Ints, starts: Ints, sizes: Ints) -> None:
        self.pool_of = pool_of
        self.n = len(starts)
        self.at = np.arange(len(pool_of)) - starts[pool_of] + 1  # column 0 holds the leading 0.0
        self.width = int(sizes.max(initial=0)) + 1

    def __call__(self, values: Floats) -> Floats:
        pad = np.zeros((self.n, self.width))
        pad[self.pool_of, self.at] = values
        return np.cumsum(pad, axis=1)[:, -1]


def _pool_index(snap: FleetSnapshot, cols: FleetColumns) -> dict[str, int]:
    """Pool id -> its index in ``cols.pool_ids`` (once per snapshot)."""
    key = ("cache-aware.pool_index",)
    found: dict[str, int] | None = snap.memo.get(key)
    if found is None:
        found = snap.memo[key] = {p: k for k, p in enumerate(cols.pool_ids)}
    return found


def _hot_prefixes(snap: FleetSnapshot, cols: FleetColumns) -> list[tuple[str, ...]]:
    """Every row's ``hot_prefixes`` (once per snapshot)."""
    key = ("cache-aware.hot_prefixes",)
    found: list[tuple[str, ...]] | None = snap.memo.get(key)
    if found is None:
        found = snap.memo[key] = list(map(attrgetter("hot_prefixes"), records(cols)))
    return found


def _powered(score: Floats, pos: npt.NDArray[np.bool_], alpha: float) -> Floats:
    """``v ** alpha`` where ``pos`` (else 0.0), the powers Python's (``pow`` of two floats is ``**``),
    as :func:`shares` takes them: numpy's ``power`` may use another implementation (SIMD)."""
    out = np.zeros(len(score))
    out[pos] = list(map(pow, score[pos].tolist(), repeat(alpha)))
    return out
