"""``fleetloop actuate``: the group of actuator commands, and the logging every actuator runs under.

Each actuator's module adds its own subcommand and handler (``register(act_sub)``); this module owns
the group and runs each handler with the actuators' log set-up: ``fleetloop.*`` lines go through a
queue to a thread, so a slow stderr never blocks the event loop.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import queue
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

from fleetloop.edges.actuate.haproxy import command as haproxy
from fleetloop.edges.actuate.sglang_router import command as sglang_router
from fleetloop.edges.actuate.vllm_router import command as vllm_router

Handler = Callable[[argparse.Namespace], int]


def register(sub: Any) -> None:
    act = sub.add_parser("actuate", help="apply fleetloop's desired state to a real router")
    act_sub = act.add_subparsers(dest="actuate_command", required=True, parser_class=type(act))
    haproxy.register(act_sub)
    vllm_router.register(act_sub)
    sglang_router.register(act_sub)
    for parser in act_sub.choices.values():
        parser.set_defaults(handler=logged(parser.get_default("handler")))


def logged(handler: Handler) -> Handler:
    """``handler`` run with the actuators' logging set up, and torn down (flushed) after."""

    @wraps(handler)
    def run(args: argparse.Namespace) -> int:
        listener = setup_logging()
        try:
            return handler(args)
        finally:
            listener.stop()

    return run


def setup_logging() -> logging.handlers.QueueListener:
    """Log lines go through a queue to a thread: a slow stderr never blocks the event loop."""
    q: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    listener = logging.handlers.QueueListener(q, handler)
    root = logging.getLogger("fleetloop")
    root.handlers[:] = [logging.handlers.QueueHandler(q)]
    root.setLevel(logging.INFO)
    root.propagate = False
    listener.start()
    return listener
