"""Replay judges each stretch of the window by the policy it was recorded under, not by the log's
first tick: with ``--policy FILE``, where the file is the recorded document the stretch is exact
(byte for byte, from the recorded run's state), elsewhere a what-if."""

from __future__ import annotations

from typing import Any

import pytest
from fleetloop.core.shard import INPUTS, Shard
from fleetloop.daemon.replay.replay import (
    RecordedTick,
    ReplayReport,
    UnknownPolicy,
    Window,
    replay_ticks,
    replay_window,
    reproduced,
)
from fleetloop.policies.registry import CompiledPolicy, builtin_policy, compile_policy, parse_document
from tests.unit.test_shard_checkpoint import cut_at, stream

SECONDS = 60
SWITCH = 30  # ticks from this index on are decided under the second policy


def _version(policy: CompiledPolicy, version: int, **breaker: Any) -> CompiledPolicy:
    data = policy.document.model_dump(mode="json")
    data["metadata"]["version"] = version
    data["spec"]["breaker"]["params"].update(breaker)
    return compile_policy(parse_document(data, f"v{version}"))


def _record(first: CompiledPolicy, then: CompiledPolicy) -> tuple[list[RecordedTick], dict[str, Any]]:
    """A shard run live over a generated incident, switching policy at tick ``SWITCH``."""
    rows, ticks = stream(seconds=SECONDS)
    shard = Shard(0)
    recorded: list[RecordedTick] = []
    for k, (tick, ts) in enumerate(ticks):
        cut = cut_at(rows, ts)
        for logical in INPUTS:
            shard.add(logical, rows[logical][shard.read[logical] : cut[logical]])
        policy = first if k < SWITCH else then
        decided = shard.decide(tick, cut, policy) or ()
        offsets = {f"{logical}:0": upto for logical, upto in cut.items()}
        recorded.append(RecordedTick(tick, offsets, policy.stamp.hash, tuple(decided)))
    inputs = {f"{logical}:0": [(r.offset, r.item) for r in rows[logical]] for logical in INPUTS}
    return recorded, inputs


def _by_version(report: ReplayReport) -> dict[int, Any]:
    return {s.version: s for s in report.stretches.values()}


@pytest.fixture(scope="module")
def rollback() -> tuple[CompiledPolicy, CompiledPolicy, list[RecordedTick], dict[str, Any]]:
    """v3, then v5 with v3's content (what ``policy rollback`` publishes): only the stamp differs."""
    v3 = _version(builtin_policy("default"), 3)
    v5 = _version(v3, 5)
    assert v5.stamp.hash != v3.stamp.hash
    ticks, inputs = _record(v3, v5)
    return v3, v5, ticks, inputs


def test_a_window_recorded_under_the_file_is_exact_even_when_the_log_began_under_another(
    rollback: Any,
) -> None:
    v3, v5, ticks, inputs = rollback
    later = Window(from_ms=ticks[SWITCH].tick.ts_ms)
    report, mode = replay_window(ticks, inputs, {v3.stamp.hash: v3}, later, policy=v5)
    assert mode == "exact"
    assert reproduced(report) is True
    assert report.identical == report.decisions_compared > 100
    [stretch] = report.stretches.values()
    assert (stretch.version, stretch.mode, stretch.verdict) == (5, "exact", "byte-identical")
    assert (stretch.first_tick, stretch.last_tick) == (ticks[SWITCH].tick.tick_id, ticks[-1].tick.tick_id)


def test_a_window_recorded_under_another_version_is_a_what_if_not_a_false_divergence(
    rollback: Any,
) -> None:
    """The user's case: the file is v3, the window ran v5 (the same content). Not 'exact:
    DIFFERENT' on every decision: a what-if in which nothing would change."""
    v3, _, ticks, inputs = rollback
    later = Window(from_ms=ticks[SWITCH].tick.ts_ms)
    report, mode = replay_window(ticks, inputs, {}, later, policy=v3)
    assert mode == "what-if"
    assert reproduced(report) is None
    [stretch] = report.stretches.values()
    assert (stretch.version, stretch.mode) == (5, "what-if")
    assert stretch.verdict == "0 decisions would change"
    assert stretch.decisions_compared > 100


def test_a_window_across_the_change_is_judged_per_stretch(rollback: Any) -> None:
    v3, v5, ticks, inputs = rollback
    report, mode = replay_window(ticks, inputs, {}, Window(), policy=v3)
    assert mode == "mixed"
    assert reproduced(report) is True
    stretches = _by_version(report)
    assert stretches[3].mode == "exact"
    assert stretches[3].verdict == "byte-identical"
    assert (stretches[3].first_tick, stretches[3].last_tick) == (
        ticks[0].tick.tick_id,
        ticks[SWITCH - 1].tick.tick_id,
    )
    assert stretches[5].mode == "what-if"
    assert stretches[5].verdict == "0 decisions would change"
    assert report.ticks_compared == SECONDS
    # Without a file: both stretches exact, each named with its own policy.
    plain, mode = replay_window(ticks, inputs, {v3.stamp.hash: v3, v5.stamp.hash: v5}, Window())
    assert mode == "exact"
    assert [(s.version, s.mode, s.verdict) for s in plain.stretches.values()] == [
        (3, "exact", "byte-identical"),
        (5, "exact", "byte-identical"),
    ]


def _renamed(policy: CompiledPolicy, version: int) -> CompiledPolicy:
    data = policy.document.model_dump(mode="json")
    data["metadata"].update(name="default", version=version)
    return compile_policy(parse_document(data, f"v{version}"))


def test_an_exact_stretch_after_a_what_if_one_is_replayed_from_the_recorded_state() -> None:
    """v1 is classic's content (Envoy's breaker, HPA), v2 the default's. Replayed with v2's file,
    the v1 stretch is a what-if (its decisions change) and the v2 stretch is still byte-identical:
    the exact pass decided the v1 ticks with v1, as recorded, so v2's stretch starts from the state
    it had. Deciding every tick with the file instead would have differed there."""
    v1 = _renamed(builtin_policy("classic"), 1)
    v2 = _renamed(builtin_policy("default"), 2)
    ticks, inputs = _record(v1, v2)
    report, mode = replay_window(ticks, inputs, {v1.stamp.hash: v1}, Window(), policy=v2)
    assert mode == "mixed"
    stretches = _by_version(report)
    assert stretches[1].mode == "what-if"
    assert stretches[1].changed > 0
    assert (stretches[2].mode, stretches[2].verdict) == ("exact", "byte-identical")
    assert reproduced(report) is True
    naive = replay_ticks(ticks, inputs, v2, judged=lambda rt: rt.policy_hash == v2.stamp.hash)
    assert not naive.exact, "one pass with the file reproduces v2's stretch: the test tells nothing"
    # The exact stretch needs the earlier stretch's policy to rebuild the state: without it, say so.
    with pytest.raises(UnknownPolicy) as raised:
        replay_window(ticks, inputs, {}, Window(), policy=v2)
    assert raised.value.policy_hash == v1.stamp.hash


def test_a_tampered_record_in_an_exact_stretch_is_still_a_difference(rollback: Any) -> None:
    v3, v5, ticks, inputs = rollback
    bad = list(ticks)
    rt = bad[SWITCH + 3]
    first = rt.decisions[0]
    changed = first.model_copy(update={"ts_ms": first.ts_ms + 1})
    bad[SWITCH + 3] = RecordedTick(rt.tick, rt.input_offsets, rt.policy_hash, (changed, *rt.decisions[1:]))
    report, mode = replay_window(bad, inputs, {v3.stamp.hash: v3}, Window(), policy=v5)
    assert mode == "mixed"
    assert reproduced(report) is False
    stretches = _by_version(report)
    assert stretches[5].verdict == "DIFFERENT"
    assert stretches[3].mode == "what-if"
