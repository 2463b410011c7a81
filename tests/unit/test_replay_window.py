"""Replay windows without a broker: ends by time, by input offsets, by a group's committed offsets
and by the decision log's offsets; bad forms are one line; progress lines only on long runs."""

from __future__ import annotations

import pytest
from fleetloop.cli.main import main
from fleetloop.daemon.replay import command
from fleetloop.daemon.replay.command import End, Progress, parse_end, window_of
from fleetloop.daemon.replay.replay import RecordedTick, Window, replay_ticks
from fleetloop.policies.registry import builtin_policy
from tests.unit.test_replay_compare import _record


def test_ends_read_times_offsets_and_groups() -> None:
    assert parse_end(None, "from", "").time_ms is None
    assert parse_end(["1700000000000"], "to", "").time_ms == 1_700_000_000_000
    assert parse_end(["2026-01-01T00:00:00Z"], "to", "").time_ms == 1_767_225_600_000
    end = parse_end(["fleet.requests:1:40", "stg.fleet.telemetry:0:7", "group:fleetloop"], "from", "stg")
    assert end.offsets == {"fleet.requests:1": 40, "fleet.telemetry:0": 7}
    assert end.groups == ["fleetloop"]
    assert parse_end("fleet.requests:0:3,fleet.requests:1:4", "from", "").offsets == {
        "fleet.requests:0": 3,
        "fleet.requests:1": 4,
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--from", "fleet.requests:0:9", "--to", "fleet.requests:0:3"],
            "from offset 9 is after to offset 3",
        ),
        (["--from", "control.ticks:0:9"], "offsets name fleet.telemetry, fleet.requests, control.decisions"),
        (["--from", "fleet.requests:-1:9"], "partition and offset must be >= 0"),
        (["--from", "yesterday"], "not a time, TOPIC:PARTITION:OFFSET or group:NAME"),
        (["--to", "group:"], "group:NAME needs a group name"),
        (["--from", "5", "--from", "fleet.requests:0:1"], "give one time, or offsets and groups, not both"),
        (["--from", "fleet.requests:0:1", "--from", "fleet.requests:0:2"], "names fleet.requests:0 twice"),
        (["--from", "9", "--to", "3"], "an empty window (from is after to)"),
        (["--event-time-window", "ten"], "--event-time-window wants PAST_S,FUTURE_S"),
    ],
)
def test_a_bad_window_is_one_line_and_exit_2_before_any_broker_is_asked(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--bootstrap-servers", "127.0.0.1:9", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert message in err, err


def _compared(ticks: list[RecordedTick], window: Window) -> list[int]:
    return [rt.tick.tick_id for rt in ticks if not window.before(rt) and not window.after(rt)]


def test_offset_ends_pick_the_ticks_that_folded_those_records() -> None:
    ticks, inputs = _record(builtin_policy("default"))
    cuts = [rt.input_offsets["fleet.requests:0"] for rt in ticks]
    # From record R: the first tick compared is the first whose cut passed R.
    r = cuts[10]  # tick 10 folded records < cuts[10]; record cuts[10] arrives in tick 11
    start = End("x", offsets={"fleet.requests:0": r})
    stop = End("y", offsets={"fleet.requests:0": cuts[20] - 1})  # the last record tick 20 folded
    window = window_of(start, stop, {})
    kept = _compared(ticks, window)
    assert kept == [rt.tick.tick_id for rt in ticks[11:21]]
    report = replay_ticks(ticks, inputs, {ticks[0].policy_hash: builtin_policy("default")}, window=window)
    assert report.exact
    assert report.ticks_compared == 10
    assert report.ticks_replayed == 21  # the ticks before the window rebuilt the state


def test_a_group_end_stops_at_what_the_group_committed() -> None:
    ticks, _ = _record(builtin_policy("default"))
    committed = {"g": {"fleet.requests:0": ticks[5].input_offsets["fleet.requests:0"]}}
    window = window_of(End("x"), End("group:g", groups=["g"]), committed)
    assert _compared(ticks, window)[-1] == ticks[5].tick.tick_id
    window = window_of(End("group:g", groups=["g"]), End("y"), committed)
    assert _compared(ticks, window)[0] == ticks[6].tick.tick_id


def test_decision_log_offsets_bound_the_window() -> None:
    ticks, _ = _record(builtin_policy("default"))
    logged = [
        RecordedTick(rt.tick, rt.input_offsets, rt.policy_hash, rt.decisions, log_offset=10 * i)
        for i, rt in enumerate(ticks)
    ]
    start = End("a", offsets={"control.decisions:0": 30})
    stop = End("b", offsets={"control.decisions:0": 59})
    assert _compared(logged, window_of(start, stop, {})) == [rt.tick.tick_id for rt in ticks[3:6]]


def test_progress_prints_only_after_its_interval_and_never_with_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    now = [100.0]
    monkeypatch.setattr(command.clock, "monotonic_s", lambda: now[0])
    quiet = Progress(enabled=False, every_s=2.0)
    shown = Progress(enabled=True, every_s=2.0)
    for step in range(10):
        now[0] = 100.0 + step
        quiet.ticks(step * 100, 1000)
        shown.ticks(step * 100, 1000)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "fleetloop replay: 200 of 1,000 ticks replayed (20%) (2 s)",
        "fleetloop replay: 400 of 1,000 ticks replayed (40%) (4 s)",
        "fleetloop replay: 600 of 1,000 ticks replayed (60%) (6 s)",
        "fleetloop replay: 800 of 1,000 ticks replayed (80%) (8 s)",
    ]


def test_a_hostile_policy_record_does_not_end_a_replay() -> None:
    """control.policy takes any bytes a producer sends (the daemon refuses a bad document and keeps
    its policy): replay reads the same records to know every policy a decision may be stamped with,
    and a record nested past the decoder's depth is skipped like any other bad one, not a
    RecursionError that ends the replay."""
    from types import SimpleNamespace

    from fleetloop.daemon.replay.command import _known_policies
    from fleetloop.policies.registry import builtin_policy

    deep = SimpleNamespace(value=b"[" * 100_000 + b"]" * 100_000)
    garbage = SimpleNamespace(value=b"\xff not json")
    known = _known_policies([deep, garbage])
    assert builtin_policy("default").stamp.hash in known
    assert len(known) == 3  # default, none, classic
