"""``fleetloop bench sizing``'s verdict over the ticks and decisions it read (pure part)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from fleetloop.bench.loadgen import overload_skipped, rebalances_beyond_start, stability
from fleetloop.bench.sizing import SKIPPED_HEADER, judge
from fleetloop.daemon.runtime.telemetry import DaemonStats


@dataclass
class _Rec:
    value: bytes
    timestamp: int = 0
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def _tick(pool: str, s: int, skipped: bool = False) -> _Rec:
    value = orjson.dumps({"ts_ms": s * 1000, "tick_id": s, "pool_id": pool})
    return _Rec(value, s * 1000, [(SKIPPED_HEADER, b"outage")] if skipped else [])


def _decision(pool: str, s: int, at_ms: int, kind: str = "routing") -> _Rec:
    body: dict[str, Any] = {"kind": kind, "pool_id": pool}
    return _Rec(orjson.dumps({"ts_ms": s * 1000, "tick_id": s, "body": body}), at_ms)


def test_counts_ticks_of_the_window_and_the_first_routing_decision_of_each() -> None:
    pools = {"a", "b"}
    ticks = [_tick(p, s) for p in sorted(pools) for s in range(9, 14)]  # 9 and 13 are outside [10, 13)
    decisions = [
        _decision("a", 10, 10_200),
        _decision("a", 10, 10_100),  # the first one published counts
        _decision("a", 11, 11_300),
        _decision("a", 12, 12_900),
        _decision("b", 10, 10_400),
        _decision("b", 11, 11_050, kind="breaker"),  # not a routing decision: b's tick 11 is undecided
        _decision("b", 12, 12_500),
        _decision("b", 9, 9_100),  # outside the window
    ]
    v = judge(ticks, decisions, pools, t0_ms=10_000, t1_ms=13_000, tick_ms=1000)
    assert v["boundaries"] == 3
    assert v["ticks_expected"] == 6
    assert v["ticks_published"] == 6
    assert v["ticks_decided"] == 5
    assert v["tick_ids_are_boundaries"]
    assert v["lag_p50_ms"] == 400.0  # lags 100, 300, 900, 400, 500
    assert v["lag_max_ms"] == 900.0


def test_skipped_and_missing_ticks_are_not_decided() -> None:
    ticks = [_tick("a", 10), _tick("a", 11, skipped=True)]  # tick 12 never published
    decisions = [_decision("a", 10, 10_100), _decision("a", 11, 11_100)]
    v = judge(ticks, decisions, {"a"}, t0_ms=10_000, t1_ms=13_000, tick_ms=1000)
    assert (v["ticks_expected"], v["ticks_published"], v["ticks_skipped"], v["ticks_decided"]) == (3, 1, 1, 1)


def test_the_stability_figures_come_from_the_daemons_stop_line(tmp_path: Path) -> None:
    stats = DaemonStats(
        loop_stall_max_ms=42.4,
        gc_pause_max_ms=7.0,
        loop_stall_own_max_ms=12.0,
        assignments=3,
        ticks_overload=2,
    )
    log = tmp_path / "daemon.log"
    lines = [
        {"event": "daemon started", "assignments": 9},
        {"event": "loop", "stall_max_s": 0.04},
        {"event": "daemon stopped", **stats.summary()},
    ]
    log.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    assert stability(str(log)) == {
        "loop_stall_max_ms": 42,
        "gc_pause_max_ms": 7,
        "loop_stall_own_max_ms": 12,
        "gc_pause_own_max_ms": 0,
        "assignments": 3,
    }
    assert overload_skipped(str(log)) == 2
    assert set(stability(str(tmp_path / "none.log")).values()) == {None}


def test_rebalances_are_the_assignments_beyond_what_the_daemons_start_up_explains() -> None:
    assert rebalances_beyond_start([1]) == 0
    assert rebalances_beyond_start([2, 1]) == 0  # the second to join hands the first one more
    assert rebalances_beyond_start([1, 2]) == 0  # ... whichever joined first
    assert rebalances_beyond_start([2, 2]) == 1  # one more round with both running
    assert rebalances_beyond_start([3, 2, 1]) == 0
    assert rebalances_beyond_start([5, 4, 3]) == 6
    assert rebalances_beyond_start([1, None]) is None


def test_the_longest_stalls_with_what_ran_come_from_the_stop_lines_console_and_json(tmp_path: Path) -> None:
    """The daemon's longest stalls of its own time and what ran in each reach the bench's report:
    read from the "daemon stopped" line whether the log is console or JSON, the daemons' longest
    first, each with its daemon's index."""
    from fleetloop.bench.loadgen import stopped_stalls
    from fleetloop.bench.sizing import top_stalls
    from fleetloop.daemon.runtime.telemetry import Stall

    first, second = DaemonStats(), DaemonStats()
    fold = "core.model.fold._fold_outcome<daemon.runtime.decider._decide_batch"
    first.note_stall(Stall(120.0, 300.0, fold))
    first.note_stall(Stall(60.0, 61.0, "gc30"))
    second.note_stall(Stall(90.0, 95.0, "daemon.observe.decode.decode_rows<daemon.runtime.intake.read"))
    console = tmp_path / "d0.log"
    console.write_text(
        "2026-12-06T14:31:26Z [info     ] daemon stopped                 [fleetloop.daemon] "
        f"assignments=1 loop_stall_max_ms=300 stalls={first.stalls_shown()} ticks_decided=9\n"
    )
    as_json = tmp_path / "d1.log"
    as_json.write_bytes(
        orjson.dumps({"event": "daemon stopped", **second.summary(), "stalls": second.stalls_shown()}) + b"\n"
    )
    quiet = tmp_path / "d2.log"
    none = DaemonStats().stalls_shown()
    quiet.write_bytes(orjson.dumps({"event": "daemon stopped", "stalls": none}) + b"\n")
    got = [stopped_stalls(str(p)) for p in (console, as_json, quiet)]
    assert got[0] == [
        "120/300ms@core.model.fold._fold_outcome<daemon.runtime.decider._decide_batch",
        "60/61ms@gc30",
    ]
    assert got[2] == []
    assert top_stalls(got) == [
        "d0:120/300ms@core.model.fold._fold_outcome<daemon.runtime.decider._decide_batch",
        "d1:90/95ms@daemon.observe.decode.decode_rows<daemon.runtime.intake.read",
        "d0:60/61ms@gc30",
    ]
    assert top_stalls([got[0]], n=1) == [got[0][0]]  # one daemon: no index
    assert stopped_stalls(str(tmp_path / "none.log")) == []
