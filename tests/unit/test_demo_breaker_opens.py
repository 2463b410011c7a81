"""The wire demo's report of a breaker open: the first enforced open, with the reason it opened."""

from __future__ import annotations

from fleetloop.demo.wire import BreakerOpens
from fleetloop.schemas import BreakerDecision, Decision, PolicyStamp

STAMP = PolicyStamp(name="default", version=3, hash="0123456789abcdef", mode="enforce")


def _open(ts_ms: int, reason: str, *, enforced: bool, state: str = "open") -> Decision:
    body = BreakerDecision(
        entity="node/n2",
        pool_id="p",
        node_id="n2",
        state=state,
        enforced=enforced,
        reason=reason,
    )
    return Decision(ts_ms=ts_ms, tick_id=ts_ms // 1000, policy=STAMP, body=body)


def test_an_open_held_back_by_the_cap_reports_the_reason_it_opened_and_when_it_was_let_out() -> None:
    opens = BreakerOpens()
    assert opens.feed(_open(1_000, "latency-outlier:capacity-cap", enforced=False)) is None
    o = opens.feed(_open(2_000, "latency-ejected", enforced=True))
    assert o is not None
    assert (o["ts_ms"], o["reason"], o["held_back_by"]) == (2_000, "latency-outlier", "capacity-cap")
    assert opens.feed(_open(3_000, "latency-ejected", enforced=True)) is None  # the first only


def test_an_open_enforced_at_once_reports_its_own_reason() -> None:
    opens = BreakerOpens()
    assert opens.feed(_open(1_000, "consecutive-failures", enforced=False, state="closed")) is None
    o = opens.feed(_open(1_000, "latency-outlier", enforced=True))
    assert o is not None
    assert (o["reason"], o["held_back_by"]) == ("latency-outlier", None)
