"""A broker that cannot be reached, or connection flags that cannot work, end every command in ONE
line naming the problem (exit 2): the error's type at most once, no client log line before it, and
a TLS file or an empty --bootstrap-servers named before any connection is tried."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from pathlib import Path

import pytest
from aiohttp import web
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from fleetloop.cli.main import main
from fleetloop.daemon.cli_common import held_client_logs
from fleetloop.kafka_security import error_text
from tests.support.haproxy import running_haproxy
from tests.support.http import free_port, nodes
from tests.support.policies import FOUNDATION_YAML
from tests.support.service import FLEETLOOP
from tests.support.vllm_router import start_vllm_router

REFUSED = "127.0.0.1:1"  # nothing listens: connection refused at once, no broker needed
REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [FLEETLOOP, *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO, env=env
    )


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """In process: these fail before any client (or its log) exists."""
    code = main(argv)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (["run", "--bootstrap-servers", REFUSED], f"fleetloop run: cannot reach Kafka at {REFUSED}: "),
        (["policy", "apply", str(FOUNDATION_YAML), "--bootstrap-servers", REFUSED],
         f"fleetloop policy: cannot reach Kafka at {REFUSED}: "),
        (["fleet", "--scenario", "scenarios/steady-chat.yaml", "--seconds", "1", "--bootstrap-servers",
          REFUSED], f"fleetloop fleet: cannot use Kafka at {REFUSED}: "),
        (["scrape", "--runtime", "vllm", "--target", "127.0.0.1:9", "--pool", "p", "--duration-s", "1",
          "--bootstrap-servers", REFUSED], f"fleetloop scrape: cannot use Kafka at {REFUSED}: "),
        (["rollup", "--bootstrap-servers", REFUSED], f"fleetloop rollup: cannot reach {REFUSED}: "),
        (["demo", "--seconds", "10", "--bootstrap-servers", REFUSED],
         f"fleetloop demo: cannot use Kafka at {REFUSED}: "),
    ],
)  # fmt: skip
def test_an_unreachable_broker_is_one_line_naming_the_error_once(argv: list[str], starts: str) -> None:
    line = _one_line(_cli(*argv))
    assert line.startswith(starts + "Unable to bootstrap from"), line
    assert "KafkaConnectionError" not in line
    assert "[aiokafka]" not in line


def test_a_missing_tls_file_is_named_with_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    ssl = ["run", "--bootstrap-servers", REFUSED, "--security-protocol", "SSL"]
    done = _main([*ssl, "--ssl-cafile", "/nonexistent"], capsys)
    assert _one_line(done) == "fleetloop: --ssl-cafile /nonexistent: no such file"


def test_a_file_that_is_no_certificate_is_named_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "key.pem"
    key.write_text("not a key\n")
    ssl = ["run", "--bootstrap-servers", REFUSED, "--security-protocol", "SSL"]
    done = _main([*ssl, "--ssl-certfile", str(tmp_path), "--ssl-keyfile", str(key)], capsys)
    assert _one_line(done) == f"fleetloop: --ssl-certfile {tmp_path}: is a directory, not a file"
    done = _main([*ssl, "--ssl-cafile", str(key)], capsys)
    line = _one_line(done)
    assert line.startswith(f"fleetloop: cannot load TLS files (--ssl-cafile {key}): "), line
    assert "cannot reach" not in line


def test_a_password_file_that_is_not_text_is_named_with_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"\xc1\x00binary")
    sasl = ["run", "--bootstrap-servers", REFUSED, "--security-protocol", "SASL_PLAINTEXT"]
    done = _main([*sasl, "--sasl-username", "u", "--sasl-password-file", str(secret)], capsys)
    assert (
        _one_line(done) == f"fleetloop: --sasl-password-file {secret}: not UTF-8 text (byte 0xc1 at offset 0)"
    )


@pytest.mark.parametrize("bootstrap", ["", " ", "broker:9092,"])
def test_an_empty_bootstrap_address_is_refused(bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line(_main(["run", "--bootstrap-servers", bootstrap], capsys))
    assert line.startswith("fleetloop: --bootstrap-servers "), line
    assert "empty address" in line


def test_error_text_names_the_type_at_most_once() -> None:
    assert error_text(KafkaConnectionError("Unable to bootstrap from [x]")) == "Unable to bootstrap from [x]"
    assert error_text(KafkaTimeoutError()) == "KafkaTimeoutError"
    assert error_text(TimeoutError()) == "TimeoutError"
    assert error_text(ConnectionRefusedError("refused\n  twice")) == "ConnectionRefusedError: refused twice"


def _failed_start_up(client: logging.Logger) -> None:
    with held_client_logs():
        client.error('Unable connect to "127.0.0.1:1"')
        raise RuntimeError("start-up failed")


def test_client_logs_are_dropped_when_start_up_fails_and_kept_when_it_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = logging.getLogger("aiokafka.conn")
    # A command run in process earlier in the session (policy apply, status, ...) silences the client
    # for good (quiet_client_logs: level CRITICAL); `run`, whose start-up this is, never does.
    aiokafka = logging.getLogger("aiokafka")
    level = aiokafka.level
    aiokafka.setLevel(logging.NOTSET)
    try:
        _held_and_replayed(client, caplog)
    finally:
        aiokafka.setLevel(level)


def _held_and_replayed(client: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        with pytest.raises(RuntimeError):
            _failed_start_up(client)
        assert caplog.records == []
        with held_client_logs():
            client.warning("first")
            client.warning("second")
            assert caplog.records == []
        assert [r.getMessage() for r in caplog.records] == ["first", "second"]
        client.warning("after")  # a running command's client logs as configured
        assert caplog.records[-1].getMessage() == "after"
    assert logging.getLogger("aiokafka").propagate
    assert not logging.getLogger("aiokafka").handlers


# -- the actuators: their target answers, the broker does not -------------------------------------


def _follow_refused(done: subprocess.CompletedProcess[str], prog: str) -> None:
    line = _one_line(done)
    assert line.startswith(f"{prog}: cannot follow control.state at {REFUSED}: Unable to bootstrap"), line


async def _cli_async(*args: str) -> subprocess.CompletedProcess[str]:
    """:func:`_cli` off the event loop (the test's own servers keep answering meanwhile)."""
    return await asyncio.to_thread(_cli, *args)


async def test_actuate_haproxy_with_an_unreachable_broker_is_one_line(tmp_path: Path) -> None:
    """Its consumer was started outside the try that stops it: the one line came with two more
    (``Unclosed AIOKafkaConsumer`` and the consumer's repr)."""
    sock = tmp_path / "admin.sock"
    config = (
        f"global\n    stats socket {sock} mode 600 level admin\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
        f"frontend fe\n    bind 127.0.0.1:{free_port()}\n    default_backend chat\n"
        f"backend chat\n    server s0 127.0.0.1:{free_port()} weight 100\n"
    )
    bmap = tmp_path / "backends.yaml"
    bmap.write_text("pools:\n  chat:\n    backend: chat\n    model: m\n    servers:\n      chat/0: s0\n")
    async with running_haproxy(tmp_path, config):
        done = await _cli_async(
            "actuate", "haproxy", "--runtime-api", f"unix:{sock}", "--backend-map", str(bmap),
            "--bootstrap-servers", REFUSED,
        )  # fmt: skip
    _follow_refused(done, "fleetloop actuate haproxy")


async def test_actuate_vllm_router_with_an_unreachable_broker_is_one_line(tmp_path: Path) -> None:
    async with nodes(1, lambda _node: _ok) as ports:
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        wmap = tmp_path / "workers.yaml"
        wmap.write_text(f"pools:\n  chat:\n    chat/0: {urls[0]}\n")
        router, port = await start_vllm_router(urls, "round_robin", tmp_path / "vllm-router.log")
        try:
            done = await _cli_async(
                "actuate", "vllm-router", "--url", f"http://127.0.0.1:{port}", "--worker-map", str(wmap),
                "--bootstrap-servers", REFUSED,
            )  # fmt: skip
        finally:
            router.terminate()
            router.wait(10)
    _follow_refused(done, "fleetloop actuate vllm-router")


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")
