"""The ``fleetloop`` command: the composition root (the only module that wires the runtime and sim).

Every subcommand lives in its own module with ``register(subparsers)`` and a handler returning an
exit code; that module is imported only when its command runs (:data:`COMMANDS`). Errors a user
can cause (a bad flag, a bad file, an unreachable broker) end as one line on stderr and exit code
2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final

from fleetloop import __version__
from fleetloop.daemon.service.settings import EnvError, apply_env
from fleetloop.policies.errors import PolicyError
from fleetloop.user_input import UsageError, UserInputError

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


# The subcommands, in the order ``fleetloop --help`` lists them: name -> the line it shows, and the
# function that imports the module defining the command and lets it add its parser. A module is
# imported only when its command runs (``fleetloop --help`` imports none of them); the whole tree is
# built for the settings table and the tests. A module may add several commands (run and policy).


def _runtime(sub: Any) -> None:
    from fleetloop.cli import commands  # noqa: PLC0415 - lazy: imported when its command runs

    commands.register(sub)


def _replay(sub: Any) -> None:
    from fleetloop.daemon.replay import command  # noqa: PLC0415 - lazy: imported when its command runs

    command.register(sub)


def _demo(sub: Any) -> None:
    from fleetloop.demo import demo  # noqa: PLC0415 - lazy: imported when its command runs

    demo.register(sub)


def _rollup(sub: Any) -> None:
    # The fleet-wide second stage.
    from fleetloop.daemon.rollup import command  # noqa: PLC0415 - lazy: imported when its command runs

    command.register(sub)


def _bench(sub: Any) -> None:
    # Benchmarks drive the runtime and generated fleets.
    from fleetloop.bench import command  # noqa: PLC0415 - lazy: imported when its command runs

    command.register(sub)


def _sim(sub: Any) -> None:
    # The composition root is the one place that may import the simulator's commands.
    from fleetloop.sim import command  # noqa: PLC0415 - lazy: imported when its command runs

    command.register(sub)


def _whatif(sub: Any) -> None:
    # Reads the broker like replay, runs the simulator.
    from fleetloop.whatif import command  # noqa: PLC0415 - lazy: imported when its command runs

    command.register(sub)


def _actuate(sub: Any) -> None:
    from fleetloop.edges.actuate import command  # noqa: PLC0415 - lazy: imported when its command runs

    command.register(sub)


def _fleet(sub: Any) -> None:
    from fleetloop.edges.fleet import command  # noqa: PLC0415 - lazy: imported when its command runs

    command.register(sub)


def _scrape(sub: Any) -> None:
    from fleetloop.edges.scrape import command  # noqa: PLC0415 - lazy: imported when its command runs

    command.register(sub)


COMMANDS: Final[dict[str, tuple[str, Callable[[Any], None]]]] = {
    "run": ("run the daemon (the sidecar control loop)", _runtime),
    "policy": ("validate, apply, diff, roll back policy documents; status", _runtime),
    "replay": ("recompute recorded decisions from recorded inputs, or a what-if", _replay),
    "demo": ("run the daemon and a simulated fleet over Kafka, end to end", _demo),
    "rollup": ("fleet-wide figures from every shard's summary (the second stage), to control.state", _rollup),
    "bench": ("benchmarks that print figures (ratios from the same run)", _bench),
    "sim": ("simulate a fleet scenario in virtual time under a policy or baseline", _sim),
    "whatif": ("simulate a recorded window under the recorded policy and a candidate, side by side", _whatif),
    "actuate": ("apply fleetloop's desired state to a real router", _actuate),
    "fleet": ("serve a scenario's nodes over HTTP (OpenAI API, vLLM /metrics) in real time", _fleet),
    "scrape": ("scrape vLLM / SGLang / TensorRT-LLM / Dynamo /metrics into fleet.telemetry", _scrape),
}


def build_parser(
    environ: Mapping[str, str] | None = None, *, commands: Collection[str] | None = None
) -> argparse.ArgumentParser:
    """The command line with every subcommand in ``commands`` complete (default: all of them); the
    others are listed with their help line only. ``FLEETLOOP_*`` variables in ``environ`` (default:
    the process's) become the defaults of the complete commands' flags (fleetloop.daemon.service.settings)."""
    parser = _Parser(
        prog="fleetloop", description="A streaming control plane for LLM inference fleets, on Kafka."
    )
    parser.add_argument("--version", action="version", version=f"fleetloop {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    wanted = COMMANDS if commands is None else [name for name in COMMANDS if name in commands]
    for register in dict.fromkeys(COMMANDS[name][1] for name in wanted):  # each module once
        register(sub)
    for name, (line, _) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=line)
    # Every long flag also reads FLEETLOOP_<FLAG> from the environment (service/settings.py).
    apply_env(parser, environ)
    _describe(parser)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not a flag (the top level's flags,
    ``--help`` and ``--version``, take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


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
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        named = command_of(words)
        args = build_parser(commands={named} if named else set()).parse_args(words)
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
