"""What every subcommand shares: the one-line user error and common arguments."""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
from collections.abc import Iterator

from fleetloop.daemon.observe.decode import Door
from fleetloop.kafka_security import Bootstrap, SecurityError, connection_from_args
from fleetloop.policies.registry import CompiledPolicy, builtin_policy, load_policy
from fleetloop.user_input import UsageError

__all__ = [  # UsageError too: the commands import it from here
    "UsageError",
    "connection_from",
    "door_from",
    "held_client_logs",
    "log_args",
    "policy_from",
    "quiet_client_logs",
]


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
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


@contextlib.contextmanager
def held_client_logs(limit: int = 200) -> Iterator[None]:
    """The Kafka client's log records during a long-running command's start-up, held back: dropped
    if the start-up fails (its one-line error says why, and is the only line), emitted in order
    once it succeeds. The client's logging is as configured before and after."""
    client = logging.getLogger("aiokafka")
    held: collections.deque[logging.LogRecord] = collections.deque(maxlen=limit)

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record)

    hold = Hold()
    propagate = client.propagate
    client.addHandler(hold)
    client.propagate = False
    started = False
    try:
        yield
        started = True
    finally:
        client.removeHandler(hold)
        client.propagate = propagate
    if started:
        for record in held:
            logging.getLogger(record.name).handle(record)


def door_from(window: str, max_record_bytes: int, verb: str = "run") -> Door:
    """The door of ``fleetloop run`` (and replay): ``--event-time-window PAST_S,FUTURE_S`` (or ``off``)."""
    if not 1024 <= max_record_bytes <= 64 * 1024 * 1024:
        raise UsageError(
            f"fleetloop {verb}: --max-record-bytes must be between 1024 and 67108864, got {max_record_bytes}"
        )
    if window.strip().lower() == "off":
        return Door(max_record_bytes, None, None)
    try:
        past_s, future_s = (float(x) for x in window.split(","))
    except ValueError:
        raise UsageError(
            f"fleetloop {verb}: --event-time-window wants PAST_S,FUTURE_S (e.g. 600,30) or off, "
            f"got {window!r}"
        ) from None
    if not (0 <= past_s <= 30 * 86_400 and 0 <= future_s <= 86_400):
        raise UsageError(f"fleetloop {verb}: --event-time-window: PAST_S 0..2592000, FUTURE_S 0..86400")
    return Door(max_record_bytes, round(past_s * 1000), round(future_s * 1000))
