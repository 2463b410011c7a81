"""Consoles for the commands' human output, on a terminal or into a pipe.

On a terminal, rich sizes its output to the window. Into a pipe or a file (CI logs, ``| tee``,
``2> run.log``) it falls back to 80 columns: tables squeeze node ids to ``chat-l…`` and status
lines break mid-phrase. A reader of a log has no window to fit, so there the width is
``PIPE_WIDTH`` (or ``COLUMNS`` when the user set it) and a line of text is never broken, only a
table is laid out to the width.

A reader that closes the pipe early (``| head``) ends the command through the CLI entry point's one
rule for every command (fleetloop.cli.main.main), not through rich's own exit.
"""

from __future__ import annotations

import errno
import os
import sys

from rich.console import Console

PIPE_WIDTH = 200  # columns of a table written into a pipe or file, unless COLUMNS says otherwise


def pipe_width(environ: dict[str, str] | None = None) -> int:
    """The width for output that is not a terminal: ``COLUMNS`` when it is a positive integer."""
    value = (os.environ if environ is None else environ).get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) > 0 else PIPE_WIDTH


class _Console(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A console on stdout (or stderr) for people: rich's own sizing on a terminal, else
    :func:`pipe_width` columns with no wrapping of plain lines. ``width`` fixes the width anyway."""
    stream = sys.stderr if stderr else sys.stdout
    if width is not None:
        return _Console(stderr=stderr, highlight=False, width=width)
    if stream.isatty():
        return _Console(stderr=stderr, highlight=False)
    return _Console(stderr=stderr, highlight=False, width=pipe_width(), soft_wrap=True)
