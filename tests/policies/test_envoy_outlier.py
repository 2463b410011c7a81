"""envoy-outlier: Envoy outlier detection with its shipped defaults.

Two kinds of test here:

- decision tables and properties for what the docstring promises in our terms (ticks, pools,
  decisions, the event-time interval timer);
- cases PORTED from Envoy's own suite, ``test/common/upstream/outlier_detection_impl_test.cc``
  (envoyproxy/envoy, the post-#27909 version with ``TEST_F(OutlierDetectorImplTest,
  MaxEjectionPercentage)``), each naming its original. They run through :class:`Harness`, which
  plays the role of Envoy's test fixture: ``load`` reports call results for a host (the model's
  consecutive-failure counter and the success-rate bucket) and decides at once, as Envoy's
  ``loadRq`` posts a consecutive-5xx detection to the main thread at once; ``interval`` fires the
  interval timer at the current time, as the test's ``interval_timer_->invokeCallback()`` does, and
  then swaps the success-rate bucket; ``at`` sets the simulated time.

Cases that do not translate are not ported: gateway-failure and local-origin (split mode) detectors
(our outcomes carry no such distinction; not modelled), active health checks, extension monitors,
event-logger JSON, stats counters, cross-thread races other than the double delivery, and
configuration plumbing of fields we do not have.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from fleetloop.policies.base import PolicyResult
from fleetloop.policies.breaker.envoy_outlier import (
    DetectorState,
    EnvoyOutlier,
    EnvoyOutlierParams,
    ejection_time_ms,
    success_rate_threshold,
)
from fleetloop.schemas.decisions import BreakerDecision
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.policies.snapshots import by_node, ctx, node, snapshot

T0 = 1_700_000_000_000
NEVER = 10**13


class Harness:
    """Envoy's ``OutlierDetectorImplTest`` fixture, driving the algorithm through its contract."""

    def __init__(self, hosts: list[str], **params: Any) -> None:
        self.params = EnvoyOutlierParams(**params)
        self.algo = EnvoyOutlier()
        self.hosts = list(hosts)
        self.now = T0
        self.tick = 0
        self.failures = dict.fromkeys(hosts, 0)  # the model's consecutive_failures
        self.ok = dict.fromkeys(hosts, 0)  # the current success-rate bucket
        self.bad = dict.fromkeys(hosts, 0)
        self.state: DetectorState = self.algo.initial_state()
        self.decisions: dict[str, BreakerDecision] = {}
        self.result: PolicyResult[DetectorState] | None = None
        self._decide(timer=False)  # the detector starts; its interval timer is armed

    def at(self, ms: int) -> None:
        self.now = T0 + ms

    def load(self, host: str, count: int, code: int) -> None:
        for _ in range(count):
            if code >= 500:
                self.failures[host] += 1
                self.bad[host] += 1
            else:
                self.failures[host] = 0
                self.ok[host] += 1
        self._decide(timer=False)

    def interval(self) -> None:
        self._decide(timer=True)
        self.ok = dict.fromkeys(self.hosts, 0)
        self.bad = dict.fromkeys(self.hosts, 0)

    def remove(self, host: str) -> None:
        self.hosts.remove(host)

    def ejected(self, host: str) -> bool:
        return self.state.hosts[host].ejected

    def _decide(self, *, timer: bool) -> None:
        # Every node's decision, not only the emitted ones: these tests judge the rule (what is
        # decided); which records are published is tests/policies/test_emission.py's.
        state = replace(self.state, emitted={})
        if state.next_interval_ms is not None:
            state = replace(state, next_interval_ms=self.now if timer else self.now + NEVER)
        views = [
            node(h, consecutive_failures=self.failures[h], ok_w=self.ok[h], failures_w=self.bad[h])
            for h in self.hosts
        ]
        snap = snapshot(views, now_ms=self.now)
        self.tick += 1
        self.result = self.algo.decide(snap, self.params, state, ctx(snap, tick_id=self.tick))
        self.state = self.result.state
        self.decisions = by_node(self.result)


def decide_once(
    views: list[Any], state: DetectorState | None = None, **params: Any
) -> PolicyResult[DetectorState]:
    snap = snapshot(views)
    algo = EnvoyOutlier()
    return algo.decide(snap, EnvoyOutlierParams(**params), state or algo.initial_state(), ctx(snap))


# --- ported from envoyproxy/envoy test/common/upstream/outlier_detection_impl_test.cc ---------------


def test_sr_threshold() -> None:
    # Ported: TEST(OutlierUtility, SRThreshold).
    mean, threshold = success_rate_threshold([50, 100, 100, 100, 100], 1.9)
    assert mean == 90.0
    assert threshold == 52.0


def test_detector_static_config_defaults() -> None:
    # Ported (defaults part): TEST_F(OutlierDetectorImplTest, DetectorStaticConfig) checks the
    # unset fields keep Envoy's defaults; with nothing set, every DEFAULT_* of
    # outlier_detection_impl.h. enforcing_failure_percentage stays 0, as there.
    p = EnvoyOutlierParams()
    assert (p.consecutive_5xx, p.interval_ms, p.base_ejection_time_ms, p.max_ejection_ms) == (
        5,
        10_000,
        30_000,
        300_000,
    )
    assert (p.max_ejection_percent, p.always_eject_one_host, p.max_ejection_time_jitter_ms) == (10, False, 0)
    assert (p.enforcing_consecutive_5xx, p.enforcing_success_rate, p.enforcing_failure_percentage) == (
        100,
        100,
        0,
    )
    assert (p.success_rate_minimum_hosts, p.success_rate_request_volume, p.success_rate_stdev_factor) == (
        5,
        100,
        1900,
    )
    assert (p.failure_percentage_threshold, p.failure_percentage_minimum_hosts) == (85, 5)
    assert p.failure_percentage_request_volume == 50


def test_detector_static_config_max_default_value() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, DetectorStaticConfigMaxDefaultValue).
    p = EnvoyOutlierParams(interval_ms=100, base_ejection_time_ms=10_000)
    assert (p.interval_ms, p.base_ejection_time_ms, p.max_ejection_ms) == (100, 10_000, 300_000)


def test_detector_static_config_invalid_max_eject_time() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, DetectorStaticConfigiInvalidMaxEjectTime).
    with pytest.raises(ValidationError, match="max_ejection_time_ms cannot be smaller"):
        EnvoyOutlierParams(interval_ms=100, base_ejection_time_ms=10_000, max_ejection_time_ms=3_000)


def test_detector_static_config_base_larger_than_max_no_max() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, DetectorStaticConfigBaseLargerThanMaxNoMax).
    p = EnvoyOutlierParams(interval_ms=100, base_ejection_time_ms=400_000)
    assert (p.base_ejection_time_ms, p.max_ejection_ms) == (400_000, 400_000)


def test_basic_flow_5xx_via_http_codes() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, BasicFlow5xxViaHttpCodes) (max_ejection_percent 100).
    d = Harness(["h0", "h1"], max_ejection_percent=100)
    d.load("h0", 1, 500)
    d.load("h0", 1, 200)
    d.load("h0", 4, 500)
    assert not d.ejected("h0")
    d.at(0)
    d.load("h0", 1, 500)
    assert d.ejected("h0")
    assert d.decisions["h0"].state == "open"
    assert d.decisions["h0"].reason == "consecutive-5xx"
    # Interval that doesn't bring the host back in.
    d.at(9_999)
    d.interval()
    assert d.ejected("h0")
    assert d.state.hosts["h0"].unejected_at_ms is None
    # Interval that does bring the host back in.
    d.at(30_001)
    d.interval()
    assert not d.ejected("h0")
    assert d.state.hosts["h0"].unejected_at_ms == T0 + 30_001
    assert d.decisions["h0"].reason == "unejected"
    # Eject host again to cause an ejection after an unejection has taken place.
    d.load("h0", 4, 500)
    assert not d.ejected("h0")
    d.at(40_000)
    d.load("h0", 1, 500)
    assert d.ejected("h0")
    assert d.state.hosts["h0"].num_ejections == 2
    assert sum(1 for h in d.state.hosts.values() if h.ejected) == 1


def test_external_origin_events_non_split() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, ExternalOriginEventsNonSplit) (max 60%, 2 hosts):
    # a success between failures resets the run; a long run ejects.
    d = Harness(["h0", "h1"], max_ejection_percent=60)
    for _ in range(100):
        d.load("h0", 1, 500)
        d.load("h0", 1, 200)
    assert not d.ejected("h0")
    d.load("h0", 100, 500)
    assert d.ejected("h0")


def test_large_number_of_timeouts() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, LargeNumberOfTimeouts), in Envoy's default non-split
    # mode (a timeout is a 504, a 5xx): failures reported while ejected do not count after return.
    d = Harness(["h0"], max_ejection_percent=100)
    d.load("h0", 5, 504)
    assert d.ejected("h0")
    d.load("h0", 10, 504)
    d.at(50_001)
    d.interval()
    assert not d.ejected("h0")
    d.load("h0", 4, 504)
    assert not d.ejected("h0")
    d.load("h0", 1, 504)
    assert d.ejected("h0")


def test_basic_flow_success_rate_external_origin() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, BasicFlowSuccessRateExternalOrigin) (max 100%,
    # consecutive-5xx detection not enforced so success rate is tested alone).
    hosts = [f"h{i}" for i in range(5)]
    d = Harness(hosts, max_ejection_percent=100, enforcing_consecutive_5xx=0)
    for h in hosts:
        d.load(h, 200, 200)
    d.load("h4", 200, 503)
    assert not d.ejected("h4")
    assert d.decisions["h4"].reason == "consecutive-5xx-not-enforced"
    assert not d.decisions["h4"].enforced
    d.at(10_000)
    d.interval()
    assert d.result is not None
    assert d.decisions["h4"].inputs["success_rate_pct"] == 50.0
    assert d.result.diagnostics["success_rate_mean_pct"] == 90.0
    assert d.result.diagnostics["success_rate_threshold_pct"] == 52.0
    assert d.ejected("h4")
    assert d.decisions["h4"].reason == "success-rate"
    assert sum(1 for h in d.state.hosts.values() if h.ejected) == 1
    # Interval that doesn't bring the host back in.
    d.at(19_999)
    d.interval()
    assert d.ejected("h4")
    # Interval that does bring the host back in.
    d.at(50_001)
    d.interval()
    assert not d.ejected("h4")
    # Give 4 hosts enough request volume but not to the 5th. Should not cause an ejection.
    for h in hosts:
        d.load(h, 25, 200)
    d.load("h4", 25, 503)
    d.at(60_001)
    d.interval()
    assert not any(h.ejected for h in d.state.hosts.values())
    assert d.decisions["h4"].inputs["success_rate_pct"] == 50.0  # computed, volume too low to judge
    assert "success_rate_mean_pct" not in d.result.diagnostics


def test_empty_success_rate() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, EmptySuccessRate): no hosts and
    # success_rate_minimum_hosts 0 must not divide by zero.
    d = Harness([], success_rate_minimum_hosts=0)
    d.at(10_000)
    d.interval()
    assert d.decisions == {}


def test_basic_flow_failure_percentage_external_origin() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, BasicFlowFailurePercentageExternalOrigin) (max 100%,
    # consecutive 5xx and success rate not enforced, failure percentage enforced).
    hosts = [f"h{i}" for i in range(5)]
    d = Harness(
        hosts,
        max_ejection_percent=100,
        enforcing_consecutive_5xx=0,
        enforcing_success_rate=0,
        enforcing_failure_percentage=100,
    )
    for h in hosts:
        d.load(h, 50, 200)
    d.load("h3", 250, 503)  # failure percentage slightly below threshold
    d.load("h4", 300, 503)  # slightly above
    d.at(10_000)
    d.interval()
    assert d.decisions["h3"].inputs["success_rate_pct"] == pytest.approx(100.0 * 50 / 300, abs=1e-6)
    assert d.decisions["h4"].inputs["success_rate_pct"] == pytest.approx(100.0 * 50 / 350, abs=1e-6)
    assert not d.ejected("h3")
    assert d.ejected("h4")
    assert d.decisions["h4"].reason == "failure-percentage"
    d.at(19_999)
    d.interval()
    assert d.ejected("h4")
    d.at(50_001)
    d.interval()
    assert not d.ejected("h4")
    for h in hosts:
        d.load(h, 25, 200)
    d.load("h4", 25, 503)
    d.at(60_001)
    d.interval()
    assert not any(h.ejected for h in d.state.hosts.values())
    assert d.decisions["h4"].inputs["success_rate_pct"] == 50.0


def test_eject_time_backoff_time_based_detection() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, EjectTimeBackoffTimeBasedDetection): failure
    # percentage on one host (minimum hosts 1), base ejection 10 s.
    d = Harness(
        ["h0"],
        base_ejection_time_ms=10_000,
        max_ejection_percent=100,
        enforcing_consecutive_5xx=0,
        enforcing_success_rate=0,
        enforcing_failure_percentage=100,
        failure_percentage_minimum_hosts=1,
    )
    d.at(0)
    d.load("h0", 100, 500)
    d.at(10_000)
    d.interval()
    assert d.ejected("h0")
    d.at(20_000)
    d.interval()
    assert not d.ejected("h0")
    d.load("h0", 100, 500)
    d.at(30_000)
    d.interval()
    assert d.ejected("h0")  # second ejection in a row: 20 s
    d.at(40_000)
    d.interval()
    assert d.ejected("h0")
    d.at(50_000)
    d.interval()
    assert not d.ejected("h0")
    d.load("h0", 100, 200)  # two healthy periods bring the ejection time down
    d.at(60_000)
    d.interval()
    assert not d.ejected("h0")
    d.load("h0", 100, 200)
    d.at(70_000)
    d.interval()
    assert not d.ejected("h0")
    d.load("h0", 100, 500)
    d.at(80_000)
    d.interval()
    assert d.ejected("h0")
    d.at(90_000)
    d.interval()
    assert not d.ejected("h0")  # back after one base ejection time


def test_remove_while_ejected() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, RemoveWhileEjected).
    d = Harness(["h0"], max_ejection_percent=100)
    d.load("h0", 4, 500)
    d.at(0)
    d.load("h0", 1, 500)
    assert d.ejected("h0")
    d.remove("h0")
    d.at(9_999)
    d.interval()
    assert d.state.hosts == {}
    assert d.decisions == {}


def test_overflow() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, Overflow) (2 hosts, max 60%).
    d = Harness(["h0", "h1"], max_ejection_percent=60)
    d.load("h0", 4, 500)
    d.at(0)
    d.load("h0", 1, 500)
    assert d.ejected("h0")
    d.load("h1", 5, 500)
    assert not d.ejected("h1")
    assert sum(1 for h in d.state.hosts.values() if h.ejected) == 1
    # ejections_overflow: detected, not enforced.
    assert (d.decisions["h1"].state, d.decisions["h1"].enforced) == ("open", False)
    assert d.decisions["h1"].reason == "consecutive-5xx-overflow"


def test_not_enforcing() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, NotEnforcing) (3 hosts, max 35%, 5xx not enforced).
    d = Harness(["h0", "h1", "h2"], max_ejection_percent=35, enforcing_consecutive_5xx=0)
    d.load("h0", 4, 503)
    d.load("h0", 1, 503)
    assert not d.ejected("h0")
    assert (d.decisions["h0"].state, d.decisions["h0"].enforced) == ("open", False)
    assert d.decisions["h0"].reason == "consecutive-5xx-not-enforced"
    assert d.state.hosts["h0"].num_ejections == 0


def test_cross_thread_fail_race() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, CrossThreadFailRace): the same detection delivered
    # twice (here: the same tick decided twice) results in a single ejection.
    d = Harness(["h0"], max_ejection_percent=100)
    d.load("h0", 5, 500)
    d.load("h0", 0, 500)
    assert d.ejected("h0")
    assert d.state.hosts["h0"].num_ejections == 1


def test_max_ejection_percentage() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, MaxEjectionPercentage): a 50% ejection limit does not
    # eject more than 1 of 3 hosts (max_ejection_time_jitter 13 s, as there).
    d = Harness(["h0", "h1", "h2"], max_ejection_percent=50, max_ejection_time_jitter_ms=13_000)
    d.at(0)
    d.load("h0", 5, 500)
    d.load("h1", 5, 500)
    d.load("h2", 5, 500)
    assert [d.ejected(h) for h in ("h0", "h1", "h2")] == [True, False, False]
    assert 0 <= d.state.hosts["h0"].jitter_ms <= 13_000


def test_max_ejection_percentage_single_host() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, MaxEjectionPercentageSingleHost): a single host is
    # not ejected with a max ejection percent below 100.
    d = Harness(["h0"], max_ejection_percent=90, max_ejection_time_jitter_ms=13_000)
    d.load("h0", 5, 500)
    assert not d.ejected("h0")


def test_consecutive_5xx_already_ejected() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, Consecutive_5xxAlreadyEjected).
    d = Harness(["h0"], max_ejection_percent=100)
    d.load("h0", 4, 500)
    d.at(0)
    d.load("h0", 1, 500)
    assert d.ejected("h0")
    d.load("h0", 1, 200)
    d.load("h0", 5, 500)
    assert d.ejected("h0")
    assert d.state.hosts["h0"].num_ejections == 1


def test_eject_time_backoff() -> None:
    # Ported: TEST_F(OutlierDetectorImplTest, EjectTimeBackoff): base 10 s; the ejection time grows
    # with each ejection in a row (10, 20, 30 s) and shrinks while the node stays healthy.
    d = Harness(["h0"], base_ejection_time_ms=10_000, max_ejection_percent=100)
    d.at(0)
    d.load("h0", 5, 500)
    assert d.ejected("h0")
    d.at(10_000)
    d.interval()
    assert not d.ejected("h0")
    d.load("h0", 5, 500)  # second ejection in a row: 20 s
    assert d.ejected("h0")
    d.at(20_000)
    d.interval()
    assert d.ejected("h0")
    d.at(30_000)
    d.interval()
    assert not d.ejected("h0")
    d.load("h0", 5, 500)  # third: 30 s
    for t in (40_000, 50_000):
        d.at(t)
        d.interval()
        assert d.ejected("h0")
    d.at(60_000)
    d.interval()
    assert not d.ejected("h0")
    for t in (70_000, 80_000):  # two healthy intervals
        d.at(t)
        d.interval()
    d.load("h0", 5, 500)  # now 20 s
    assert d.decisions["h0"].until_ms == T0 + 100_000
    d.at(90_000)
    d.interval()
    assert d.ejected("h0")
    d.at(100_000)
    d.interval()
    assert not d.ejected("h0")
    for i in range(1, 51):  # a long healthy period: back to 1 x base
        d.at(100_000 + i * 10_000)
        d.interval()
    d.at(610_000)
    d.load("h0", 5, 500)
    assert d.ejected("h0")
    d.at(620_000)
    d.interval()
    assert not d.ejected("h0")


@pytest.mark.parametrize(
    ("max_ejection_time_ms", "ramp", "cap_intervals"),
    [
        # Ported: TEST_F(OutlierDetectorImplTest, MaxEjectTime): base 10 s, max 300 s; 30
        # ejections in a row reach the cap, further ones stay at 300 s.
        (300_000, 30, 30),
        # Ported: TEST_F(OutlierDetectorImplTest, MaxEjectTimeNotAlligned): max 305 s is not a
        # multiple of the base; the longest ejection is returned at the 310 s interval.
        (305_000, 31, 31),
    ],
)
def test_max_eject_time(max_ejection_time_ms: int, ramp: int, cap_intervals: int) -> None:
    d = Harness(
        ["h0"],
        base_ejection_time_ms=10_000,
        max_ejection_time_ms=max_ejection_time_ms,
        max_ejection_percent=100,
    )
    tick = 0
    d.at(0)
    for i in range(1, ramp + 1):
        d.load("h0", 5, 500)
        assert d.ejected("h0")
        for _ in range(1, i):
            tick += 1
            d.at(tick * 10_000)
            d.interval()
            assert d.ejected("h0")
        tick += 1
        d.at(tick * 10_000)
        d.interval()
        assert not d.ejected("h0"), f"ejection {i} should last {i * 10} s"
    for _ in range(1, 10):
        d.load("h0", 5, 500)
        assert d.ejected("h0")
        for _ in range(1, cap_intervals):
            tick += 1
            d.at(tick * 10_000)
            d.interval()
            assert d.ejected("h0")
        tick += 1
        d.at(tick * 10_000)
        d.interval()
        assert not d.ejected("h0")


def test_backoff_is_capped_so_recovery_is_bounded() -> None:
    # ejectHost raises the backoff only while backoff * base < max + base: with base 10 s and max
    # 300 s it stops at 31, so after 40 ejections in a row five healthy intervals bring the next
    # ejection down to 270 s (an unbounded backoff would still be at the 300 s cap).
    d = Harness(["h0"], base_ejection_time_ms=10_000, max_ejection_percent=100)
    t = 0
    for _ in range(40):
        d.load("h0", 5, 500)
        t += ejection_time_ms(d.params, d.state.hosts["h0"])
        d.at(t)
        d.interval()
        assert not d.ejected("h0")
    assert d.state.hosts["h0"].backoff == 31
    for _ in range(5):
        t += 10_000
        d.at(t)
        d.interval()
    assert d.state.hosts["h0"].backoff == 26
    d.load("h0", 5, 500)
    assert d.decisions["h0"].until_ms == T0 + t + 270_000


# --- decision tables: the shipped defaults in our terms ---------------------------------------------


def failing(node_id: str, run: int = 5, **fields: Any) -> Any:
    return node(node_id, consecutive_failures=run, failures_w=run, **fields)


@pytest.mark.parametrize(
    ("pool_size", "failing_nodes", "ejected"),
    [
        # Envoy >= 1.27 checks 100 * (ejected + 1) / hosts <= 10 before ejecting: a pool of fewer
        # than 10 nodes ejects nobody by default ...
        (1, 1, 0),
        (8, 1, 0),
        (9, 3, 0),
        # ... 10 to 19 nodes eject one, 20 to 29 two.
        (10, 3, 1),
        (16, 4, 1),
        (20, 5, 2),
        (30, 30, 3),
    ],
)
def test_default_max_ejection_percent_binds(pool_size: int, failing_nodes: int, ejected: int) -> None:
    views = [failing(f"n{i:02d}") if i < failing_nodes else node(f"n{i:02d}") for i in range(pool_size)]
    decisions = by_node(decide_once(views))
    enforced_open = [d for d in decisions.values() if d.state == "open" and d.enforced]
    detected = [d for d in decisions.values() if d.state == "open" and not d.enforced]
    assert len(enforced_open) == ejected
    assert len(detected) == failing_nodes - ejected
    assert all(d.reason == "consecutive-5xx-overflow" for d in detected)


def test_only_ready_nodes_are_endpoints_and_count_in_the_cap() -> None:
    # 10 nodes of which one is loading weights: 9 endpoints, 100 * 1 / 9 > 10: no ejection.
    views = [failing("n00"), *[node(f"n{i:02d}") for i in range(1, 9)], node("n09", weights_state="loading")]
    decisions = by_node(decide_once(views))
    assert not decisions["n00"].enforced
    assert (decisions["n09"].state, decisions["n09"].reason) == ("closed", "not-an-endpoint")
    # the same with the tenth node ready: 100 * 1 / 10 <= 10
    views[-1] = node("n09")
    assert by_node(decide_once(views))["n00"].enforced


def test_a_node_rejoining_the_endpoints_starts_afresh() -> None:
    algo, params = EnvoyOutlier(), EnvoyOutlierParams(always_eject_one_host=True)
    others = [node("b"), node("c")]
    state = algo.initial_state()
    for views in (
        [node("a", consecutive_failures=5), *others],  # ejected
        [node("a", consecutive_failures=7, weights_state="cold"), *others],  # preempted: leaves the endpoints
        [node("a", consecutive_failures=7), *others],  # warm again: a new host, its old run does not count
    ):
        snap = snapshot(views)
        result = algo.decide(snap, params, state, ctx(snap))
        state = result.state
    assert (by_node(result)["a"].state, state.hosts["a"].num_ejections) == ("closed", 0)
    snap = snapshot([node("a", consecutive_failures=12), *others])
    assert by_node(algo.decide(snap, params, state, ctx(snap)))["a"].state == "open"


def test_always_eject_one_host_restores_pre_1_27_minimum() -> None:
    views = [failing("a"), failing("b"), node("c")]
    decisions = by_node(decide_once(views, always_eject_one_host=True))
    assert [decisions[n].state == "open" and decisions[n].enforced for n in "abc"] == [True, False, False]


def test_longest_run_is_ejected_first_within_a_tick() -> None:
    views = [failing(f"n{i:02d}", run=5 + i) for i in range(3)] + [node(f"m{i:02d}") for i in range(7)]
    decisions = by_node(decide_once(views))
    assert [n for n, d in decisions.items() if d.enforced and d.state == "open"] == ["n02"]


def test_ejection_decision_fields() -> None:
    views = [failing("a", run=7)] + [node(f"b{i}") for i in range(9)]
    d = by_node(decide_once(views))["a"]
    assert (d.state, d.enforced, d.reason, d.ejections) == ("open", True, "consecutive-5xx", 1)
    assert d.until_ms == snapshot().now_ms + 30_000
    assert d.probe_frac == 0.0  # no half-open probes in Envoy
    assert d.inputs["consecutive_failures"] == 7.0
    healthy = by_node(decide_once(views))["b0"]
    assert (healthy.state, healthy.reason) == ("closed", "healthy")


def test_interval_timer_runs_in_event_time() -> None:
    # Un-ejection happens only on interval ticks: the first interval is 10 s after the detector
    # starts; an ejection at t=1 s (30 s) ends at the first interval tick at or after t=31 s: 40 s.
    algo, params = EnvoyOutlier(), EnvoyOutlierParams(always_eject_one_host=True)
    state = algo.initial_state()
    seen: dict[int, str] = {}
    held: dict[str, BreakerDecision] = {}  # the newest record per node, as a router holds it
    run = 0
    for second in range(0, 61):
        if second == 1:
            run = 5
        snap = snapshot([node("a", consecutive_failures=run), node("b")], now_ms=1_000_000 + second * 1000)
        result = algo.decide(snap, params, state, ctx(snap, tick_id=second))
        state = result.state
        held.update(by_node(result))
        seen[second] = held["a"].state
    assert state.next_interval_ms == 1_000_000 + 70_000
    assert seen[0] == "closed"
    assert all(seen[s] == "open" for s in range(1, 40))
    assert all(seen[s] == "closed" for s in range(40, 61))


def test_an_ok_call_resets_the_run_and_runs_count_from_the_last_reset() -> None:
    algo, params = EnvoyOutlier(), EnvoyOutlierParams(always_eject_one_host=True)
    state = algo.initial_state()
    pool = [node(f"z{i}") for i in range(3)]
    held: dict[str, BreakerDecision] = {}  # the newest record per node, as a router holds it
    for run in (3, 4, 0, 2, 4):  # 0: an ok call; 4 < 5 since the reset
        snap = snapshot([node("a", consecutive_failures=run), *pool])
        result = algo.decide(snap, params, state, ctx(snap))
        state = result.state
        held.update(by_node(result))
        assert held["a"].state == "closed"
    snap = snapshot([node("a", consecutive_failures=5), *pool])
    assert by_node(algo.decide(snap, params, state, ctx(snap)))["a"].state == "open"


def test_partial_enforcement_draws_from_the_context_generator() -> None:
    params = EnvoyOutlierParams(enforcing_consecutive_5xx=50, always_eject_one_host=True)
    outcomes = set()
    for seed in range(40):
        snap = snapshot([failing("a"), node("b")])
        result = EnvoyOutlier().decide(snap, params, EnvoyOutlier().initial_state(), ctx(snap, seed=seed))
        outcomes.add(by_node(result)["a"].reason)
        again = EnvoyOutlier().decide(snap, params, EnvoyOutlier().initial_state(), ctx(snap, seed=seed))
        assert by_node(again) == by_node(result)  # same seed, same draw
    assert outcomes == {"consecutive-5xx", "consecutive-5xx-not-enforced"}


def test_ejection_time_formula() -> None:
    p = EnvoyOutlierParams()
    from fleetloop.policies.breaker.envoy_outlier import HostState

    assert [ejection_time_ms(p, HostState(backoff=b)) for b in (1, 2, 3, 10, 11)] == [
        30_000,
        60_000,
        90_000,
        300_000,
        300_000,
    ]
    assert ejection_time_ms(p, HostState(backoff=2, jitter_ms=7)) == 60_007


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=40),
    st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=40),
    st.integers(min_value=0, max_value=100),
    st.booleans(),
)
def test_never_ejects_more_than_max_ejection_percent(
    size: int, runs: list[int], pct: int, always_one: bool
) -> None:
    views = [node(f"n{i:02d}", consecutive_failures=runs[i % len(runs)]) for i in range(size)]
    decisions = by_node(decide_once(views, max_ejection_percent=pct, always_eject_one_host=always_one))
    ejected = sum(1 for d in decisions.values() if d.state == "open" and d.enforced)
    allowed = sum(1 for k in range(1, size + 1) if 100.0 * k / size <= pct)
    if always_one:
        allowed = max(allowed, 1)
    assert ejected <= allowed
    eligible = sum(1 for v in views if v.consecutive_failures >= 5)
    assert ejected == min(eligible, allowed)
