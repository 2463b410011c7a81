"""Exact restarts on real brokers: a daemon (a real ``fleetloop run`` process) is killed with SIGKILL
at exact points (mid-batch, between publish and commit, between checkpoint and commit) and at
arbitrary moments, restarted after an outage, or run as two instances of which one is killed. The
decision log it leaves must equal, decision for decision and byte for byte, what one uninterrupted
shard per partition decides over the same recorded topics (every tick on control.ticks with its
recorded cut, in offset order). What may differ, by design, is only documented: a tick republished
after a crash between publish and commit appears twice with the same bytes.

Also checked: no tick boundary is missing for any pool between its first and last tick (outage
ticks were published late and decided), and restarts really restored checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from fleetloop import clock
from fleetloop.core.shard import INPUTS, Row, Shadow, Shard
from fleetloop.daemon.act.publish import decision_bytes
from fleetloop.daemon.runtime import CUT_HEADER, SKIPPED_FROM_HEADER, SKIPPED_HEADER
from fleetloop.policies.registry import CompiledPolicy, load_policy
from fleetloop.schemas import Decision, RequestOutcome, Tick
from fleetloop.schemas.topics import DECISIONS, REQUESTS, SHADOW, TELEMETRY, TICKS
from tests.support.policies import FOUNDATION_YAML
from tests.support.records import outcome, telemetry, to_bytes

pytestmark = pytest.mark.system  # kill -9 restarts and outages, minutes of live ticks

FLEETLOOP = Path(sys.executable).parent / "fleetloop"
TICK_MS = 500
N_PARTITIONS = 4


def _pools() -> list[str]:
    """Four pool ids that land on four different partitions (keys are hashed like the producer does)."""
    part = DefaultPartitioner()
    chosen: dict[int, str] = {}
    for i in range(200):
        name = f"pool-{i}"
        chosen.setdefault(part(name.encode(), list(range(N_PARTITIONS)), list(range(N_PARTITIONS))), name)
        if len(chosen) == N_PARTITIONS:
            break
    return [chosen[p] for p in sorted(chosen)]


POOLS = _pools()


def _policy(tmp: Path) -> tuple[Path, CompiledPolicy]:
    path = tmp / "policy.yaml"
    path.write_text(FOUNDATION_YAML.read_text().replace("tick_ms: 1000", f"tick_ms: {TICK_MS}"))
    return path, load_policy(path)


@dataclass
class Fleet:
    """Serving nodes and a router in miniature: telemetry every 250 ms, calls every 50 ms, and one
    node per pool that fails in bursts (so breakers open, back off and probe across restarts)."""

    env: Any
    sent: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        rng = np.random.default_rng(11)
        p = AIOKafkaProducer(bootstrap_servers=self.env.bootstrap_servers, acks="all", linger_ms=5)
        await p.start()
        try:
            step = 0
            while not self.stop.is_set():
                now = clock.wall_ms()
                futures = []
                for pool in POOLS:
                    key = pool.encode()
                    if step % 5 == 0:
                        for i in range(3):
                            t = telemetry(
                                f"{pool}/{i}", pool=pool, ts_ms=now, queue_depth=int(rng.integers(0, 6))
                            )
                            futures.append(
                                await p.send(self.env.topic(TELEMETRY), value=to_bytes(t), key=key)
                            )
                    burst = (step // 60) % 2 == 1  # 3 s of failures every 6 s on node 2
                    for _ in range(int(rng.integers(1, 4))):
                        node = f"{pool}/{int(rng.integers(0, 3))}"
                        kind = "error" if burst and node.endswith("/2") else "ok"
                        self.sent += 1
                        o: RequestOutcome = outcome(
                            node,
                            kind,
                            pool=pool,
                            ts_ms=now,
                            n=self.sent,
                            workflow_id=f"w-{self.sent // 7}",
                            cost_usd=0.0005,
                            task_outcome="succeeded" if kind == "ok" and self.sent % 7 == 6 else None,
                        )
                        futures.append(await p.send(self.env.topic(REQUESTS), value=to_bytes(o), key=key))
                await asyncio.gather(*futures)
                step += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 0.05)
        finally:
            await p.stop()


@contextlib.asynccontextmanager
async def feeding(env: Any) -> AsyncIterator[Fleet]:
    fleet = Fleet(env)
    task = asyncio.create_task(fleet.run())
    try:
        yield fleet
    finally:
        fleet.stop.set()
        await asyncio.wait_for(task, 30)


@pytest.fixture(autouse=True)
def _reap_procs() -> Iterator[None]:
    """Every ``fleetloop run`` a test started is killed when the test ends, passed or failed: a
    failing assertion must not leave a daemon running against the session's broker."""
    yield
    while Proc.started:
        proc = Proc.started.pop()
        if proc.p.poll() is None:
            proc.p.kill()
            proc.p.wait(30)


class Proc:
    """One ``fleetloop run`` process; its output goes to a file (a full pipe would stall it)."""

    started: ClassVar[list[Proc]] = []

    def __init__(self, env: Any, policy: Path, log: Path, fault: str | None = None) -> None:
        environ = dict(os.environ)
        environ.pop("FLEETLOOP_FAULT", None)
        if fault:
            environ["FLEETLOOP_FAULT"] = fault
        self.log = log
        self._mark = log.stat().st_size if log.exists() else 0
        idem = "on" if env.broker.capabilities.idempotent_producer else "off"
        with log.open("ab") as out:
            self.p = subprocess.Popen(
                [
                    str(FLEETLOOP),
                    "run",
                    "--bootstrap-servers",
                    env.bootstrap_servers,
                    "--topic-prefix",
                    env.prefix,
                    "--group-id",
                    env.group("restarts"),
                    "--policy",
                    str(policy),
                    "--idempotence",
                    idem,
                    "--checkpoint-interval-s",
                    "1",
                    "--log-format",
                    "json",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environ,
            )
        Proc.started.append(self)

    async def assigned(self, timeout_s: float = 60) -> None:
        """Wait until this process has been given partitions (after a kill -9 the group waits for
        the dead member's session to time out first)."""
        async with asyncio.timeout(timeout_s):
            while True:
                text = self.log.read_bytes()[self._mark :]
                if b'"partitions assigned"' in text:
                    return
                assert self.p.poll() is None, text.decode(errors="replace")[-3000:]
                await asyncio.sleep(0.2)

    async def wait(self, timeout_s: float) -> int:
        return await asyncio.to_thread(self.p.wait, timeout_s)

    async def kill9(self) -> int:
        self.p.send_signal(signal.SIGKILL)
        return await self.wait(30)

    async def stop(self) -> int:
        self.p.send_signal(signal.SIGTERM)
        return await self.wait(60)

    def summary(self) -> dict[str, Any]:
        for line in reversed(self.log.read_text(errors="replace").splitlines()):
            with contextlib.suppress(orjson.JSONDecodeError):
                rec = orjson.loads(line)
                if isinstance(rec, dict) and rec.get("event") == "daemon stopped":
                    return rec
        return {}


async def _read(env: Any, logical: str) -> dict[int, list[Any]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=env.bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    try:
        topic = env.topic(logical)
        parts = sorted(consumer.partitions_for_topic(topic) or await _partitions(consumer, topic))
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out: dict[int, list[Any]] = {tp.partition: [] for tp in tps}
        async with asyncio.timeout(60):
            while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
                for tp, rs in (await consumer.getmany(timeout_ms=300)).items():
                    out[tp.partition].extend(rs)
        return out
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await consumer._client.force_metadata_update()
    return consumer.partitions_for_topic(topic) or set()


async def _committed(env: Any) -> dict[int, int]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=env.bootstrap_servers, group_id=env.group("restarts"), enable_auto_commit=False
    )
    await consumer.start()
    try:
        out = {}
        for p in range(N_PARTITIONS):
            c = await consumer.committed(TopicPartition(env.topic(TICKS), p))
            out[p] = c if c is not None else 0
        return out
    finally:
        await consumer.stop()


@dataclass
class Verdict:
    ticks: int = 0
    decisions: int = 0
    republished_identical: int = 0
    conflicting: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    different: list[str] = field(default_factory=list)
    holes: list[str] = field(default_factory=list)
    skipped: int = 0


async def compare_with_an_uninterrupted_run(
    env: Any,
    policy: CompiledPolicy | list[tuple[int, CompiledPolicy]],
    shadows: list[tuple[int, Shadow | None]] | None = None,
) -> Verdict:
    """``policy``: one for the whole run, or activations (from event time, policy), oldest first.
    ``shadows``: the shadow policy's timeline; then the shadow log (control.shadow) is compared
    with what the uninterrupted shards decide under it, instead of the enforced log."""
    activations = [(0, policy)] if isinstance(policy, CompiledPolicy) else policy

    def shadow_at(ts: int) -> Shadow | None:
        chosen = None
        for from_ts, s in shadows or ():
            if from_ts <= ts:
                chosen = s
        return chosen

    def policy_at(ts: int) -> CompiledPolicy:
        chosen = activations[0][1]
        for from_ts, p in activations:
            if from_ts <= ts:
                chosen = p
        return chosen

    ticks_by_part = await _read(env, TICKS)
    inputs = {logical: await _read(env, logical) for logical in INPUTS}
    decided = await _read(env, SHADOW if shadows is not None else DECISIONS)
    committed = await _committed(env)
    v = Verdict()

    expected: dict[tuple[str, int], bytes] = {}
    seen_ids: dict[str, list[int]] = {}
    for p, records in sorted(ticks_by_part.items()):
        shard = Shard(p)
        for r in records:
            if r.offset >= committed[p]:
                break  # published but not processed before the final stop
            tick = Tick.model_validate_json(r.value)
            headers = dict(r.headers or ())
            seen_ids.setdefault(tick.pool_id, []).append(tick.tick_id)
            if SKIPPED_HEADER in headers:
                # A skipped record stands for its range (an outage beyond the catch-up, overload):
                # those boundaries are on the topic, as skipped, not missing.
                first = int(headers.get(SKIPPED_FROM_HEADER, str(tick.tick_id).encode()))
                seen_ids[tick.pool_id].extend(range(first, tick.tick_id))
                shard.skip(tick)
                v.skipped += 1
                continue
            cut = {k: int(x) for k, x in orjson.loads(headers[CUT_HEADER]).items()}
            for logical in INPUTS:
                rows = inputs[logical][p]
                shard.add(
                    logical,
                    (
                        Row(x.offset, x.timestamp, _decode(logical, x.value))
                        for x in rows
                        if shard.read[logical] <= x.offset < cut[logical]
                    ),
                )
            out = shard.decide(tick, cut, policy_at(tick.ts_ms)) or ()
            if shadows is not None:
                out = shard.decide_shadow(tick, shadow_at(tick.ts_ms)) if out else ()
            for d in out:
                expected[(d.key, d.tick_id)] = decision_bytes(d)
            v.ticks += 1
    for pool, ids in sorted(seen_ids.items()):
        ids = sorted(set(ids))
        gaps = sorted(set(range(ids[0], ids[-1] + 1)) - set(ids))
        if gaps:
            v.holes.append(f"{pool}: {gaps[:5]}")

    recorded: dict[tuple[str, int], bytes] = {}
    for rs in decided.values():
        for r in rs:
            d = Decision.model_validate_json(r.value)
            k = (d.key, d.tick_id)
            b = decision_bytes(d)
            if k in recorded:
                if recorded[k] == b:
                    v.republished_identical += 1
                else:
                    v.conflicting.append(f"{k}")
                continue
            recorded[k] = b
    v.decisions = len(expected)
    for k in sorted(set(expected) | set(recorded)):
        if k not in recorded:
            v.missing.append(str(k))
        elif k not in expected:
            v.extra.append(str(k))
        elif recorded[k] != expected[k]:
            v.different.append(f"{k}\n  recorded {recorded[k][:600]!r}\n  expected {expected[k][:600]!r}")
    return v


def _decode(logical: str, value: bytes) -> Any:
    from fleetloop.schemas import NodeTelemetry

    model = NodeTelemetry if logical == TELEMETRY else RequestOutcome
    try:
        return model.model_validate_json(value)
    except ValueError:
        return None


def _assert_exact(v: Verdict) -> None:
    report = (
        f"{v.ticks} ticks, {v.decisions} decisions; conflicting {len(v.conflicting)}, missing "
        f"{len(v.missing)}, extra {len(v.extra)}, different {len(v.different)}, holes {v.holes}\n"
        + "\n".join([*v.conflicting[:3], *v.missing[:3], *v.extra[:3], *v.different[:2]])
    )
    assert v.ticks > 20, report
    assert v.decisions > 200, report
    assert not v.conflicting, report
    assert not v.different, report
    assert not v.missing, report
    assert not v.extra, report
    assert not v.holes, report
    print(f"exact: {report.splitlines()[0]}; republished identical {v.republished_identical}")


@pytest.mark.timeout(1200)
async def test_kill_9_at_exact_points_and_restarts_leave_the_decisions_of_an_uninterrupted_run(
    kafka_env: Any, tmp_path: Path
) -> None:
    policy_path, policy = _policy(tmp_path)
    log = tmp_path / "daemon.log"
    async with feeding(kafka_env):
        # Killed by its own fault points: each run dies at an exact place in the batch.
        for fault in ("crash:after-publish:6", "crash:mid-batch:25", "crash:after-checkpoint:4"):
            proc = Proc(kafka_env, policy_path, log, fault)
            # Each fault point is reached within seconds on a quiet machine; on a loaded one the
            # ticks wait for their inputs longer, so the bound is generous (not a timing claim).
            rc = await proc.wait(240)
            assert rc == -signal.SIGKILL, f"{fault}: exit {rc}\n{log.read_text()[-3000:]}"
            await asyncio.sleep(1.5)  # an outage: ticks are missed, then caught up
        # Killed from outside at an arbitrary moment.
        proc = Proc(kafka_env, policy_path, log)
        await proc.assigned()
        await asyncio.sleep(2.5)  # elapsed time: a few live ticks, then the kill lands mid-stream
        assert await proc.kill9() == -signal.SIGKILL
        await asyncio.sleep(1.5)  # an outage: ticks are missed, then caught up
        final = Proc(kafka_env, policy_path, log)
        await final.assigned()
        await asyncio.sleep(4)  # elapsed time: the catch-up, then live ticks (the check needs > 20)
    await asyncio.sleep(1.5)  # elapsed time: the fleet's last records reach their ticks before the stop
    assert await final.stop() == 0, log.read_text()[-3000:]
    summary = final.summary()
    assert summary.get("ticks_caught_up", 0) > 0, summary  # the outage's boundaries were decided late
    assert "starting clean" not in log.read_text()
    v = await compare_with_an_uninterrupted_run(kafka_env, policy)
    _assert_exact(v)


async def test_two_instances_one_killed_the_survivor_takes_over_exactly(
    kafka_env: Any, tmp_path: Path
) -> None:
    policy_path, policy = _policy(tmp_path)
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    async with feeding(kafka_env):
        a = Proc(kafka_env, policy_path, log_a)
        await a.assigned()
        await asyncio.sleep(2)  # elapsed time: a alone decides live ticks
        b = Proc(kafka_env, policy_path, log_b)
        await b.assigned()  # b joined: the partitions were split between the two
        await asyncio.sleep(3)  # elapsed time: both decide their halves
        assert await b.kill9() == -signal.SIGKILL
        mark = log_a.stat().st_size
        async with asyncio.timeout(60):  # a notices (session timeout) and takes b's partitions
            while log_a.read_bytes()[mark:].count(b'"partitions assigned"') < 1:
                await asyncio.sleep(0.2)
        await asyncio.sleep(4)  # elapsed time: the survivor decides b's pools too
    await asyncio.sleep(1.5)  # elapsed time: the fleet's last records reach their ticks before the stop
    assert await a.stop() == 0, log_a.read_text()[-3000:]
    assert '"kept": true' in log_a.read_text() or '"kept":true' in log_a.read_text(), (
        "the survivor should keep the partitions it already owned"
    )
    v = await compare_with_an_uninterrupted_run(kafka_env, policy)
    _assert_exact(v)


async def test_a_broker_outage_is_decided_on_recovery_from_the_recorded_inputs(
    kafka_env: Any, broker: Any, tmp_path: Path
) -> None:
    """The broker process is paused (SIGSTOP: unreachable, same data afterwards) while the daemon
    and the fleet run; the ticks of the outage are published late and decided exactly."""
    policy_path, policy = _policy(tmp_path)
    log = tmp_path / "daemon.log"
    pid = broker._proc.pid  # the session's broker: paused, never stopped, and resumed in `finally`
    async with feeding(kafka_env):
        proc = Proc(kafka_env, policy_path, log)
        await proc.assigned()
        await asyncio.sleep(3)  # elapsed time: live ticks before the outage
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(6)  # the outage itself
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(12)  # elapsed time: reconnect, catch up the outage's ticks, live ticks again
    await asyncio.sleep(1.5)  # elapsed time: the fleet's last records reach their ticks before the stop
    assert await proc.stop() == 0, log.read_text()[-3000:]
    summary = proc.summary()
    assert summary.get("ticks_caught_up", 0) > 0, summary
    v = await compare_with_an_uninterrupted_run(kafka_env, policy)
    _assert_exact(v)


async def test_an_outage_longer_than_the_catch_up_is_published_as_skipped_with_its_reason(
    kafka_env: Any, tmp_path: Path
) -> None:
    from fleetloop.daemon.runtime import Daemon, DaemonConfig

    _, policy = _policy(tmp_path)

    def config() -> DaemonConfig:
        return DaemonConfig(
            bootstrap_servers=kafka_env.bootstrap_servers,
            policy=policy,
            prefix=kafka_env.prefix,
            group_id=kafka_env.group("skips"),
            idempotence=kafka_env.broker.capabilities.idempotent_producer,
            catchup_max_ticks=2,
        )

    async def run_for(seconds: float) -> Daemon:
        daemon = Daemon(config())
        stop = asyncio.Event()
        task = asyncio.create_task(daemon.run(stop))
        await asyncio.wait_for(daemon.ready.wait(), 60)
        await asyncio.sleep(seconds)  # elapsed time: a run of live ticks
        stop.set()
        await asyncio.wait_for(task, 60)
        return daemon

    async with feeding(kafka_env):
        await run_for(3)
        await asyncio.sleep(4)  # 8 boundaries of 500 ms missed: 2 are caught up, the rest skipped
        second = await run_for(3)
    assert second.stats.ticks_skipped >= 1
    ticks = await _read(kafka_env, TICKS)
    skipped = [
        (dict(r.headers or ()), Tick.model_validate_json(r.value)) for rs in ticks.values() for r in rs
    ]
    marks = [(h, t) for h, t in skipped if SKIPPED_HEADER in h]
    assert marks, "no tick record marked skipped"
    headers, tick = marks[0]
    assert b"beyond the catch-up of 2" in headers[SKIPPED_HEADER]
    assert int(headers["fleetloop.skipped_from"]) < tick.tick_id
