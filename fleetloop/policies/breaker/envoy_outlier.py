"""envoy-outlier: Envoy's outlier detection with the defaults it ships, as the ``classic`` breaker.

What it does: ejects a node from its pool's load balancing when it fails 5 calls in a row
(consecutive 5xx) or when its success rate over the last interval is a statistical outlier
(success rate), for a time that grows with each ejection; and returns it when that time has passed.
There is no half-open probe state in Envoy: an ejected host is simply returned at the first interval
tick after its ejection time ran out. It follows ``source/common/upstream/outlier_detection_impl.cc``
of current Envoy (main, 2024-2025: v1.31 and later), in particular:

- ``max_ejection_percent`` is checked *before* ejecting, counting the ejection about to happen:
  ``100 * (ejected + 1) / hosts <= max_ejection_percent``. Since Envoy 1.27 (PR #27909) this is a
  hard limit: with the default 10% a pool of fewer than 10 nodes ejects nothing. Before 1.27 one host
  could always be ejected; since 1.31 (PR #34796) that behaviour is the opt-in
  ``always_eject_one_host`` (default false, as here).
- The ejection time multiplies: ``min(base_ejection_time * backoff, max_ejection_time) + jitter``,
  where ``backoff`` goes up by one per ejection (while ``backoff * base < max + base``) and down by
  one for every interval a returned host stays healthy. ``max_ejection_time`` defaults to
  ``max(300 s, base_ejection_time)``.
- An ejection is "detected" (reported, counters reset) and then "enforced" with probability
  ``enforcing_*`` percent; a detection beyond the ejection cap or not enforced leaves the host in.

Formula, per node ``i`` at a tick at event time ``now``::

    run_i = consecutive failed calls since the last counter reset (an ok call, a detection, a return)
    consecutive 5xx:   run_i >= consecutive_5xx  and i not ejected  -> detect; try_eject(i)
    every interval (first at detector start + interval), in this order:
      return i    if ejected and min(base * backoff_i, max) + jitter_i <= now - ejected_at_i
      success rate, over nodes not ejected with volume_i = ok_w + failures_w >= request_volume:
        sr_i = 100 * ok_w / volume_i
        if #valid >= success_rate_minimum_hosts:
          threshold = mean(sr) - (stdev_factor / 1000) * stdev(sr)      # population stdev
          sr_i < threshold                                -> try_eject(i)
      failure percentage (enforcing default 0: detected only):
          volume_i >= fp_request_volume, #valid >= fp_minimum_hosts,
          100 - sr_i >= failure_percentage_threshold      -> try_eject(i)
      backoff_i -= 1  if i not ejected and returned at least one interval ago (and backoff_i > 0)
    try_eject(i): allowed = 100 * (ejected + 1) / n_pool <= max_ejection_percent
                            (or ejected == 0 when always_eject_one_host)
                  if allowed and rng < enforcing_percent: eject(i): backoff_i += 1 (capped), ...

Records are change-only (:mod:`fleetloop.policies.breaker.emission`): an open node's every tick, a
closed node's when its state fields change and on its keyframe ticks.

Inputs: the pool's endpoints, i.e. its ready nodes (warm, not draining, telemetry not stale): a
Kubernetes pod that is not ready is not in the endpoint set Envoy sees, so it is neither judged nor
counted in ``hosts``; a node that leaves the set is forgotten, and one that joins a running detector
starts with a fresh counter. Per endpoint: the router-observed ``consecutive_failures`` (error,
timeout and retry outcomes in a row; Envoy's default non-split mode also counts a timeout as a 5xx),
and ``ok_w``/``failures_w`` over the engine window, which stands in for Envoy's per-interval
success-rate bucket: the classic policy sets ``envelope.window_ms`` equal to ``interval_ms``, so the
window *is* the last interval. Event time ``ctx.now_ms``; randomness (enforcing percentages strictly
between 0 and 100, jitter) from ``ctx.rng`` only.

Parameters (defaults, bounds; Envoy's names and defaults): ``consecutive_5xx`` 5 (>=1),
``interval_ms`` 10 000 (>=1), ``base_ejection_time_ms`` 30 000 (>=1), ``max_ejection_time_ms``
unset = max(300 000, base) (>= base), ``max_ejection_time_jitter_ms`` 0, ``max_ejection_percent``
10 (0-100), ``always_eject_one_host`` false, ``enforcing_consecutive_5xx`` 100 (0-100),
``enforcing_success_rate`` 100, ``success_rate_minimum_hosts`` 5, ``success_rate_request_volume``
100, ``success_rate_stdev_factor`` 1900 (divided by 1000), ``failure_percentage_threshold`` 85,
``failure_percentage_minimum_hosts`` 5, ``failure_percentage_request_volume`` 50,
``enforcing_failure_percentage`` 0. Not modelled (no input for them, or off by default): consecutive
gateway failure (enforcing 0 by default), split local-origin errors (off by default), active health
checks, outlier-detection extensions.

Departures forced by sampling: Envoy sees every call; this sees the failure run at each tick. A
detection happens at the first tick where the run has reached the threshold (not at the exact call),
several detections within one tick are taken longest run first (Envoy: in arrival order), and an ok
call followed by a longer failure run between two ticks is seen as a continuing run from the last
reset. Envoy would call ``ejectHost`` twice for a host that both the success-rate and the
failure-percentage detector flag in one interval; here a host already ejected is skipped.

Trade-offs: cheap and local, blind to latency (a slow node that answers is never ejected), and the
10% cap makes it inert on small pools. Success-rate ejection needs 5 nodes with 100 calls each per
interval, which LLM nodes (a few calls per second each) rarely reach at low load.

Failure mode: a pool-wide outage ejects at most 10% of the pool (often nobody), so traffic keeps
flowing to failing nodes and errors stay visible; a flapping node is ejected for ever longer
(up to 300 s) and each return costs another run of failed calls before it is ejected again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Self

import numpy as np
from pydantic import Field, model_validator

from fleetloop.policies.base import FleetSnapshot, NodeView, Params, PolicyContext, PolicyResult, r6
from fleetloop.policies.breaker.emission import Emitted, change_only
from fleetloop.schemas.decisions import BreakerDecision

DEFAULT_MAX_EJECTION_TIME_MS = 300_000
EjectionType = Literal["consecutive-5xx", "success-rate", "failure-percentage"]


class EnvoyOutlierParams(Params):
    consecutive_5xx: int = Field(default=5, ge=1, le=1_000_000)
    interval_ms: int = Field(default=10_000, ge=1, le=3_600_000)
    base_ejection_time_ms: int = Field(default=30_000, ge=1, le=86_400_000)
    max_ejection_time_ms: int | None = Field(default=None, ge=1, le=86_400_000)
    max_ejection_time_jitter_ms: int = Field(default=0, ge=0, le=3_600_000)
    max_ejection_percent: int = Field(default=10, ge=0, le=100)
    always_eject_one_host: bool = False
    enforcing_consecutive_5xx: int = Field(default=100, ge=0, le=100)
    enforcing_success_rate: int = Field(default=100, ge=0, le=100)
    success_rate_minimum_hosts: int = Field(default=5, ge=0, le=100_000)
    success_rate_request_volume: int = Field(default=100, ge=0, le=100_000_000)
    success_rate_stdev_factor: int = Field(default=1900, ge=0, le=100_000)
    failure_percentage_threshold: int = Field(default=85, ge=0, le=100)
    failure_percentage_minimum_hosts: int = Field(default=5, ge=0, le=100_000)
    failure_percentage_request_volume: int = Field(default=50, ge=0, le=100_000_000)
    enforcing_failure_percentage: int = Field(default=0, ge=0, le=100)

    @model_validator(mode="after")
    def _max_not_below_base(self) -> Self:
        # DetectorImpl::create refuses this configuration.
        if self.max_ejection_time_ms is not None and self.max_ejection_time_ms < self.base_ejection_time_ms:
            raise ValueError("max_ejection_time_ms cannot be smaller than base_ejection_time_ms")
        return self

    @property
    def max_ejection_ms(self) -> int:
        """Envoy: if unset, the default (300 s) or ``base_ejection_time``, whichever is larger."""
        if self.max_ejection_time_ms is not None:
            return self.max_ejection_time_ms
        return max(DEFAULT_MAX_EJECTION_TIME_MS, self.base_ejection_time_ms)

    def enforcing(self, kind: EjectionType) -> int:
        return {
            "consecutive-5xx": self.enforcing_consecutive_5xx,
            "success-rate": self.enforcing_success_rate,
            "failure-percentage": self.enforcing_failure_percentage,
        }[kind]


@dataclass(frozen=True, slots=True)
class HostState:
    """Envoy's ``DetectorHostMonitorImpl`` for one node, plus the counter-reset bookkeeping."""

    ejected: bool = False
    ejected_at_ms: int | None = None
    unejected_at_ms: int | None = None
    num_ejections: int = 0
    backoff: int = 0  # ejectTimeBackoff
    jitter_ms: int = 0
    ejection_type: str = ""
    failures_mark: int = 0  # the model's consecutive_failures when Envoy's counter was last reset
    failures_seen: int = 0  # the model's consecutive_failures at the previous tick


@dataclass(frozen=True, slots=True)
class DetectorState:
    hosts: Mapping[str, HostState] = field(default_factory=dict)
    next_interval_ms: int | None = None  # the interval timer; armed at the first tick
    emitted: Mapping[str, Emitted] = field(default_factory=dict)  # node -> its last record's fields, tick


def ejection_time_ms(params: EnvoyOutlierParams, host: HostState) -> int:
    """How long ``host`` stays ejected: ``min(base * backoff, max) + jitter``."""
    return min(params.base_ejection_time_ms * host.backoff, params.max_ejection_ms) + host.jitter_ms


def success_rate_threshold(rates: Sequence[float], stdev_factor: float) -> tuple[float, float]:
    """``(mean, mean - stdev_factor * stdev)`` over the valid hosts' success rates (population
    standard deviation), as ``DetectorImpl::successRateEjectionThreshold``."""
    mean = sum(rates) / len(rates)
    variance = sum((r - mean) ** 2 for r in rates) / len(rates)
    return mean, mean - stdev_factor * math.sqrt(variance)


def _feature_enabled(percent: int, rng: np.random.Generator) -> bool:
    """Envoy's ``runtime.featureEnabled(key, percent)``: a draw only strictly between 0 and 100."""
    if percent >= 100:
        return True
    if percent <= 0:
        return False
    return int(rng.integers(0, 100)) < percent


def _try_eject(
    hosts: dict[str, HostState],
    node_id: str,
    kind: EjectionType,
    *,
    params: EnvoyOutlierParams,
    now: int,
    rng: np.random.Generator,
) -> str:
    """``DetectorImpl::ejectHost``. Updates ``hosts`` (a local working copy); returns the reason."""
    active = sum(1 for h in hosts.values() if h.ejected)
    allowed = 100.0 * (active + 1) / len(hosts) <= min(100, params.max_ejection_percent)
    if params.always_eject_one_host:
        allowed = allowed or active == 0
    if not allowed:
        return f"{kind}-overflow"
    if not _feature_enabled(params.enforcing(kind), rng):
        return f"{kind}-not-enforced"
    h = hosts[node_id]
    jitter = (
        int(rng.integers(0, params.max_ejection_time_jitter_ms + 1))
        if params.max_ejection_time_jitter_ms
        else 0
    )
    base = params.base_ejection_time_ms
    backoff = h.backoff + 1 if h.backoff * base < params.max_ejection_ms + base else h.backoff
    hosts[node_id] = replace(
        h,
        ejected=True,
        ejected_at_ms=now,
        num_ejections=h.num_ejections + 1,
        backoff=backoff,
        jitter_ms=jitter,
        ejection_type=kind,
    )
    return kind


def _endpoints(nodes: Sequence[NodeView], state: DetectorState) -> dict[str, HostState]:
    """The detector's hosts (a working copy): the cluster's endpoints, i.e. the nodes that are ready
    (warm, not draining, not silent). A node that leaves them is forgotten (the member-update
    callback); one that (re)joins a running detector starts with a fresh counter, as a new host
    monitor does."""
    started = state.next_interval_ms is not None
    hosts: dict[str, HostState] = {}
    for n in nodes:
        if n.warm and not n.stale:
            cf = n.consecutive_failures
            fresh = HostState(failures_mark=cf, failures_seen=cf) if started else HostState()
            hosts[n.node_id] = state.hosts.get(n.node_id, fresh)
    return hosts


@dataclass(slots=True)
class _Pass:
    """One tick's pass of the detector: the endpoints' host monitors (a working copy, updated in
    place), what it reads per node, and what it found per node."""

    hosts: dict[str, HostState]
    failures: Mapping[str, int]  # every pool node's consecutive_failures
    volumes: Mapping[str, int]  # each endpoint's calls in the window (ok + failures)
    events: dict[str, str] = field(default_factory=dict)  # node -> what happened to it this tick
    runs: dict[str, int] = field(default_factory=dict)  # node -> failed calls since its counter's reset
    rates: dict[str, float] = field(default_factory=dict)  # node -> success rate %, when judged


def _consecutive_5xx(tick: _Pass, params: EnvoyOutlierParams, *, now: int, rng: np.random.Generator) -> None:
    """The consecutive-5xx detector over the calls since the previous tick: each host's run since
    its counter's last reset, and a detection, longest run first, for each host not ejected whose
    run reached ``consecutive_5xx``."""
    hosts, failures = tick.hosts, tick.failures
    candidates: list[tuple[int, str]] = []
    for node_id, h in hosts.items():
        cf = failures[node_id]
        mark = 0 if cf < h.failures_seen else h.failures_mark  # the run shrank: an ok call reset it
        tick.runs[node_id] = cf - mark
        hosts[node_id] = replace(h, failures_mark=mark, failures_seen=cf)
        if not h.ejected and cf - mark >= params.consecutive_5xx:
            candidates.append((mark - cf, node_id))
    for _, node_id in sorted(candidates):
        # Detected: Envoy resets the counter whether or not the ejection happens.
        hosts[node_id] = replace(hosts[node_id], failures_mark=failures[node_id])
        tick.events[node_id] = _try_eject(hosts, node_id, "consecutive-5xx", params=params, now=now, rng=rng)


def _on_interval(
    snap: FleetSnapshot, tick: _Pass, params: EnvoyOutlierParams, ctx: PolicyContext
) -> dict[str, float]:
    """One run of the interval timer, in Envoy's order: return the hosts whose ejection time has
    passed, run the statistical detectors, then step down the backoff of hosts returned at least an
    interval ago. The diagnostics."""
    now, hosts = ctx.now_ms, tick.hosts
    for node_id, h in hosts.items():
        if h.ejected and h.ejected_at_ms is not None and ejection_time_ms(params, h) <= now - h.ejected_at_ms:
            hosts[node_id] = replace(
                h, ejected=False, unejected_at_ms=now, failures_mark=tick.failures[node_id]
            )
            tick.events[node_id] = "unejected"
    diagnostics = _statistical(snap, tick, params, ctx) if hosts else {}
    for node_id, h in hosts.items():
        returned = h.unejected_at_ms
        if not h.ejected and returned is not None and now - returned >= params.interval_ms and h.backoff:
            hosts[node_id] = replace(h, backoff=h.backoff - 1)
    return diagnostics


def _statistical(
    snap: FleetSnapshot, tick: _Pass, params: EnvoyOutlierParams, ctx: PolicyContext
) -> dict[str, float]:
    """``DetectorImpl::processSuccessRateEjections`` for the external-origin monitor."""
    hosts = tick.hosts
    if (
        len(hosts) < params.success_rate_minimum_hosts
        and len(hosts) < params.failure_percentage_minimum_hosts
    ):
        return {}
    valid_sr: list[tuple[str, float]] = []
    valid_fp: list[tuple[str, float]] = []
    for node_id, h in hosts.items():
        volume = tick.volumes[node_id]
        if h.ejected or volume == 0:
            continue
        rate = 100.0 * snap.nodes[node_id].ok_w / volume
        tick.rates[node_id] = rate
        if volume >= params.success_rate_request_volume:
            valid_sr.append((node_id, rate))
        if volume >= params.failure_percentage_request_volume:
            valid_fp.append((node_id, rate))
    out: dict[str, float] = {}
    if valid_sr and len(valid_sr) >= params.success_rate_minimum_hosts:
        mean, threshold = success_rate_threshold(
            [r for _, r in valid_sr], params.success_rate_stdev_factor / 1000.0
        )
        out = {"success_rate_mean_pct": r6(mean), "success_rate_threshold_pct": r6(threshold)}
        for node_id, rate in valid_sr:
            if rate < threshold:
                tick.events[node_id] = _try_eject(
                    hosts, node_id, "success-rate", params=params, now=ctx.now_ms, rng=ctx.rng
                )
    if valid_fp and len(valid_fp) >= params.failure_percentage_minimum_hosts:
        for node_id, rate in valid_fp:
            if 100.0 - rate >= params.failure_percentage_threshold and not hosts[node_id].ejected:
                tick.events[node_id] = _try_eject(
                    hosts, node_id, "failure-percentage", params=params, now=ctx.now_ms, rng=ctx.rng
                )
    return out


class EnvoyOutlier:
    name = "envoy-outlier"
    section = "breaker"
    Params = EnvoyOutlierParams

    def initial_state(self) -> DetectorState:
        return DetectorState()

    def decide(
        self, snap: FleetSnapshot, params: EnvoyOutlierParams, state: DetectorState, ctx: PolicyContext
    ) -> PolicyResult[DetectorState]:
        now = ctx.now_ms
        nodes = snap.pool_nodes(ctx.pool_id)
        hosts = _endpoints(nodes, state)
        tick = _Pass(
            hosts=hosts,
            failures={n.node_id: n.consecutive_failures for n in nodes},
            volumes={n.node_id: n.ok_w + n.failures_w for n in nodes if n.node_id in hosts},
        )
        # 1. Consecutive 5xx, from the calls that arrived since the previous tick.
        _consecutive_5xx(tick, params, now=now, rng=ctx.rng)
        # 2. The interval timer (DetectorImpl::onIntervalTimer).
        diagnostics: dict[str, float] = {}
        next_interval = state.next_interval_ms
        if next_interval is None:
            next_interval = now + params.interval_ms
        elif now >= next_interval:
            diagnostics = _on_interval(snap, tick, params, ctx)
            next_interval = now + params.interval_ms
        decisions = [self._node_decision(n.node_id, tick, params, ctx) for n in nodes]
        diagnostics["ejected"] = float(sum(1 for h in hosts.values() if h.ejected))
        emitted, fields = change_only(decisions, state.emitted, ctx.tick_id)
        return PolicyResult(
            decisions=emitted,
            state=DetectorState(hosts=hosts, next_interval_ms=next_interval, emitted=fields),
            diagnostics=diagnostics,
        )

    @classmethod
    def _node_decision(
        cls, node_id: str, tick: _Pass, params: EnvoyOutlierParams, ctx: PolicyContext
    ) -> BreakerDecision:
        """A node's record for this tick: closed and not judged when it is not an endpoint; else its
        host monitor's state with the inputs it was judged on."""
        if node_id not in tick.hosts:
            return BreakerDecision(
                entity=f"node/{node_id}",
                pool_id=ctx.pool_id,
                node_id=node_id,
                state="closed",
                reason="not-an-endpoint",
            )
        inputs = {
            "consecutive_failures": float(tick.runs[node_id]),
            "requests_w": float(tick.volumes[node_id]),
        }
        if node_id in tick.rates:
            inputs["success_rate_pct"] = r6(tick.rates[node_id])
        inputs["backoff"] = float(tick.hosts[node_id].backoff)
        return cls._decision(
            params,
            h=tick.hosts[node_id],
            event=tick.events.get(node_id),
            node_id=node_id,
            ctx=ctx,
            inputs=inputs,
        )

    @staticmethod
    def _decision(
        params: EnvoyOutlierParams,
        *,
        h: HostState,
        event: str | None,
        node_id: str,
        ctx: PolicyContext,
        inputs: dict[str, float],
    ) -> BreakerDecision:
        entity = f"node/{node_id}"
        if h.ejected and h.ejected_at_ms is not None:
            return BreakerDecision(
                entity=entity,
                pool_id=ctx.pool_id,
                node_id=node_id,
                state="open",
                until_ms=h.ejected_at_ms + ejection_time_ms(params, h),
                ejections=h.num_ejections,
                reason=event if event is not None else "ejected",
                inputs=inputs,
            )
        if event is not None and event != "unejected":
            # Detected but not ejected (over max_ejection_percent, or not enforced): Envoy's
            # "detected" ejection. The host keeps its traffic.
            return BreakerDecision(
                entity=entity,
                pool_id=ctx.pool_id,
                node_id=node_id,
                state="open",
                enforced=False,
                ejections=h.num_ejections,
                reason=event,
                inputs=inputs,
            )
        return BreakerDecision(
            entity=entity,
            pool_id=ctx.pool_id,
            node_id=node_id,
            state="closed",
            ejections=h.num_ejections,
            reason=event if event is not None else "healthy",
            inputs=inputs,
        )
