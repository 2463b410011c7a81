"""consecutive-errors: eject a node after a run of failed calls; probe it before trusting it again.

Formula, a state machine per node (Envoy's consecutive-5xx detector with half-open probes)::

    closed    --(consecutive_failures >= threshold)-->                      open (ejections += 1)
    open      --(now >= opened_ms + min(base_ms * 2**(ejections-1), max_ms))--> half_open
    half_open --(a probe call succeeded: the run was reset since probing)--> closed
    half_open --(a probe call failed: consecutive_failures grew)-->           open (ejections += 1)

A node that stays closed for ``forgive_after_ms`` gets its ejection count back to zero, so
the backoff is for repeat offenders. While half-open the node gets ``probe_frac`` of the pool's
traffic (the engine sets the weight).

Inputs: ``consecutive_failures`` per node (router-observed error, timeout and retry outcomes in the
order the router reported them; an ok call resets it). Parameters (defaults, bounds):
``threshold`` 5 (1-1000), ``base_ejection_ms`` 10 000, ``max_ejection_ms`` 300 000,
``probe_frac`` 0.05 (0-0.5), ``forgive_after_ms`` 300 000.
Records are change-only (:mod:`fleetloop.policies.breaker.emission`): a closed node's record only
when its state fields change and on its keyframe ticks; an open or half-open node's every tick.
Trade-offs: fast and cheap for hard failures; blind to a node that is slow but answers (the outlier
breaker looks at latency). Failure mode: a pool-wide outage opens every breaker; the engine caps the
ejected share and fails open, so traffic keeps flowing and the errors stay visible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pydantic import Field

from fleetloop.policies.base import FleetSnapshot, Params, PolicyContext, PolicyResult
from fleetloop.policies.breaker.emission import Emitted, change_only
from fleetloop.schemas.decisions import BreakerDecision, BreakerStateName


class ConsecutiveErrorsParams(Params):
    threshold: int = Field(default=5, ge=1, le=1000)
    base_ejection_ms: int = Field(default=10_000, ge=100, le=3_600_000)
    max_ejection_ms: int = Field(default=300_000, ge=100, le=86_400_000)
    probe_frac: float = Field(default=0.05, ge=0.0, le=0.5)
    forgive_after_ms: int = Field(default=300_000, ge=0)


@dataclass(frozen=True, slots=True)
class NodeBreaker:
    state: BreakerStateName = "closed"
    ejections: int = 0
    since_ms: int = 0  # when the current state began
    failures_at_probe: int = 0  # consecutive_failures when half-open began


@dataclass(frozen=True, slots=True)
class State:
    """Per node: its breaker, and its last emitted record's state fields and tick."""

    nodes: Mapping[str, NodeBreaker] = field(default_factory=dict)
    emitted: Mapping[str, Emitted] = field(default_factory=dict)


def backoff_ms(params: ConsecutiveErrorsParams, ejections: int) -> int:
    return int(min(params.base_ejection_ms * 2 ** max(0, ejections - 1), params.max_ejection_ms))


def step(
    nb: NodeBreaker, failures: int, now: int, params: ConsecutiveErrorsParams
) -> tuple[NodeBreaker, str]:
    """One transition of one node's breaker. Returns the new state and the reason code."""
    if nb.state == "closed":
        if failures >= params.threshold:
            return NodeBreaker("open", nb.ejections + 1, now, failures), "consecutive-failures"
        if nb.ejections and now - nb.since_ms >= params.forgive_after_ms:
            return replace(nb, ejections=0), "forgiven"
        return nb, "healthy"
    if nb.state == "open":
        if now - nb.since_ms >= backoff_ms(params, nb.ejections):
            return NodeBreaker("half_open", nb.ejections, now, failures), "probe"
        return nb, "ejected"
    # half_open. A run shorter than when probing began means an ok call reset it since: a probe
    # succeeded, even if calls after it failed before this tick.
    if failures == 0 or failures < nb.failures_at_probe:
        return NodeBreaker("closed", nb.ejections, now, 0), "probe-succeeded"
    if failures > nb.failures_at_probe:
        return NodeBreaker("open", nb.ejections + 1, now, failures), "probe-failed"
    return nb, "probing"


class ConsecutiveErrors:
    name = "consecutive-errors"
    section = "breaker"
    Params = ConsecutiveErrorsParams

    def initial_state(self) -> State:
        return State()

    def decide(
        self,
        snap: FleetSnapshot,
        params: ConsecutiveErrorsParams,
        state: State | Mapping[str, NodeBreaker],
        ctx: PolicyContext,
    ) -> PolicyResult[State]:
        if not isinstance(state, State):  # a checkpoint from before change-only records
            state = State(nodes=state)
        new_state: dict[str, NodeBreaker] = {}
        decisions: list[BreakerDecision] = []
        known = state.nodes
        for node in snap.pool_nodes(ctx.pool_id):
            nb, reason = step(
                known.get(node.node_id, NodeBreaker()), node.consecutive_failures, ctx.now_ms, params
            )
            new_state[node.node_id] = nb
            decisions.append(
                BreakerDecision(
                    entity=f"node/{node.node_id}",
                    pool_id=ctx.pool_id,
                    node_id=node.node_id,
                    state=nb.state,
                    probe_frac=params.probe_frac if nb.state == "half_open" else 0.0,
                    until_ms=nb.since_ms + backoff_ms(params, nb.ejections) if nb.state == "open" else None,
                    ejections=nb.ejections,
                    reason=reason,
                    inputs={"consecutive_failures": float(node.consecutive_failures)},
                )
            )
        emitted, fields = change_only(decisions, state.emitted, ctx.tick_id)
        return PolicyResult(decisions=emitted, state=State(nodes=new_state, emitted=fields))
