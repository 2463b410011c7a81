"""Policy lifecycle on real brokers: ``policy apply`` refuses what the daemon would not run, waits for
the activation and says from which tick; the daemon refuses a raw older document once (not again at a
restart), a restart resumes the activated policy (not the last document written for the name),
``rollback`` republishes old content as a new version; and a replay of the whole window, across the
policy changes and a kill -9, is byte-identical."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from fleetloop.cli.main import main
from fleetloop.policies.registry import CompiledPolicy, compile_policy, load_policy
from fleetloop.schemas.topics import DEADLETTER, POLICY, POLICY_ACTIVE
from tests.integration.test_restarts import (
    Proc,
    _assert_exact,
    _policy,
    _read,
    compare_with_an_uninterrupted_run,
    feeding,
)
from tests.support.wait import wait_until

pytestmark = pytest.mark.system  # policy changes across a kill -9 restart


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = int(await asyncio.to_thread(main, list(argv)))
    out, err = capsys.readouterr()
    return code, out, err


def _json_lines(log: Path) -> list[dict[str, Any]]:
    out = []
    for raw in log.read_bytes().splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            out.append(line)
    return out


def _variant(base: Path, tmp: Path, name: str, *, version: int, threshold: int = 5, doc: str = "") -> Path:
    text = base.read_text().replace("version: 1", f"version: {version}")
    text = text.replace("threshold: 5", f"threshold: {threshold}")
    if doc:
        text = doc
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return path


async def test_apply_refusals_restart_rollback_and_an_exact_replay_across_them(
    kafka_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v1_path, v1 = _policy(tmp_path)
    v2_path = _variant(v1_path, tmp_path, "v2", version=2, threshold=3)
    other = (
        _variant(v1_path, tmp_path, "other", version=9).read_text().replace("name: foundation", "name: other")
    )
    other_path = tmp_path / "other.yaml"
    other_path.write_text(other)
    bad_path = tmp_path / "bad.yaml"
    bad_path.write_text(
        v2_path.read_text().replace("version: 2", "version: 3").replace("threshold: 3", "threshold: -1")
    )
    log = tmp_path / "daemon.log"
    base = ["--bootstrap-servers", kafka_env.bootstrap_servers, "--topic-prefix", kafka_env.prefix]
    group = ["--group-id", kafka_env.group("restarts")]

    async with feeding(kafka_env):
        proc = Proc(kafka_env, v1_path, log)
        await proc.assigned()
        await asyncio.sleep(2)  # elapsed time: live ticks under v1

        code, out, err = await _cli(capsys, "policy", "apply", str(v2_path), *base, *group)
        assert code == 0, err
        assert "active from tick" in out, out
        assert "v2" in out, out

        for path, why in ((v2_path, "not newer"), (v1_path, "not newer"), (other_path, "runs 'foundation'")):
            code, out, err = await _cli(capsys, "policy", "apply", str(path), *base, *group)
            assert code == 2, (path, out, err)
            assert why in err, err
            assert len(err.strip().splitlines()) == 1, err
        code, out, err = await _cli(capsys, "policy", "apply", str(bad_path), *base, *group)
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1, err

        # Behind the CLI's back: an older version straight onto control.policy. The daemon refuses it.
        p = AIOKafkaProducer(bootstrap_servers=kafka_env.bootstrap_servers, acks="all")
        await p.start()
        try:
            raw = orjson.dumps(v1.document.model_dump(mode="json"))
            await p.send_and_wait(kafka_env.topic(POLICY), value=raw, key=b"foundation")
        finally:
            await p.stop()

        async def refused() -> dict[str, Any] | None:
            status = json.loads((await _cli(capsys, "policy", "status", *base, *group, "--json"))[1])
            return status if status["refused"] >= 1 else None

        status = await wait_until(refused, 30, "the daemon to refuse v1", interval_s=0.5)
        assert status["version"] == 2, status
        assert status["refused"] == 1, status
        assert "not newer" in status["last_refusal"]

        # kill -9 and restart: the last document written for the name is the refused v1; the
        # restart resumes v2 and does not dead-letter v1 again.
        assert await proc.kill9() == -signal.SIGKILL
        await asyncio.sleep(1)  # an outage: ticks are missed, then caught up
        proc = Proc(kafka_env, v1_path, log)
        await proc.assigned()
        # Its start-up line names the policy in force (the resumed v2), not --policy's v1.
        started = [line for line in _json_lines(log) if line.get("event") == "daemon started"]
        assert [(s["policy"], s["version"]) for s in started] == [("foundation", 1), ("foundation", 2)]
        assert started[-1]["hash"] == load_policy(v2_path).stamp.hash
        await asyncio.sleep(3)  # a window for a restart that forgot the refusal to refuse v1 again
        code, out, _ = await _cli(capsys, "policy", "status", *base, *group, "--json")
        assert json.loads(out)["version"] == 2, out

        code, out, err = await _cli(capsys, "policy", "rollback", *base, *group)
        assert code == 0, err
        assert "v3" in out, out
        assert "active from tick" in out, out
        await asyncio.sleep(3)  # elapsed time: live ticks under v3
    await asyncio.sleep(1.5)  # elapsed time: the fleet's last records reach their ticks before the stop
    assert await proc.stop() == 0, log.read_text()[-3000:]

    letters = [r for rs in (await _read(kafka_env, DEADLETTER)).values() for r in rs]
    policy_letters = [r for r in letters if dict(r.headers or ()).get("fleetloop.stage") == b"policy"]
    assert len(policy_letters) == 1, [dict(r.headers or ()) for r in policy_letters]

    # v3 is v1's content under a new version.
    active = json.loads([r for rs in (await _read(kafka_env, POLICY_ACTIVE)).values() for r in rs][-1].value)
    assert active["version"] == 3
    v3 = compile_policy(v1.document.model_validate(active["history"][-1]["document"]))
    assert v3.document.spec == v1.document.spec

    # The decision log, across two policy changes and a kill -9, equals an uninterrupted run...
    policies: list[tuple[int, CompiledPolicy]] = [
        (a["from_ts_ms"], compile_policy(v1.document.model_validate(a["document"])))
        for a in active["history"]
    ]
    v = await compare_with_an_uninterrupted_run(kafka_env, policies)
    _assert_exact(v)
    versions = {p.stamp.version for _, p in policies}
    assert versions == {1, 2, 3}
    # ...and `fleetloop replay` says so too, following the activations.
    code, out, err = await _cli(capsys, "replay", *base, "--json")
    report = json.loads(out)
    assert code == 0, (report, err)
    assert report["exact"] is True
    assert report["different"] == 0
    assert report["missing"] == 0
    print(f"replay across 2 policy changes and a kill -9: {report['decisions_compared']} decisions, 0 differ")
    assert load_policy(v2_path).stamp.hash != v1.stamp.hash
