"""A pool's committed size: the node count an autoscaler holds and steps from. The one
implementation for slo-predictive and the engine's step limit
(``fleetloop.core.decide.shaping.shape_autoscale``)."""

from __future__ import annotations


def committed(last_target: int | None, current: int) -> int:
    """``min(current, last target)`` once a target was set, else ``current``.

    Active nodes above the last target are nodes the autoscaler asked to give back (the actuator is
    still removing them, their drain is not yet in telemetry, or a floor of the actuator's own keeps
    them), not demand: holding or stepping from ``current`` there raises the target back to them
    without any load. On 24 idle nodes slo-predictive's target went 24, 18, 24 every 30 s that way:
    the nodes asked to drain, still reporting, were read a window later as the pool's size. Kubernetes'
    HPA steps from ``spec.replicas``, not from the pods it sees. Fewer active nodes than the target (a
    node lost) read as they are."""
    return current if last_target is None else min(current, last_target)
