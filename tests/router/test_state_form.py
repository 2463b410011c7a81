"""The two forms of ``control.state`` as the router library and the actuators read them.

Form 1 (no headers): every enforced decision every tick; a routing decision is fresh for the
reader's fail-static TTL from when it was decided. Form 2 (``fleetloop.state_form: 2``,
``fleetloop.refresh_ms``; :mod:`fleetloop.daemon.act.state_changes`): a key is re-sent only when it
changes and at its refresh, so an unchanged pool's newest record may be a refresh period old while
the daemon stands by it: fresh for the TTL plus the refresh. Either way, past that, fail static.
"""

from __future__ import annotations

from fleetloop.edges.actuate.haproxy.mapping import BackendMap, PoolMap, Slot, targets
from fleetloop.edges.actuate.worker_list.mapping import WorkerMap, desired_workers
from fleetloop.router.follow import StateOnly
from fleetloop.router.state import DesiredState, rotation
from fleetloop.schemas.decisions import refresh_s_of, state_headers
from tests.router.test_pick import routing

TTL = 5.0  # an operator's short fail-static TTL, below the daemon's 10 s refresh
REFRESH_S = refresh_s_of(state_headers(10_000))
WEIGHTS = {"p/0": 0.75, "p/1": 0.25}


def _state(refresh_s: float) -> DesiredState:
    sink = StateOnly(TTL)
    assert sink.apply([routing("p", WEIGHTS)], 0.0, refresh_s)
    return sink.state


def test_the_change_only_form_keeps_routing_fresh_for_the_ttl_plus_the_refresh() -> None:
    assert REFRESH_S == 10.0
    st = _state(REFRESH_S)
    between = TTL + 4.0  # past the TTL, before the refresh was due: the daemon stands by it
    assert rotation(st, "p", ["p/0", "p/1"], between, TTL).mode == "routing"
    assert rotation(st, "p", ["p/0", "p/1"], TTL + REFRESH_S + 0.1, TTL).mode == "fail-static"


def test_the_every_tick_form_goes_stale_after_the_ttl_as_before() -> None:
    st = _state(0.0)
    assert rotation(st, "p", ["p/0", "p/1"], TTL - 0.1, TTL).mode == "routing"
    assert rotation(st, "p", ["p/0", "p/1"], TTL + 4.0, TTL).mode == "fail-static"


def test_both_actuators_keep_the_weights_of_a_change_only_record_between_refreshes() -> None:
    now = TTL + 4.0
    slots = tuple(Slot(f"p/{i}", "p", "be", f"s{i}") for i in range(2))
    haproxy = {
        s.server: t.weight
        for s, t in targets(
            _state(REFRESH_S), BackendMap((PoolMap("p", "be", "m", slots),)), now, TTL
        ).items()
    }
    assert haproxy["s0"] > haproxy["s1"]  # weighted as decided, not plain load balancing
    wmap = WorkerMap({"p": {"p/0": "http://w0", "p/1": "http://w1", "p/2": "http://w2"}})
    workers = desired_workers(_state(REFRESH_S), wmap, now, TTL)
    assert workers["http://w2"] == (False, "not-a-member")  # fail static would list it
    old = desired_workers(_state(0.0), wmap, now, TTL)
    assert old["http://w2"] == (True, "fail-static")


def test_the_router_picks_by_weight_between_refreshes() -> None:
    st = _state(REFRESH_S)
    assert st.routing_fresh("p", TTL + 4.0, TTL) is not None
    assert st.routing_fresh("p", TTL + REFRESH_S + 0.1, TTL) is None
