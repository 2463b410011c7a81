"""Apache Kafka with a SASL_SSL listener on loopback, for the security tests.

Set-up, all made inside the test session:
- a CA and a server certificate for ``127.0.0.1``/``localhost`` (``cryptography``), written as PEM;
  the broker reads them as a PEM keystore (``ssl.keystore.type=PEM``);
- SCRAM users created by Kafka's own ``kafka.tools.StorageTool format --add-scram`` (SCRAM-SHA-256
  and SCRAM-SHA-512), a PLAIN user in the listener's JAAS line;
- ``StandardAuthorizer`` on, ``allow.everyone.if.no.acl.found=true``, so the ACLs a test creates on
  ``control.policy`` (``KafkaAcls.java``, Kafka's own ``Admin`` API) are what decides who may write it;
- a PLAINTEXT ``INTERNAL`` listener for inter-broker traffic and the readiness probe (principal
  ``ANONYMOUS``, a super user): clients under test only ever use the SASL_SSL port.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fleetloop.clock import wall_ms
from fleetloop.daemon.brokers.apache import (
    ApacheKafka,
    format_storage,
    java_command,
    kraft_settings,
    render_properties,
)
from fleetloop.daemon.brokers.base import free_ports

HERE: Final = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password: str
    mechanism: str  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512


USERS: Final = (
    User("operator", "op-Secret-7f3a9c", "SCRAM-SHA-256"),
    User("fleetloop", "fl-Secret-2b81d4", "SCRAM-SHA-512"),
    User("intruder", "in-Secret-9e04aa", "SCRAM-SHA-256"),
    User("plainuser", "pl-Secret-51c6e0", "PLAIN"),
)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_certificates(out: Path) -> tuple[Path, Path]:
    """(ca.pem, server.pem with its PKCS#8 key first and the certificate chain after)."""
    now = dt.datetime.fromtimestamp(wall_ms() / 1000, dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fleetloop test CA"))
        .issuer_name(_name("fleetloop test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_path, server_path = out / "ca.pem", out / "server.pem"
    ca_path.write_bytes(ca.public_bytes(pem))
    server_path.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + cert.public_bytes(pem)
        + ca.public_bytes(pem)
    )
    return ca_path, server_path


class SecureKafka(ApacheKafka):
    """Apache Kafka 4.x KRaft with SASL_SSL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and ACLs."""

    def __init__(self) -> None:
        super().__init__(heap_mb=384)
        self.secure_port: int | None = None
        self.ca_path: Path | None = None

    @property
    def secure_bootstrap(self) -> str:
        assert self.secure_port is not None
        return f"127.0.0.1:{self.secure_port}"

    def _prepare(self, workdir: Path) -> tuple[int, Sequence[str]]:
        home, java = self._check_install()
        internal, secure, controller = free_ports(3, self._host)
        self.secure_port = secure
        self.ca_path, server_pem = make_certificates(workdir)
        plain = " ".join(f'user_{u.name}="{u.password}"' for u in USERS if u.mechanism == "PLAIN")
        settings = {
            **kraft_settings(node_id=1, controller_port=controller, data_dir=workdir / "data"),
            "listeners": f"INTERNAL://127.0.0.1:{internal},SASL_SSL://127.0.0.1:{secure},"
            f"CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"INTERNAL://127.0.0.1:{internal},SASL_SSL://127.0.0.1:{secure}",
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};"
            ),
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(server_pem),
            "ssl.client.auth": "none",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "true",
        }
        config = workdir / "server.properties"
        (workdir / "logs").mkdir()
        config.write_text(render_properties(settings), encoding="utf-8")
        scram = [
            arg
            for u in USERS
            if u.mechanism.startswith("SCRAM")
            for arg in ("--add-scram", f"{u.mechanism}=[name={u.name},password={u.password}]")
        ]
        format_storage(home, java, workdir, config, scram)
        broker = java_command(
            home, "kafka.Kafka", [str(config)], logs_dir=workdir / "logs", heap_mb=self.heap_mb, java=java
        )
        return internal, broker  # readiness is probed on the PLAINTEXT internal listener

    def acls(self, *args: str) -> str:
        """Run ``KafkaAcls.java`` (Kafka's Admin API) against the internal listener; its stdout."""
        home, java = self._check_install()
        argv = [java, "-cp", f"{home / 'lib'}/*", str(HERE / "KafkaAcls.java"), self.bootstrap_servers, *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"KafkaAcls {' '.join(args)} failed: {done.stderr[-2000:]}")
        return done.stdout
