"""The daemon's handling of shadow documents on control.policy, without a broker: what it takes,
refuses (with a dead letter) or ignores, how a tombstone removes the shadow, and what the
active-policy record says."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import yaml
from fleetloop.core.shard import Shadow
from fleetloop.daemon.runtime.follower import PolicyFollower
from fleetloop.policies.registry import CompiledPolicy, compile_policy, parse_document
from tests.support.policies import FOUNDATION_YAML
from tests.support.runtime_harness import rig
from tests.support.virtual_time import FakeClock, run_virtual, sleep_until


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    offset: int
    topic: str = "control.policy"
    partition: int = 0
    timestamp: int = 0


def doc(version: int, mode: str = "enforce", name: str = "foundation", threshold: int = 5) -> CompiledPolicy:
    data: dict[str, Any] = yaml.safe_load(FOUNDATION_YAML.read_text())
    data["metadata"].update(name=name, version=version)
    data["spec"]["mode"] = mode
    data["spec"]["breaker"]["params"]["threshold"] = threshold
    return compile_policy(parse_document(data))


def rec(p: CompiledPolicy, offset: int) -> Rec:
    key = f"{p.stamp.name}/shadow" if p.document.spec.mode == "shadow" else p.stamp.name
    return Rec(key.encode(), orjson.dumps(p.document.model_dump(mode="json")), offset)


Then = Callable[[PolicyFollower, FakeClock], Awaitable[None]]


def following(check: Then, wall_ms: int = 1_700_000_000_500) -> None:
    """Run ``check`` on a policy follower (enforcing ``foundation`` v1) in virtual time."""

    async def run(clock: FakeClock) -> None:
        async with rig(clock, policy=doc(1)) as r:
            await check(r.follower(), clock)

    run_virtual(run, wall_ms=wall_ms)


async def activate_pending(f: PolicyFollower) -> None:
    assert f.pending_shadow is not None
    await f.apply_pending()
    assert f.pending_shadow is None


def test_a_shadow_document_runs_beside_and_is_held_to_its_own_versions() -> None:
    async def check(f: PolicyFollower, clock: FakeClock) -> None:
        s2 = doc(2, "shadow", threshold=3)
        assert f.consider(rec(s2, 1), "foundation") is None
        assert f.pending_policy is None  # the enforcing policy is not replaced
        await activate_pending(f)
        assert f.engine.policy.stamp.version == 1
        current = f.shadow_now()
        assert current is not None
        assert current.stamp.hash == s2.stamp.hash
        assert current.stamp.mode == "shadow"
        # The same shadow again: ignored; an older or equal version: refused with a dead letter.
        assert f.consider(rec(s2, 2), "foundation") is None
        assert f.pending_shadow is None
        refused = f.consider(rec(doc(2, "shadow", threshold=4), 3), "foundation")
        assert refused is not None
        assert "not newer than the shadow in force v2" in refused.reason
        jump = f.consider(rec(doc(5000, "shadow"), 4), "foundation")
        assert jump is not None
        assert "policy-version-jump" in jump.reason
        assert f.stats.policies_refused == 2
        # Another name's shadow: another group's, ignored.
        assert f.consider(rec(doc(9, "shadow", name="other"), 5), "foundation") is None
        assert f.pending_shadow is None
        # A newer one replaces it; the record names the whole timeline.
        assert f.consider(rec(doc(3, "shadow", threshold=2), 6), "foundation") is None
        await activate_pending(f)
        record = f.active_record()
        assert [sa.document.metadata.version for sa in record.shadow if sa.document] == [2, 3]
        assert record.version == 1
        assert record.considered_offset == 6

    following(check)


def test_a_tombstone_on_name_slash_shadow_removes_the_shadow_from_the_next_boundary() -> None:
    async def check(f: PolicyFollower, clock: FakeClock) -> None:
        assert f.consider(Rec(b"foundation/shadow", None, 1), "foundation") is None
        assert f.pending_shadow is None  # nothing to remove: not even a dead letter
        assert f.consider(rec(doc(2, "shadow"), 2), "foundation") is None
        await activate_pending(f)
        await sleep_until(clock, 1_700_000_005_200)
        assert f.consider(Rec(b"other/shadow", None, 3), "foundation") is None  # another group's
        assert f.pending_shadow is None
        assert f.consider(Rec(b"foundation", None, 3), "foundation") is not None  # empty: refused
        assert f.consider(Rec(b"foundation/shadow", None, 4), "foundation") is None
        await activate_pending(f)
        assert f.shadow_now() is None
        (t_on, on), (t_off, off) = f.shadows
        assert isinstance(on, Shadow)
        assert off is None
        assert (t_on, t_off) == (1_700_000_001_000, 1_700_000_006_000)  # the next tick boundaries
        assert f.shadow_at(t_on - 1) is None
        assert f.shadow_at(t_on) is on
        assert f.shadow_at(t_off - 1) is on
        assert f.shadow_at(t_off) is None
        assert f.active_record().shadow_document is None

    following(check)


def test_an_enforcing_document_leaves_the_shadow_alone() -> None:
    async def check(f: PolicyFollower, clock: FakeClock) -> None:
        assert f.consider(rec(doc(2, "shadow"), 1), "foundation") is None
        await activate_pending(f)
        assert f.consider(rec(doc(2), 2), "foundation") is None
        assert f.pending_policy is not None
        assert f.pending_policy.stamp.version == 2
        assert f.pending_shadow is None
        assert f.shadow_now() is not None

    following(check)


def test_each_activation_is_on_control_policy_active_and_a_restart_resumes_it() -> None:
    """The follower publishes the group's record at every activation; a new follower of the
    group (a restart) loads it: the policy in force, the shadow beside it, where to read on."""

    async def run(clock: FakeClock) -> None:
        async with rig(clock, policy=doc(1)) as r:
            f = r.follower()
            await f.load_active()
            assert f.consider(rec(doc(2), 1), "foundation") is None
            assert f.consider(rec(doc(3, "shadow"), 2), "foundation") is None
            await f.apply_pending()
            again = r.follower()
            await again.load_active()
            assert again.engine.policy.stamp.version == 2
            shadow = again.shadow_now()
            assert shadow is not None
            assert shadow.stamp.version == 3
            assert again.considered == 2
            assert again.active_record() == f.active_record()

    run_virtual(run, wall_ms=1_700_000_000_500)
