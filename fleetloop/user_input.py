"""What every command does with what a user hands it: input files read, output paths checked, seeds bounded.

One place, so every command refuses the same bad input with the same one line (the CLI's rule: a
bad flag or file is one line on stderr and exit code 2, never a traceback):

- :func:`read_text` reads a user-supplied input file (a scenario, a policy document, an actuator's
  map): a regular file of at most :data:`MAX_INPUT_BYTES`, UTF-8. Anything else (a missing file, a
  directory, ``/dev/zero``, a binary file) is a :class:`UserInputError` naming the file and, for
  bad UTF-8, the byte offset. :func:`read_yaml` adds the YAML parse and refuses an empty document,
  and one nested past what the parser can compose (PyYAML composes recursively: a few hundred
  levels of ``[[[...]]]`` end in a RecursionError, a traceback, well inside the size cap).
- :func:`output_dir` and :func:`output_file` check an output path (``--report DIR``,
  ``--nodes-file PATH``) *before* a command runs anything long: a run is not thrown away at its end
  because its report cannot be written.
- :func:`check_seed` bounds ``--seed`` (numpy refuses a negative seed with a traceback).
- :class:`UsageError` is a refusal a command words itself; :class:`UserInputError` one it does not.

A leaf: it imports nothing of fleetloop, so the schemas, policies, simulator, daemon and edges
(actuators included) can all use it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

MAX_INPUT_BYTES = 4 * 1024 * 1024
"""The largest input file read (4 MiB): the biggest shipped scenario or policy is a few KiB, a
generated fleet's scenario well under 1 MiB; past this it is not a hand-written document."""

SEED_MAX = 2**63 - 101
"""The largest ``--seed``: numpy takes 0 .. 2**64-1, and ``whatif --seeds N`` (N <= 100) runs from
``--seed`` upwards, so every command keeps the same headroom below 2**63."""


class UsageError(Exception):
    """A problem the user can fix, worded by the command itself (``fleetloop run: ...``): printed as
    one line on stderr, exit code 2."""


class UserInputError(ValueError):
    """A file or flag the user can fix: one line, exit code 2."""


def read_text(path: str | Path, *, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a user's input file. Raises :class:`UserInputError` ("PATH: problem")."""
    p = Path(path)
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise UserInputError(f"{p}: cannot read ({kind})")
        if st.st_size > max_bytes:
            limit = _size(max_bytes)
            raise UserInputError(f"{p}: {st.st_size} bytes, over the {limit} limit for an input file")
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)  # a file that grew since the stat is still bounded
    except OSError as exc:
        raise UserInputError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise UserInputError(f"{p}: over the {_size(max_bytes)} limit for an input file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserInputError(
            f"{p}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def read_yaml(path: str | Path) -> Any:
    """The YAML document in a user's input file (:func:`read_text`), never None: an empty file (or
    one of comments only) is refused, as is bad YAML (with its line)."""
    p = Path(path)
    text = read_text(p)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserInputError(f"{p}: not valid YAML{where}") from None
    except RecursionError:
        raise UserInputError(f"{p}: nested too deeply to read (a document is a few levels deep)") from None
    if data is None:
        raise UserInputError(f"{p} is empty")
    return data


def output_dir(path: str | Path, *, flag: str, prog: str) -> Path:
    """A directory the command will write into: created now (as the writer would) and probed."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserInputError(f"{prog}: {flag} {p}: exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
        _probe(p)
    except OSError as exc:
        raise UserInputError(f"{prog}: {flag} {p}: cannot write there ({exc.strerror or exc})") from None
    return p


def output_file(path: str | Path, *, flag: str, prog: str, make_parents: bool = False) -> Path:
    """A file the command will write (or replace): its directory must exist (or, with
    ``make_parents``, is created now, as the writer would) and take a new file."""
    p = Path(path)
    if p.is_dir():
        raise UserInputError(f"{prog}: {flag} {p}: is a directory")
    parent = p.parent
    if not make_parents and not parent.is_dir():
        raise UserInputError(f"{prog}: {flag} {p}: no directory {parent}")
    try:
        if make_parents:
            parent.mkdir(parents=True, exist_ok=True)
        _probe(parent)
    except OSError as exc:
        raise UserInputError(f"{prog}: {flag} {p}: cannot write there ({exc.strerror or exc})") from None
    return p


def check_seed(seed: int | None, *, prog: str) -> None:
    """``--seed`` in 0 .. :data:`SEED_MAX` (None: the scenario's own seed)."""
    if seed is not None and not 0 <= seed <= SEED_MAX:
        raise UserInputError(f"{prog}: --seed must be between 0 and 2**63-101, got {seed}")


def _probe(directory: Path) -> None:
    with tempfile.TemporaryFile(dir=directory, prefix=".fleetloop-probe-"):
        pass


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"
