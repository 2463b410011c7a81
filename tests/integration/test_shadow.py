"""Shadow mode on real brokers: ``policy apply`` of a ``spec.mode: shadow`` document runs it beside
the enforcing policy (decisions on control.shadow, never on control.state or control.decisions);
``policy status`` names it; it survives a kill -9; ``policy compare`` reports how it differs;
``policy remove-shadow`` stops it; and the enforced decision log stays exactly what the enforcing
policy alone decides (an uninterrupted replay and ``fleetloop replay`` agree byte for byte)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from fleetloop.core.shard import Shadow
from fleetloop.policies.registry import CompiledPolicy, compile_policy, load_policy
from fleetloop.schemas import Decision
from fleetloop.schemas.topics import DECISIONS, POLICY_ACTIVE, SHADOW, STATE
from tests.integration.test_policy_lifecycle import _cli
from tests.integration.test_restarts import (
    Proc,
    _assert_exact,
    _policy,
    _read,
    compare_with_an_uninterrupted_run,
    feeding,
)

pytestmark = pytest.mark.system  # a kill -9 restart across a shadow's life


def _shadow_doc(base: Path, tmp: Path, version: int) -> Path:
    text = (
        base.read_text()
        .replace("version: 1", f"version: {version}")
        .replace("mode: enforce", "mode: shadow")
        .replace("threshold: 5", "threshold: 2")
        .replace("alpha: 2.0", "alpha: 0.5")
        .replace("depth_p0: 64", "depth_p0: 8")
    )
    path = tmp / f"shadow-v{version}.yaml"
    path.write_text(text)
    return path


def _decisions(parts: dict[int, list[Any]]) -> list[Decision]:
    return [Decision.model_validate_json(r.value) for rs in parts.values() for r in rs if r.value]


async def test_a_shadow_runs_beside_survives_a_restart_is_compared_and_removed_leaving_enforced_exact(
    kafka_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v1_path, v1 = _policy(tmp_path)
    shadow_path = _shadow_doc(v1_path, tmp_path, 2)
    shadow = load_policy(shadow_path)
    log = tmp_path / "daemon.log"
    base = ["--bootstrap-servers", kafka_env.bootstrap_servers, "--topic-prefix", kafka_env.prefix]
    group = ["--group-id", kafka_env.group("restarts")]

    async with feeding(kafka_env):
        proc = Proc(kafka_env, v1_path, log)
        await proc.assigned()
        await asyncio.sleep(2)  # elapsed time: live ticks under the enforcing policy alone
        code, out, err = await _cli(capsys, "policy", "status", *base, *group)
        assert code == 0, (out, err)
        assert "shadow: none" in out, (out, err)

        code, out, err = await _cli(capsys, "policy", "apply", str(shadow_path), *base, *group)
        assert code == 0, err
        assert f"shadow foundation v2  hash {shadow.stamp.hash}" in out, out
        assert "active from tick" in out, out
        code, out, err = await _cli(capsys, "policy", "status", *base, *group)
        assert f"shadow: foundation v2  hash {shadow.stamp.hash}" in out, out
        assert "group" in out, out  # the enforcing policy is unchanged
        assert "foundation v1" in out, out  # the enforcing policy is unchanged
        # The same shadow again: not newer than the shadow in force, one line, exit 2.
        code, out, err = await _cli(capsys, "policy", "apply", str(shadow_path), *base, *group)
        assert code == 2, (out, err)
        assert "not newer than the shadow in force v2" in err, (out, err)
        assert len(err.strip().splitlines()) == 1, err
        await asyncio.sleep(3)  # elapsed time: shadow decisions before the kill

        # kill -9 and restart: the shadow is resumed from control.policy.active.
        assert await proc.kill9() == -signal.SIGKILL
        await asyncio.sleep(1)  # an outage: ticks are missed, then caught up
        proc = Proc(kafka_env, v1_path, log)
        await proc.assigned()
        await asyncio.sleep(4)  # elapsed time: shadow decisions after the restart
        assert b'"shadow policy resumed"' in log.read_bytes(), log.read_text()[-3000:]
        code, out, _ = await _cli(capsys, "policy", "status", *base, *group)
        assert f"shadow: foundation v2  hash {shadow.stamp.hash}" in out, out

        code, out, err = await _cli(capsys, "policy", "remove-shadow", *base, *group)
        assert code == 0, err
        assert "removed shadow foundation v2" in out, out
        code, out, _ = await _cli(capsys, "policy", "status", *base, *group)
        assert "shadow: none" in out, out
        code, out, err = await _cli(capsys, "policy", "remove-shadow", *base, *group)
        assert code == 2, (out, err)
        assert "runs no shadow policy" in err, (out, err)
        await asyncio.sleep(2)  # elapsed time: enforced ticks after the removal
    await asyncio.sleep(1.5)  # elapsed time: the fleet's last records reach their ticks before the stop
    assert await proc.stop() == 0, log.read_text()[-3000:]

    shadowed = _decisions(await _read(kafka_env, SHADOW))
    enforced = _decisions(await _read(kafka_env, DECISIONS))
    state = _decisions(await _read(kafka_env, STATE))
    assert len(shadowed) > 50, len(shadowed)
    assert {(d.policy.name, d.policy.version, d.policy.hash, d.policy.mode) for d in shadowed} == {
        ("foundation", 2, shadow.stamp.hash, "shadow")
    }
    # Routers never see it: neither the audit log nor the desired state holds a shadow decision.
    assert {d.policy.hash for d in enforced} == {v1.stamp.hash}
    assert {d.policy.hash for d in state} == {v1.stamp.hash}
    # Removed: no shadow decision at or after the tick the removal took effect from.
    active = json.loads([r for rs in (await _read(kafka_env, POLICY_ACTIVE)).values() for r in rs][-1].value)
    removed_from = active["shadow"][-1]["from_ts_ms"]
    assert active["shadow"][-1]["document"] is None
    assert max(d.ts_ms for d in shadowed) < removed_from
    assert max(d.ts_ms for d in enforced) >= removed_from  # the enforcing policy went on

    # The enforced log is exactly what the enforcing policy decides alone (no shadow in the replay).
    policies: list[tuple[int, CompiledPolicy]] = [
        (a["from_ts_ms"], compile_policy(v1.document.model_validate(a["document"])))
        for a in active["history"]
    ]
    _assert_exact(await compare_with_an_uninterrupted_run(kafka_env, policies))
    # The shadow log, across the kill -9, is exactly what uninterrupted shards decide under it.
    shadows: list[tuple[int, Shadow | None]] = [
        (
            a["from_ts_ms"],
            Shadow.of(compile_policy(v1.document.model_validate(a["document"]))) if a["document"] else None,
        )
        for a in active["shadow"]
    ]
    shadow_verdict = await compare_with_an_uninterrupted_run(kafka_env, policies, shadows)
    assert shadow_verdict.decisions == len({(d.key, d.tick_id) for d in shadowed})
    assert not shadow_verdict.different, shadow_verdict.different[:2]
    assert not shadow_verdict.missing, shadow_verdict.missing[:3]
    assert not shadow_verdict.extra, shadow_verdict.extra[:3]
    assert not shadow_verdict.conflicting
    code, out, err = await _cli(capsys, "replay", *base, "--json")
    report = json.loads(out)
    assert code == 0, (out, err)
    assert report["exact"] is True, (report, err)

    # policy compare: a table, and --json with every kind the two policies decided.
    code, out, err = await _cli(capsys, "policy", "compare", *base, "--json")
    assert code == 0, err
    cmp = json.loads(out)
    assert cmp["ticks_paired"] > 10, cmp
    assert cmp["shadow_policies"] == [{"name": "foundation", "version": 2, "hash": shadow.stamp.hash}]
    kinds = cmp["by_kind"]
    assert {"routing", "breaker", "admission", "autoscale"} <= set(kinds), kinds
    # alpha 0.5 vs 2.0 spreads the weights differently; depth_p0 8 vs 64 sheds far earlier.
    assert kinds["routing"]["differ"] > 0, kinds["routing"]
    assert 0 < kinds["routing"]["distance_max"] <= 1, kinds["routing"]
    assert kinds["admission"]["differ"] == kinds["admission"]["compared"], kinds["admission"]
    assert kinds["admission"]["distance_max"] >= 56, kinds["admission"]
    assert kinds["autoscale"]["differ"] == 0  # both fixed
    code, table, err = await _cli(capsys, "policy", "compare", *base)
    assert code == 0, err
    assert "TV distance" in table, table
    assert "admission" in table, table
    with capsys.disabled():
        print(f"\npolicy compare ({kafka_env.broker.kind}):\n{table}")
    code, out, err = await _cli(capsys, "policy", "compare", *base, "--window", "5..3")
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
