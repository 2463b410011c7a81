"""Rules the suite keeps so that it stays fast and a newcomer's ``make test`` passes (README,
Development), checked over the test sources so a new test keeps them too."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SLEEP = re.compile(r"\bsleep\(([^()]*(?:\([^()]*\))?[^()]*)\)")
TOOL_LOOKUP = re.compile(r"""which\(\s*["'](haproxy|chromium|chromium-browser|google-chrome|node)["']""")


def _short(arg: str) -> bool:
    try:
        return float(arg) < 0.5
    except ValueError:
        return False  # an expression: it may be long


def test_an_integration_test_waits_for_a_condition_or_says_what_elapsed_time_it_needs() -> None:
    """A fixed sleep of 0.5 s or more stands for a condition a poll could see (tests/support/wait.py:
    wait_until), unless the test needs the time itself (an outage, a window of traffic): then the
    line says so in a comment."""
    bare = [
        f"{path.relative_to(TESTS.parent)}:{n}: {line.strip()}"
        for path in sorted((TESTS / "integration").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if (m := SLEEP.search(line)) and not _short(m.group(1)) and "#" not in line
    ]
    assert not bare, "use tests.support.wait.wait_until, or say why the time must pass:\n" + "\n".join(bare)


def test_programs_pip_does_not_install_are_looked_up_through_require_tool() -> None:
    """HAProxy, Chromium and Node: skipped with one line under make test, failed under .ci/run
    (tests/support/tools.py), never a bare lookup that fails or skips on its own terms."""
    own = [
        f"{path.relative_to(TESTS.parent)}:{n}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != "tools.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if TOOL_LOOKUP.search(line)
    ]
    assert not own, "use tests.support.tools.require_tool:\n" + "\n".join(own)
