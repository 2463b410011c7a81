"""The safety envelope: limits the engine applies to every algorithm's output (docs/decisions/fail-static.md).

Algorithms propose; the engine disposes. Whatever an algorithm returns, the engine:

- treats a node whose telemetry is older than ``stale_after_ms`` as saturated: weight 0;
- never ejects more than ``max_ejected_frac`` of a pool (breakers beyond it are "detected", not
  "enforced", and the node keeps its traffic), but always one when the fraction is not 0,
  ejecting the worst offenders first, and never an ejection whose useful work the nodes left
  serving have no spare capacity for (a pool-wide slowdown: ejecting would pile the same load on
  fewer, equally slow nodes); a node in a failure streak carries no useful work, so it is ejected
  at the tick its breaker opens whatever the pool's load; an ejection it let out enforced is held
  to its end (no release, no flapping); see ``fleetloop.core.decide.shaping.cap_ejections``;
- fails open: when every node of a pool would get weight 0, it spreads traffic evenly over the
  pool's non-draining nodes instead (panic threshold; routers never eject every node);
- limits an autoscale target to ``max_scale_step`` nodes away from the current count per tick
  (pool bounds are the autoscale algorithm's and the GPU workers' to enforce), whatever target
  an algorithm proposes; a decrease counts from the target it last let out when that is lower
  (nodes already asked to go back are no new step);
- holds a pool's autoscale drain list: a node let out on it stays on it until the fleet model
  forgets the node, a target above the nodes left serving takes it back (the most recently asked
  first), or it has kept reporting, ready, for a grace (the autoscaler's lead: the fleet's own
  floor keeps it), and a node the grace took back is not named again until the target falls
  below its value then (``fleetloop.core.decide.shaping.keep_draining``): a router following the
  newest decision must not take a draining node back one tick after it was named, nor keep a node
  the fleet will not remove out of rotation for good;
- freezes the autoscale target of a silent pool (no fresh telemetry from any of its nodes and no
  router outcome in the window) at the last target it let out, never below the pool's serving
  nodes: silence means fleetloop knows nothing, not that demand vanished;
- names at most ``max_spill_pools`` overflow pools in a routing decision (the first ones the
  algorithm ranked), so a flood of pools serving the same model cannot fill routers' spill lists;
- never sheds priority ``protected_priority`` and better below ``min_queue_threshold``, whether
  the limit is on queue depth or on outstanding work (queued + running), and never for their
  latency budget (it names them in the admission decision's ``budget_protected_priority``; a
  call with no deadline, budget 0, is never shed for one whatever its class).

Inputs: the algorithms' decisions and the snapshot. Defaults below. Failure mode: the envelope
can only make a decision more conservative; a bug here shows as too little action, never as a
fleet-wide ejection.
"""

from __future__ import annotations

from pydantic import Field

from fleetloop.policies.base import Params


class Envelope(Params):
    window_ms: int = Field(default=10_000, ge=1000, le=300_000, description="figures over this window")
    stale_after_ms: int = Field(default=5_000, ge=500, le=600_000)
    max_ejected_frac: float = Field(default=0.5, ge=0.0, le=1.0)
    max_scale_step: int = Field(default=8, ge=1, le=1000)
    min_queue_threshold: int = Field(default=2, ge=1, le=1_000_000)
    protected_priority: int = Field(default=0, ge=-1, le=9, description="-1: protect none")
    max_spill_pools: int = Field(
        default=8, ge=0, le=64, description="overflow pools named per routing decision"
    )
