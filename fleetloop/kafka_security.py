"""Kafka client security: one place that turns settings into aiokafka connection arguments.

A top-level module (stdlib + aiokafka only), so the daemon, the CLI and every edge (scrapers,
actuators, the router library) can share it without importing each other.

Every Kafka client fleetloop makes (the daemon's consumers and producer, the CLI's admin and
probe clients, edges such as scrapers and actuators) takes its connection from
:func:`connect`: ``AIOKafkaConsumer(**connect(conn), ...)``. ``conn`` is a plain bootstrap string
(PLAINTEXT) or a :class:`KafkaConnection` carrying TLS and SASL settings:

- ``security_protocol``: ``PLAINTEXT`` | ``SSL`` | ``SASL_PLAINTEXT`` | ``SASL_SSL``;
- TLS: ``ssl_cafile`` (the CA that signed the broker's certificate; the system store when unset),
  ``ssl_certfile``/``ssl_keyfile`` (a client certificate, for mTLS), ``ssl_check_hostname``;
- SASL: ``sasl_mechanism`` ``PLAIN`` | ``SCRAM-SHA-256`` | ``SCRAM-SHA-512``, ``sasl_username``
  and ``sasl_password`` (from ``FLEETLOOP_SASL_PASSWORD`` or ``--sasl-password-file``; never a
  command-line flag, where ``ps`` would show it).

Secrets stay out of sight: :class:`Secret` renders as ``***`` in ``repr``/``str``, and
:func:`redact` strips any ``user:password@`` from a bootstrap string before it is echoed in a log
line or an error. Credentials inside ``--bootstrap-servers`` are refused (one line, not echoed).
"""

from __future__ import annotations

import argparse
import os
import re
import ssl
from dataclasses import dataclass
from typing import Any, Final, Literal

from aiokafka.helpers import create_ssl_context

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
PROTOCOLS: Final[tuple[Protocol, ...]] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS: Final[tuple[Mechanism, ...]] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORD_ENV: Final = "FLEETLOOP_SASL_PASSWORD"  # noqa: S105 - the variable's name, not a password
_USERINFO = re.compile(r"(?:^|(?<=[,;\s/]))[^,;\s/@]*@")


class SecurityError(ValueError):
    """Settings that cannot make a secure connection (a one-line user error; never echoes secrets)."""


class Secret:
    """A string that never shows itself in a repr, a log line or an f-string."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))


def redact(bootstrap: str) -> str:
    """``bootstrap`` with any ``user[:password]@`` removed from each address."""
    return _USERINFO.sub("***@", bootstrap)


def check_bootstrap(bootstrap: str) -> str:
    """The bootstrap string, or :class:`SecurityError` when it embeds credentials."""
    if "@" in bootstrap:
        raise SecurityError(
            f"--bootstrap-servers must not carry credentials ({redact(bootstrap)}): "
            "use --sasl-username and FLEETLOOP_SASL_PASSWORD (or --sasl-password-file)"
        )
    return bootstrap


@dataclass(frozen=True, slots=True)
class KafkaConnection:
    """Where and how to connect. ``str(conn)`` is the redacted bootstrap string."""

    bootstrap_servers: str
    security_protocol: Protocol = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: Mechanism | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None

    def __post_init__(self) -> None:
        check_bootstrap(self.bootstrap_servers)
        if self.security_protocol not in PROTOCOLS:
            raise SecurityError(
                f"unknown security protocol {self.security_protocol!r}; known: {', '.join(PROTOCOLS)}"
            )
        sasl = self.security_protocol.startswith("SASL_")
        if sasl:
            if self.sasl_mechanism not in MECHANISMS:
                raise SecurityError(
                    f"{self.security_protocol} needs --sasl-mechanism, one of {', '.join(MECHANISMS)}"
                )
            if not self.sasl_username or not self.sasl_password:
                raise SecurityError(
                    f"{self.security_protocol} needs --sasl-username and a password "
                    "(FLEETLOOP_SASL_PASSWORD or --sasl-password-file)"
                )
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password:
            raise SecurityError(
                f"SASL settings given but --security-protocol is {self.security_protocol}; "
                "use SASL_SSL (or SASL_PLAINTEXT on a trusted network)"
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise SecurityError(
                "--ssl-certfile and --ssl-keyfile go together (a client certificate and its key)"
            )

    def __str__(self) -> str:
        return redact(self.bootstrap_servers)

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        try:
            ctx: ssl.SSLContext = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
        except (OSError, ssl.SSLError) as exc:
            files = (
                ("--ssl-cafile", self.ssl_cafile),
                ("--ssl-certfile", self.ssl_certfile),
                ("--ssl-keyfile", self.ssl_keyfile),
            )
            given = ", ".join(f"{flag} {path}" for flag, path in files if path) or "the system CA store"
            raise SecurityError(f"cannot load TLS files ({given}): {error_text(exc)}") from None
        ctx.check_hostname = self.ssl_check_hostname
        return ctx

    def kwargs(self) -> dict[str, Any]:
        """aiokafka keyword arguments (``bootstrap_servers`` included) for any client class."""
        out: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.tls:
            out["ssl_context"] = self.ssl_context()
        if self.security_protocol.startswith("SASL_"):
            assert self.sasl_password is not None
            out["sasl_mechanism"] = self.sasl_mechanism
            out["sasl_plain_username"] = self.sasl_username
            out["sasl_plain_password"] = self.sasl_password.reveal()
        return out


Bootstrap = str | KafkaConnection


def connect(bootstrap: Bootstrap) -> dict[str, Any]:
    """Connection keyword arguments for ``AIOKafka{Consumer,Producer,AdminClient}``."""
    if isinstance(bootstrap, KafkaConnection):
        return bootstrap.kwargs()
    return {"bootstrap_servers": check_bootstrap(bootstrap)}


def shown(bootstrap: Bootstrap) -> str:
    """What a log line or an error may print for ``bootstrap``."""
    return str(bootstrap) if isinstance(bootstrap, KafkaConnection) else redact(bootstrap)


def error_text(exc: BaseException) -> str:
    """``exc`` for a one-line error, its type named at most once. aiokafka's errors print as
    ``KafkaConnectionError: Unable to bootstrap ...``: the message alone says what went wrong there;
    an error with no message is its type (``KafkaTimeoutError``); any other is ``Type: message``."""
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    if text.startswith(f"{name}: "):
        return text[len(name) + 2 :]
    if not text:
        return name
    return text if name in text else f"{name}: {text}"


def from_settings(
    bootstrap_servers: str,
    *,
    security_protocol: str = "PLAINTEXT",
    ssl_cafile: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    ssl_check_hostname: bool = True,
    sasl_mechanism: str | None = None,
    sasl_username: str | None = None,
    sasl_password: str | None = None,
    sasl_password_file: str | None = None,
) -> Bootstrap:
    """A :class:`KafkaConnection` from flat settings (flags, environment); a plain string for PLAINTEXT."""
    if sasl_password_file:
        try:
            with open(sasl_password_file, encoding="utf-8") as f:
                sasl_password = f.read().strip()
        except OSError as exc:
            raise SecurityError(
                f"cannot read --sasl-password-file {sasl_password_file}: {exc.strerror}"
            ) from None
        except UnicodeDecodeError as exc:
            raise SecurityError(
                f"--sasl-password-file {sasl_password_file}: not UTF-8 text "
                f"(byte {exc.object[exc.start]:#04x} at offset {exc.start})"
            ) from None
    if not all(a.strip() for a in bootstrap_servers.split(",")):
        raise SecurityError(
            f"--bootstrap-servers {bootstrap_servers!r}: an empty address (want HOST:PORT[,HOST:PORT...])"
        )
    protocol = security_protocol.upper()
    if protocol not in PROTOCOLS:
        raise SecurityError(f"unknown security protocol {security_protocol!r}; known: {', '.join(PROTOCOLS)}")
    mechanism = sasl_mechanism.upper() if sasl_mechanism else None
    if mechanism is not None and mechanism not in MECHANISMS:
        raise SecurityError(f"unknown SASL mechanism {sasl_mechanism!r}; known: {', '.join(MECHANISMS)}")
    conn = KafkaConnection(
        bootstrap_servers=bootstrap_servers,
        security_protocol=protocol,
        ssl_cafile=ssl_cafile,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        ssl_check_hostname=ssl_check_hostname,
        sasl_mechanism=mechanism,
        sasl_username=sasl_username,
        sasl_password=Secret(sasl_password) if sasl_password else None,
    )
    if conn.tls:  # a missing file is named now, not as the first client's TLS error
        for flag, path in (
            ("--ssl-cafile", ssl_cafile),
            ("--ssl-certfile", ssl_certfile),
            ("--ssl-keyfile", ssl_keyfile),
        ):
            if path is not None:
                _check_file(flag, path)
        conn.ssl_context()  # and a file that is no certificate or key is named now too
    if protocol == "PLAINTEXT":
        return conn.bootstrap_servers
    return conn


def _check_file(flag: str, path: str) -> None:
    """``path`` is a file this process can read, or :class:`SecurityError` naming ``flag`` and it."""
    if not os.path.exists(path):
        raise SecurityError(f"{flag} {path}: no such file")
    if os.path.isdir(path):
        raise SecurityError(f"{flag} {path}: is a directory, not a file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise SecurityError(f"{flag} {path}: cannot read ({exc.strerror or exc})") from None


def bootstrap_arg(p: argparse.ArgumentParser, *, required: bool) -> None:
    """``--bootstrap-servers``, ``--topic-prefix`` and the TLS/SASL flags of every Kafka-using command."""
    p.add_argument(
        "--bootstrap-servers",
        required=required,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (comma separated)",
    )
    p.add_argument(
        "--topic-prefix", default="", metavar="PREFIX", help="prefix of every topic name (default: none)"
    )
    security_args(p)


def security_args(p: argparse.ArgumentParser) -> None:
    """TLS and SASL flags every Kafka-using command takes (see fleetloop.kafka_security)."""
    g = p.add_argument_group("Kafka security (TLS, SASL)")
    g.add_argument(
        "--security-protocol",
        type=str.upper,
        choices=PROTOCOLS,
        default="PLAINTEXT",
        help="how to talk to the brokers (default: PLAINTEXT)",
    )
    g.add_argument(
        "--ssl-cafile", metavar="FILE", help="CA certificate(s) that signed the brokers' certificates"
    )
    g.add_argument("--ssl-certfile", metavar="FILE", help="client certificate (mutual TLS)")
    g.add_argument("--ssl-keyfile", metavar="FILE", help="the client certificate's private key")
    g.add_argument(
        "--ssl-no-check-hostname",
        action="store_true",
        help="accept a broker certificate whose name does not match the address (not recommended)",
    )
    g.add_argument("--sasl-mechanism", type=str.upper, choices=MECHANISMS, help="SASL mechanism")
    g.add_argument("--sasl-username", metavar="NAME", help="SASL user (the principal ACLs name)")
    g.add_argument(
        "--sasl-password-file",
        metavar="FILE",
        help=f"file holding the SASL password (or set {PASSWORD_ENV}; never a flag)",
    )


def connection_from_args(args: argparse.Namespace) -> Bootstrap:
    """The connection :func:`security_args`' flags describe (:class:`SecurityError` when incomplete)."""
    return from_settings(
        args.bootstrap_servers,
        security_protocol=args.security_protocol,
        ssl_cafile=args.ssl_cafile,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        ssl_check_hostname=not args.ssl_no_check_hostname,
        sasl_mechanism=args.sasl_mechanism,
        sasl_username=args.sasl_username,
        sasl_password=(os.environ.get(PASSWORD_ENV) or None)
        if str(args.security_protocol).startswith("SASL_")
        else None,
        sasl_password_file=args.sasl_password_file,
    )
