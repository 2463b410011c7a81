"""What every subcommand shares: the one-line user error and common arguments."""

from __future__ import annotations

import argparse

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


def policy_from(path: str | None) -> CompiledPolicy:
    return load_policy(path) if path else builtin_policy("default")


def quiet_client_logs() -> None:
    """Commands that report connection problems themselves (one line) silence the client's own log."""
    import logging

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
