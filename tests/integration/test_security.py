"""TLS + SASL against Apache Kafka's SASL_SSL listener (tests/support/secure_kafka.py says how it is set up).

Apache Kafka only: the embedded broker has no TLS or SASL. Every fleetloop client is exercised
over SASL_SSL: the daemon (``fleetloop run``, settings from FLEETLOOP_* variables, SCRAM-SHA-512),
``fleetloop policy apply`` (SCRAM-SHA-256, password from a file), the admin helpers (PLAIN), and
the documented ACLs decide who may write ``control.policy``. No secret shows up anywhere.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fleetloop.daemon.brokers import free_port
from fleetloop.daemon.brokers.admin import missing_topics
from fleetloop.kafka_security import from_settings
from tests.support.policies import FOUNDATION_YAML
from tests.support.secure_kafka import USERS, SecureKafka
from tests.support.service import FLEETLOOP, fleetloop_run, total

PREFIX = "sec"
USER = {u.name: u for u in USERS}
SECRETS = [u.password for u in USERS]


@pytest.fixture(scope="module")
def secure() -> Iterator[SecureKafka]:
    broker = SecureKafka()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLEETLOOP, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def _sasl(secure: SecureKafka, user: str) -> list[str]:
    u = USER[user]
    return [
        "--bootstrap-servers",
        secure.secure_bootstrap,
        "--topic-prefix",
        PREFIX,
        "--security-protocol",
        "SASL_SSL",
        "--ssl-cafile",
        str(secure.ca_path),
        "--sasl-mechanism",
        u.mechanism,
        "--sasl-username",
        u.name,
    ]


def _no_secrets(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, "a password leaked into output"


async def test_sasl_ssl_daemon_policy_apply_acls_and_no_secrets(secure: SecureKafka, tmp_path: Path) -> None:
    daemon = USER["fleetloop"]
    env = {  # the daemon takes every setting from the environment
        "FLEETLOOP_BOOTSTRAP_SERVERS": secure.secure_bootstrap,
        "FLEETLOOP_TOPIC_PREFIX": PREFIX,
        "FLEETLOOP_SECURITY_PROTOCOL": "SASL_SSL",
        "FLEETLOOP_SSL_CAFILE": str(secure.ca_path),
        "FLEETLOOP_SASL_MECHANISM": daemon.mechanism,
        "FLEETLOOP_SASL_USERNAME": daemon.name,
        "FLEETLOOP_SASL_PASSWORD": daemon.password,
        "FLEETLOOP_CREATE_TOPICS": "1",
        "FLEETLOOP_POLICY": str(FOUNDATION_YAML),
        "FLEETLOOP_LOG_FORMAT": "json",
    }
    v2 = yaml.safe_load(FOUNDATION_YAML.read_text(encoding="utf-8"))
    v2["metadata"]["version"] = 2
    v2_path = tmp_path / "foundation-v2.yaml"
    v2_path.write_text(yaml.safe_dump(v2), encoding="utf-8")
    op_pw = tmp_path / "operator.password"
    op_pw.write_text(USER["operator"].password + "\n", encoding="utf-8")
    async with fleetloop_run([], tmp_path, port=free_port(), env=env) as svc:
        await svc.wait_status("/readyz", 200, timeout_s=120)
        # Only the operator may write control.policy (the ACLs SECURITY.md documents).
        await asyncio.to_thread(
            secure.acls, "policy-acls", f"{PREFIX}.control.policy", "operator", daemon.name
        )
        denied = await asyncio.to_thread(
            _cli,
            "policy",
            "apply",
            str(v2_path),
            *_sasl(secure, "intruder"),
            env={"FLEETLOOP_SASL_PASSWORD": USER["intruder"].password},
        )
        assert denied.returncode == 2, denied.stderr
        assert len(denied.stderr.strip().splitlines()) == 1
        assert "Authorization" in denied.stderr or "authoriz" in denied.stderr.lower()
        applied = await asyncio.to_thread(
            _cli,
            "policy",
            "apply",
            str(v2_path),
            *_sasl(secure, "operator"),
            "--sasl-password-file",
            str(op_pw),
        )
        assert applied.returncode == 0, applied.stderr
        assert "applied  foundation v2" in applied.stdout
        async with asyncio.timeout(60):
            while total(await svc.metrics(), "fleetloop_policy_info", name="foundation", version="2") != 1:
                await asyncio.sleep(0.3)
        metrics_text = (await svc.get("/metrics")).text
        bodies = [(await svc.get(p)).text for p in ("/healthz", "/readyz")]
    assert svc.proc.returncode == 0
    _no_secrets(
        svc.stderr(), metrics_text, *bodies, denied.stdout, denied.stderr, applied.stdout, applied.stderr
    )
    assert "policy activated" in svc.stderr()


async def test_plain_mechanism_reaches_the_broker(secure: SecureKafka) -> None:
    u = USER["plainuser"]
    conn = from_settings(
        secure.secure_bootstrap,
        security_protocol="SASL_SSL",
        ssl_cafile=str(secure.ca_path),
        sasl_mechanism=u.mechanism,
        sasl_username=u.name,
        sasl_password=u.password,
    )
    missing = await missing_topics(conn, f"plain-{free_port()}")
    assert len(missing) >= 7  # it connected, authenticated and listed topics


@pytest.mark.parametrize(
    ("case", "extra", "env"),
    [
        ("wrong password", [], {"FLEETLOOP_SASL_PASSWORD": "not-" + USER["operator"].password}),
        ("unknown CA", ["--ssl-cafile", "/etc/ssl/certs/ca-certificates.crt"], None),
    ],
)
def test_bad_credentials_or_trust_end_in_one_line_without_secrets(
    secure: SecureKafka, case: str, extra: list[str], env: dict[str, str] | None
) -> None:
    args = _sasl(secure, "operator")
    env = env or {"FLEETLOOP_SASL_PASSWORD": USER["operator"].password}
    if extra:
        i = args.index("--ssl-cafile")
        args[i + 1] = extra[1]
    done = _cli("policy", "apply", str(FOUNDATION_YAML), *args, env=env)
    assert done.returncode == 2, (case, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    _no_secrets(done.stdout, done.stderr)
    assert USER["operator"].password not in done.stderr


def test_credentials_in_the_bootstrap_string_are_refused_and_not_echoed(secure: SecureKafka) -> None:
    pw = USER["operator"].password
    done = _cli("run", "--bootstrap-servers", f"operator:{pw}@{secure.secure_bootstrap}")
    assert done.returncode == 2
    assert pw not in done.stderr
    assert "operator:" not in done.stderr
    assert "must not carry credentials" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
