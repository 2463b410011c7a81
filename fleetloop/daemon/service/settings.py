"""Settings from the environment: every long flag ``--some-thing`` of every command reads
``FLEETLOOP_SOME_THING`` when the flag is not given on the command line.

The flag wins over the variable; the variable wins over the built-in default. Switches
(``--no-ticker``) take ``1/true/yes/on`` or ``0/false/no/off``. A value the flag would refuse is
refused the same way, naming the variable (one line, exit 2). Secrets have variables and no
flags: ``FLEETLOOP_SASL_PASSWORD``. ``python -m fleetloop.cli.settings_table`` prints the
docs/configuration.md's table of the long-running commands' settings (a test keeps the two equal).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

PREFIX: Final = "FLEETLOOP_"
LONG_RUNNING: Final = ("run", "demo", "scrape", "fleet", "actuate")  # the commands the settings table covers
SKIP: Final = frozenset({"--help", "--version"})
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})
EXTRA: Final = (
    ("FLEETLOOP_SASL_PASSWORD", "(none: never a flag)", "the SASL password (or --sasl-password-file)"),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "(none)",
        "when set, traces and metrics are also exported over OTLP/HTTP",
    ),
)


class EnvError(ValueError):
    """A FLEETLOOP_* variable with a value its flag would refuse."""


def env_name(option: str) -> str:
    return PREFIX + option.lstrip("-").upper().replace("-", "_")


def _long(action: argparse.Action) -> str | None:
    for opt in action.option_strings:
        if opt.startswith("--") and opt not in SKIP:
            return opt
    return None


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.Action]]:
    """Every (command path, action) of ``parser`` and its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # aliases
                    continue
                seen.add(id(sub))
                yield from walk(sub, (*path, name))
        elif _long(action) is not None:
            yield path, action


def _convert(action: argparse.Action, var: str, raw: str) -> Any:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        low = raw.strip().lower()
        if low not in _TRUE | _FALSE:
            raise EnvError(f"{var}={raw!r}: expected 1/true/yes/on or 0/false/no/off")
        on = low in _TRUE
        return on if isinstance(action, argparse._StoreTrueAction) else not on
    if action.nargs not in (None, "?") or isinstance(action, argparse._AppendAction):
        items = [x for x in raw.split(",") if x]
        return [_one(action, var, x) for x in items]
    return _one(action, var, raw)


def _one(action: argparse.Action, var: str, raw: str) -> Any:
    value: Any = raw
    if callable(action.type):
        try:
            value = action.type(raw)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise EnvError(f"{var}={raw!r}: {exc or 'invalid value'}") from None
    if action.choices is not None and value not in action.choices:
        raise EnvError(f"{var}={raw!r}: choose from {', '.join(map(str, action.choices))}")
    return value


def apply_env(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Make ``FLEETLOOP_*`` variables the defaults of their flags (and satisfy ``required``)."""
    env = os.environ if environ is None else environ
    for _path, action in walk(parser):
        opt = _long(action)
        assert opt is not None
        var = env_name(opt)
        if var not in env:
            continue
        action.default = _convert(action, var, env[var])
        action.required = False


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "false"
    d = action.default
    if d is None or d == argparse.SUPPRESS:
        return "(none)"
    if d == "":
        return '""'
    return str(d)


def env_table(parser: argparse.ArgumentParser, commands: Sequence[str] = LONG_RUNNING) -> str:
    """A Markdown table of the variables of ``commands`` (one row per variable)."""
    # One row per variable, or one per meaning when commands give the same flag different ones.
    rows: dict[tuple[str, str, str, str], list[str]] = {}
    for path, action in walk(parser):
        if not path or path[0] not in commands:
            continue
        opt = _long(action)
        assert opt is not None
        help_text = " ".join((action.help or "").split()).replace("|", "\\|")
        rows.setdefault((env_name(opt), opt, _default(action), help_text), []).append(" ".join(path))
    lines = ["| variable | flag | commands | default | meaning |", "|---|---|---|---|---|"]
    for (var, opt, default, help_text), cmds in sorted(rows.items()):
        lines.append(f"| `{var}` | `{opt}` | {', '.join(sorted(cmds))} | `{default}` | {help_text} |")
    for var, default, help_text in EXTRA:
        lines.append(f"| `{var}` | — | all | {default} | {help_text} |")
    return "\n".join(lines) + "\n"
