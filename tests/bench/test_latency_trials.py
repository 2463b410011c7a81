"""``fleetloop bench latency``'s reading of a trial: what counts as a release of an enforced ejection
before its end (a flap), the failed calls in a row its policy opens on, its table and its flags."""

from __future__ import annotations

import pytest
from fleetloop.bench.latency import error_threshold, print_table, releases
from fleetloop.cli.main import main
from fleetloop.policies.registry import builtin_policy
from tests.support.policies import foundation

END = 31_000  # the first ejection's until_ms in the tables below (decided at 1,000, 30 s backoff)


@pytest.mark.parametrize(
    ("records", "flaps"),
    [
        ([], []),
        # Out every tick to its end, then a probe: no release.
        ([(1_000, "open", True, END), (2_000, "open", True, END), (END, "half_open", True, None)], []),
        # Detected (capped) before it is enforced: not a release of anything.
        ([(1_000, "open", False, END), (2_000, "open", False, END), (3_000, "open", True, END)], []),
        # The old engine: capacity-capped for a tick in the middle of the ejection, then out again.
        (
            [(1_000, "open", True, END), (12_000, "open", False, END), (13_000, "open", True, END)],
            [12_000],
        ),
        # Two ticks released count as one release; a second one later counts again.
        (
            [
                (1_000, "open", True, END),
                (12_000, "open", False, END),
                (13_000, "closed", True, None),
                (14_000, "open", True, END),
                (25_000, "open", False, END),
                (26_000, "open", True, END),
            ],
            [12_000, 25_000],
        ),
        # Released at its end (a probe, or back closed): no flap.
        ([(1_000, "open", True, END), (END, "closed", True, None)], []),
        # An ejection without an end: any release is before it.
        ([(1_000, "open", True, None), (2_000, "closed", True, None)], [2_000]),
        # A second ejection (after the probe failed) is judged against its own end.
        (
            [
                (1_000, "open", True, END),
                (END, "half_open", True, None),
                (32_000, "open", True, 92_000),
                (40_000, "open", False, 92_000),
            ],
            [40_000],
        ),
    ],
)
def test_releases_are_the_returns_to_rotation_before_the_end(
    records: list[tuple[int, str, bool, int | None]], flaps: list[int]
) -> None:
    assert releases(records) == flaps


def test_the_threshold_is_the_policys_failed_calls_in_a_row() -> None:
    assert error_threshold(builtin_policy("default")) == 5  # latency-outlier's error_threshold
    assert error_threshold(builtin_policy("classic")) == 5  # envoy-outlier's consecutive_5xx
    assert error_threshold(foundation()) == 5  # consecutive-errors' threshold


def test_the_table_has_a_row_per_trial_and_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    trial = {
        "node": "n-1", "failed_calls": 5, "latency_ms": 512.3, "after_boundary_ms": 61.0,
        "detected_before_open": ["consecutive-failures:capacity-cap"], "backoff_ms": 30_000, "flaps": 2,
        "load_average": 1.2,
    }  # fmt: skip
    missed = {**trial, "node": "n-2", "latency_ms": None, "detected_before_open": [], "flaps": 0}
    result = {
        "nodes": 1000, "pools": 24, "events_per_s": 2000, "broker": "tansu", "daemons": 1,
        "per_trial": [trial, missed], "error_threshold": 5, "p50_ms": 512.3, "p99_ms": 512.3,
        "max_ms": 512.3, "missed": 1, "trials": 2, "after_boundary_p50_ms": 61.0,
        "after_boundary_p99_ms": 61.0, "flaps": 2, "trials_with_flaps": 1, "trials_detected_first": 1,
        "target_ms": 1100.0, "met": False, "load_average_min": 1.2, "load_average_max": 1.2,
        "summaries_repeated": 0, "summaries": 10,
    }  # fmt: skip
    print_table(result)
    out = capsys.readouterr().out
    assert "capacity-cap" in out
    assert "missed" in out
    assert "flaps (releases of an enforced ejection before its end): 2 in 1 of 2 trials" in out
    assert "NOT met" in out


@pytest.mark.parametrize("rate", ["0", "100.5"])
def test_trials_need_background_calls(rate: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Without ok calls there is no common case to measure (and no router call to fail): one line."""
    assert main(["bench", "latency", "--outcomes-per-node", rate]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("fleetloop bench latency: --outcomes-per-node must be above 0 and at most 100")
    assert "\n" not in err
