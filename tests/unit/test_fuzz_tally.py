"""What ``fleetloop bench fuzz`` counts as refused: every record the daemon dead-letters, counted by
its reason kind wherever it is refused (the door, or the policy follower), and nothing else.

A daemon in virtual time on the in-memory broker is sent the bench's own forged policy (a version
jump): the follower refuses it, its dead letter is counted by reason like the door's, and the
bench's takeover tally counts it. The same jump for a policy no daemon of this group follows is
ignored (no dead letter): the tally reports it as not refused.
"""

from __future__ import annotations

import asyncio

import orjson
from fleetloop.bench.fuzz import forged_policies, takeover_tally
from fleetloop.daemon.runtime import Daemon
from fleetloop.policies.registry import builtin_policy
from fleetloop.schemas.topics import DEADLETTER, POLICY, topic_name
from tests.support.memory_broker import MemoryBroker
from tests.support.runtime_harness import daemon, running, topic
from tests.support.virtual_time import FakeClock, run_virtual

T0 = 1_800_000_000_000


def _after_a_policy_record(value: bytes, key: bytes) -> tuple[dict[str, int], int, int, list[str]]:
    """A daemon following ``default`` is sent one control.policy record: its dead letters by reason,
    in all, the policies it refused, and the reasons on the dead-letter topic."""

    async def main(clock: FakeClock) -> tuple[dict[str, int], int, int, list[str]]:
        broker = MemoryBroker(clock)
        d: Daemon = daemon(broker, clock)
        async with running(d):
            broker.append(topic_name(broker.prefix, POLICY), value, key)
            await asyncio.sleep(5.0)  # virtual: the follower polls every 0.5 s
        reasons = [dict(r.headers).get("fleetloop.error", b"").decode() for r in topic(broker, DEADLETTER)]
        return dict(d.stats.dead_by_reason), d.stats.dead_letters, d.stats.policies_refused, reasons

    return run_virtual(main, wall_ms=T0)


def test_a_forged_policy_version_refused_by_the_follower_is_counted_by_its_reason() -> None:
    (jump,) = [h for h in forged_policies(builtin_policy("default")) if h.category == "policy-version-jump"]
    by_reason, total, refused, published = _after_a_policy_record(jump.value, jump.key)
    assert refused == 1
    assert by_reason == {"policy-version-jump": 1}
    assert total == 1
    assert [r.split(":", 1)[0] for r in published] == ["policy-version-jump"]
    assert takeover_tally({"policy-version-jump": 1}, by_reason) == {
        "sent": 1,
        "refused": 1,
        "refused_by_reason": {"policy-version-jump": 1},
    }


def test_a_forged_policy_that_goes_nowhere_is_reported_as_not_refused() -> None:
    (jump,) = [h for h in forged_policies(builtin_policy("default")) if h.category == "policy-version-jump"]
    doc = orjson.loads(jump.value)
    doc["metadata"]["name"] = "another-groups-policy"  # ignored: no refusal, no dead letter
    by_reason, total, refused, published = _after_a_policy_record(orjson.dumps(doc), b"another-groups-policy")
    assert (by_reason, total, refused, published) == ({}, 0, 0, [])
    tally = takeover_tally({"ts-future": 2, "policy-version-jump": 1}, {"event-time-too-new": 2, **by_reason})
    assert (tally["sent"], tally["refused"]) == (3, 2)
    assert tally["refused_by_reason"] == {"event-time-too-new": 2, "policy-version-jump": 0}


def test_the_tally_never_counts_more_refusals_of_a_kind_than_attempts_it_answers() -> None:
    tally = takeover_tally({"ts-future": 2, "tick-future": 1}, {"event-time-too-new": 9})
    assert (tally["sent"], tally["refused"]) == (3, 3)
