"""slo-predictive: size each pool for its token demand one cold start ahead, against SLO headroom.

What it does: every tick it measures how hard the pool's warm nodes are pressed against the SLO
(KV cache, TTFT, TBT), learns from that how many tokens per second one warm node sustains at the
target, projects the pool's token demand one cold start ahead from its recent slope, and sets the
node count that carries the projected demand at the target. It scales up at once (a cold node
needs ``cold_start`` seconds before it absorbs anything, so being late is what costs), scales down
slowly and in steps (a node given back costs a whole cold start to get back), counts cold and
loading nodes as capacity *arriving* (they add to the node count but not to the capacity that
explains today's pressure), and names the nodes to drain: not-warm ones first, then the least
loaded warm ones, so a drained node finishes its in-flight work and takes no new calls.

Formula, per tick, over the pool's warm, fresh, non-draining nodes not behind an open breaker
(``ctx.breakers``) ``W`` (``n_w = |W|``) and the
cold or loading ones ``A`` (arriving)::

    ttft_ms, tbt_ms = the SLO of the calls the pool served (``spec.slo`` via ``ctx.slo``: the
                      strictest class served binds, :mod:`fleetloop.policies.slo`)
    target_ttft = headroom * ttft_ms          target_tbt = headroom * tbt_ms
    prefill     = prefill_ms(model, gpu, gpus, mean uncached prompt)   (:mod:`..prefill`)
                  mean uncached prompt = prompt_tokens_rate / request_rate x (1 - mean_W(prefix hit))
    P_kv   = mean_W(kv_cache_used_frac) / kv_target
    P_ttft = max(0, ttft_p50_ms_w - prefill) / target_ttft   (the pool's median, over the window)

  TTFT is a prefill's own compute time plus the wait before it (queue, batch contention).
  Capacity fixes the wait only: a 30k-token llama-70b prompt takes its ~2.7 s on any idle H100
  node, and a pool that read that as pressure would grow, idle, to its maximum. So only the part
  above the predicted compute time counts, against the whole headroom of the SLO (capacity can
  remove the wait, nothing else). When the GPU or model is unknown the prediction is 0 (every millisecond
  counts as fixable, the conservative side).
    P_tbt  = EWMA(1000 * n_w * median_W(running) / output_tokens_rate_per_s) / target_tbt
             the effective time between tokens a running request sees, prefill stalls included
             (Little's law: requests in service / tokens out per second), smoothed over a window
    P_q    = (running + waiting) / running              when every warm node has a waiting
                                                         request on average (a node that cannot
                                                         admit is at capacity), else 0
    P      = max(P_kv, P_ttft, P_tbt, P_q)              pressure, 1.0 = at target

  Medians and means, not tails: a p99 is set by the longest prompt's prefill and by the batching
  knob's chunk size, which no node count changes (a pool scaled on them never scales down);
  queueing, which capacity does fix, moves the median and the mean too. The effective TBT is what
  a task's duration is made of (calls x output tokens x TBT), so it is what deadlines feel.

    D      = prompt_tokens_rate_per_s + output_tokens_rate_per_s      (served token demand)
    B      = sum(queued_prompt_tokens) / lead                          (backlog, drained over lead)
    V      = diverted_tokens_rate_per_s                                (diverted: tokens/s of calls the
             router moved from this pool to a pool of another model the caller accepts)
    C_obs  = (D / n_w) / P                              tokens/s a warm node carries at P = 1
    C      = EWMA(C_obs), half-life ``capacity_halflife_s``, learned only when the window holds
             >= ``min_requests`` calls and P >= 0.05 (an idle node says nothing about capacity)
    lead   = learned cold start (EWMA of cold -> warm times seen, each in (0, 3600] s; a time
             outside is a clock that jumped or a stuck node, not learned) or ``cold_start_s``
    slope  = least-squares slope of D over the last ``lead`` seconds, counted only when it and
             the slope of the newer half of those seconds are both positive and above 2 standard
             errors (one independent sample per telemetry window); then the smaller of the two.
             A step or a start-up ramp that has levelled off is not a trend.
    D_proj = D + slope * lead
    short  = max over the model's other pools s of (P_s * n_s - a_s), when positive: the nodes a
             sibling with n_s warm nodes at pressure P_s (KV, TTFT, queue; not its smoothed TBT)
             needs beyond its a_s warm and arriving ones (:func:`sibling_excess`)
    need   = (max(n_w * P, (D + B) / C) + V / C) * max(1, D_proj / D) + short
             (+ spare_nodes when need > 0; V / C is 0 while no C is learned)
    raw    = current                        if |need / current - 1| <= tolerance
           = ceil(need)                     otherwise            (current = |W| + |A|)
    desired = min(max(current, min(raw over up window)), max(raw over down window))
    a decrease is at most max(1, floor(down_step_frac * current)) per ``down_period_s``, and none
    while a task whose final call was on this pool failed within the down window (never trade
    successful tasks for node-hours: the KPI's denominator is worth more than its numerator's
    saving), nor while the pool's open workflows accumulate:
        O, S, E = the pool's share of the ledger: open workflows that have called it (tasks
                  started, not yet ended), tasks that first called it and those of them that
                  ended (or were let go) so far, sampled every tick over the last lead
        rise    = O_now - O_oldest, counted only when O_now > O at the span's midpoint (still rising)
        noise   = sqrt((S_now - S_oldest) + (E_now - E_oldest))
        accumulating = rise > 2 * noise
      A level count moves by starts minus ends; with Poisson starts and ends that difference has
      variance starts + ends, so a rise of two of its standard deviations is not churn. (A
      regression slope with one independent sample per window would not do: the count changes
      only when a task starts or ends, so neighbouring windows share almost all of it, and random
      walks of a few tasks read as trends.)
    desired is clamped to the pool's [min_nodes, max_nodes];
    drain   = the (current - desired) first of A (cold, then loading), then W by
              (running + queued requests, KV use), highest node id first on ties.

Why open workflows: an agent or research task is a chain of sequential calls, and the served
tokens count a call only when it ends; while tasks arrive faster than they finish (a start-up, or
a rise in task arrivals) every open task will call again, so demand still rises for as long as a
task lasts (research-long-context: 40-60 calls of ~20 s each, about 1,000 s per task), and a pool
sized to today's served tokens is short by the time the tasks' later calls come, one cold start
too late. A count that is level or falling holds nothing. Both holds read the pool's own share of
the ledger (``PoolView.open_workflows``, ``tasks_failed``), not the fleet's: in a fleet of several
pools one pool's failing or accumulating tasks would otherwise hold every pool at its peak size
(burst-a100-2x: a 70B pool at its maximum with copilot tasks past their deadlines kept the 8B
pool at 24 nodes for 380 s after its burst, against a need of 7). A task that calls two pools
counts as open on both; a failed task is charged to the pool of its final call, the one that
could not serve it in time (our own sheds included: a shed task is lost too).

Why diverted demand: the router moves a call that would queue here to another model's pool the
caller accepts (its model spill, :mod:`fleetloop.router.pick` step 6), to bridge this pool's cold
start. Those calls leave ``D``, so a pool sized on ``D`` alone shrinks by what was moved, and the
other pool's room, now its only reserve, closes when that pool's own tenants need it
(cascade-degraded-gpu seed 7: the 70B pool went from 12 to 8 nodes while 20% of its priority-0
calls ran on the L40S 8B pool, then a 2x spike filled that pool and the task gain over classic fell
from +187 to -26; ``bench/results/burst-s11.md``). Counting them (each moved call's copy keyed by
the preferred pool, ``RequestOutcome.diverted_to``, folded into its window in its own shard) keeps
the pool sized for its whole demand: the spill bridges a cold start, it does not replace
capacity, and once the pool has grown its nodes stop queueing, the calls stop moving and ``V``
returns into ``D``. Both pools carry the moved calls for that time (the serving pool grows for what
it serves), the price of not losing them.

Why a sibling's shortfall: a router splits a model's calls among its pools by routable capacity
(node count, or decode bandwidth), so each pool of a model carries a share proportional to its
size, and a pool that cannot grow (its ``max_nodes``, a provider's step limit; bounds the policy
does not see) stays pressed however far its sibling shrinks. research-long-context: the MI300X
pool (96k tokens of KV per node against prompts of 16k-100k) sat at its maximum of 20 at pressure
1.4-7 while the H200 pool of the same model (343k tokens of KV per node) shrank to 4 nodes at 0.37,
and tasks missed their deadlines. The shortfall is counted against the sibling's own warm plus
arriving nodes, so a sibling that can grow (it asks within a tick) moves nothing here.

Without a learned ``C`` and no warm node the target holds (nothing to extrapolate from); a pool
with no node yet gets ``min_nodes``. The down window defaults to the lead: by the ski-rental
argument, keeping an idle node for as long as it takes to get one back is within 2x of the best
possible cost whatever the future load does.

Inputs: per node ``weights_state``, ``draining``, ``stale``, ``kv_cache_used_frac``,
``running_requests``, ``queue_depth``, ``queued_prompt_tokens``, ``model``, ``gpu_type``,
``gpu_count``, ``prefix_cache_hit_frac``; per pool ``open_workflows``, ``workflows_started``,
``workflows_ended``, ``tasks_failed`` (its share of the ledger), ``model`` (its siblings: the other
pools of that model, with their nodes' KV, queue and TTFT), ``prompt_tokens_rate_per_s``,
``output_tokens_rate_per_s``, ``diverted_tokens_rate_per_s``, ``request_rate_per_s``,
``ttft_p50_ms_w``, ``requests_w``; the SLO
(``ctx.slo``; no copy here);
the snapshot's ``window_ms``; event time ``ctx.now_ms``. State: demand samples over the trend
window, the learned capacity and cold start, the smoothed TBT, first-seen times of not-warm nodes,
recent raw targets, the open-workflow samples over the trend window, the last target and
scale-down time, and the nodes it asked to drain
(excluded for one window, so a node removed before its telemetry says "draining" is not counted
as capacity).

Parameters (defaults, bounds): ``headroom`` 0.5 (0.1-1: the signals are medians and means while an SLO
bounds a tail; under load a p99 sits about twice the median, so medians aim at half the SLO), ``kv_target``
0.8 (0.1-1: vLLM preempts when the KV cache is full, and running sequences keep growing by their
output), ``cold_start_s`` 120 (0-3600: the lead until one is observed; a 70B model's weights take
minutes to load), ``prefill_efficiency`` 0.5 (0.05-1: the share of dense peak a prefill reaches,
:mod:`fleetloop.policies.prefill`), ``tolerance`` 0.1 (0-1, HPA's band), ``up_window_s`` 10 (0-600:
one telemetry window, so one noisy tick does not buy a node), ``down_window_s`` None (= the lead; 0-3600),
``down_step_frac`` 0.25 and ``down_period_s`` 30 (a step is observed for three 10 s windows before
the next, so the learned capacity is re-checked at the new size), ``capacity_halflife_s`` 60
(1-3600), ``min_requests`` 20 (0-100000), ``min_nodes`` 1, ``max_nodes`` 1000, ``pools`` per-pool
``{min_nodes, max_nodes}`` overrides, ``spare_nodes`` 0 (0-100: N+k redundancy for a pool that
serves traffic; a lost node is replaced only after a cold start, so a pool sized to demand alone
breaches its SLO, and loses tasks, for that long after every host loss or ejection).

Trade-offs: token throughput is a truer capacity signal for LLM serving than GPU utilization (a
GPU is "busy" decoding a batch of one), and the SLO ratios make it model- and GPU-agnostic with no
per-GPU constant; but pressure is assumed linear in load, which under-estimates capacity where
latency has a floor (a lone long prompt) and over-estimates it near saturation, where TTFT turns
up steeply (both err towards more nodes). Demand is what the pool served: a saturated pool
understates it, which the pressure term and the backlog compensate for.

Failure mode: a retry storm or a degraded node inflates demand or TTFT and buys nodes (the
breaker and retry budget are the levers for those; the median over nodes keeps one slow node
from setting P); with no warm node and nothing learned the target holds, so a pool that lost
every node waits for the GPU workers' own floor (``min_nodes``); a step change in demand reads
as a slope for one lead time and is over-provisioned by up to the step's size until it passes.
Demand that steps up faster than a cold start is lost until new nodes warm: the pool is sized to
the demand it sees, plus ``spare_nodes``, and keeps no reserve for a surge it has not seen
(burst-a100-2x: arrivals triple on a pool sized for a third of its warm capacity). Reacting
faster does not help (asking for the maximum 1 s into the burst recovers 231 of the 2,897 tasks
seed 29 is short of classic: the nodes warm a cold start later), nor does using the warm nodes
better (during that burst they complete more calls per warm node-second than classic's, 4.1
against 3.8): only nodes warm before the step do. Seed 29 by lever: before the step this policy
reads the 8B pool at pressure 0.31-0.38 (need 4 with the spare) and has scaled it from 8 to 6
nodes, where classic's HPA holds 12; all but 37 of the 3,006 lost trial tasks end in 200-350 s,
before the new nodes warm (~325-400 s), shed by admission as the overflow of six nodes
(admission off loses 514 more tasks; the retry budget refuses nothing: the row is unchanged
without it). The same policy held at 8 nodes there still loses 1,568 tasks against classic; held
at 12 it meets all five seeds (+36 to +151 tasks, 0.84-0.93x classic's cost per success; seed 29
peaks at 17 nodes instead of 24). burst-cold-nodes is the same case on its 70B pool (a ~290 s cold
start, its 4th node asked at ~90 s warms 90 s into the step): held at classic's 5 nodes, seeds 9
and 12 go from -12 and -3 tasks to +5 and +2 and all five seeds are met, at 0.55-0.58x classic's
cost against 0.52-0.55x (``bench/results/burst-s10.md``). There the callers accept the 8B model
too, so the router's model spill bridges the cold start instead, with this pool sized for the
calls it moved (``V`` above): all five seeds are met with no floor (``bench/results/burst-s12.md``).
burst-a100-2x's trial tasks accept one model only, so nothing bridges its step. A standing reserve
is not derived here because nothing before a first step tells a bursty pool from a steady one:
``need x 1.83`` everywhere
(headroom 0.27, kv_target 0.44) meets burst-cold-nodes at seed 9 but still misses burst-a100-2x at
seed 29 and costs the other stress scenarios up to 64% more per success (the stress geometric mean
would go from 0.69 to about 0.81x classic's), and even held only on pools whose cold start exceeds
their tasks' deadlines (a figure the policy does not see) it misses burst-a100-2x on 5 of 5 seeds.
A reserve held on scale-downs only (keep ``S x`` the need's nodes) cannot stand in for it: that
pool starts at 8 and needs ~12 warm, and S = 3 (it keeps all 8) still loses 1,565 tasks against
classic on seed 29, while steady-chat-2x already pays 13% more per success; the 70B pool of
burst-cold-nodes is never scaled down before its step (``bench/results/burst-s11.md``).
An operator who expects unannounced steps sets ``pools.<id>.min_nodes``. A need above
``MAX_NEED_NODES`` (10**6, from a hostile figure such as 10**12 queued tokens) is capped there, so one
record cannot fail its pool's tick. While tasks
accumulate for longer than their own duration (a workload that only grows) no scale-down happens
until it levels off, which costs the idle nodes of that time. The sibling rule assumes equal
per-node capacity across a model's pools and reads each sibling's pressure against this pool's
SLO; a sibling whose pressure capacity cannot fix (every node waiting on a prompt that fits no
node) buys nodes here that carry the moved share, never the unfittable prompts.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import NamedTuple, Protocol, Self, TypeVar

import numpy as np
from pydantic import Field, model_validator

from fleetloop.policies.base import (
    FleetSnapshot,
    Params,
    PolicyContext,
    PolicyResult,
    PoolView,
    r6,
)
from fleetloop.policies.columns import Bools, fleet_columns, segment_medians
from fleetloop.policies.pool_figures import (
    distinct_pools,
    ejected_by,
    is_ident,
    loaded,
    mark_rows,
    pool_index,
    pool_owners,
    r6_many,
    records,
    row_ids,
    segment_counts,
    segment_sums,
    segment_whole_sums,
)
from fleetloop.policies.prefill import DEFAULT_EFFICIENCY, prefill_ms
from fleetloop.policies.slo import DEFAULT_BOOK, Slo
from fleetloop.schemas.base import MAX_COUNT, assemble
from fleetloop.schemas.decisions import AutoscaleDecision

MIN_LEARN_PRESSURE = 0.05
# No pool has a million nodes; a larger need is capped so its figure stays within a decision's bound.
MAX_NEED_NODES = 1_000_000.0
SIGNIFICANCE = 2.0  # standard errors a slope must clear to count as a trend
MIN_TREND_SAMPLES = 3.0  # independent windows needed to fit a slope
ACCUMULATION_Z = 2.0  # standard deviations of churn the open-workflow count must rise by


class PoolBounds(Params):
    min_nodes: int = Field(ge=0, le=100_000)
    max_nodes: int = Field(ge=1, le=100_000)


class SloPredictiveParams(Params):
    headroom: float = Field(default=0.5, ge=0.1, le=1.0)
    kv_target: float = Field(default=0.8, ge=0.1, le=1.0)
    prefill_efficiency: float = Field(default=DEFAULT_EFFICIENCY, ge=0.05, le=1.0)
    cold_start_s: float = Field(default=120.0, ge=0.0, le=3600.0)
    tolerance: float = Field(default=0.1, ge=0.0, le=1.0)
    up_window_s: float = Field(default=10.0, ge=0.0, le=600.0)
    down_window_s: float | None = Field(default=None, ge=0.0, le=3600.0)
    down_step_frac: float = Field(default=0.25, gt=0.0, le=1.0)
    down_period_s: float = Field(default=30.0, ge=0.0, le=3600.0)
    capacity_halflife_s: float = Field(default=60.0, ge=1.0, le=3600.0)
    min_requests: int = Field(default=20, ge=0, le=100_000)
    spare_nodes: int = Field(default=0, ge=0, le=100)
    min_nodes: int = Field(default=1, ge=0, le=100_000)
    max_nodes: int = Field(default=1000, ge=1, le=100_000)
    pools: dict[str, PoolBounds] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        for name, lo, hi in [("", self.min_nodes, self.max_nodes)] + [
            (f"pools.{p}.", b.min_nodes, b.max_nodes) for p, b in sorted(self.pools.items())
        ]:
            if lo > hi:
                raise ValueError(f"{name}min_nodes ({lo}) is above {name}max_nodes ({hi})")
        return self

    def bounds(self, pool_id: str) -> tuple[int, int]:
        b = self.pools.get(pool_id)
        return (b.min_nodes, b.max_nodes) if b is not None else (self.min_nodes, self.max_nodes)


@dataclass(frozen=True, slots=True)
class SloPredictiveState:
    demand: tuple[tuple[int, float], ...] = ()  # (event time ms, tokens/s), oldest first
    capacity_tok_s: float | None = None  # learned tokens/s per warm node at P = 1
    cold_start_s: float | None = None  # learned cold -> warm time
    not_warm_since: tuple[tuple[str, int], ...] = ()  # node id -> first seen cold or loading
    recs: tuple[tuple[int, int], ...] = ()  # (event time ms, raw target)
    last_desired: int | None = None
    last_down_ms: int | None = None
    drained: tuple[tuple[str, int], ...] = ()  # node id -> when we asked to drain it
    tbt_ms: float | None = None  # effective time between tokens, smoothed over a window
    failed_tasks: int = 0  # the pool's count of failed tasks at the last tick
    last_failure_ms: int | None = None  # when a task last failed on this pool
    # (event time ms, open workflows, tasks started so far, tasks ended so far), oldest first
    open_workflows: tuple[tuple[int, int, int, int], ...] = ()


class Node(Protocol):
    """What this algorithm reads of a node: a :class:`NodeView` or its :class:`NodeFigures`."""

    @property
    def node_id(self) -> str: ...
    @property
    def draining(self) -> bool: ...
    @property
    def stale(self) -> bool: ...
    @property
    def weights_state(self) -> str: ...
    @property
    def queued_prompt_tokens(self) -> int: ...
    @property
    def running_requests(self) -> int: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def kv_cache_used_frac(self) -> float: ...
    @property
    def prefix_cache_hit_frac(self) -> float: ...
    @property
    def model(self) -> str: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def gpu_count(self) -> int: ...


class NodeFigures(NamedTuple):
    """The :class:`NodeView` fields this algorithm reads, the same values, without building a view
    per node (a view costs several times a tuple; at 10,000 nodes this algorithm, reading its own
    pool and every sibling, was what built them all)."""

    node_id: str
    draining: bool
    stale: bool
    weights_state: str
    queued_prompt_tokens: int
    running_requests: int
    queue_depth: int
    kv_cache_used_frac: float
    prefix_cache_hit_frac: float
    model: str
    gpu_type: str
    gpu_count: int


def node_figures(snap: FleetSnapshot, pool_id: str) -> tuple[NodeFigures, ...]:
    """``snap.pool_nodes(pool_id)`` as :class:`NodeFigures`, read from the snapshot's columns (the
    numbers and flags as the columns hold them, the three strings from the node's telemetry record),
    every pool's once per snapshot."""
    key = ("slo-predictive.node_figures",)
    found: dict[str, tuple[NodeFigures, ...]] | None = snap.memo.get(key)
    if found is None:
        cols = fleet_columns(snap)
        recs = records(cols)

        def strings(name: str) -> list[str]:
            return list(map(attrgetter(name), recs))

        def ints(name: str) -> list[int]:
            return cols.ints(name).tolist()  # type: ignore[no-any-return]

        def floats(name: str) -> list[float]:
            return cols.floats(name).tolist()  # type: ignore[no-any-return]

        rows = list(
            map(
                NodeFigures._make,
                zip(
                    row_ids(snap), cols.draining.tolist(), cols.stale.tolist(), strings("weights_state"),
                    ints("queued_prompt_tokens"), ints("running_requests"), ints("queue_depth"),
                    floats("kv_cache_used_frac"), floats("prefix_cache_hit_frac"), strings("model"),
                    strings("gpu_type"), ints("gpu_count"), strict=True,
                ),
            )
        )  # fmt: skip
        found = snap.memo[key] = {p: tuple(rows[a:b]) for p, (a, b) in cols.bounds.items()}
    return found.get(pool_id, ())


NodesOf = Callable[[FleetSnapshot, str], Sequence[Node]]
_N = TypeVar("_N", bound=Node)


def _median(xs: Sequence[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def trend_slope(samples: Sequence[tuple[int, float]], window_ms: int) -> float:
    """A demand trend that holds over the whole span and over its newer half, else 0."""
    if len(samples) < 2:
        return 0.0
    mid_ms = (samples[0][0] + samples[-1][0]) / 2.0
    whole = fit_slope(samples, window_ms)
    newer = fit_slope([s for s in samples if s[0] >= mid_ms], window_ms)
    return min(whole, newer) if whole > 0 and newer > 0 else 0.0


def fit_slope(samples: Sequence[tuple[int, float]], window_ms: int) -> float:
    """The least-squares slope of demand (tokens/s per s) when positive and significant, else 0.

    Samples ``window_ms`` apart are the independent ones (each is a window average), so the
    standard error is inflated by sqrt(n / n_eff) with ``n_eff = span / window``."""
    n = len(samples)
    if n < 3:
        return 0.0
    span_ms = samples[-1][0] - samples[0][0]
    n_eff = span_ms / max(1, window_ms)
    if n_eff < MIN_TREND_SAMPLES:
        return 0.0
    ts = [(t - samples[0][0]) / 1000.0 for t, _ in samples]
    ys = [y for _, y in samples]
    mt = sum(ts) / n
    my = sum(ys) / n
    sxx = sum((t - mt) ** 2 for t in ts)
    if sxx <= 0:
        return 0.0
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / sxx
    if slope <= 0:
        return 0.0
    resid = sum((y - my - slope * (t - mt)) ** 2 for t, y in zip(ts, ys, strict=True))
    var = resid / max(1, n - 2)
    se = math.sqrt(var / sxx) * math.sqrt(n / max(n_eff, 1.0))
    return slope if slope > SIGNIFICANCE * se else 0.0


def accumulation(samples: Sequence[tuple[int, int, int, int]]) -> tuple[float, float]:
    """(rise, noise) of the open-workflow count over the samples' span: ``rise`` is its net change,
    0 unless the newer half rose too (a step that levelled off is not accumulation); ``noise`` is
    the standard deviation of that change if it were only the churn of a level count, the square
    root of the tasks that started plus those that ended over the span (a birth-death count's
    change is their difference; for Poisson starts and ends its variance is their sum)."""
    if len(samples) < 2:
        return 0.0, 0.0
    t0, o0, s0, e0 = samples[0]
    t1, o1, s1, e1 = samples[-1]
    mid_ms = (t0 + t1) / 2.0
    o_mid = next(o for t, o, _, _ in samples if t >= mid_ms)
    rise = float(o1 - o0) if o1 > o_mid else 0.0
    return rise, math.sqrt(max(1, (s1 - s0) + (e1 - e0)))


def drain_order(nodes: Sequence[_N]) -> list[_N]:
    """Scale-down victims, best first: cold, then loading (paid for, carrying nothing), then warm
    ones by load (running + queued requests, then KV use), highest node id first on ties."""
    rank = {"cold": 0, "loading": 1}
    by_id = sorted(nodes, key=lambda n: n.node_id, reverse=True)
    return sorted(
        by_id,
        key=lambda n: (
            rank.get(n.weights_state, 2),
            n.running_requests + n.queue_depth,
            n.kv_cache_used_frac,
        ),
    )


@dataclass(frozen=True, slots=True)
class Pressure:
    kv: float
    ttft: float | None
    tbt: float | None
    queue: float

    @property
    def value(self) -> float:
        return max(self.kv, self.ttft or 0.0, self.tbt or 0.0, self.queue)


def predicted_prefill_ms(pool: PoolView | None, warm: Sequence[Node], params: SloPredictiveParams) -> float:
    """The compute time of the pool's mean uncached prompt on one of its warm nodes (0 unknown)."""
    if pool is None or not warm or pool.request_rate_per_s <= 0:
        return 0.0
    hit = sum(n.prefix_cache_hit_frac for n in warm) / len(warm)
    tokens = pool.prompt_tokens_rate_per_s / pool.request_rate_per_s * (1.0 - min(max(hit, 0.0), 1.0))
    ref = warm[0]
    ms = prefill_ms(ref.model, ref.gpu_type, ref.gpu_count, tokens, params.prefill_efficiency)
    return ms if ms is not None else 0.0


def pressure(  # noqa: PLR0917 - the signals, then the SLO and the prefill that shift them
    warm: Sequence[Node],
    ttft: float | None,
    tbt: float | None,
    params: SloPredictiveParams,
    slo: Slo = DEFAULT_BOOK.default,
    prefill: float = 0.0,
) -> Pressure:
    """How hard the warm nodes press against the SLO targets; 1.0 = at target. ``ttft`` is the
    pool's windowed TTFT p50, ``tbt`` the smoothed effective time between tokens, ``prefill`` the
    predicted compute time of a prefill (subtracted from ``ttft``: capacity cannot remove it)."""
    kv = sum(n.kv_cache_used_frac for n in warm) / len(warm) / params.kv_target if warm else 0.0
    waiting = sum(n.queue_depth for n in warm)
    running = sum(n.running_requests for n in warm)
    queue = (running + waiting) / max(running, 1) if warm and waiting >= len(warm) else 0.0
    return Pressure(
        queue=queue,
        kv=kv,
        ttft=max(0.0, ttft - prefill) / (params.headroom * slo.ttft_ms) if ttft is not None else None,
        tbt=tbt / (params.headroom * slo.tbt_ms) if tbt is not None else None,
    )


def sibling_excess(
    snap: FleetSnapshot,
    ctx: PolicyContext,
    params: SloPredictiveParams,
    pool: PoolView | None,
    n_warm: int,
    *,
    nodes_of: NodesOf = node_figures,
) -> tuple[float, float]:
    """(the pressure of the model's other pool that is short the most nodes, the nodes this pool
    needs to carry what that pool cannot), (0, 0) when no sibling is short.

    A router splits a model's calls among its pools by their routable capacity, so this pool's
    share grows with its nodes. A sibling ``s`` with ``n_s`` warm nodes at pressure ``P_s`` needs
    ``P_s * n_s`` nodes; when its own node count (warm plus arriving, ``a_s``) stays below that,
    it could not get them (its ``max_nodes``, or its provider's step limit; the policy does not see
    those bounds) and ``short = P_s * n_s - a_s`` nodes of the model's demand are unserved. Sized
    for the model's demand with the sibling's nodes counted as they are, this pool needs
    ``n * P + short`` (equal per-node capacity and pressure linear in load, as for ``need``). A
    sibling that can grow asks for its nodes within a tick and is not short for long; the up
    window (``up_window_s``) keeps one tick's reading from buying nodes here. The sibling's
    pressure is read without its smoothed TBT (another pool's state): KV, TTFT above its predicted
    prefill, queue, against this pool's SLO."""
    if pool is None or not pool.model:
        return 0.0, 0.0
    ejected = {i for i, b in ctx.breakers.items() if b.enforced and b.state == "open"}
    slo = ctx.pool_slo(snap)
    best_p, best_short = 0.0, 0.0
    siblings = [(sid, sib) for sid, sib in _model_pools(snap, pool.model) if sid != ctx.pool_id]
    if ejected and any(not ejected.isdisjoint(sib.node_ids) for _, sib in siblings):
        # The breakers are this pool's, so in the engine they name none of a sibling's nodes; when
        # they do, the sibling is read here with those nodes left out.
        for sid, sib in siblings:
            found = _sibling(snap, sid, sib, params, slo=slo, ejected=ejected, nodes_of=nodes_of)
            if found is not None and found[1] > best_short:
                best_p, best_short = found
        return best_p, best_short
    # Otherwise the siblings' figures are the snapshot's alone: the model's pools that are short
    # are found once per snapshot and SLO (not once per pool and sibling, which costs a model's
    # pools squared), in pool order; only a shortfall > 0 can ever be picked.
    for sid, p, short in _model_shortfalls(snap, pool.model, params, slo, nodes_of):
        if sid != ctx.pool_id and short > best_short:
            best_p, best_short = p, short
    return best_p, best_short


def _model_pools(snap: FleetSnapshot, model: str) -> list[tuple[str, PoolView]]:
    """The snapshot's pools serving ``model``, in pool order (grouped once per snapshot)."""
    key = ("slo-predictive.model_pools",)
    found: dict[str, list[tuple[str, PoolView]]] | None = snap.memo.get(key)
    if found is None:
        found = snap.memo[key] = {}
        for sid, sib in snap.pools.items():
            found.setdefault(sib.model, []).append((sid, sib))
    return found.get(model, [])


def _model_shortfalls(
    snap: FleetSnapshot, model: str, params: SloPredictiveParams, slo: Slo, nodes_of: NodesOf = node_figures
) -> tuple[tuple[str, float, float], ...]:
    """``(pool, P_s, shortfall)`` of the model's pools short of nodes (shortfall > 0), in pool
    order, read against ``slo`` with no node left out; once per snapshot, model, params and SLO."""
    key = ("slo-predictive.shortfalls", model, id(params), slo, nodes_of)
    memo = snap.memo.get(key)
    if memo is None or memo[0] is not params:
        out: list[tuple[str, float, float]] = []
        for sid, sib in _model_pools(snap, model):
            found = _sibling(snap, sid, sib, params, slo=slo, ejected=frozenset(), nodes_of=nodes_of)
            if found is not None and found[1] > 0:
                out.append((sid, *found))
        memo = snap.memo[key] = (params, tuple(out))
    return memo[1]


def _sibling(
    snap: FleetSnapshot,
    sid: str,
    sib: PoolView,
    params: SloPredictiveParams,
    *,
    slo: Slo,
    ejected: Collection[str],
    nodes_of: NodesOf = node_figures,
) -> tuple[float, float] | None:
    """A sibling's ``(P_s, P_s * n_s - a_s)``, None without a warm node (:func:`sibling_excess`)."""
    active = [n for n in nodes_of(snap, sid) if not n.draining and not n.stale]
    warm = [n for n in active if n.weights_state == "warm" and n.node_id not in ejected]
    if not warm:
        return None
    prefill = predicted_prefill_ms(sib, warm, params)
    p = pressure(warm, sib.ttft_p50_ms_w, None, params, slo, prefill).value
    return p, p * len(warm) - len(active)


class SloPredictive:
    name = "slo-predictive"
    section = "autoscale"
    Params = SloPredictiveParams

    def initial_state(self) -> SloPredictiveState:
        return SloPredictiveState()

    def decide(
        self,
        snap: FleetSnapshot,
        params: SloPredictiveParams,
        state: SloPredictiveState,
        ctx: PolicyContext,
    ) -> PolicyResult[SloPredictiveState]:
        """Reads each node as :class:`NodeFigures` (from the snapshot's columns, no view built)."""
        return self._decide(snap, params, state, ctx, node_figures)

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: SloPredictiveParams,
        states: Sequence[SloPredictiveState],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[SloPredictiveState]]:
        """Equal, element for element and bit for bit (decisions, state, diagnostics), to
        ``[self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``: the batch's
        node figures as segment operations over the snapshot's columns (see ``_decide_pools``)."""
        if len(states) != len(ctxs) or not distinct_pools(ctxs):
            return [self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]
        return _decide_pools(snap, params, states, ctxs)

    def _decide(
        self,
        snap: FleetSnapshot,
        params: SloPredictiveParams,
        state: SloPredictiveState,
        ctx: PolicyContext,
        nodes_of: NodesOf,
    ) -> PolicyResult[SloPredictiveState]:
        now = ctx.now_ms
        window_ms = max(1, snap.window_ms)
        tick_s = max(ctx.tick_ms, 1) / 1000.0
        lo, hi = params.bounds(ctx.pool_id)
        pool = snap.pools.get(ctx.pool_id)
        nodes = nodes_of(snap, ctx.pool_id)

        drained = tuple((i, t) for i, t in state.drained if now - t <= window_ms)
        asked = {i for i, _ in drained}
        active = [n for n in nodes if not n.draining and not n.stale and n.node_id not in asked]
        ejected = {i for i, b in ctx.breakers.items() if b.enforced and b.state == "open"}
        warm = [n for n in active if n.weights_state == "warm" and n.node_id not in ejected]
        arriving = [n for n in active if n.weights_state != "warm"]
        current = len(active)

        # Cold start: learn from nodes seen going from cold/loading to warm.
        since = dict(state.not_warm_since)
        cold_start = state.cold_start_s
        for n in nodes:
            if n.stale:
                continue
            if n.weights_state != "warm":
                since.setdefault(n.node_id, now)
            elif n.node_id in since:
                cold_start = _learn_cold_start(cold_start, now, since.pop(n.node_id))
        live = {n.node_id for n in nodes if not n.stale}
        not_warm_since = tuple(sorted((i, t) for i, t in since.items() if i in live))
        lead_s = cold_start if cold_start is not None else params.cold_start_s

        # Demand: served tokens/s, its trend over the lead, and the backlog.
        demand = (pool.prompt_tokens_rate_per_s + pool.output_tokens_rate_per_s) if pool else 0.0
        horizon_ms = max(lead_s * 1000.0, 3.0 * window_ms)
        samples = (*((t, d) for t, d in state.demand if now - t <= horizon_ms), (now, demand))
        # A controller that has not yet seen a whole horizon does not extrapolate (start-up).
        full = bool(state.demand) and now - state.demand[0][0] >= horizon_ms
        slope = trend_slope(samples, window_ms) if full else 0.0
        projected = demand + slope * lead_s
        backlog = sum(n.queued_prompt_tokens for n in active) / max(lead_s, window_ms / 1000.0)

        # Capacity per warm node at the target, learned from the pressure it is seen at.
        out_rate = pool.output_tokens_rate_per_s if pool else 0.0
        # The median node's concurrency, times the node count: one slow node piling up requests
        # (a breaker's case, not a capacity one) does not make the whole pool look stalled.
        running = len(warm) * (_median([float(n.running_requests) for n in warm]) or 0.0)
        started = state.demand[0][0] if state.demand else now
        settled = now - started >= window_ms and pool is not None and pool.requests_w >= params.min_requests
        # Output is counted when a call ends: until a whole window of calls has ended the rate
        # understates the tokens flowing and the ratio would read as a stall.
        tbt_now = 1000.0 * running / out_rate if warm and out_rate > 0 and settled else None
        tbt = state.tbt_ms
        if tbt_now is not None:
            beta = 1.0 - 0.5 ** (tick_s * 1000.0 / window_ms)
            tbt = tbt_now if tbt is None else tbt + beta * (tbt_now - tbt)
        elif not warm:
            tbt = None
        slo = ctx.pool_slo(snap)
        prefill = predicted_prefill_ms(pool, warm, params)
        p = pressure(warm, pool.ttft_p50_ms_w if pool else None, tbt, params, slo, prefill)
        p_now = p.value
        capacity = state.capacity_tok_s
        learnable = (
            pool is not None
            and warm
            and pool.requests_w >= params.min_requests
            and p_now >= MIN_LEARN_PRESSURE
            and demand > 0
        )
        c_obs: float | None = None
        if learnable:
            c_obs = demand / len(warm) / p_now
            alpha = 1.0 - 0.5 ** (tick_s / params.capacity_halflife_s)
            capacity = c_obs if capacity is None else capacity + alpha * (c_obs - capacity)

        # Open workflows: each one will call again (a chain of sequential calls), so while their
        # number grows the demand still ahead is not yet in the served tokens.
        counts = (
            (now, pool.open_workflows, pool.workflows_started, pool.workflows_ended)
            if pool is not None
            else (now, 0, 0, 0)
        )
        open_wf = (*(o for o in state.open_workflows if now - o[0] <= horizon_ms), counts)
        open_rise, open_noise = accumulation(open_wf) if full else (0.0, 0.0)
        accumulating = open_rise > ACCUMULATION_Z * open_noise
        growth = max(1.0, projected / demand) if demand > 0 else 1.0
        level = len(warm) * p_now
        by_capacity = (demand + backlog) / capacity if capacity else 0.0
        # Calls the router moved to another model's pool: demand this pool still has to carry.
        diverted_tok_s = pool.diverted_tokens_rate_per_s if pool is not None else 0.0
        diverted = diverted_tok_s / capacity if capacity else 0.0
        # A pool of the same model short of the nodes its pressure asks for: this pool carries it.
        sib_p, sib_short = sibling_excess(snap, ctx, params, pool, len(warm), nodes_of=nodes_of)
        sibling_binds = sib_short > 0
        need = (max(level, by_capacity) + diverted) * growth + sib_short
        if need > 0:
            need += params.spare_nodes  # N+k: survive losing k nodes while replacements warm up
        # A hostile figure the schema accepts (a node reporting 10**12 queued prompt tokens) reads
        # as ~1e15 nodes, past a decision's figure bound, and would fail the pool's whole tick
        # (breaker and routing with it). Past MAX_NEED_NODES the figure only says "as many as
        # allowed": max_nodes and the step limit apply after.
        need = min(need, MAX_NEED_NODES)

        inputs: dict[str, float] = {
            "warm_nodes": float(len(warm)),
            "arriving_nodes": float(len(arriving)),
            "pressure": r6(p_now),
            "pressure_kv": r6(p.kv),
            "pressure_queue": r6(p.queue),
            "demand_tok_s": r6(demand),
            "projected_tok_s": r6(projected),
            "backlog_tok_s": r6(backlog),
            "lead_s": r6(lead_s),
            "ttft_slo_ms": r6(slo.ttft_ms),
            "tbt_slo_ms": r6(slo.tbt_ms),
            "prefill_ms": r6(prefill),
            "open_workflows": float(counts[1]),
            "open_workflows_rise": r6(open_rise),
            "open_workflows_noise": r6(open_noise),
            "sibling_pressure": r6(sib_p),
            "sibling_short_nodes": r6(sib_short),
        }
        if p.ttft is not None:
            inputs["pressure_ttft"] = r6(p.ttft)
        if p.tbt is not None:
            inputs["pressure_tbt"] = r6(p.tbt)
        if capacity is not None:
            inputs["capacity_tok_s"] = r6(capacity)
        if diverted_tok_s > 0:
            inputs["diverted_tok_s"] = r6(diverted_tok_s)

        t = _target(
            state, params, pool, now=now, has_nodes=bool(nodes), current=current, n_warm=len(warm),
            capacity=capacity, need=need, slope=slope, sibling_binds=sibling_binds,
            accumulating=accumulating, lead_s=lead_s, bounds=(lo, hi),
        )  # fmt: skip
        raw, desired, reason, recs = t.raw, t.desired, t.reason, t.recs
        last_down, last_failure, failed_tasks = t.last_down_ms, t.last_failure_ms, t.failed_tasks
        inputs["need_nodes"] = r6(need)
        inputs["raw_desired"] = float(raw)

        drain: tuple[str, ...] = ()
        if desired < current:
            drain = tuple(n.node_id for n in drain_order(active)[: current - desired])
            drained = tuple(sorted((*drained, *((i, now) for i in drain))))

        new_state = SloPredictiveState(
            demand=samples,
            capacity_tok_s=capacity,
            cold_start_s=cold_start,
            not_warm_since=not_warm_since,
            recs=recs,
            last_desired=desired,
            last_down_ms=last_down,
            drained=drained,
            tbt_ms=tbt,
            failed_tasks=failed_tasks,
            last_failure_ms=last_failure,
            open_workflows=open_wf,
        )
        decision = AutoscaleDecision(
            entity=f"pool/{ctx.pool_id}",
            pool_id=ctx.pool_id,
            current_nodes=current,
            desired_nodes=desired,
            drain=drain,
            reason=reason,
            inputs=inputs,
        )
        diagnostics = {
            "pressure": r6(p_now),
            "need_nodes": r6(need),
            "desired_nodes": float(desired),
        }
        if c_obs is not None:
            diagnostics["capacity_obs_tok_s"] = r6(c_obs)
        return PolicyResult(decisions=(decision,), state=new_state, diagnostics=diagnostics)


# -- the batch form ---------------------------------------------------------------------------------
#
# ``SloPredictive.decide_pools``: every pool of a batch at once. The node figures each pool's tick
# reads (counts, sums and medians over its active, warm and arriving nodes, and its siblings') are
# segment operations over the snapshot's columns (:mod:`fleetloop.policies.pool_figures`), one numpy
# pass each for the whole batch, the same doubles as the plain form's Python arithmetic over the
# pool's nodes in node order; the rest (state, reasons, the decision) is the plain form's arithmetic
# pool by pool, with the decision assembled without validation when every part is in bounds.
# ``tests/unit/test_batch_sections.py`` holds it to the loop of :meth:`SloPredictive.decide`.

_AUTOSCALE_FIELDS = (
    "entity",
    "reason",
    "inputs",
    "kind",
    "pool_id",
    "current_nodes",
    "desired_nodes",
    "drain",
)
assert (
    tuple(AutoscaleDecision.model_fields) == _AUTOSCALE_FIELDS
)  # ``_autoscale_decision`` lists them in order
# The inputs every slo-predictive decision carries first, in order (the batch form's layout).
_INPUT_KEYS = (
    "warm_nodes",
    "arriving_nodes",
    "pressure",
    "pressure_kv",
    "pressure_queue",
    "demand_tok_s",
    "projected_tok_s",
    "backlog_tok_s",
    "lead_s",
    "ttft_slo_ms",
    "tbt_slo_ms",
    "prefill_ms",
    "open_workflows",
    "open_workflows_rise",
    "open_workflows_noise",
    "sibling_pressure",
    "sibling_short_nodes",
)
_AUTOSCALE_GIVEN = frozenset(
    ("entity", "pool_id", "current_nodes", "desired_nodes", "drain", "reason", "inputs")
)


def _autoscale_decision(  # noqa: PLR0917 - the decision's fields
    pool_id: str,
    current: int,
    desired: int,
    drain: tuple[str, ...],
    reason: str,
    inputs: dict[str, float],
    *,
    figures_in_bounds: bool,
) -> AutoscaleDecision:
    """``AutoscaleDecision(...)`` as :meth:`SloPredictive.decide` builds it, assembled without
    validation when every part is valid (the counts within ``NonNegInt``, the ids ``Ident``s, every
    figure a finite float within ``Figure``: ``figures_in_bounds``, the caller's ``inputs_ok`` of
    ``inputs``, all floats), else validated (and refused) as there."""
    if (
        0 <= current <= MAX_COUNT
        and 0 <= desired <= MAX_COUNT
        and type(current) is int
        and type(desired) is int
        and is_ident(pool_id)
        and all(is_ident(i) for i in drain)
        and figures_in_bounds
    ):
        values: dict[str, object] = {
            "entity": f"pool/{pool_id}",
            "reason": reason,
            "inputs": inputs,
            "kind": "autoscale",
            "pool_id": pool_id,
            "current_nodes": current,
            "desired_nodes": desired,
            "drain": drain,
        }
        return assemble(AutoscaleDecision, values, set(_AUTOSCALE_GIVEN))
    return AutoscaleDecision(
        entity=f"pool/{pool_id}",
        pool_id=pool_id,
        current_nodes=current,
        desired_nodes=desired,
        drain=drain,
        reason=reason,
        inputs=inputs,
    )


_T = TypeVar("_T", bound=tuple)  # type: ignore[type-arg]


def _recent(seq: tuple[_T, ...], now: int, span: float) -> tuple[_T, ...]:
    """``tuple(e for e in seq if now - e[0] <= span)``: the plain filter, here as a slice when the
    kept entries are a suffix (times ascending, as every tick appends ``now``), checked by the
    oldest kept time (the ``min`` of the suffix's times, taken in C), else the filter itself."""
    n = len(seq)
    i = 0
    while i < n and not now - seq[i][0] <= span:
        i += 1
    if i == n:
        return ()
    rest = seq[i:]
    if now - min(map(_FIRST, rest)) <= span:
        return rest
    return tuple(e for e in seq if now - e[0] <= span)


class _Target(NamedTuple):
    """A pool's node target this tick (:func:`_target`)."""

    raw: int  # before stabilization
    desired: int
    reason: str
    recs: tuple[tuple[int, int], ...]  # the raw targets stabilization keeps, this one last
    last_down_ms: int | None
    last_failure_ms: int | None
    failed_tasks: int


def _target(
    state: SloPredictiveState,
    params: SloPredictiveParams,
    pool: PoolView | None,
    *,
    now: int,
    has_nodes: bool,
    current: int,
    n_warm: int,
    capacity: float | None,
    need: float,
    slope: float,
    sibling_binds: bool,
    accumulating: bool,
    lead_s: float,
    bounds: tuple[int, int],
) -> _Target:
    """The raw target and its reason from ``need``, then stabilization (both forms): up at once past
    a short window (``up_window_s``), down only to the highest raw target within the down window
    (the lead, unless ``down_window_s``), held while tasks fail or accumulate, one step of at most
    ``down_step_frac`` per ``down_period_s``, clamped to the pool's bounds. ``has_nodes``: the pool
    has a node row; ``current``: its active nodes; ``n_warm``: those serving."""
    lo, hi = bounds
    if not has_nodes and pool is None:
        raw, reason = lo, "no-pool-yet"
    elif current == 0:
        raw, reason = max(lo, math.ceil(need)), "no-active-node"
    elif not n_warm and capacity is None:
        raw, reason = current, "nothing-warm-yet"
    elif abs(need / current - 1.0) <= params.tolerance:
        raw, reason = current, "within-tolerance"
    else:
        raw = math.ceil(need - 1e-9)
        reason = "scale-up" if raw > current else "scale-down"
    if slope > 0 and raw > current:
        reason = "scale-up-trend"
    if sibling_binds and raw > current:
        reason = "scale-up-sibling-short"

    down_window_ms = (params.down_window_s if params.down_window_s is not None else lead_s) * 1000.0
    up_window_ms = params.up_window_s * 1000.0
    keep_ms = max(down_window_ms, up_window_ms)
    first = () if state.last_desired is not None else ((now, current),)  # as HPA's first sync
    recs = (*first, *_recent(state.recs, now, keep_ms), (now, raw))
    up_floor = _within(recs, now, up_window_ms, min)
    down_ceiling = _within(recs, now, down_window_ms, max)
    desired = min(max(current, up_floor), down_ceiling)
    if raw > current and up_floor < raw:
        reason = "scale-up-stabilized"
    elif raw < current and down_ceiling > raw:
        reason = "scale-down-stabilized"
    last_down = state.last_down_ms
    last_failure = state.last_failure_ms
    failed_tasks = pool.tasks_failed if pool is not None else state.failed_tasks
    if failed_tasks > state.failed_tasks and state.last_desired is not None:
        last_failure = now
    failing = last_failure is not None and now - last_failure <= down_window_ms
    if desired < current and failing:
        desired, reason = current, "scale-down-held-tasks-failing"
    if desired < current and accumulating:
        desired, reason = current, "scale-down-held-tasks-accumulating"
    if desired < current:
        if last_down is not None and now - last_down < params.down_period_s * 1000.0:
            desired, reason = current, "scale-down-rate-limited"
        else:
            step = max(1, math.floor(params.down_step_frac * current))
            desired = max(desired, current - step)
    if current == 0:
        desired = raw
    clamped = min(max(desired, lo), hi)
    if clamped != desired:
        reason = "at-max-nodes" if clamped < desired else "at-min-nodes"
        desired = clamped
    if desired < current:
        last_down = now
    return _Target(raw, desired, reason, recs, last_down, last_failure, failed_tasks)


# The longest time from first seen cold to warm taken as a cold start: the bound of the
# ``cold_start_s`` parameter. A node that took longer was stuck, not starting.
MAX_COLD_START_S = 3600.0


def _learn_cold_start(cold_start: float | None, now: int, seen_cold_ms: int) -> float | None:
    """The EWMA (weight 1/2) of cold -> warm times, with the sample ``now - seen_cold_ms``. A sample
    outside (0, ``MAX_COLD_START_S``] is no cold start but a clock that jumped (a tick from the far
    future, then back) or a stuck node, and is not learned: a negative one made the lead and the down
    window negative (an empty max(), the pool's tick refused), a huge one a lead of years."""
    sample = (now - seen_cold_ms) / 1000.0
    if not 0.0 < sample <= MAX_COLD_START_S:
        return cold_start
    return sample if cold_start is None else 0.5 * cold_start + 0.5 * sample


def _within(
    recs: tuple[tuple[int, int], ...], now: int, span: float, pick: Callable[[Iterable[int]], int]
) -> int:
    """``pick(r for t, r in recs if now - t <= span)``. When the times ascend (every tick appends
    ``now``), the entries within ``span`` are a suffix: its start is found by bisection, and checked
    (the suffix's oldest time is within ``span``, the newest time before it is not: ``min`` and
    ``max`` taken in C), then the suffix is picked in C; else the plain generator."""
    i = bisect_left(recs, True, key=lambda e: now - e[0] <= span)
    rest = recs[i:]
    if (not rest or now - min(map(_FIRST, rest)) <= span) and (
        i == 0 or not now - max(map(_FIRST, recs[:i])) <= span
    ):
        return pick(map(_SECOND, rest))
    return pick(r for t, r in recs if now - t <= span)


_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


class _Sides(NamedTuple):
    """Per pool of the columns: the figures of a set of its nodes (``warm``) within ``active``."""

    active: list[int]
    warm: list[int]
    kv: list[float]  # sum of kv_cache_used_frac over warm
    hit: list[float]  # sum of prefix_cache_hit_frac over warm
    waiting: list[float]  # sum of queue_depth over warm (the exact integer, as a double)
    running: list[float]  # sum of running_requests over warm (likewise)
    first: list[int]  # the first warm row (-1 without)


def _sides(snap: FleetSnapshot, active: Bools, warm: Bools) -> _Sides:
    cols = fleet_columns(snap)
    n_warm = segment_counts(cols, warm)
    rows = np.flatnonzero(warm)
    at = np.searchsorted(cols.pool_of[rows], np.arange(len(cols.pool_ids), dtype=np.int64))
    first = np.where(n_warm > 0, rows[np.minimum(at, max(len(rows) - 1, 0))] if len(rows) else -1, -1)
    return _Sides(
        segment_counts(cols, active).tolist(),
        n_warm.tolist(),
        segment_sums(cols, cols.floats("kv_cache_used_frac"), warm).tolist(),
        segment_sums(cols, cols.floats("prefix_cache_hit_frac"), warm).tolist(),
        segment_whole_sums(cols, "queue_depth", warm).tolist(),
        segment_whole_sums(cols, "running_requests", warm).tolist(),
        first.tolist(),
    )


def _prefill(  # noqa: PLR0917 - the pool, its warm nodes' figures, the params
    snap: FleetSnapshot,
    pool: PoolView | None,
    n_warm: int,
    hit_sum: float,
    first: int,
    params: SloPredictiveParams,
) -> float:
    """:func:`predicted_prefill_ms` from the warm nodes' hit sum and the first warm row."""
    if pool is None or not n_warm or pool.request_rate_per_s <= 0:
        return 0.0
    hit = hit_sum / n_warm
    tokens = pool.prompt_tokens_rate_per_s / pool.request_rate_per_s * (1.0 - min(max(hit, 0.0), 1.0))
    cols = fleet_columns(snap)
    rec = records(cols)[first]
    ms = prefill_ms(
        rec.model, rec.gpu_type, int(cols.ints("gpu_count")[first]), tokens, params.prefill_efficiency
    )
    return ms if ms is not None else 0.0


def _pressure_of(  # noqa: PLR0917 - :func:`pressure`'s sums, then its signals
    n_warm: int,
    kv_sum: float,
    waiting: float,
    running: float,
    ttft: float | None,
    tbt: float | None,
    params: SloPredictiveParams,
    slo: Slo,
    prefill: float,
) -> Pressure:
    """:func:`pressure` from the warm nodes' sums."""
    kv = kv_sum / n_warm / params.kv_target if n_warm else 0.0
    queue = (running + waiting) / max(running, 1) if n_warm and waiting >= n_warm else 0.0
    return Pressure(
        queue=queue,
        kv=kv,
        ttft=max(0.0, ttft - prefill) / (params.headroom * slo.ttft_ms) if ttft is not None else None,
        tbt=tbt / (params.headroom * slo.tbt_ms) if tbt is not None else None,
    )


def _decide_pools(
    snap: FleetSnapshot,
    params: SloPredictiveParams,
    states: Sequence[SloPredictiveState],
    ctxs: Sequence[PolicyContext],
) -> list[PolicyResult[SloPredictiveState]]:
    cols = fleet_columns(snap)
    index = pool_index(snap)
    window_ms = max(1, snap.window_ms)
    draining, stale = cols.draining, cols.stale
    is_warm = loaded(snap)
    base = ~draining & ~stale  # a sibling's active nodes: nothing left out
    active = base
    ejected_rows: Bools | None = None
    drained_of: list[tuple[tuple[str, int], ...]] = []
    ejected_of: list[set[str]] = []
    for st, ctx in zip(states, ctxs, strict=True):
        now = ctx.now_ms
        drained = tuple((i, t) for i, t in st.drained if now - t <= window_ms) if st.drained else ()
        drained_of.append(drained)
        if drained:
            if active is base:
                active = base.copy()
            mark_rows(snap, active, ctx.pool_id, [i for i, _ in drained], value=False)
        ejected = ejected_by(snap, ctx.breakers)
        ejected_of.append(ejected)
        if ejected:
            if ejected_rows is None:
                ejected_rows = np.zeros(len(cols), dtype=np.bool_)
            mark_rows(snap, ejected_rows, ctx.pool_id, ejected)
    s_warm = base & is_warm
    sib = _sides(snap, base, s_warm)
    if active is base and ejected_rows is None:
        own = sib
    else:
        warm_rows = active & is_warm
        if ejected_rows is not None:
            warm_rows &= ~ejected_rows
        own = _sides(snap, active, warm_rows)
    arriving = segment_counts(cols, active & ~is_warm).tolist()
    running_w = np.where(active & is_warm, cols.floats("running_requests"), np.nan)  # ints, exact
    if ejected_rows is not None:
        running_w[ejected_rows] = np.nan
    medians = segment_medians(running_w, cols.pool_of, len(cols.pool_ids))[0].tolist()
    not_warm = segment_counts(cols, ~stale & ~is_warm).tolist()
    backlog_sum = segment_whole_sums(cols, "queued_prompt_tokens", active).tolist()

    # A sibling's (P_s, P_s * n_s - a_s), read against an SLO, for the model's pools short (> 0).
    shortfalls: dict[tuple[str, Slo], list[tuple[str, float, float]]] = {}
    sib_prefill: list[float | None] = [None] * len(cols.pool_ids)

    def prefill_of(j: int) -> float:
        found = sib_prefill[j]
        if found is None:
            found = sib_prefill[j] = _prefill(
                snap, snap.pools.get(cols.pool_ids[j]), sib.warm[j], sib.hit[j], sib.first[j], params
            )
        return found

    def short_of(model: str, slo: Slo) -> list[tuple[str, float, float]]:
        found = shortfalls.get((model, slo))
        if found is None:
            found = shortfalls[(model, slo)] = []
            for sid, sview in _model_pools(snap, model):
                j = index.get(sid)
                if j is None or not sib.warm[j]:
                    continue
                n = sib.warm[j]
                prefill_s = (
                    prefill_of(j)
                    if sview is snap.pools.get(sid)
                    else _prefill(snap, sview, n, sib.hit[j], sib.first[j], params)
                )
                p_s = _pressure_of(
                    n,
                    sib.kv[j],
                    sib.waiting[j],
                    sib.running[j],
                    sview.ttft_p50_ms_w,
                    None,
                    params,
                    slo,
                    prefill_s,
                ).value
                short = p_s * n - sib.active[j]
                if short > 0:
                    found.append((sid, p_s, short))
        return found

    # Every figure the pools' decisions and diagnostics round, in one list: rounded at once after the
    # loop (``r6_many``, the same doubles as ``r6``), then handed back in order.
    flat: list[float] = []
    made: list[tuple[str, int, int, tuple[str, ...], str, tuple[str, ...], SloPredictiveState, bool]] = []
    for k, (state, ctx) in enumerate(zip(states, ctxs, strict=True)):
        pid = ctx.pool_id
        now = ctx.now_ms
        tick_s = max(ctx.tick_ms, 1) / 1000.0
        lo, hi = params.bounds(pid)
        pool = snap.pools.get(pid)
        j = index.get(pid, -1)
        has_nodes = j >= 0
        drained = drained_of[k]
        ejected = ejected_of[k]
        if has_nodes:
            current = own.active[j]
            n_warm = own.warm[j]
            n_arriving = arriving[j]
        else:
            current = n_warm = n_arriving = 0

        # Cold start: learn from nodes seen going from cold/loading to warm.
        cold_start = state.cold_start_s
        if state.not_warm_since or (has_nodes and not_warm[j]):
            since = dict(state.not_warm_since)
            a, b = cols.bounds.get(pid, (0, 0))
            ids = row_ids(snap)[a:b]
            stale_l = stale[a:b].tolist()
            for node_id, s_, w_ in zip(ids, stale_l, is_warm[a:b].tolist(), strict=True):
                if s_:
                    continue
                if not w_:
                    since.setdefault(node_id, now)
                elif node_id in since:
                    cold_start = _learn_cold_start(cold_start, now, since.pop(node_id))
            live = {node_id for node_id, s_ in zip(ids, stale_l, strict=True) if not s_}
            not_warm_since = tuple(sorted((i, t) for i, t in since.items() if i in live))
        else:
            not_warm_since = ()
        lead_s = cold_start if cold_start is not None else params.cold_start_s

        # Demand: served tokens/s, its trend over the lead, and the backlog.
        demand = (pool.prompt_tokens_rate_per_s + pool.output_tokens_rate_per_s) if pool else 0.0
        horizon_ms = max(lead_s * 1000.0, 3.0 * window_ms)
        samples = (*_recent(state.demand, now, horizon_ms), (now, demand))
        full = bool(state.demand) and now - state.demand[0][0] >= horizon_ms
        slope = trend_slope(samples, window_ms) if full else 0.0
        projected = demand + slope * lead_s
        backlog = (backlog_sum[j] if has_nodes else 0) / max(lead_s, window_ms / 1000.0)

        out_rate = pool.output_tokens_rate_per_s if pool else 0.0
        running = n_warm * ((medians[j] if n_warm else None) or 0.0)
        started = state.demand[0][0] if state.demand else now
        settled = now - started >= window_ms and pool is not None and pool.requests_w >= params.min_requests
        tbt_now = 1000.0 * running / out_rate if n_warm and out_rate > 0 and settled else None
        tbt = state.tbt_ms
        if tbt_now is not None:
            beta = 1.0 - 0.5 ** (tick_s * 1000.0 / window_ms)
            tbt = tbt_now if tbt is None else tbt + beta * (tbt_now - tbt)
        elif not n_warm:
            tbt = None
        slo = ctx.pool_slo(snap)
        if has_nodes:
            if own is sib or (
                n_warm == sib.warm[j] and own.hit[j] == sib.hit[j] and own.first[j] == sib.first[j]
            ):
                # The pool's own warm nodes give the siblings' figures (nothing of it drained or
                # ejected): the same prefill, computed once (a signed zero hit sum reads as +0.0).
                prefill = prefill_of(j)
            else:
                prefill = _prefill(snap, pool, n_warm, own.hit[j], own.first[j], params)
            p = _pressure_of(
                n_warm, own.kv[j], own.waiting[j], own.running[j],
                pool.ttft_p50_ms_w if pool else None, tbt, params, slo, prefill,
            )  # fmt: skip
        else:
            prefill = _prefill(snap, pool, 0, 0.0, -1, params)
            p = _pressure_of(0, 0.0, 0, 0, pool.ttft_p50_ms_w if pool else None, tbt, params, slo, prefill)
        p_now = p.value
        capacity = state.capacity_tok_s
        learnable = (
            pool is not None
            and n_warm
            and pool.requests_w >= params.min_requests
            and p_now >= MIN_LEARN_PRESSURE
            and demand > 0
        )
        c_obs: float | None = None
        if learnable:
            c_obs = demand / n_warm / p_now
            alpha = 1.0 - 0.5 ** (tick_s / params.capacity_halflife_s)
            capacity = c_obs if capacity is None else capacity + alpha * (c_obs - capacity)

        counts = (
            (now, pool.open_workflows, pool.workflows_started, pool.workflows_ended)
            if pool is not None
            else (now, 0, 0, 0)
        )
        open_wf = (*_recent(state.open_workflows, now, horizon_ms), counts)
        open_rise, open_noise = accumulation(open_wf) if full else (0.0, 0.0)
        accumulating = open_rise > ACCUMULATION_Z * open_noise
        growth = max(1.0, projected / demand) if demand > 0 else 1.0
        level = n_warm * p_now
        by_capacity = (demand + backlog) / capacity if capacity else 0.0
        # Calls the router moved to another model's pool: demand this pool still has to carry.
        diverted_tok_s = pool.diverted_tokens_rate_per_s if pool is not None else 0.0
        diverted = diverted_tok_s / capacity if capacity else 0.0

        # The siblings (:func:`sibling_excess`).
        sib_p, sib_short = 0.0, 0.0
        if pool is not None and pool.model:
            crossing = False
            if ejected:
                # ``sibling_excess``'s test: does a breaker of this pool name a sibling's node?
                owners = pool_owners(snap)
                model = pool.model
                crossing = any(
                    sid != pid and snap.pools[sid].model == model
                    for node_id in ejected
                    for sid in owners(node_id)
                )
            if crossing:
                sib_p, sib_short = sibling_excess(snap, ctx, params, pool, n_warm)
            else:
                for sid, p_s, short in short_of(pool.model, slo):
                    if sid != pid and short > sib_short:
                        sib_p, sib_short = p_s, short
        sibling_binds = sib_short > 0
        need = (max(level, by_capacity) + diverted) * growth + sib_short
        if need > 0:
            need += params.spare_nodes
        need = min(need, MAX_NEED_NODES)

        # The decision's inputs, in order, before rounding (``float(n)`` is its own rounding).
        keys: tuple[str, ...] = _INPUT_KEYS
        flat += (
            float(n_warm), float(n_arriving), p_now, p.kv, p.queue, demand, projected, backlog, lead_s,
            slo.ttft_ms, slo.tbt_ms, prefill, float(counts[1]), open_rise, open_noise, sib_p, sib_short,
        )  # fmt: skip
        if p.ttft is not None or p.tbt is not None or capacity is not None or diverted_tok_s > 0:
            more = []
            if p.ttft is not None:
                more.append("pressure_ttft")
                flat.append(p.ttft)
            if p.tbt is not None:
                more.append("pressure_tbt")
                flat.append(p.tbt)
            if capacity is not None:
                more.append("capacity_tok_s")
                flat.append(capacity)
            if diverted_tok_s > 0:
                more.append("diverted_tok_s")
                flat.append(diverted_tok_s)
            keys = (*keys, *more)

        t = _target(
            state, params, pool, now=now, has_nodes=has_nodes, current=current, n_warm=n_warm,
            capacity=capacity, need=need, slope=slope, sibling_binds=sibling_binds,
            accumulating=accumulating, lead_s=lead_s, bounds=(lo, hi),
        )  # fmt: skip
        raw, desired, reason, recs = t.raw, t.desired, t.reason, t.recs
        last_down, last_failure, failed_tasks = t.last_down_ms, t.last_failure_ms, t.failed_tasks
        flat += (need, float(raw))

        drain: tuple[str, ...] = ()
        if desired < current:
            asked = {i for i, _ in drained}
            nodes = [
                n
                for n in node_figures(snap, pid)
                if not n.draining and not n.stale and n.node_id not in asked
            ]
            drain = tuple(n.node_id for n in drain_order(nodes)[: current - desired])
            drained = tuple(sorted((*drained, *((i, now) for i in drain))))

        new_state = SloPredictiveState(
            demand=samples,
            capacity_tok_s=capacity,
            cold_start_s=cold_start,
            not_warm_since=not_warm_since,
            recs=recs,
            last_desired=desired,
            last_down_ms=last_down,
            drained=drained,
            tbt_ms=tbt,
            failed_tasks=failed_tasks,
            last_failure_ms=last_failure,
            open_workflows=open_wf,
        )
        if c_obs is not None:
            flat.append(c_obs)
        made.append((pid, current, desired, drain, reason, keys, new_state, c_obs is not None))

    rounded, bounded = r6_many(flat)
    results: list[PolicyResult[SloPredictiveState]] = []
    at = 0
    for pid, current, desired, drain, reason, names, new_state, has_obs in made:
        end = at + len(names) + 2
        inputs = dict(zip((*names, "need_nodes", "raw_desired"), rounded[at:end], strict=True))
        diagnostics = {
            "pressure": inputs["pressure"],
            "need_nodes": inputs["need_nodes"],
            "desired_nodes": float(desired),
        }
        ok = all(bounded[at:end])
        if has_obs:
            diagnostics["capacity_obs_tok_s"] = rounded[end]
            end += 1
        at = end
        decision = _autoscale_decision(pid, current, desired, drain, reason, inputs, figures_in_bounds=ok)
        results.append(PolicyResult(decisions=(decision,), state=new_state, diagnostics=diagnostics))
    return results
