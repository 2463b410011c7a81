"""Replay without a broker: a what-if compares what was decided, not which policy stamp said so."""

from __future__ import annotations

from typing import Any

from fleetloop.core.shard import INPUTS, Shard
from fleetloop.daemon.replay.replay import RecordedTick, replay_ticks
from fleetloop.policies.registry import CompiledPolicy, builtin_policy, compile_policy, parse_document
from tests.unit.test_shard_checkpoint import cut_at, stream


def _record(policy: CompiledPolicy, seconds: int = 40) -> tuple[list[RecordedTick], dict[str, list[Any]]]:
    """Run one shard live over a generated stream and keep its decision log, as the daemon would."""
    rows, ticks = stream(seconds=seconds)
    shard = Shard(0)
    recorded: list[RecordedTick] = []
    for tick, ts in ticks:
        cut = cut_at(rows, ts)
        for logical in INPUTS:
            shard.add(logical, rows[logical][shard.read[logical] : cut[logical]])
        decided = shard.decide(tick, cut, policy) or ()
        offsets = {f"{logical}:0": upto for logical, upto in cut.items()}
        recorded.append(RecordedTick(tick, offsets, policy.stamp.hash, tuple(decided)))
    inputs = {f"{logical}:0": [(r.offset, r.item) for r in rows[logical]] for logical in INPUTS}
    return recorded, inputs


def _bumped(policy: CompiledPolicy) -> CompiledPolicy:
    """The same document under a new version: only the stamp differs."""
    data = policy.document.model_dump(mode="json")
    data["metadata"]["version"] = policy.stamp.version + 1
    return compile_policy(parse_document(data, "bumped"))


def test_a_version_bump_changes_nothing_in_a_what_if() -> None:
    policy = builtin_policy("default")
    recorded, inputs = _record(policy)
    bumped = _bumped(policy)
    assert bumped.stamp.hash != policy.stamp.hash

    what_if = replay_ticks(recorded, inputs, bumped, compare_stamps=False)
    assert what_if.decisions_compared > 100
    assert what_if.exact, what_if.first_difference

    # With stamps compared (an exact replay's rule), every decision reads as changed: the
    # comparison above is what makes the what-if say something.
    stamped = replay_ticks(recorded, inputs, bumped, compare_stamps=True)
    assert stamped.different == stamped.decisions_compared > 100


def test_an_exact_replay_of_the_recorded_policy_is_byte_identical() -> None:
    policy = builtin_policy("default")
    recorded, inputs = _record(policy)
    report = replay_ticks(recorded, inputs, {policy.stamp.hash: policy})
    assert report.exact
    assert report.identical == report.decisions_compared > 100


def test_a_what_if_with_other_parameters_still_shows_changes() -> None:
    policy = builtin_policy("default")
    recorded, inputs = _record(policy)
    other = builtin_policy("classic")
    report = replay_ticks(recorded, inputs, other, compare_stamps=False)
    assert report.different + report.missing + report.extra > 0
