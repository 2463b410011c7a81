"""consecutive-errors: eject after a run of failed calls, probe before trusting again."""

from __future__ import annotations

import pytest
from fleetloop.policies.breaker.consecutive_errors import (
    ConsecutiveErrors,
    ConsecutiveErrorsParams,
    NodeBreaker,
    State,
    backoff_ms,
    step,
)
from fleetloop.schemas.decisions import BreakerDecision
from pydantic import ValidationError
from tests.policies.snapshots import by_node, ctx, node, snapshot

P = ConsecutiveErrorsParams()  # threshold 5, base 10 s, max 300 s, probe 0.05, forgive 300 s
T = 1_000_000


class Breaker:
    """One node's breaker driven through decide(), tick by tick, in event time."""

    def __init__(self, params: ConsecutiveErrorsParams = P) -> None:
        self.params = params
        self.state: State = ConsecutiveErrors().initial_state()

    def tick(self, at_ms: int, failures: int) -> BreakerDecision:
        snap = snapshot([node("a", consecutive_failures=failures), node("b")], now_ms=T + at_ms)
        result = ConsecutiveErrors().decide(snap, self.params, self.state, ctx(snap))
        self.state = result.state
        return by_node(result)["a"]


@pytest.mark.parametrize(
    ("failures", "state"),
    [(0, "closed"), (4, "closed"), (5, "open"), (50, "open")],
)
def test_closed_to_open_at_threshold(failures: int, state: str) -> None:
    d = Breaker().tick(0, failures)
    assert d.state == state
    if state == "open":
        assert (d.reason, d.ejections, d.until_ms) == ("consecutive-failures", 1, T + 10_000)
        assert d.inputs == {"consecutive_failures": float(failures)}


def test_open_to_half_open_after_backoff_then_closed_on_success() -> None:
    b = Breaker()
    assert b.tick(0, 5).state == "open"
    assert b.tick(9_999, 5).state == "open"
    d = b.tick(10_000, 5)
    assert (d.state, d.reason, d.probe_frac, d.until_ms) == ("half_open", "probe", 0.05, None)
    assert b.tick(11_000, 5).reason == "probing"  # no probe outcome yet
    d = b.tick(12_000, 0)  # a probe call succeeded: the router's run was reset
    assert (d.state, d.reason, d.probe_frac) == ("closed", "probe-succeeded", 0.0)


def test_half_open_to_open_on_failure_with_doubled_backoff() -> None:
    b = Breaker()
    b.tick(0, 5)
    b.tick(10_000, 5)
    d = b.tick(11_000, 6)  # the probe failed
    assert (d.state, d.reason, d.ejections, d.until_ms) == ("open", "probe-failed", 2, T + 11_000 + 20_000)
    assert b.tick(30_999, 6).state == "open"
    assert b.tick(31_000, 6).state == "half_open"


def test_backoff_doubles_up_to_max() -> None:
    assert [backoff_ms(P, k) for k in (1, 2, 3, 5, 6, 10)] == [
        10_000,
        20_000,
        40_000,
        160_000,
        300_000,
        300_000,
    ]


def test_half_open_success_then_failure_between_ticks_closes() -> None:
    # A probe succeeded (the run was reset) and one more call failed before the next tick: the run
    # is 1, below the run at which probing began. The probe did succeed, so the breaker closes.
    b = Breaker()
    b.tick(0, 5)
    b.tick(10_000, 5)
    d = b.tick(11_000, 1)
    assert (d.state, d.reason) == ("closed", "probe-succeeded")


def test_forgiveness_resets_ejection_count_after_quiet_period() -> None:
    b = Breaker()
    b.tick(0, 5)
    b.tick(10_000, 5)
    b.tick(11_000, 0)  # closed at 11 s with 1 ejection
    assert b.tick(11_000 + 299_999, 0).ejections == 1
    d = b.tick(11_000 + 300_000, 0)
    assert (d.reason, d.ejections) == ("forgiven", 0)
    # the next trip starts from the base backoff again
    d = b.tick(400_000, 5)
    assert (d.ejections, d.until_ms) == (1, T + 400_000 + 10_000)


def test_repeat_offender_is_not_forgiven_early() -> None:
    b = Breaker()
    b.tick(0, 5)
    b.tick(10_000, 5)
    b.tick(11_000, 0)
    d = b.tick(20_000, 5)  # trips again within the forgiveness period
    assert (d.state, d.ejections, d.until_ms) == ("open", 2, T + 20_000 + 20_000)


def test_step_is_pure() -> None:
    nb = NodeBreaker()
    assert step(nb, 5, 0, P) == (NodeBreaker("open", 1, 0, 5), "consecutive-failures")
    assert nb == NodeBreaker()


def test_every_pool_node_gets_a_decision_and_only_the_pool() -> None:
    snap = snapshot([node("a"), node("b"), node("x", pool_id="q")])
    result = ConsecutiveErrors().decide(snap, P, {}, ctx(snap))
    assert sorted(by_node(result)) == ["a", "b"]
    assert all(d.state == "closed" and d.reason == "healthy" for d in by_node(result).values())


def test_param_bounds() -> None:
    with pytest.raises(ValidationError):
        ConsecutiveErrorsParams(threshold=0)
    with pytest.raises(ValidationError):
        ConsecutiveErrorsParams(probe_frac=0.6)
