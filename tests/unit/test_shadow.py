"""Shadow mode in the shard: a shadow policy decides the same ticks from the same records with its
own state, and the enforced decisions are the same bytes with or without it."""

from __future__ import annotations

from fleetloop.core.checkpoint import decode, encode
from fleetloop.core.shard import INPUTS, Row, Shadow, Shard
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.daemon.replay.compare import Comparison, compare
from fleetloop.daemon.replay.replay import unstamped_bytes
from fleetloop.policies.registry import CompiledPolicy, builtin_policy, compile_policy
from fleetloop.schemas import Tick
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.policy import PolicyDocument
from tests.unit.test_shard_checkpoint import cut_at, stream


def shadow_of(name: str, version: int = 7) -> Shadow:
    """Built-in policy ``name`` as a shadow document of the enforcing policy's name."""
    data = builtin_policy(name).document.model_dump(mode="json")
    data["metadata"].update(name="default", version=version)
    data["spec"]["mode"] = "shadow"
    return Shadow.of(compile_policy(PolicyDocument.model_validate(data)))


def run(
    rows: dict[str, list[Row]],
    ticks: list[tuple[Tick, int]],
    policy: CompiledPolicy,
    shadow: Shadow | None = None,
    *,
    restore_at: int | None = None,
    shadow_until: int | None = None,
    shadow_from: int = 0,
    then: tuple[int, Shadow] | None = None,
) -> tuple[list[bytes], list[bytes]]:
    shard = Shard(0)
    enforced: list[bytes] = []
    shadowed: list[bytes] = []
    for k, (tick, ts) in enumerate(ticks):
        cut = cut_at(rows, ts)
        if restore_at is not None and k == restore_at:
            shard = Shard.from_checkpoint(decode(encode(shard.checkpoint_value())))
        for logical in INPUTS:
            shard.add(logical, rows[logical][shard.read[logical] : cut[logical]])
        decided = shard.decide(tick, cut, policy)
        assert decided is not None
        enforced.extend(decision_bytes(d) for d in decided)
        active = shadow if (shadow_until is None or k < shadow_until) and k >= shadow_from else None
        if then is not None and k >= then[0]:
            active = then[1]
        shadowed.extend(decision_bytes(d) for d in shard.decide_shadow(tick, active))
    return enforced, shadowed


def test_enforced_decisions_are_byte_identical_with_and_without_a_shadow() -> None:
    rows, ticks = stream()
    policy = builtin_policy("default")
    alone, none = run(rows, ticks, policy)
    beside, shadowed = run(rows, ticks, policy, shadow_of("classic"))
    assert none == []
    assert len(alone) > 300  # breaker records are change-only
    assert beside == alone
    # The shadow really decided something else from the same ticks (else the test proves nothing).
    assert len(shadowed) > 300  # breaker records are change-only
    assert set(shadowed) != set(alone)


def test_a_shadow_decides_what_it_would_decide_in_charge_stamped_as_shadow() -> None:
    rows, ticks = stream()
    shadow = shadow_of("default", version=9)
    _, shadowed = run(rows, ticks, builtin_policy("default"), shadow)
    in_charge, _ = run(rows, ticks, shadow.runner)
    parsed = [Decision.model_validate_json(b) for b in shadowed]
    assert {(d.policy.name, d.policy.version, d.policy.hash, d.policy.mode) for d in parsed} == {
        ("default", 9, shadow.policy.stamp.hash, "shadow")
    }
    assert [unstamped_bytes(d) for d in parsed] == [
        unstamped_bytes(Decision.model_validate_json(b)) for b in in_charge
    ]
    # In charge, a breaker it trips is enforced (a shadow document compiled as it is only detects).
    assert any(d.body.kind == "breaker" and d.body.state == "open" and d.body.enforced for d in parsed)


def test_shadow_state_survives_a_checkpoint_and_is_forgotten_when_the_shadow_is_removed() -> None:
    rows, ticks = stream()
    policy, shadow = builtin_policy("default"), shadow_of("classic")
    enforced, continuous = run(rows, ticks, policy, shadow)
    for k in (10, 30, 45):
        again, restored = run(rows, ticks, policy, shadow, restore_at=k)
        assert (again, restored) == (enforced, continuous)
    # Removed at tick 40: no shadow decisions after it, and its state is gone from the checkpoint.
    _, cut_short = run(rows, ticks, policy, shadow, shadow_until=40)
    assert 0 < len(cut_short) < len(continuous)
    shard = Shard(0)
    tick, ts = ticks[0]
    cut = cut_at(rows, ts)
    for logical in INPUTS:
        shard.add(logical, rows[logical][: cut[logical]])
    shard.decide(tick, cut, policy)
    assert shard.decide_shadow(tick, shadow)
    assert shard.checkpoint_value()["shadow_states"]
    shard.decide_shadow(tick, None)
    assert shard.checkpoint_value()["shadow_states"] == {}


def _autoscale_only(version: int, headroom: float = 0.6) -> Shadow:
    """The default policy with another autoscale headroom, as a shadow: its breaker is the enforced one."""
    data = builtin_policy("default").document.model_dump(mode="json")
    data["metadata"]["version"] = version
    data["spec"]["autoscale"]["params"]["headroom"] = headroom
    data["spec"]["mode"] = "shadow"
    return Shadow.of(compile_policy(PolicyDocument.model_validate(data)))


def _compared(enforced: list[bytes], shadowed: list[bytes]) -> Comparison:
    return compare(
        [Decision.model_validate_json(b) for b in enforced],
        [Decision.model_validate_json(b) for b in shadowed],
    )


def test_a_shadow_applied_while_a_breaker_is_open_starts_from_the_enforced_state() -> None:
    """p/5 fails from second 20 and its breaker opens; a shadow that changes only autoscale
    parameters, applied at second 30, holds it open too: its breakers do not differ at all (a shadow
    started empty closed it on every tick, and the compare blamed the candidate)."""
    rows, ticks = stream()
    policy = builtin_policy("default")
    enforced, shadowed = run(rows, ticks, policy, _autoscale_only(9), shadow_from=30)
    parsed = [Decision.model_validate_json(b) for b in enforced]
    assert any(
        d.body.kind == "breaker" and d.body.state == "open" and d.tick_id == ticks[30][0].tick_id
        for d in parsed
    ), "no breaker is open when the shadow starts: the test proves nothing"
    result = _compared(enforced, shadowed)
    assert result.ticks_paired == len(ticks) - 30
    assert result.by_kind["breaker"].compared > 0
    assert result.by_kind["breaker"].differ == 0, result.by_kind["breaker"].details
    assert result.by_kind["autoscale"].compared > 0


def test_a_new_shadow_document_starts_again_from_the_enforced_state() -> None:
    """Classic's breaker as a first shadow (another algorithm), then at second 30 a shadow of the
    enforced breaker: the second starts from the enforced state, not from the first shadow's."""
    rows, ticks = stream()
    policy = builtin_policy("default")
    second = _autoscale_only(9)
    enforced, shadowed = run(rows, ticks, policy, shadow_of("classic", version=8), then=(30, second))
    later = [b for b in shadowed if Decision.model_validate_json(b).policy.version == 9]
    result = _compared(enforced, later)
    assert result.ticks_paired == len(ticks) - 30
    assert result.by_kind["breaker"].differ == 0, result.by_kind["breaker"].details
    # Restored from a checkpoint at any tick, the same shadow decisions.
    for k in (29, 30, 31, 45):
        assert run(rows, ticks, policy, shadow_of("classic", version=8), then=(30, second), restore_at=k) == (
            enforced,
            shadowed,
        )
