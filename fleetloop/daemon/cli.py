"""The ``fleetloop`` command: the composition root (the only module that wires the runtime and sim).

Every subcommand lives in its own module with ``register(subparsers)`` and a handler returning an
exit code. Errors a user can cause (a bad flag, a bad file, an unreachable broker) end as one line
on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleetloop import __version__
from fleetloop.daemon.cli_common import UsageError

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Module docstrings serve as descriptions; their reST literals read as noise in --help.
        if isinstance(kwargs.get("description"), str):
            kwargs["description"] = kwargs["description"].replace("``", "")
        # A flag is spelled out: argparse would take --bootstrap-server (singular) for
        # --bootstrap-servers, and a later flag could make an accepted abbreviation ambiguous.
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        for action in self._actions:
            # argparse names a missing subcommand by its internal dest ("required: policy_command").
            if (
                isinstance(action, argparse._SubParsersAction)
                and message == f"the following arguments are required: {action.dest}"
            ):
                message = f"which command? one of: {', '.join(action.choices)}"
        raise UsageError(f"{self.prog}: {message}")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extra = super().parse_known_args(args, namespace)
        if extra and " " in self.prog:
            # A subcommand names itself in the refusal ("fleetloop bench soak: unrecognized
            # arguments: ..."), not the top-level "fleetloop" argparse would name.
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return ns, extra


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``FLEETLOOP_*`` variables in ``environ`` (default: the process's)
    become the defaults of their flags (fleetloop.daemon.service.settings)."""
    parser = _Parser(
        prog="fleetloop", description="A streaming control plane for LLM inference fleets, on Kafka."
    )
    parser.add_argument("--version", action="version", version=f"fleetloop {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    # Each module registers its subcommand(s). Keep this list sorted.
    from fleetloop.daemon import commands

    commands.register(sub)
    # The fleet-wide second stage (fleetloop rollup).
    from fleetloop.daemon.rollup import command as rollup_command

    rollup_command.register(sub)
    # Benchmarks (`fleetloop bench ...`): they drive the runtime and generated fleets.
    from fleetloop.bench import command as bench_command

    bench_command.register(sub)
    # The simulator's commands (the composition root is the one place that may import sim).
    from fleetloop.sim import command as sim_command

    sim_command.register(sub)
    # What-if on a recorded window: reads the broker like replay, runs the simulator.
    from fleetloop.whatif import command as whatif_command

    whatif_command.register(sub)
    # The edges: runtime adapters and the emulated fleet.
    from fleetloop.edges.actuate import command as actuate_command
    from fleetloop.edges.fleet import command as fleet_command
    from fleetloop.edges.scrape import command as scrape_command

    actuate_command.register(sub)
    fleet_command.register(sub)
    scrape_command.register(sub)
    # Every long flag also reads FLEETLOOP_<FLAG> from the environment (service/settings.py).
    from fleetloop.daemon.service.settings import apply_env

    apply_env(parser, environ)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """A subcommand registered with only a ``help`` line shows that line atop its own ``--help``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not sub.description and helps.get(name):
                    sub.description = str(helps[name])
                _describe(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code. A reader that closes the pipe early (``fleetloop policy status
    | head -3``) ends the command quietly, with the exit code a shell gives a tool SIGPIPE ended (141)."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # a closed pipe often shows only here, after the last write
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # a socket's broken pipe, not the reader's: not ours to hide
        # The interpreter flushes stdout once more at exit: let that write go nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _stdout_closed() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone: poll reports an error on it."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a stream without a descriptor
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _main(argv: Sequence[str] | None) -> int:
    from fleetloop.daemon.service.settings import EnvError
    from fleetloop.policies.registry import PolicyError
    from fleetloop.user_input import UserInputError

    try:
        args = build_parser().parse_args(argv)
        handler: Handler = args.handler
        return handler(args)
    except UsageError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    except EnvError as exc:
        sys.stderr.write(f"fleetloop: {exc}\n")
        return 2
    except PolicyError as exc:
        sys.stderr.write(f"fleetloop: policy refused: {exc}\n")
        return 2
    except UserInputError as exc:  # fleetloop.user_input: a file or flag a command did not word itself
        msg = str(exc)
        sys.stderr.write(f"{msg if msg.startswith('fleetloop') else 'fleetloop: ' + msg}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("fleetloop: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
