"""latency-outlier: eject a node that is far slower than its pool, or that keeps failing; probe it
before trusting it again; bring returning and newly warm nodes back on a slow-start ramp.

What it does: a degraded GPU (thermal throttling, a failing HBM stack, a link fallen back to PCIe)
throws no errors; it answers, slowly, and a load balancer that only counts errors keeps feeding it
while clients time out and retry. This breaker compares each node's latency with its pool's
median, robustly, and ejects the node when its per-token time sits far above its peers' (and its
first-token time is not fine either) for long enough; it also ejects on consecutive errors by
running the ``consecutive-errors`` state machine
(:func:`fleetloop.policies.breaker.consecutive_errors.step`) alongside.

Formula. Each node remembers its figures of the last ``memory_ms`` (telemetry reports a step time
only when an iteration ends in the interval, and a long decode run on a slow GPU is one iteration
to the books, so a single interval is often empty); a signal's value for the node is the median of
its remembered figures, once there are ``min_samples`` of them (a fresh step time that is not
flagged clears the TBT family at once, so the median does not outlive the episode that raised it).
Per signal ``x`` in two families, TBT = (``tbt_p50_ms``, ``tbt_p99_ms``) and TTFT =
(``ttft_mean_ms_w``, router-observed over the window, ``ttft_p99_ms``), over the pool's serving
nodes (warm, not stale) that have a value, when at least ``min_hosts`` do::

    m = median(x_j)      MAD = median(|x_j - m|)
    flagged(x_i) = x_i >= ratio * m  and  x_i >= m + k * 1.4826 * MAD  and  x_i - m >= floor
    family: flagged if any of its signals is, else clear if any has a value, else nodata; TTFT also
            counts as flagged when the node has no first token in the window but reported timeouts
    outlier_i = TBT flagged and TTFT not clear        (slow steps, first tokens not fine either)

Queueing inflates first-token time but not step time, so step time leads. A healthy node that
prefills a very long prompt also shows long iterations (attention over a 100k context makes an
8192-token chunk take about a second) for as long as that prefill lasts, ten seconds or so; a
degraded GPU stays slow for minutes. Hence the persistence rule. A state machine per node (the
latency one; the error one is ``consecutive-errors``')::

    closed    --(outlier for detect_ticks ticks in a row)-->           open   (ejections += 1)
    open      --(now >= since + min(base * 2**(ejections-1), max))-->  half_open (probe_frac)
    half_open --(outlier again, or TTFT flagged with no step figure)--> open  (ejections += 1)
    half_open --(clean figures after probe_min_ms, or no verdict by probe_max_ms)--> closed, ramping
    closed    --(forgive_after_ms without ejection)-->                 ejections = 0

Published state: ``open`` if either machine is open; else ``half_open`` with ``probe_frac`` if
either probes; else, for ``slow_start_ms`` after a node came back from half-open or turned warm
(weights loaded) after the first tick, ``half_open`` with ``probe_frac = share x (min_frac +
(1 - min_frac) x elapsed / slow_start_ms)``, ``share = 1 / serving nodes`` (the engine gives a
half-open node exactly ``probe_frac`` of the pool's traffic: that is the routing-weight ramp);
else ``closed``.

Pool-wide failures: an error ejection (consecutive failures) is published as detected, not
enforced (reason ``...:pool-wide``) while the pool's failure level is at least half the node's own
failure share (``POOL_WIDE_SHARE`` 0.5, the same "half the pool" reading as the panic threshold):
when every node times out together (a slowdown shared by the pool, or overload) the failures are
not the node's, and ejecting it piles its calls onto nodes failing the same way. The pool's level
is the median failure share over the serving nodes that took calls and are *not* in a failure
streak themselves (``consecutive_failures < error_threshold``); over all of them when every one is::

    level = median{ failures_w_j / requests_w_j : j serving, requests_w_j > 0,
                    consecutive_failures_j < error_threshold }   (all such j when none qualifies)
    shared_i = serving_i and level >= POOL_WIDE_SHARE * failures_w_i / requests_w_i > 0

The nodes in a streak are the ones being judged, so they are not their own evidence: when a
quarter of the hosts crash in a pool the autoscaler had shrunk, three of the five nodes that took
calls fail every new call at once (connection refused) while their window still holds successes
from before the crash, and a median over all five read the pool as failing with them, so the dead
nodes kept their routing weight for the five seconds until their telemetry went stale
(host-loss-mid-decode lost two priority-0 tasks there). The nodes whose latest calls succeed say
whether the failures are everywhere: in a pool-wide slowdown they time out too (their window share
stays near the streaking node's) and the ejection is still withheld; when they succeed, the
streaking node fails alone (a black hole, a broken GPU, a crashed host) and is ejected. A node
that stopped reporting (stale) is never shielded. The engine adds a capacity check on top (no
ejection whose useful work the rest cannot carry); a node in a failure streak carries none, so
an error ejection is enforced at the tick it opens, however loaded the pool
(``fleetloop.core.decide.shaping.cap_ejections``).

No release before the end: an ejection this breaker published enforced stays enforced until its
``until_ms`` (:func:`held_open`, from the node's last emitted record). The pool-wide rule and the
panic threshold decide whether to enforce an ejection, not whether to release one: both are read
afresh every tick, from a window that empties once routers stop sending to the ejected node (its
failure share then reads 0) or from peers that start failing, and a release would bring the node
back for a tick or two and take it out again (a flap, with a failed call or more each time). It
comes back through the half-open probe, as an ejection that was never shielded does.

Caps: a new latency ejection is enforced only while the pool's open nodes stay within
``floor(max_ejected_frac x nodes)`` (most severe first, severity = the node's largest ratio to its
pool median); beyond it the breaker is "detected", not enforced. Panic threshold: when fewer than
``panic_threshold`` of the serving nodes are neither open nor outliers, the latency breakers of
the pool are all published as detected, not enforced: a pool-wide slowdown is overload, and
ejecting would pile the load on fewer nodes. Error ejections are capped by the engine's envelope.

Records are change-only (:mod:`fleetloop.policies.breaker.emission`, the rule every breaker shares):
an open or half-open node's decision every tick; a closed node's when its state fields (state,
enforced, probe fraction, until, reason, ejections) differ from its last emitted record, and on its
keyframe ticks (every ``KEYFRAME_TICKS`` ticks, staggered by node id). The state keeps, per node, the
fields last emitted.

Inputs: the SLO (``ctx.slo``, for the floors); per node ``tbt_p50_ms``, ``tbt_p99_ms``,
``ttft_p99_ms`` (node telemetry over its last interval), ``ttft_mean_ms_w``, ``consecutive_failures``,
``requests_w`` and ``failures_w`` (router outcomes), ``node_timeouts_w``, ``weights_state``,
``draining``, ``stale``; ``ctx.now_ms``.

Parameters (defaults, bounds; the reasoning behind each):

- ``ratio`` 3.0 (1.5-100) and ``k`` 3.0 (0-20): healthy replicas of one pool under balanced load
  differ in step time by their batch's KV reads (tens of percent) and in first-token time by their
  prompt mix (within ~2x over a window); degraded GPUs run 2-10x slower. 3x the median and three
  scaled MADs (Leys et al. 2013, "Detecting outliers: do not use standard deviation around the
  mean, use absolute deviation around the median", which recommends 2.5-3) catch the bad ones
  without ejecting the busy ones; a 2x degradation goes unseen, by design.
- ``tbt_floor_frac`` 0.1 and ``ttft_floor_frac`` 0.05 (0-1) of the pool's SLO (``spec.slo``, the
  strictest class among the calls it served; no copy here): a node must also be this much slower
  in absolute terms; a tenth of the TBT SLO (10 ms of 100) or a twentieth of the TTFT SLO (100 ms
  of 2 s) is small against what a call may take, so ratios over tiny numbers (an idle llama-8b)
  do not trip, and a pool held to a looser SLO tolerates proportionally more.
- ``min_hosts`` 3 (2-1000): a median of fewer nodes says nothing about which one is odd.
- ``memory_ms`` 20 000 (0-600 000), ``min_samples`` 2 (1-1000): a slow node reports a step time
  every few seconds; 20 s gathers a few, and has expired by the time a 30 s ejection ends, so a
  probe is judged on fresh figures.
- ``detect_ticks`` 10 (1-100): ten one-second ticks in a row, longer than the longest prefill a
  healthy node does (a 100k-token prompt, about twelve 8192-token iterations), far shorter than a
  degradation; the routing section's speed scorer moves traffic off the node meanwhile.
- ``base_ejection_ms`` 30 000, ``max_ejection_ms`` 300 000: Envoy's outlier-detection defaults
  (30 s base, 300 s cap), doubled per repeat ejection.
- ``probe_frac`` 0.05 (0-0.5), ``probe_min_ms`` 10 000, ``probe_max_ms`` 60 000: a few calls for a
  window's worth of evidence; a node that got no verdict in a minute returns on the ramp.
- ``slow_start_ms`` 20 000 (0-600 000), ``slow_start_min_frac`` 0.25 (0-1): a returning or newly
  warm node starts at a quarter of its fair share and reaches it in 20 s, long enough for a few
  telemetry intervals to show a relapse before it carries a full share, short enough not to waste a
  freshly loaded node during a burst (a cold start already took minutes).
- ``max_ejected_frac`` 0.34 (0-1): at most a third of a pool ejected for latency, so the rest
  carries at most 1.5x its load.
- ``panic_threshold`` 0.5 (0-1): Envoy's ``healthy_panic_threshold`` default.
- ``error_threshold`` 5 (1-1000), ``error_forgive_after_ms`` 300 000, ``forgive_after_ms`` 300 000:
  the consecutive-errors machine's parameters (Envoy's consecutive-5xx default of 5).

Implementation: :func:`decide_columns` computes the same thing as the per-node form
(``tests.oracles.policies.latency_outlier_plain``, the tests' reference): the remembered figures, the pool's
medians and MADs, the failure level and every node's verdict are array operations over the
snapshot's fleet-wide columns (:mod:`fleetloop.policies.columns`); the state machines are stepped
only for nodes with something to step, and a closed node's decision is assembled directly. Tested
decision for decision, byte for byte, on generated fleets (``tests/unit/test_fast_breaker.py``).
``LatencyOutlier.decide_pools`` (:mod:`fleetloop.policies.breaker.latency_batch`) decides a batch
of pools at once with the same arithmetic, equal to the loop of ``decide`` bit for bit
(``tests/unit/test_breaker_batch.py``).

State: per node, the two machines (:class:`NodeState`); per pool, the remembered figures as
arrays (:class:`fleetloop.policies.memory.PoolMemory`: a row per node, a slot per remembered tick),
so the medians of a whole pool are a few array operations rather than four sorts per node (a
10,000-node fleet decides every second). The arrays hold exactly what a per-node list would
(``tests/policies/test_fast_paths.py`` compares them tick by tick, bit for bit). A checkpoint
written before this layout (a ``NodeState`` with its own ``obs`` list) does not decode: the shard
starts fresh and says why.

Trade-offs: latency detection needs peers: it is off in pools with fewer than ``min_hosts``
reporting nodes, and it cannot see a slowdown shared by most of the pool (that is load, handled by
routing, admission and autoscaling). Detection takes ``detect_ticks`` plus the figures' arrival
(10-20 s); a node slow for less goes unejected. Slow start delays a new node's full share by 20 s.

Failure mode: a healthy node that prefills back-to-back very long prompts for longer than
``detect_ticks`` can be flagged; it keeps its in-flight work and is probed back in. A half-open node
that gets no probe calls returns after ``probe_max_ms`` and is caught again by detection (with a
longer backoff). If most nodes' telemetry goes stale the reference median is missing and the
latency machine holds its state; error ejection goes on. In a pool-wide slowdown where the few
nodes not in a failure streak happen to succeed more than half as often as the streaking ones, an
error ejection is enforced that the old all-node median withheld, and the engine's capacity check
does not refuse it (the node's streak says it carries no useful work). An ejection enforced just
before the pool turns to a pool-wide failure stays out to its end (no release before the end).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from fleetloop.policies.base import FleetSnapshot, NodeView, Params, PolicyContext, PolicyResult, r6, r6_array
from fleetloop.policies.breaker.consecutive_errors import ConsecutiveErrorsParams, NodeBreaker, step
from fleetloop.policies.breaker.emission import (
    KEYFRAME_TICKS,
    Emitted,
    Fields,
    emits,
    fields_of,
    keyframe_residue,
    phase,
)
from fleetloop.policies.columns import FleetColumns, Floats, fleet_columns
from fleetloop.policies.memory import PoolMemory, median_sorted
from fleetloop.policies.pool_figures import row_ids
from fleetloop.policies.slo import DEFAULT_BOOK, Slo
from fleetloop.schemas.base import MAX_COUNT, MAX_EPOCH_MS, MAX_FIGURE, assemble
from fleetloop.schemas.decisions import BreakerDecision, BreakerStateName

MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data
POOL_WIDE_SHARE = 0.5  # the median node failing at >= half this node's rate: the failure is the pool's
TBT_SIGNALS: tuple[str, ...] = ("tbt_p50_ms", "tbt_p99_ms")
TTFT_SIGNALS: tuple[str, ...] = ("ttft_mean_ms_w", "ttft_p99_ms")
SIGNALS: tuple[str, ...] = (*TBT_SIGNALS, *TTFT_SIGNALS)


class LatencyOutlierParams(Params):
    ratio: float = Field(default=3.0, ge=1.5, le=100.0)
    k: float = Field(default=3.0, ge=0.0, le=20.0)
    tbt_floor_frac: float = Field(default=0.1, ge=0.0, le=1.0)
    ttft_floor_frac: float = Field(default=0.05, ge=0.0, le=1.0)
    min_hosts: int = Field(default=3, ge=2, le=1000)
    memory_ms: int = Field(default=20_000, ge=0, le=600_000)
    min_samples: int = Field(default=2, ge=1, le=1000)
    detect_ticks: int = Field(default=10, ge=1, le=100)
    base_ejection_ms: int = Field(default=30_000, ge=100, le=3_600_000)
    max_ejection_ms: int = Field(default=300_000, ge=100, le=86_400_000)
    probe_frac: float = Field(default=0.05, ge=0.0, le=0.5)
    probe_min_ms: int = Field(default=10_000, ge=0, le=3_600_000)
    probe_max_ms: int = Field(default=60_000, ge=0, le=3_600_000)
    slow_start_ms: int = Field(default=20_000, ge=0, le=600_000)
    slow_start_min_frac: float = Field(default=0.25, ge=0.0, le=1.0)
    max_ejected_frac: float = Field(default=0.34, ge=0.0, le=1.0)
    panic_threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    forgive_after_ms: int = Field(default=300_000, ge=0)
    error_threshold: int = Field(default=5, ge=1, le=1000)
    error_forgive_after_ms: int = Field(default=300_000, ge=0)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.max_ejection_ms < self.base_ejection_ms:
            raise ValueError("max_ejection_ms cannot be smaller than base_ejection_ms")
        if self.probe_max_ms < self.probe_min_ms:
            raise ValueError("probe_max_ms cannot be smaller than probe_min_ms")
        return self

    def errors(self) -> ConsecutiveErrorsParams:
        """The consecutive-errors machine's parameters (same backoff and probe share), built once
        per params object (params are frozen)."""
        found = _ERRORS.get(id(self))
        if found is not None and found[0] is self:
            return found[1]
        if len(_ERRORS) >= 64:
            _ERRORS.clear()
        errors = self._errors()
        _ERRORS[id(self)] = (self, errors)
        return errors

    def _errors(self) -> ConsecutiveErrorsParams:
        return ConsecutiveErrorsParams(
            threshold=self.error_threshold,
            base_ejection_ms=self.base_ejection_ms,
            max_ejection_ms=self.max_ejection_ms,
            probe_frac=self.probe_frac,
            forgive_after_ms=self.error_forgive_after_ms,
        )


# id(params) -> (params, its errors()): the params object is kept, so its id is not reused meanwhile.
_ERRORS: dict[int, tuple[LatencyOutlierParams, ConsecutiveErrorsParams]] = {}

Obs = tuple[tuple[int, float | None, float | None, float | None, float | None], ...]


@dataclass(frozen=True, slots=True)
class NodeState:
    err: NodeBreaker = field(default_factory=NodeBreaker)
    lat: BreakerStateName = "closed"
    lat_since_ms: int = 0
    lat_ejections: int = 0
    flagged_ticks: int = 0
    ramp_from_ms: int | None = None
    was_warm: bool = False


def _with(ns: NodeState, **kw: Any) -> NodeState:
    """``dataclasses.replace`` for the hot path (it runs for every node on every tick)."""
    return NodeState(
        kw.get("err", ns.err),
        kw.get("lat", ns.lat),
        kw.get("lat_since_ms", ns.lat_since_ms),
        kw.get("lat_ejections", ns.lat_ejections),
        kw.get("flagged_ticks", ns.flagged_ticks),
        kw.get("ramp_from_ms", ns.ramp_from_ms),
        kw.get("was_warm", ns.was_warm),
    )


def _eject_within_cap(
    params: LatencyOutlierParams,
    pool_size: int,
    *,
    wants: list[tuple[float, str]],
    stepped: dict[str, NodeState],
    reasons: dict[str, str],
    open_now: int,
    now: int,
) -> set[str]:
    """Cap on the share ejected for latency, most severe first: opens the nodes of ``wants``
    (``(-severity, node)``) in ``stepped`` while ``open_now`` stays within
    ``floor(max_ejected_frac x pool_size)``; the rest are named ``:max-ejected`` in ``reasons`` and
    returned."""
    cap = math.floor(params.max_ejected_frac * pool_size + 1e-9)
    over_cap: set[str] = set()
    for _, node_id in sorted(wants):
        ns = stepped[node_id]
        if open_now + 1 <= cap:
            stepped[node_id] = _with(
                ns, lat="open", lat_since_ms=now, lat_ejections=ns.lat_ejections + 1, flagged_ticks=0
            )
            open_now += 1 if ns.err.state != "open" else 0
        else:
            over_cap.add(node_id)
            reasons[node_id] = f"{reasons[node_id]}:max-ejected"
    return over_cap


def _empty_memory() -> PoolMemory:
    return PoolMemory.empty(len(SIGNALS))


@dataclass(frozen=True, slots=True, eq=False)
class RowCache:
    """What :func:`fleetloop.policies.breaker.latency_batch.decide_pools` reads of ``nodes`` and
    ``emitted`` as arrays, per row of ``ids`` (the pool's nodes at the tick that built it): derived
    data only, rebuilt from the dicts whenever it is missing or for other ids (:func:`row_cache`)."""

    ids: tuple[str, ...]
    quiet: npt.NDArray[np.bool_]  # :func:`quiet`: nothing to step but for its inputs
    was_warm: npt.NDArray[np.bool_]
    steady: npt.NDArray[np.bool_]  # its last record was closed, healthy, no ejections (HEALTHY)
    since: npt.NDArray[np.int64]  # its last record's tick
    phase: npt.NDArray[np.int64]  # :func:`fleetloop.policies.breaker.emission.phase`

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RowCache):
            return NotImplemented
        return self.ids == other.ids and all(
            np.array_equal(getattr(self, f), getattr(other, f))
            for f in ("quiet", "was_warm", "steady", "since", "phase")
        )

    __hash__ = None  # type: ignore[assignment]


HEALTHY: Fields = ("closed", True, 0.0, None, "healthy", 0)  # a quiet node's record's state fields


def quiet(ns: NodeState) -> bool:
    """Both machines closed with no streak, no ejection on record and no ramp: the node's tick has
    nothing to step unless it fails, turns outlier or changes warmth (``decide_columns``' test)."""
    e = ns.err
    return (
        e.state == "closed"
        and not e.ejections
        and ns.lat == "closed"
        and not ns.flagged_ticks
        and not ns.lat_ejections
        and ns.ramp_from_ms is None
    )


def row_cache(
    ids: tuple[str, ...], nodes: Mapping[str, NodeState], emitted: Mapping[str, Emitted]
) -> RowCache:
    """:class:`RowCache` read from the dicts (every id of ``ids`` must be in both)."""
    ns = [nodes[i] for i in ids]
    em = [emitted[i] for i in ids]
    return RowCache(
        ids,
        np.array([quiet(x) for x in ns], dtype=np.bool_),
        np.array([x.was_warm for x in ns], dtype=np.bool_),
        np.array([e[0] == HEALTHY for e in em], dtype=np.bool_),
        np.array([e[1] for e in em], dtype=np.int64),
        np.array([phase(i) for i in ids], dtype=np.int64),
    )


@dataclass(frozen=True, slots=True, weakref_slot=True)
class State:
    started: bool = False
    nodes: Mapping[str, NodeState] = field(default_factory=dict)
    memory: PoolMemory = field(default_factory=_empty_memory)
    # Node -> its last emitted record's state fields and tick (:mod:`fleetloop.policies.breaker.emission`).
    emitted: Mapping[str, Emitted] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A node's latency against its pool: each family flagged, clear or without data."""

    tbt: str  # "flagged" | "clear" | "nodata"
    ttft: str
    severity: float  # the largest ratio of a signal to its pool median (0 without data)

    @property
    def outlier(self) -> bool:
        return self.tbt == "flagged" and self.ttft != "clear"

    @property
    def relapse(self) -> bool:
        """Slow while probing: an outlier, or first tokens far slower with no step figures."""
        return self.outlier or (self.ttft == "flagged" and self.tbt == "nodata")

    @property
    def clean(self) -> bool:
        fams = (self.tbt, self.ttft)
        return "flagged" not in fams and "clear" in fams


def serving(node: NodeView) -> bool:
    return node.warm and not node.stale


def _value(node: NodeView, signal: str) -> float | None:
    v: float | None = getattr(node, signal)
    return v if v is not None and math.isfinite(v) and v >= 0 else None


def figures_now(node: NodeView) -> tuple[float | None, float | None, float | None, float | None] | None:
    """This tick's figures of a serving node, if it has any (what the memory adds)."""
    if node.weights_state == "warm" and not node.draining and not node.stale:
        vals = (
            _finite(node.tbt_p50_ms),
            _finite(node.tbt_p99_ms),
            _finite(node.ttft_mean_ms_w),
            _finite(node.ttft_p99_ms),
        )
        if vals != (None, None, None, None):
            return vals
    return None


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) and v >= 0 else None


def _remembered(obs: Obs, node: NodeView, now: int, memory_ms: int) -> Obs:
    """The memory kept (``0 < now - ts < memory_ms``) plus this tick's figures, if any.

    The memory is in ascending event time (each tick appends ``now`` after dropping everything at
    or after it), so what is kept is one slice: the figures too old are a prefix, those not before
    ``now`` (a tick decided again) a suffix."""
    lo, hi = 0, len(obs)
    while lo < hi and now - obs[lo][0] >= memory_ms:
        lo += 1
    while hi > lo and obs[hi - 1][0] >= now:
        hi -= 1
    kept = obs[lo:hi] if lo or hi < len(obs) else obs
    vals = figures_now(node)
    return (*kept, (now, *vals)) if vals is not None else kept


def aggregate(obs: Obs, min_samples: int) -> dict[str, float]:
    """Signal -> the median of the node's remembered figures, for signals with enough of them (the
    plain form of :func:`advance` and :func:`medians`, which the tests hold them to)."""
    out: dict[str, float] = {}
    if not obs or len(obs) < min_samples:
        return out
    columns = tuple(zip(*obs, strict=True))
    for i, s in enumerate(SIGNALS):
        col = columns[i + 1]
        xs = sorted([v for v in col if v is not None] if None in col else col)
        if xs and len(xs) >= min_samples:
            out[s] = median_sorted(xs)
    return out


def advance(mem: PoolMemory, pool: Sequence[NodeView], now: int, memory_ms: int) -> PoolMemory:
    """The pool's memory after this tick (:meth:`PoolMemory.advance`): what :func:`_remembered`
    keeps for each node, for the whole pool at once."""
    rows: list[int] = []
    figs: list[tuple[float | None, ...]] = []
    for r, n in enumerate(pool):
        f = figures_now(n)
        if f is not None:
            rows.append(r)
            figs.append(f)
    return mem.advance(tuple(n.node_id for n in pool), now, memory_ms, rows, figs)


def reference(values: list[float], min_hosts: int) -> tuple[float, float] | None:
    """``(median, MAD)`` over the pool's nodes, or None with fewer than ``min_hosts`` figures."""
    xs = sorted(values)
    if len(xs) < min_hosts:
        return None
    m = median_sorted(xs)
    return m, median_sorted(sorted(abs(x - m) for x in xs))


def judge(
    node: NodeView,
    agg: Mapping[str, float],
    refs: Mapping[str, tuple[float, float] | None],
    params: LatencyOutlierParams,
    slo: Slo = DEFAULT_BOOK.default,
) -> Verdict:
    tbt_floor = params.tbt_floor_frac * slo.tbt_ms
    ttft_floor = params.ttft_floor_frac * slo.ttft_ms
    return _judge(node, agg, limits(refs, params), tbt_floor, ttft_floor)


Limits = Mapping[str, tuple[float, float, float]]


def limits(refs: Mapping[str, tuple[float, float] | None], params: LatencyOutlierParams) -> Limits:
    """Signal -> (median m, ``ratio * m``, ``m + k * 1.4826 * MAD``): the pool's bounds, once per tick."""
    out: dict[str, tuple[float, float, float]] = {}
    for s, ref in refs.items():
        if ref is not None:
            m, mad = ref
            out[s] = (m, params.ratio * m, m + params.k * MAD_SCALE * mad)
    return out


def _family(
    signals: tuple[str, ...], values: Mapping[str, float], lims: Limits, floor: float, severity: float
) -> tuple[str, float]:
    """A family's status (flagged, clear or nodata) and the severity seen so far."""
    status = "nodata"
    for s in signals:
        lim = lims.get(s)
        x = values.get(s)
        if lim is None or x is None:
            continue
        m, above_ratio, above_mad = lim
        if m > 0:
            severity = max(severity, x / m)
        if x >= above_ratio and x >= above_mad and x - m >= floor:
            return "flagged", severity
        status = "clear"
    return status, severity


def _judge(
    node: NodeView, agg: Mapping[str, float], lims: Limits, tbt_floor: float, ttft_floor: float
) -> Verdict:
    tbt, severity = _family(TBT_SIGNALS, agg, lims, tbt_floor, 0.0)
    if tbt == "flagged":
        # A fresh step time that is fine clears the node at once: the remembered median outlives
        # the episode (a long prefill) that raised it.
        now_figures = {sig: v for sig in TBT_SIGNALS if (v := _value(node, sig)) is not None}
        if now_figures:
            fresh, severity = _family(TBT_SIGNALS, now_figures, lims, tbt_floor, severity)
            if fresh == "clear":
                tbt = "clear"
    ttft, severity = _family(TTFT_SIGNALS, agg, lims, ttft_floor, severity)
    if ttft == "nodata" and node.ttft_mean_ms_w is None and node.node_timeouts_w > 0:
        ttft = "flagged"  # calls went in, no first token came out, the node timed them out
    # Capped at MAX_FIGURE: a node reporting a step time of 1e308 (the schema accepts it) made its
    # severity leave the decision's bounds and refused the pool's whole breaker tick. Only the order
    # among such nodes (then by node id) and the published figure change.
    return Verdict(tbt, ttft, min(severity, MAX_FIGURE))


def failure_share(n: NodeView) -> float:
    return n.failures_w / n.requests_w if n.requests_w > 0 else 0.0


def pool_failure_frac(pool: Sequence[NodeView], streak: int) -> float:
    """The pool's failure level: the median failure share over its serving nodes that took calls
    in the window and are not in a failure streak themselves (``consecutive_failures < streak``,
    the error machine's threshold); over every serving node that took calls when all are.

    The nodes in a streak are the candidates being judged, so they are not their own evidence: when
    three of a pool's six busy nodes crash, the window still holds their successes from before the
    crash and a median over all six reads the pool as failing with them (host-loss-mid-decode).
    The nodes whose latest calls succeed say whether the failures are everywhere."""
    xs: list[float] = []
    streaking: list[float] = []
    for n in pool:
        if serving(n) and n.requests_w > 0:
            (streaking if n.consecutive_failures >= streak else xs).append(failure_share(n))
    xs = xs or streaking
    if not xs:
        return 0.0
    xs.sort()
    return median_sorted(xs)


def failing_with_pool(n: NodeView, pool_failing: float) -> bool:
    """The node's failures are the pool's: the median serving node fails at least half as often.

    A node that fails alone (a black hole, a bad GPU) sits far above a median near zero; when the
    whole pool times out together (every node slowed, or overloaded), the median node fails about
    as often as this one, and ejecting it would only move its calls onto nodes failing the same way.
    """
    return serving(n) and n.requests_w > 0 and pool_failing >= POOL_WIDE_SHARE * failure_share(n) > 0


def held_open(before: Emitted | None, now: int) -> bool:
    """The node's last record (its state fields as this breaker emitted them) was an enforced
    ejection whose end (``until_ms``) is still ahead: it stays enforced while its machine is open.

    The pool-wide rule and the panic threshold are read afresh every tick, and the node's own
    window is what they read: once routers stop sending to an ejected node its window empties
    and its failure share reads 0 (no longer "failing with the pool"), or the pool's failures
    rise and read as shared. Judged again, an enforced ejection would be released for a tick and
    taken back (a flap); it is not. It ends when its machine leaves ``open`` (a probe)."""
    if before is None:
        return False
    state, enforced, _, until, _, _ = before[0]
    return state == "open" and enforced and (until is None or now < until)


def backoff_ms(params: LatencyOutlierParams, ejections: int) -> int:
    return int(min(params.base_ejection_ms * 2 ** max(0, ejections - 1), params.max_ejection_ms))


def _latency_step(
    ns: NodeState, v: Verdict, now: int, params: LatencyOutlierParams
) -> tuple[NodeState, str, bool]:
    """One transition of the latency machine. Returns (state, reason, wants_to_open)."""
    if ns.lat == "open":
        if now - ns.lat_since_ms >= backoff_ms(params, ns.lat_ejections):
            return _with(ns, lat="half_open", lat_since_ms=now, flagged_ticks=0), "latency-probe", False
        return ns, "latency-ejected", False
    if ns.lat == "half_open":
        if v.relapse:
            return ns, "latency-probe-failed", True
        elapsed = now - ns.lat_since_ms
        if (v.clean and elapsed >= params.probe_min_ms) or elapsed >= params.probe_max_ms:
            back = _with(ns, lat="closed", lat_since_ms=now, flagged_ticks=0, ramp_from_ms=now)
            return back, "latency-probe-succeeded", False
        return ns, "latency-probing", False
    # closed
    flagged = ns.flagged_ticks + 1 if v.outlier else 0
    if flagged != ns.flagged_ticks:
        ns = _with(ns, flagged_ticks=flagged)
    if flagged >= params.detect_ticks:
        return ns, "latency-outlier", True
    if ns.lat_ejections and now - ns.lat_since_ms >= params.forgive_after_ms:
        return _with(ns, lat_ejections=0), "forgiven", False
    return ns, ("latency-suspect" if flagged else "healthy"), False


class LatencyOutlier:
    name = "latency-outlier"
    section = "breaker"
    Params = LatencyOutlierParams

    def initial_state(self) -> State:
        return State()

    def decide(
        self, snap: FleetSnapshot, params: LatencyOutlierParams, state: State, ctx: PolicyContext
    ) -> PolicyResult[State]:
        return decide_columns(snap, params, state, ctx)

    def decide_pools(
        self,
        snap: FleetSnapshot,
        params: LatencyOutlierParams,
        states: Sequence[State],
        ctxs: Sequence[PolicyContext],
    ) -> list[PolicyResult[State]]:
        """Equal, element for element and bit for bit (decisions, state, diagnostics), to
        ``[self.decide(snap, params, s, c) for s, c in zip(states, ctxs, strict=True)]``: every pool
        of the batch at once over the fleet's columns
        (:func:`fleetloop.policies.breaker.latency_batch.decide_pools`)."""
        # latency_batch imports this module: a cycle the cycle contract lists (.importlinter).
        from fleetloop.policies.breaker.latency_batch import decide_pools  # noqa: PLC0415 - known cycle

        return decide_pools(snap, params, states, ctxs)

    @staticmethod
    def _decision(
        n: NodeView,
        ns: NodeState,
        v: Verdict,
        reason: str,
        params: LatencyOutlierParams,
        *,
        now: int,
        share: float,
        over_cap: bool,
        panic: bool,
        pool_id: str,
        shared: bool = False,
        held: bool = False,
    ) -> BreakerDecision:
        inputs = {
            "consecutive_failures": float(n.consecutive_failures),
            "severity": r6(v.severity),
            "latency_ejections": float(ns.lat_ejections),
        }
        ejections = ns.lat_ejections + ns.err.ejections
        node_id = n.node_id
        err_open = ns.err.state == "open"
        lat_open = ns.lat == "open"
        if err_open or lat_open:
            untils = []
            if err_open:
                untils.append(ns.err.since_ms + backoff_ms(params, ns.err.ejections))
            if lat_open:
                untils.append(ns.lat_since_ms + backoff_ms(params, ns.lat_ejections))
            # An ejection published enforced stays so to its end (:func:`held_open`): the
            # pool-wide and panic rules judge whether to enforce it, not whether to release it.
            enforced = held or (err_open and not shared) or (lat_open and not panic)
            why = "pool-wide" if err_open and shared else "panic"
            return breaker_decision(
                pool_id, node_id, "open", reason if enforced else f"{reason}:{why}",
                inputs=inputs, ejections=ejections, enforced=enforced, until_ms=max(untils),
            )  # fmt: skip
        if over_cap:
            return breaker_decision(
                pool_id, node_id, "open", reason, inputs=inputs, ejections=ejections, enforced=False
            )
        if ns.err.state == "half_open" or ns.lat == "half_open":
            return breaker_decision(
                pool_id,
                node_id,
                "half_open",
                reason,
                inputs=inputs,
                ejections=ejections,
                probe_frac=r6(params.probe_frac),
            )
        if ns.ramp_from_ms is not None and n.warm:
            elapsed = max(0, now - ns.ramp_from_ms)
            frac = params.slow_start_min_frac + (1.0 - params.slow_start_min_frac) * (
                elapsed / max(1, params.slow_start_ms)
            )
            inputs["slow_start_frac"] = r6(frac)
            return breaker_decision(
                pool_id, node_id, "half_open", "slow-start",
                inputs=inputs, ejections=ejections, probe_frac=r6(min(0.5, share * frac)),
            )  # fmt: skip
        return breaker_decision(pool_id, node_id, "closed", reason, inputs=inputs, ejections=ejections)


_BREAKER_FIELDS = (
    "entity", "reason", "inputs", "kind", "pool_id", "node_id", "state", "enforced", "probe_frac", "until_ms",
    "ejections",
)  # fmt: skip
assert tuple(BreakerDecision.model_fields) == _BREAKER_FIELDS  # ``breaker_decision`` lists them in order


def breaker_decision(
    pool_id: str,
    node_id: str,
    state: BreakerStateName,
    reason: str,
    *,
    inputs: dict[str, float],
    ejections: int,
    enforced: bool | None = None,
    probe_frac: float | None = None,
    until_ms: int | None = None,
) -> BreakerDecision:
    """``BreakerDecision(entity=..., ...)`` with the fields given (the others at their defaults),
    assembled without validation when every part is valid by construction: the ids come from
    validated telemetry and ticks, and the figures are checked here against the schema's bounds.
    Anything else (a figure out of bounds, an empty reason) goes through validation and fails there,
    exactly as before."""
    given: dict[str, Any] = {
        "entity": f"node/{node_id}",
        "reason": reason,
        "inputs": inputs,
        "pool_id": pool_id,
        "node_id": node_id,
        "state": state,
        "ejections": ejections,
    }
    if enforced is not None:
        given["enforced"] = enforced
    if probe_frac is not None:
        given["probe_frac"] = probe_frac
    if until_ms is not None:
        given["until_ms"] = until_ms
    if (
        reason
        and 0 <= ejections <= MAX_COUNT
        and (until_ms is None or 0 <= until_ms <= MAX_EPOCH_MS)
        and (probe_frac is None or 0.0 <= probe_frac <= 1.0)
        and all(-MAX_FIGURE <= x <= MAX_FIGURE for x in inputs.values())  # False for NaN
    ):
        values = {
            "entity": given["entity"],
            "reason": reason,
            "inputs": inputs,
            "kind": "breaker",
            "pool_id": pool_id,
            "node_id": node_id,
            "state": state,
            "enforced": True if enforced is None else enforced,
            "probe_frac": 0.0 if probe_frac is None else probe_frac,
            "until_ms": until_ms,
            "ejections": ejections,
        }
        return assemble(BreakerDecision, values, set(given))
    return BreakerDecision(**given)


# -- the columnar form ------------------------------------------------------------------------------
# What ``LatencyOutlier.decide`` runs: the verdicts of a whole pool as array operations over the
# snapshot's fleet-wide columns (:mod:`fleetloop.policies.columns`), the state machines stepped in one
# pass that does no work for a node with nothing to step (closed, no streak, no ejection on record, no
# warmth change, not an outlier: its state object is kept as it was), and the common decision (closed)
# assembled directly. The same operations on the same doubles as the per-node form, in the same order
# where order matters (a family stops at its first flagged signal, so a later signal's ratio does not
# enter the severity); ``tests/unit/test_fast_breaker.py`` holds the two to the same decisions, states
# and diagnostics, byte for byte, tick after tick on generated fleets.

_NODATA, _CLEAR, _FLAGGED = 0, 1, 2
_STATUS = ("nodata", "clear", "flagged")
_CLOSED_FIELDS = frozenset({"entity", "reason", "inputs", "pool_id", "node_id", "state", "ejections"})
Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class FleetFigures:
    """Per row of the snapshot's columns, what the breaker reads (built once per snapshot)."""

    figures: Floats  # (rows, 4): the signals as :func:`_finite` reads them, NaN for none
    timed_out: Bools  # no first token in the window, but calls timed out (the TTFT no-data rule)
    share: Floats  # :func:`failure_share`
    took: Bools  # requests_w > 0
    streak: Ints  # consecutive_failures


def fleet_figures(snap: FleetSnapshot, cols: FleetColumns) -> FleetFigures:
    """The breaker's per-node figures for every row of the snapshot's columns, once per snapshot."""
    key = ("latency-outlier.figures",)
    found: FleetFigures | None = snap.memo.get(key)
    if found is None:
        raw = (
            np.stack([cols.floats(s) for s in SIGNALS], axis=1) if len(cols) else np.zeros((0, len(SIGNALS)))
        )
        with np.errstate(invalid="ignore"):
            figures = np.where(np.isfinite(raw) & (raw >= 0), raw, np.nan)
        timed_out = np.isnan(cols.floats("ttft_mean_ms_w")) & (cols.ints("node_timeouts_w") > 0)
        requests = cols.ints("requests_w")
        took = requests > 0
        # int / int in Python is the correctly rounded quotient, as is float64 / float64 of ints
        # below 2**53: the same doubles.
        share = np.zeros(len(cols))
        np.divide(cols.ints("failures_w"), requests, out=share, where=took)
        found = snap.memo[key] = FleetFigures(
            figures, timed_out, share, took, cols.ints("consecutive_failures")
        )
    return found


def references(agg: Floats, min_hosts: int) -> dict[str, tuple[float, float] | None]:
    """:func:`reference` of every signal's column of ``agg`` (NaN: no value) at once."""
    count = (~np.isnan(agg)).sum(axis=0)
    out: dict[str, tuple[float, float] | None] = dict.fromkeys(SIGNALS)
    enough = count >= min_hosts
    if not enough.any():
        return out
    ordered = np.sort(agg, axis=0, kind="stable")  # NaN last
    cols_ = np.arange(agg.shape[1])
    mid = np.maximum(count - 1, 0)
    m = _middle(ordered, count, mid, cols_)
    dev = np.sort(np.abs(agg - m), axis=0, kind="stable")
    mad = _middle(dev, count, mid, cols_)
    for j, s in enumerate(SIGNALS):
        if enough[j]:
            out[s] = (float(m[j]), float(mad[j]))
    return out


def _middle(ordered: Floats, count: Ints, mid: Ints, cols_: Ints) -> Floats:
    """Per column: :func:`median_sorted` of its first ``count`` values."""
    upper = ordered[np.minimum(count // 2, max(0, len(ordered) - 1)), cols_]
    lower = ordered[mid // 2, cols_]
    return np.where(count % 2 == 1, upper, (lower + upper) / 2)


def pool_failure_columns(f: FleetFigures, rows: slice, serve: Bools, streak: int) -> float:
    """:func:`pool_failure_frac` from the pool's rows of :class:`FleetFigures`."""
    took = serve & f.took[rows]
    if not took.any():
        return 0.0
    streaking = f.streak[rows] >= streak
    pick = took & ~streaking
    if not pick.any():
        pick = took & streaking
    return median_sorted(np.sort(f.share[rows][pick], kind="stable").tolist())


def _family_columns(
    x: Floats, lims: Sequence[tuple[float, float, float] | None], floor: float, severity: Floats
) -> tuple[Ints, Floats]:
    """:func:`_family` for every row at once: x[:, j] is signal j's value (NaN: none)."""
    status = np.zeros(len(x), dtype=np.int64)
    done = np.zeros(len(x), dtype=np.bool_)
    for j, lim in enumerate(lims):
        if lim is None:
            continue
        m, above_ratio, above_mad = lim
        xj = x[:, j]
        seen = ~done & ~np.isnan(xj)
        if m > 0:
            severity = np.where(seen, np.maximum(severity, xj / m), severity)
        with np.errstate(invalid="ignore"):
            flagged = seen & (xj >= above_ratio) & (xj >= above_mad) & (xj - m >= floor)
        status = np.where(flagged, _FLAGGED, np.where(seen, _CLEAR, status))
        done |= flagged
    return status, severity


def verdict_columns(
    agg: Floats,
    *,
    now_figures: Floats,
    serve: Bools,
    timed_out: Bools,
    lims: Limits,
    tbt_floor: float,
    ttft_floor: float,
) -> tuple[Ints, Ints, Floats]:
    """:func:`_judge` for every node of a pool: (TBT status, TTFT status, severity) as arrays
    (status codes index ``_STATUS``); a node not serving gets no verdict (nodata, nodata, 0.0)."""
    n = len(agg)
    tbt_lims = [lims.get(s) for s in TBT_SIGNALS]
    ttft_lims = [lims.get(s) for s in TTFT_SIGNALS]
    severity = np.zeros(n)
    tbt, severity = _family_columns(agg[:, :2], tbt_lims, tbt_floor, severity)
    fresh = now_figures[:, :2]
    recheck = (tbt == _FLAGGED) & ~np.isnan(fresh).all(axis=1)
    if recheck.any():
        status, again = _family_columns(fresh, tbt_lims, tbt_floor, severity)
        severity = np.where(recheck, again, severity)
        tbt = np.where(recheck & (status == _CLEAR), _CLEAR, tbt)
    ttft, severity = _family_columns(agg[:, 2:], ttft_lims, ttft_floor, severity)
    ttft = np.where((ttft == _NODATA) & timed_out, _FLAGGED, ttft)
    # ``max(0.0, ...)`` never yields -0.0 in the per-node form; + 0.0 turns a -0.0 into 0.0.
    severity = np.minimum(np.where(serve, severity, 0.0), MAX_FIGURE) + 0.0  # capped as in _judge
    return np.where(serve, tbt, _NODATA), np.where(serve, ttft, _NODATA), severity


def decide_columns(
    snap: FleetSnapshot, params: LatencyOutlierParams, state: State, ctx: PolicyContext
) -> PolicyResult[State]:
    """The per-node rule (``tests.oracles.policies.latency_outlier_plain``) over the snapshot's columns
    (see the comment above). A node's view is read only for a decision that is not closed (an open,
    probing or ramping node), so a pool's tick builds none in the common case."""
    now = ctx.now_ms
    pool_id = ctx.pool_id
    cols = fleet_columns(snap)
    lo, hi = cols.bounds.get(pool_id, (0, 0))
    rows = slice(lo, hi)
    err_params = params.errors()
    fleet = fleet_figures(snap, cols)
    figures, timed_out = fleet.figures[rows], fleet.timed_out[rows]
    warm_a = cols.warm[rows]
    serve = warm_a & ~cols.stale[rows]
    has = serve & ~np.isnan(figures).all(axis=1)
    ids = tuple(row_ids(snap)[lo:hi])
    memory = state.memory.advance(ids, now, params.memory_ms, np.flatnonzero(has), figures[has])
    med, ok = memory.median_arrays(params.min_samples)
    agg = np.where(ok & serve[:, None], med, np.nan)
    refs = references(agg, params.min_hosts)
    slo = ctx.pool_slo(snap)
    lims = limits(refs, params)
    tbt_floor = params.tbt_floor_frac * slo.tbt_ms
    ttft_floor = params.ttft_floor_frac * slo.ttft_ms
    tbt_a, ttft_a, sev_a = verdict_columns(
        agg,
        now_figures=figures,
        serve=serve,
        timed_out=timed_out,
        lims=lims,
        tbt_floor=tbt_floor,
        ttft_floor=ttft_floor,
    )
    outlier_a = (tbt_a == _FLAGGED) & (ttft_a != _CLEAR)
    tbt_l, ttft_l, sev_l, outlier_l = tbt_a.tolist(), ttft_a.tolist(), sev_a.tolist(), outlier_a.tolist()
    warm_l = warm_a.tolist()
    serve_l = serve.tolist()
    streak_a = fleet.streak[rows]
    streak_l = streak_a.tolist()
    # What a closed node's decision publishes, for the whole pool at once: the severity rounded for
    # the wire (:func:`r6_array`, the same doubles as ``round``) and the streak as a figure.
    sev_r = r6_array(sev_a)
    figures_ok = bool((np.abs(sev_r) <= MAX_FIGURE).all() and (streak_a <= MAX_FIGURE).all())  # False for NaN
    sev_rl = sev_r.tolist()
    streak_f = streak_a.astype(np.float64).tolist()

    known = state.nodes
    started = state.started
    threshold = err_params.threshold
    stepped: dict[str, NodeState] = {}
    reasons: dict[str, str] = {}
    wants: list[tuple[float, str]] = []
    open_now = 0
    for i, node_id in enumerate(ids):
        warm = warm_l[i]
        ns = known.get(node_id)
        if ns is None:
            ns = NodeState(was_warm=warm and not started)
        cf = streak_l[i]
        e = ns.err
        if (
            e.state == "closed"
            and cf < threshold
            and not e.ejections
            and ns.lat == "closed"
            and not ns.flagged_ticks
            and not ns.lat_ejections
            and warm == ns.was_warm
            and not outlier_l[i]
        ):
            # Nothing to step: the error machine stays closed ("healthy"), no ramp starts, the
            # latency machine stays closed with no streak ("healthy").
            stepped[node_id] = ns
            reasons[node_id] = "healthy"
            continue
        err, err_reason = step(e, cf, now, err_params)
        ramp = now if started and warm and not ns.was_warm else ns.ramp_from_ms
        if err is not e or ramp != ns.ramp_from_ms or warm != ns.was_warm:
            ns = _with(ns, err=err, ramp_from_ms=ramp, was_warm=warm)
        v = Verdict(_STATUS[tbt_l[i]], _STATUS[ttft_l[i]], sev_l[i])
        ns, lat_reason, want = _latency_step(ns, v, now, params)
        if want:
            wants.append((-v.severity, node_id))
        stepped[node_id] = ns
        reasons[node_id] = err_reason if err.state != "closed" or err_reason != "healthy" else lat_reason
        if ns.lat == "open" or ns.err.state == "open":
            open_now += 1

    over_cap = _eject_within_cap(
        params, len(ids), wants=wants, stepped=stepped, reasons=reasons, open_now=open_now, now=now
    )

    # Panic threshold: too few healthy nodes left means the slowness is the pool's, not a node's.
    live = 0
    healthy = 0
    for i, node_id in enumerate(ids):
        if serve_l[i]:
            live += 1
            ns = stepped[node_id]
            if ns.lat != "open" and ns.err.state != "open" and node_id not in over_cap and not outlier_l[i]:
                healthy += 1
    panic = bool(live) and healthy < params.panic_threshold * live
    share = 1.0 / max(1, live)
    pool_failing = pool_failure_columns(fleet, rows, serve, params.error_threshold)

    decisions: list[BreakerDecision] = []
    new_nodes: dict[str, NodeState] = {}
    slow_start_ms = params.slow_start_ms
    latency_open = error_open = 0
    closed_fields = _CLOSED_FIELDS
    before = state.emitted
    emitted: dict[str, Emitted] = {}
    tick_id = ctx.tick_id
    residue = keyframe_residue(tick_id)
    for i, node_id in enumerate(ids):
        ns = stepped[node_id]
        ramp_from = ns.ramp_from_ms
        if ramp_from is not None and now - ramp_from >= slow_start_ms:
            ns = _with(ns, ramp_from_ms=None)
            ramp_from = None
        new_nodes[node_id] = ns
        lat, e = ns.lat, ns.err
        if lat == "closed" and e.state == "closed":
            ejections = ns.lat_ejections + e.ejections
            reason = reasons[node_id]
            if (
                (ramp_from is None or not warm_l[i])
                and node_id not in over_cap
                and figures_ok
                and 0 <= ejections <= MAX_COUNT
                and reason
            ):
                f: Fields = ("closed", True, 0.0, None, reason, ejections)
                b = before.get(node_id)
                if (
                    b is not None
                    and b[0] == f
                    and phase(node_id) != residue
                    and 0 <= tick_id - b[1] < KEYFRAME_TICKS
                ):
                    emitted[node_id] = b
                    continue  # unchanged, not its keyframe, not too old: not emitted (emission.emits)
                emitted[node_id] = (f, tick_id)
                decisions.append(
                    assemble(
                        BreakerDecision,
                        {
                            "entity": f"node/{node_id}",
                            "reason": reason,
                            "inputs": {
                                "consecutive_failures": streak_f[i],
                                "severity": sev_rl[i],
                                "latency_ejections": float(ns.lat_ejections),
                            },
                            "kind": "breaker",
                            "pool_id": pool_id,
                            "node_id": node_id,
                            "state": "closed",
                            "enforced": True,
                            "probe_frac": 0.0,
                            "until_ms": None,
                            "ejections": ejections,
                        },
                        set(closed_fields),
                    )
                )
                continue
        else:
            latency_open += lat == "open"
            error_open += e.state == "open"
        n = cols.nodes[lo + i]  # the view, for a decision that is not closed
        d = LatencyOutlier._decision(
            n, ns, Verdict(_STATUS[tbt_l[i]], _STATUS[ttft_l[i]], sev_l[i]), reasons[node_id], params,
            now=now, share=share, over_cap=node_id in over_cap, panic=panic, pool_id=pool_id,
            shared=failing_with_pool(n, pool_failing), held=held_open(before.get(node_id), now),
        )  # fmt: skip
        f = fields_of(d)
        b = before.get(node_id)
        if b is None or emits(node_id, f, b, tick_id):
            decisions.append(d)
            emitted[node_id] = (f, tick_id)
        else:
            emitted[node_id] = b
    diagnostics = {
        "latency_open": float(latency_open),
        "error_open": float(error_open),
        "outliers": float(int(outlier_a.sum())),
        "panic": float(panic),
        "pool_failure_frac": r6(pool_failing),
    }
    return PolicyResult(
        decisions=tuple(decisions),
        state=State(started=True, nodes=new_nodes, memory=memory, emitted=emitted),
        diagnostics=diagnostics,
    )
