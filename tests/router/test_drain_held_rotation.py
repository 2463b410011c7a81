"""A router following ``control.state`` keeps a node the autoscaler asked to drain out of rotation on
every later tick, not only the tick that named it, until the fleet removes it or its grace has run
(``shaping.keep_draining``).

The engine's decisions for an idle pool whose nodes keep reporting (no actuator has removed them) go
through :class:`~fleetloop.router.state.DesiredState` as a router files them, newest per key, and the
rotation rule every actuator keeps (HAProxy's drain state, the worker lists) says which nodes take
calls. The drain list was once published only on the tick the target fell; the pool's next
decision had ``drain=()``, and the node was back in rotation one tick later."""

from __future__ import annotations

from fleetloop.core.decide.engine import Engine
from fleetloop.core.model import FleetModel, apply, snapshot
from fleetloop.policies.registry import builtin_policy
from fleetloop.router.state import DesiredState, rotation
from fleetloop.schemas import Tick
from tests.support.records import telemetry

T = 1_700_000_000_000
IDLE = {"queue_depth": 0, "running_requests": 0, "kv_cache_used_frac": 0.1, "gpu_util_frac": 0.0}
IDS = [f"p/{i:02d}" for i in range(12)]
TTL_S = 30.0


GRACE_S = 120  # the default policy's lead with no cold start seen: a node nobody removes is back then


def test_a_drained_node_stays_out_of_rotation_on_the_next_ticks() -> None:
    """No actuator removes the drained nodes: each stays out of rotation, tick after tick, until its
    grace has run (``shaping.keep_draining``: the fleet keeps it), then serves again."""
    engine, model, state = Engine(builtin_policy("default")), FleetModel(), DesiredState()
    out_since: dict[str, int] = {}  # node -> first tick the rotation kept it out for its drain
    returned: dict[str, int] = {}  # node -> the tick it was back in rotation
    for k in range(1, 300):
        now = T + k * 1_000
        apply(model, [telemetry(i, "p", ts_ms=now, **IDLE) for i in IDS])
        for d in engine.tick(snapshot(model, now), Tick(ts_ms=now, tick_id=k, pool_id="p")).decisions:
            state.accept(d, now / 1000.0)
        rot = rotation(state, "p", IDS, now / 1000.0, TTL_S)
        assert rot.mode == "routing"
        for node_id, why in rot.why.items():
            if why == "autoscale-drain" and node_id not in returned:
                out_since.setdefault(node_id, k)
        for n in out_since:
            if n not in returned and rot.serves(n):
                returned[n] = k
        early = sorted(n for n, at in returned.items() if at - out_since[n] < GRACE_S)
        assert not early, (
            f"tick {k}: {early} drained at ticks {[out_since[n] for n in early]}, back in rotation"
        )
    assert len(out_since) >= 3, "the pool scaled in"
    assert returned, "nodes nobody removes are back in rotation a grace after their drain"
    assert all(at - out_since[n] == GRACE_S for n, at in returned.items())
