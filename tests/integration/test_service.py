"""``fleetloop run`` as operators run it, on both brokers: probes, metrics, JSON logs, failing loudly.

The daemon runs as a real child process (``tests.support.service``); the tests read its HTTP face
and its stderr, and feed it records through the broker like serving nodes and routers would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from fleetloop.daemon.brokers import free_port
from fleetloop.daemon.runtime import Daemon, DaemonConfig
from fleetloop.daemon.runtime.follower import PolicyFollower
from fleetloop.daemon.service.health import TaskDied
from fleetloop.daemon.service.http import HttpServer, make_app
from fleetloop.schemas.topics import REQUESTS, TELEMETRY, TICKS
from tests.support.kafka import producer, send
from tests.support.policies import FOUNDATION_YAML, foundation
from tests.support.records import outcome, telemetry, tick
from tests.support.service import EXPORTED_METRICS, FLEETLOOP, broker_args, fleetloop_run, total
from tests.support.wait import wait_until

NODES = ("p/0", "p/1", "p/2")


def _json_lines(text: str) -> list[dict[str, Any]]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    parsed = []
    for ln in lines:
        try:
            parsed.append(orjson.loads(ln))
        except orjson.JSONDecodeError:
            raise AssertionError(f"not a JSON line under --log-format json: {ln!r}") from None
    return parsed


async def test_probes_and_metrics_of_a_running_daemon(kafka_env: Any, tmp_path: Path) -> None:
    args = broker_args(
        kafka_env,
        "svc",
        "--policy",
        str(FOUNDATION_YAML),
        "--no-ticker",
        "--log-format",
        "json",
    )
    async with fleetloop_run(args, tmp_path, port=free_port()) as svc:
        ready = await svc.wait_status("/readyz", 200)
        checks = ready.json()["checks"]
        assert checks == {
            "connected": True,
            "model_warm": True,
            "partitions_assigned": True,
            "policy_loaded": True,
            "tasks_alive": True,
        }
        live = (await svc.get("/healthz")).json()
        assert live["ok"] is True
        assert set(live["tasks"]) == {"consumer", "policy", "broker-watch", "stall-watch"}
        async with producer(kafka_env) as p:
            await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=1000) for n in NODES])
            await send(
                p, kafka_env, REQUESTS, [outcome(n, "ok", ts_ms=1100, n=i) for i, n in enumerate(NODES)]
            )
            await send(p, kafka_env, TELEMETRY, [b"{not json", b"{}", b"{not json either"])
            await send(p, kafka_env, TICKS, [tick(1), tick(2)])
        async with asyncio.timeout(60):
            while True:
                m = await svc.metrics()
                decided = total(m, "fleetloop_ticks_total", outcome="decided")
                if decided >= 2 and total(m, "fleetloop_decisions_total", kind="routing") >= 2:
                    break
                await asyncio.sleep(0.3)
        assert total(m, "fleetloop_events_consumed_total", topic="fleet.telemetry") == 6
        assert total(m, "fleetloop_events_consumed_total", topic="fleet.requests") == 3
        assert total(m, "fleetloop_events_consumed_total", topic="control.ticks") == 2
        assert total(m, "fleetloop_dead_letters_total", reason="json_invalid") == 2
        assert total(m, "fleetloop_dead_letters_total", reason="missing") == 1
        assert total(m, "fleetloop_decisions_total", kind="routing") >= 2
        assert all(lbl["reason"] for lbl, _ in m["fleetloop_decisions_total"])
        assert total(m, "fleetloop_tick_duration_seconds_count") >= 2
        assert total(m, "fleetloop_policy_info", name="foundation") == 1
        assert total(m, "fleetloop_broker_connected") == 1
        assert total(m, "fleetloop_ready") == 1
        assert total(m, "fleetloop_model_nodes") == 3
        assert total(m, "fleetloop_model_pools") == 1
        assert total(m, "fleetloop_model_open_workflows") >= 0
        # broker_errors appears once a Kafka operation was retried (the outage test sees it).
        assert EXPORTED_METRICS - {"fleetloop_broker_errors_total"} <= set(m)
        lags = m["fleetloop_consumer_lag"]
        assert {lbl["topic"] for lbl, _ in lags} == {"fleet.telemetry", "fleet.requests", "control.ticks"}
        assert all(v == 0 for _, v in lags)
    assert svc.proc.returncode == 0
    lines = _json_lines(svc.stderr())
    events = [ln["event"] for ln in lines]
    assert "daemon started" in events
    assert "daemon stopped" in events
    # Three bad records, two reason kinds: one line per kind, not one per record.
    assert events.count("dead letter") == 2


async def test_missing_topics_exit_2_with_one_line(kafka_env: Any, tmp_path: Path) -> None:
    prefix = f"absent-{uuid.uuid4().hex[:8]}"
    base = [FLEETLOOP, "run", "--bootstrap-servers", kafka_env.bootstrap_servers, "--topic-prefix", prefix]
    done = await asyncio.to_thread(subprocess.run, base, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "topics missing" in lines[0]
    assert f"{prefix}.fleet.telemetry" in lines[0]
    assert "--create-topics" in lines[0]
    # With a bounded wait: logged (JSON), then the same verdict, after the wait and not much later.
    waited = await asyncio.to_thread(
        subprocess.run,
        [*base, "--wait-for-topics", "3", "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert waited.returncode == 2
    parsed = _json_lines(waited.stderr)
    assert parsed[0]["event"] == "topics missing; waiting"
    assert "after waiting 3 s" in parsed[-1]["event"]
    assert len(parsed) <= 4, waited.stderr  # rate-limited: not one line per poll


async def test_a_dying_task_fails_healthz_and_stops_the_daemon(
    kafka_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the policy follower raises once the daemon runs; nothing else is faked."""
    gate = asyncio.Event()

    async def broken_follower(self: PolicyFollower, stop: asyncio.Event) -> None:
        await gate.wait()
        raise RuntimeError("policy topic unreadable (injected)")

    monkeypatch.setattr(PolicyFollower, "follow", broken_follower)
    daemon = Daemon(
        DaemonConfig(
            bootstrap_servers=kafka_env.bootstrap_servers,
            policy=foundation(),
            prefix=kafka_env.prefix,
            group_id=kafka_env.group("dies"),
            run_ticker=False,
            idempotence=kafka_env.broker.capabilities.idempotent_producer,
        )
    )
    seen: list[tuple[int, dict[str, Any]]] = []
    async with HttpServer(make_app(lambda: daemon.health), port=0) as server:
        import httpx

        stop = asyncio.Event()
        run = asyncio.create_task(daemon.run(stop))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            async with asyncio.timeout(60):
                while (r := await client.get("/healthz")).status_code != 200:
                    await asyncio.sleep(0.1)
            gate.set()
            with pytest.raises(TaskDied) as died:
                await asyncio.wait_for(run, 60)
            r = await client.get("/healthz")
            seen.append((r.status_code, r.json()))
    assert died.value.task == "policy"
    assert "RuntimeError: policy topic unreadable (injected)" in died.value.reason
    status, body = seen[0]
    assert status == 503
    assert body["tasks"]["policy"].startswith("dead: RuntimeError")
    with contextlib.suppress(Exception):
        stop.set()


@pytest.mark.system  # a broker outage
async def test_broker_outage_readyz_false_meanwhile_then_recovers_quietly(
    kafka_env: Any, broker: Any, tmp_path: Path
) -> None:
    """The broker stops answering (SIGSTOP) for 12 s: /readyz says so, /healthz stays up, logs stay few."""
    args = broker_args(
        kafka_env,
        "outage",
        "--log-format",
        "json",
        "--idempotence",
        "off",
    )
    async with fleetloop_run(args, tmp_path, port=free_port()) as svc:
        await svc.wait_status("/readyz", 200)
        before = len(svc.stderr().splitlines())
        proc = broker._proc
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            down = await svc.wait_status("/readyz", 503, timeout_s=30)
            assert down.json()["checks"]["connected"] is False
            assert (await svc.get("/healthz")).status_code == 200, "a broker outage is not a dead process"
            m = await svc.metrics()
            assert total(m, "fleetloop_broker_connected") == 0
            assert total(m, "fleetloop_broker_errors_total", operation="metadata") >= 1
            await asyncio.sleep(12)  # the outage itself: how many log lines it costs
            during = len(svc.stderr().splitlines()) - before
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        await svc.wait_status("/readyz", 200, timeout_s=90)
        assert total(await svc.metrics(), "fleetloop_broker_connected") == 1
    assert svc.proc.returncode == 0
    text = svc.stderr()
    assert "Traceback" not in text
    _json_lines(text)
    assert during <= 40, f"{during} log lines while the broker was away"


async def test_otlp_export_only_when_the_endpoint_is_set(kafka_env: Any, tmp_path: Path) -> None:
    """A real OTLP/HTTP receiver on loopback: traces and metrics arrive when the variable names it."""
    from aiohttp import web

    received: list[tuple[str, str, int]] = []

    async def collect(request: web.Request) -> web.Response:
        body = await request.read()
        received.append((request.path, request.headers.get("Content-Type", ""), len(body)))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/metrics", collect)
    app.router.add_post("/v1/traces", collect)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    args = broker_args(
        kafka_env,
        "otlp",
        "--no-ticker",
        "--idempotence",
        "off",
    )
    try:
        # Without the variable: the daemon runs, the receiver (also on the default port's path) hears nothing.
        async with fleetloop_run(args, tmp_path, port=free_port()) as svc:
            await svc.wait_status("/readyz", 200)
            await asyncio.sleep(3)  # a window in which nothing may arrive
        assert received == []
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_METRIC_EXPORT_INTERVAL": "1000",
            "OTEL_BSP_SCHEDULE_DELAY": "500",
        }
        async with fleetloop_run(args, tmp_path, port=free_port(), env=env) as svc:
            await svc.wait_status("/readyz", 200)
            async with producer(kafka_env) as p:
                await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=1000) for n in NODES])
                await send(p, kafka_env, TICKS, [tick(1)])
            async with asyncio.timeout(60):
                while not {"/v1/metrics", "/v1/traces"} <= {path for path, _, _ in received}:
                    await asyncio.sleep(0.2)
    finally:
        await runner.cleanup()
    assert all(ctype == "application/x-protobuf" and size > 0 for _, ctype, size in received)


async def test_a_stuck_stderr_reader_does_not_stall_the_loop(kafka_env: Any, tmp_path: Path) -> None:
    """stderr is a pipe nobody reads; 16k bad records and debug logs later, every tick is still decided."""
    argv = [
        FLEETLOOP,
        "run",
        "--bootstrap-servers",
        kafka_env.bootstrap_servers,
        "--topic-prefix",
        kafka_env.prefix,
        "--group-id",
        kafka_env.group("stuck"),
        "--policy",
        str(FOUNDATION_YAML),
        "--no-ticker",
        "--idempotence",
        "off",
        "--log-format",
        "json",
        "--log-level",
        "debug",
        "--http-port",
        str(port := free_port()),
        # The records carry synthetic event times near epoch 0: open the door's event-time window.
        "--event-time-window",
        "off",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # never read
    try:
        import httpx

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            async with asyncio.timeout(90):
                while True:
                    with contextlib.suppress(httpx.TransportError):
                        if (await client.get("/readyz")).status_code == 200:
                            break
                    await asyncio.sleep(0.2)
            async with producer(kafka_env) as p:
                await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=1000) for n in NODES])
                await send(p, kafka_env, TELEMETRY, [b"{bad %d" % i for i in range(16_000)])
                for k in range(1, 21):
                    await send(p, kafka_env, TELEMETRY, [telemetry(n, ts_ms=k * 1000) for n in NODES])
                    await send(p, kafka_env, TICKS, [tick(k)])
            from tests.support.service import RunningService

            svc = RunningService(proc, port, tmp_path / "unused")  # type: ignore[arg-type]

            async def all_done() -> Any:
                m = await svc.metrics()
                decided = total(m, "fleetloop_ticks_total", outcome="decided") >= 20
                return m if decided and total(m, "fleetloop_dead_letters_total") >= 16_000 else None

            m = await wait_until(all_done, 120, "20 ticks decided and 16,000 dead letters", interval_s=0.5)
            assert total(m, "fleetloop_dead_letters_total") == 16_000
            assert (await client.get("/healthz")).status_code == 200
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, 30)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
