"""A router following ``control.state`` keeps a node the autoscaler asked to drain out of rotation on
every later tick, not only the tick that named it (``shaping.keep_draining``).

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


def test_a_drained_node_stays_out_of_rotation_on_the_next_ticks() -> None:
    engine, model, state = Engine(builtin_policy("default")), FleetModel(), DesiredState()
    out_since: dict[str, int] = {}  # node -> first tick the rotation kept it out for its drain
    for k in range(1, 240):
        now = T + k * 1_000
        apply(model, [telemetry(i, "p", ts_ms=now, **IDLE) for i in IDS])
        for d in engine.tick(snapshot(model, now), Tick(ts_ms=now, tick_id=k, pool_id="p")).decisions:
            state.accept(d, now / 1000.0)
        rot = rotation(state, "p", IDS, now / 1000.0, TTL_S)
        assert rot.mode == "routing"
        for node_id, why in rot.why.items():
            if why == "autoscale-drain":
                out_since.setdefault(node_id, k)
        back = sorted(n for n in out_since if rot.serves(n))
        assert not back, f"tick {k}: {back} drained at ticks {[out_since[n] for n in back]}, back in rotation"
    assert len(out_since) >= 3, "the pool scaled in"
    assert len(rot.weights) == len(IDS) - len(out_since)
