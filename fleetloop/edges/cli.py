"""What the edge commands share: their one-line user error, the broker arguments, and how an actuator
starts following ``control.state``.

(The daemon's ``cli_common`` imports the policy registry; edges may not, so they keep their own.)
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from functools import wraps

from aiokafka.errors import KafkaError

from fleetloop.kafka_security import Bootstrap, SecurityError, connection_from_args, error_text, shown
from fleetloop.router.follow import StateFollower
from fleetloop.user_input import UserInputError


class EdgeUsageError(Exception):
    """A problem the user can fix: printed as one line on stderr, exit code 2."""


def connection_from(args: argparse.Namespace) -> Bootstrap:
    """The Kafka connection (TLS, SASL) the broker flags describe; a one-line error when incomplete."""
    try:
        return connection_from_args(args)
    except SecurityError as exc:
        raise EdgeUsageError(f"fleetloop: {exc}") from None


def one_line_errors(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn an :class:`EdgeUsageError` (or a :class:`UserInputError`) into one line on stderr and
    exit code 2."""

    @wraps(handler)
    def run(args: argparse.Namespace) -> int:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        try:
            return handler(args)
        except (EdgeUsageError, UserInputError) as exc:
            sys.stderr.write(f"{exc}\n")
            return 2

    return run


async def start_following(follower: StateFollower, prog: str, conn: Bootstrap) -> None:
    """Catch up on ``control.state``; a broker that cannot be reached is one line naming ``prog``."""
    try:
        await follower.start()
    except (KafkaError, OSError, TimeoutError, RuntimeError) as exc:
        raise EdgeUsageError(
            f"{prog}: cannot follow control.state at {shown(conn)}: {error_text(exc)}"
        ) from None
