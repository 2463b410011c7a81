"""The service pieces without a broker: supervision, log rate limiting and queueing, security settings."""

from __future__ import annotations

import asyncio
import io
import threading
from typing import Any

import pytest
import structlog
from fleetloop.daemon.observability import QueueWriter, RateLimiter
from fleetloop.daemon.service.health import Health, TaskDied, supervise
from fleetloop.daemon.service.metrics import reason_kind
from fleetloop.kafka_security import (
    KafkaConnection,
    Secret,
    SecurityError,
    connect,
    from_settings,
    redact,
    shown,
)

# -- supervision ---------------------------------------------------------------------------------


async def test_first_dying_task_is_raised_with_its_name_and_the_others_are_cancelled() -> None:
    health = Health()
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def dies() -> None:
        await asyncio.sleep(0.01)
        raise ConnectionResetError("broker went away")

    with pytest.raises(TaskDied) as died:
        await supervise(health, {"consumer": forever, "ticker": dies}, stop)
    assert died.value.task == "ticker"
    assert died.value.reason == "ConnectionResetError: broker went away"
    assert cancelled.is_set()
    assert stop.is_set()
    ok, body = health.live()
    assert not ok
    assert body["tasks"]["ticker"].startswith("dead: ConnectionResetError")


async def test_a_task_that_returns_early_counts_as_dead() -> None:
    async def quits() -> None:
        return None

    with pytest.raises(TaskDied, match="returned while the daemon runs"):
        await supervise(Health(), {"policy": quits}, asyncio.Event())


async def test_stop_ends_supervision_cleanly() -> None:
    health = Health()
    stop = asyncio.Event()

    async def waits() -> None:
        await stop.wait()

    asyncio.get_running_loop().call_later(0.05, stop.set)
    await supervise(health, {"a": waits, "b": waits}, stop)
    assert health.died is None


def test_readiness_names_what_it_waits_for() -> None:
    h = Health(connected=False, policy_loaded=True, connection_error="KafkaConnectionError: refused")
    ok, body = h.ready()
    assert not ok
    assert body["checks"]["connected"] is False
    assert body["checks"]["partitions_assigned"] is False
    assert body["connection_error"] == "KafkaConnectionError: refused"


# -- logs ----------------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_rate_limiter_passes_the_first_counts_the_rest_and_reports_the_count() -> None:
    clock = _Clock()
    rl = RateLimiter(window_s=10.0, now=clock)
    passed = 0
    for _ in range(100):
        try:
            rl(None, "warning", {"event": "Topic x not found", "level": "warning", "logger": "aiokafka"})
            passed += 1
        except structlog.DropEvent:
            pass
    assert passed == 1
    assert rl.suppressed_total == 99
    clock.t = 10.5
    summary = rl.due()
    assert len(summary) == 1
    assert summary[0]["repeated"] == 99
    # Different kinds (here: a dead-letter reason) are limited separately; info lines pass.
    out = rl(None, "warning", {"event": "dead letter", "level": "warning", "ratelimit_key": "missing"})
    assert "ratelimit_key" not in out
    rl(None, "warning", {"event": "dead letter", "level": "warning", "ratelimit_key": "json_invalid"})
    for _ in range(5):
        rl(None, "info", {"event": "partitions assigned", "level": "info"})


def test_queue_writer_drops_and_counts_instead_of_blocking_on_a_stuck_reader() -> None:
    release = threading.Event()

    class StuckStream(io.StringIO):
        def write(self, s: str) -> int:
            release.wait(10)
            return super().write(s)

    stream = StuckStream()
    writer = QueueWriter(stream, maxsize=10)
    started = threading.Event()

    def burst() -> None:
        started.set()
        for i in range(1000):
            writer.put(f"line {i}")

    t = threading.Thread(target=burst)
    t.start()
    t.join(5)
    assert not t.is_alive(), "put() blocked on a stuck reader"
    assert writer.dropped >= 1000 - 10 - 1
    release.set()
    writer.close()
    text = stream.getvalue()
    assert "line 0" in text
    assert "log lines dropped" in text


# -- security ------------------------------------------------------------------------------------


def test_redact_strips_credentials_from_every_address() -> None:
    assert redact("alice:s3cret@broker-1:9093,bob:pw@broker-2:9093") == "***@broker-1:9093,***@broker-2:9093"
    assert redact("broker:9092") == "broker:9092"


def test_credentials_in_the_bootstrap_string_are_refused_without_echoing_them() -> None:
    with pytest.raises(SecurityError) as err:
        connect("alice:s3cret@broker:9093")
    assert "s3cret" not in str(err.value)
    assert "alice" not in str(err.value)


def test_sasl_ssl_settings_become_aiokafka_arguments(tmp_path: object) -> None:
    conn = from_settings(
        "broker:9093",
        security_protocol="sasl_ssl",
        sasl_mechanism="scram-sha-512",
        sasl_username="operator",
        sasl_password="hunter2",
    )
    assert isinstance(conn, KafkaConnection)
    kw = connect(conn)
    assert kw["security_protocol"] == "SASL_SSL"
    assert kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kw["sasl_plain_username"] == "operator"
    assert kw["sasl_plain_password"] == "hunter2"
    assert kw["ssl_context"] is not None
    assert kw["ssl_context"].check_hostname
    for text in (repr(conn), str(conn), shown(conn), repr(Secret("hunter2"))):
        assert "hunter2" not in text


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}, "needs --sasl-username"),
        (
            {"security_protocol": "SASL_SSL", "sasl_username": "u", "sasl_password": "p"},
            "needs --sasl-mechanism",
        ),
        ({"sasl_username": "u"}, "SASL settings given"),
        ({"security_protocol": "TLS"}, "unknown security protocol"),
        ({"security_protocol": "SSL", "ssl_certfile": "c.pem"}, "go together"),
    ],
)
def test_incomplete_security_settings_are_one_line_errors(settings: dict[str, str], message: str) -> None:
    with pytest.raises(SecurityError, match=message):
        from_settings("broker:9093", **settings)  # type: ignore[arg-type]


def test_plaintext_is_a_plain_bootstrap_string() -> None:
    assert from_settings("b:9092") == "b:9092"
    assert connect("b:9092") == {"bootstrap_servers": "b:9092"}


def test_dead_letter_reason_kinds_are_bounded_labels() -> None:
    assert reason_kind("json_invalid: Invalid JSON: EOF") == "json_invalid"
    assert reason_kind("missing: ts_ms: field required") == "missing"
    assert reason_kind("some free text with value 12345") == "other"


# -- live page -----------------------------------------------------------------------------------


def _decision(tick_id: int, node: str, weight: float) -> Any:
    from fleetloop.schemas.decisions import Decision

    return Decision.model_validate(
        {
            "ts_ms": tick_id * 1000,
            "tick_id": tick_id,
            "policy": {"name": "p", "version": 1, "hash": "0" * 16, "mode": "enforce"},
            "body": {
                "kind": "routing",
                "entity": "pool-a",
                "pool_id": "pool-a",
                "reason": "least-queue",
                "weights": {node: weight},
            },
        }
    )


def test_live_view_keeps_the_newest_per_entity_and_bounded_history() -> None:
    from fleetloop.daemon.service.live import HISTORY, RECENT, LiveView

    samples = iter(range(10_000))
    view = LiveView(lambda: {"tasks_started": next(samples)})
    for t in range(1, 1000):
        view.record([_decision(t, f"n{t % 3}", 1.0)])
    state = view.state()
    assert len(state["routing"]) == 1
    assert state["routing"][0]["tick_id"] == 999
    assert len(state["recent"]) == RECENT
    assert state["recent"][0]["tick_id"] == 999  # newest first
    assert len(state["kpi"]) == min(999, HISTORY)
    assert state["policy"]["name"] == "p"
