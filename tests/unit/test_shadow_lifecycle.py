"""The daemon's handling of shadow documents on control.policy, without a broker: what it takes,
refuses (with a dead letter) or ignores, how a tombstone removes the shadow, and what the
active-policy record says."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import yaml
from fleetloop.core.shard import Shadow
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.policies.registry import CompiledPolicy, compile_policy, parse_document
from tests.support.policies import FOUNDATION_YAML


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


def daemon() -> Daemon:
    return Daemon(DaemonConfig(bootstrap_servers="127.0.0.1:9", policy=doc(1)))


def activate_pending(d: Daemon) -> None:
    assert d._pending_shadow is not None
    asyncio.run(d._activate_shadow(d._pending_shadow[0], d._pending_offset))
    d._pending_shadow = None


def test_a_shadow_document_runs_beside_and_is_held_to_its_own_versions() -> None:
    d = daemon()
    s2 = doc(2, "shadow", threshold=3)
    assert d._consider_policy(rec(s2, 1), "foundation") is None
    assert d._pending_policy is None  # the enforcing policy is not replaced
    activate_pending(d)
    assert d.engine.policy.stamp.version == 1
    current = d._shadow_now()
    assert current is not None
    assert current.stamp.hash == s2.stamp.hash
    assert current.stamp.mode == "shadow"
    # The same shadow again: ignored; an older or equal version: refused with a dead letter.
    assert d._consider_policy(rec(s2, 2), "foundation") is None
    assert d._pending_shadow is None
    refused = d._consider_policy(rec(doc(2, "shadow", threshold=4), 3), "foundation")
    assert refused is not None
    assert "not newer than the shadow in force v2" in refused.reason
    jump = d._consider_policy(rec(doc(5000, "shadow"), 4), "foundation")
    assert jump is not None
    assert "policy-version-jump" in jump.reason
    assert d.stats.policies_refused == 2
    # Another name's shadow: another group's, ignored.
    assert d._consider_policy(rec(doc(9, "shadow", name="other"), 5), "foundation") is None
    assert d._pending_shadow is None
    # A newer one replaces it; the record names the whole timeline.
    assert d._consider_policy(rec(doc(3, "shadow", threshold=2), 6), "foundation") is None
    activate_pending(d)
    record = d.active_record()
    assert [sa.document.metadata.version for sa in record.shadow if sa.document] == [2, 3]
    assert record.version == 1
    assert record.considered_offset == 6


def test_a_tombstone_on_name_slash_shadow_removes_the_shadow_from_the_next_boundary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleetloop.daemon import runtime

    now = [1_700_000_000_500]
    monkeypatch.setattr(runtime.clock, "wall_ms", lambda: now[0])
    d = daemon()
    assert d._consider_policy(Rec(b"foundation/shadow", None, 1), "foundation") is None
    assert d._pending_shadow is None  # nothing to remove: not even a dead letter
    assert d._consider_policy(rec(doc(2, "shadow"), 2), "foundation") is None
    activate_pending(d)
    now[0] = 1_700_000_005_200
    assert d._consider_policy(Rec(b"other/shadow", None, 3), "foundation") is None  # another group's
    assert d._pending_shadow is None
    assert d._consider_policy(Rec(b"foundation", None, 3), "foundation") is not None  # empty: refused
    assert d._consider_policy(Rec(b"foundation/shadow", None, 4), "foundation") is None
    activate_pending(d)
    assert d._shadow_now() is None
    (t_on, on), (t_off, off) = d._shadows
    assert isinstance(on, Shadow)
    assert off is None
    assert (t_on, t_off) == (1_700_000_001_000, 1_700_000_006_000)  # the next tick boundaries
    assert d._shadow_at(t_on - 1) is None
    assert d._shadow_at(t_on) is on
    assert d._shadow_at(t_off - 1) is on
    assert d._shadow_at(t_off) is None
    assert d.active_record().shadow_document is None


def test_an_enforcing_document_leaves_the_shadow_alone() -> None:
    d = daemon()
    assert d._consider_policy(rec(doc(2, "shadow"), 1), "foundation") is None
    activate_pending(d)
    assert d._consider_policy(rec(doc(2), 2), "foundation") is None
    assert d._pending_policy is not None
    assert d._pending_policy.stamp.version == 2
    assert d._pending_shadow is None
    assert d._shadow_now() is not None
