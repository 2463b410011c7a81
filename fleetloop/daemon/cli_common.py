"""What every subcommand shares: the one-line user error and common arguments."""

from __future__ import annotations

import argparse
import os

from fleetloop.daemon.service.security import MECHANISMS, PROTOCOLS, Bootstrap, SecurityError, from_settings
from fleetloop.policies.registry import CompiledPolicy, builtin_policy, load_policy

PASSWORD_ENV = "FLEETLOOP_SASL_PASSWORD"  # noqa: S105 - the variable's name, not a password


class UsageError(Exception):
    """A problem the user can fix: printed as one line, exit code 2."""


def bootstrap_arg(p: argparse.ArgumentParser, *, required: bool) -> None:
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
    """TLS and SASL flags every Kafka-using command takes (see fleetloop.daemon.service.security)."""
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


def connection_from(args: argparse.Namespace) -> Bootstrap:
    """The Kafka connection the flags (and FLEETLOOP_* environment) describe; one-line errors."""
    try:
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
    except SecurityError as exc:
        raise UsageError(f"fleetloop: {exc}") from None


def log_args(p: argparse.ArgumentParser) -> None:
    """Log flags of the long-running commands."""
    p.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="json: every line on stderr is one JSON object, the Kafka client's included",
    )
    p.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info", help="default: info"
    )


def policy_from(path: str | None) -> CompiledPolicy:
    return load_policy(path) if path else builtin_policy("default")


def quiet_client_logs() -> None:
    """Commands that report connection problems themselves (one line) silence the client's own log."""
    import logging

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
