"""A restart after control.policy has really compacted (Apache Kafka's log cleaner, not a
simulation): the newest document left for the name is one the daemon refused, the document it had
activated is gone from the topic, and the restarted daemon still resumes the activated one (from
control.policy.active) and does not dead-letter the refused one again. Tansu keeps every record
(no compaction), so there the test is skipped with that reason."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from fleetloop.schemas.topics import DEADLETTER, POLICY, POLICY_ACTIVE
from tests.integration.test_policy_lifecycle import _cli, _variant
from tests.integration.test_restarts import Proc, _policy, _read, feeding
from tests.support.wait import wait_until

pytestmark = pytest.mark.system  # a restart after the log cleaner ran

FAST_COMPACTION = {
    "cleanup.policy": "compact",
    "segment.ms": "300",
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "0",
}


async def test_a_restart_after_real_compaction_resumes_the_activated_policy(
    kafka_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if kafka_env.broker.kind != "kafka":
        pytest.skip("Tansu keeps every record: it has no log compaction to test")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_env.bootstrap_servers)
    await admin.start()
    try:
        await admin.alter_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, kafka_env.topic(t), configs=FAST_COMPACTION)
                for t in (POLICY, POLICY_ACTIVE)
            ]
        )
    finally:
        await admin.close()
    v1_path, v1 = _policy(tmp_path)
    v2_path = _variant(v1_path, tmp_path, "v2", version=2, threshold=3)
    log = tmp_path / "daemon.log"
    base = ["--bootstrap-servers", kafka_env.bootstrap_servers, "--topic-prefix", kafka_env.prefix]
    group = ["--group-id", kafka_env.group("restarts")]
    p = AIOKafkaProducer(bootstrap_servers=kafka_env.bootstrap_servers, acks="all")
    await p.start()
    try:
        async with feeding(kafka_env):
            proc = Proc(kafka_env, v1_path, log)
            await proc.assigned()
            code, out, err = await _cli(capsys, "policy", "apply", str(v2_path), *base, *group)
            assert code == 0, (out, err)
            # An older document for the name, behind the CLI's back: refused by the daemon.
            raw_v1 = orjson.dumps(v1.document.model_dump(mode="json"))
            await p.send_and_wait(kafka_env.topic(POLICY), value=raw_v1, key=b"foundation")

            async def refused() -> bool:
                _, out, _ = await _cli(capsys, "policy", "status", *base, *group, "--json")
                return bool(json.loads(out)["refused"] >= 1)

            await wait_until(refused, 30, "the daemon to refuse v1", interval_s=0.5)
            # Keep rolling segments (a record of another name, which the daemon ignores) until the
            # cleaner has removed v2's document: the newest for the name is the refused v1.
            other = orjson.loads(raw_v1)
            other["metadata"]["name"] = "filler"
            async with asyncio.timeout(90):
                while True:
                    await p.send_and_wait(kafka_env.topic(POLICY), value=orjson.dumps(other), key=b"filler")
                    docs = [
                        orjson.loads(r.value) for rs in (await _read(kafka_env, POLICY)).values() for r in rs
                    ]
                    versions = [
                        d["metadata"]["version"] for d in docs if d["metadata"]["name"] == "foundation"
                    ]
                    if versions == [1]:
                        break
                    await asyncio.sleep(2)  # the log cleaner runs on its own schedule
            assert await proc.kill9() == -signal.SIGKILL
            await asyncio.sleep(1)  # an outage: ticks are missed, then caught up
            proc = Proc(kafka_env, v1_path, log)
            await proc.assigned()
            await asyncio.sleep(3)  # a window for a restart that forgot the refusal to refuse v1 again
            _, out, _ = await _cli(capsys, "policy", "status", *base, *group, "--json")
            status = json.loads(out)
            assert status["version"] == 2, status
            assert status["refused"] == 1, status
        assert await proc.stop() == 0, log.read_text()[-3000:]
    finally:
        await p.stop()
    letters = [r for rs in (await _read(kafka_env, DEADLETTER)).values() for r in rs]
    policy_letters = [r for r in letters if dict(r.headers or ()).get("fleetloop.stage") == b"policy"]
    assert len(policy_letters) == 1, [dict(r.headers or ()) for r in policy_letters]
    with capsys.disabled():
        print("\nrestart after real compaction: control.policy holds only the refused v1; v2 resumed")
