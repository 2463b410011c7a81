"""fleetloop.router: the library a router or gateway embeds to follow fleetloop's desired state.

- :class:`DesiredState` (pure): the newest enforced decision per key from ``control.state``.
- :class:`Router` (pure, no clock): ``pick()`` a node per call by weights, by-priority weights,
  breaker states, autoscale's drain list, prefix affinity, shed thresholds, spill-over;
  ``allow_retry()`` against the retry budget; fail static for ``fail_static_s``, then plain load balancing.
- ``fleetloop.router.follow.StateFollower`` (asyncio, aiokafka): keeps a Router current from
  ``control.state`` (and, optionally, endpoint load from ``fleet.telemetry``).
- ``fleetloop.router.publish.OutcomePublisher`` (asyncio, aiokafka): each call's ``RequestOutcome``
  to ``fleet.requests`` without ever blocking the caller.

The pure parts import no Kafka client, so the simulator uses them without one. It imports the
wire schemas only (import-linter contract ``router-library``): no daemon, no simulator.
"""

from __future__ import annotations

from fleetloop.router.pick import FAIL_STATIC_S, Endpoint, NodeLike, Route, Router
from fleetloop.router.state import DesiredState, PoolState

__all__ = ["FAIL_STATIC_S", "DesiredState", "Endpoint", "NodeLike", "PoolState", "Route", "Router"]
