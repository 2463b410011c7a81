"""What every subcommand shares: the one-line user error and common arguments."""

from __future__ import annotations

import argparse

from fleetloop.kafka_security import Bootstrap, SecurityError, connection_from_args, security_args
from fleetloop.policies.registry import CompiledPolicy, builtin_policy, load_policy


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


def connection_from(args: argparse.Namespace) -> Bootstrap:
    """The Kafka connection the flags (and FLEETLOOP_* environment) describe; one-line errors."""
    try:
        return connection_from_args(args)
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
