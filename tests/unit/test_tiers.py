"""The two test tiers the README's Development section describes: what `make test` and
`make test-system` run, and that the long forms it names are in the second."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# README's words for the long forms -> tests (an id's start) that must all be in make test-system
LONG_FORMS = {
    "soak": "tests/integration/test_soak_bench.py",
    "fuzz": "tests/integration/test_fuzz_bench.py",
    "kill -9 restarts": "tests/integration/test_restarts.py",
    "policy lifecycles": "tests/integration/test_policy_lifecycle.py",
    "the stack bench": "tests/bench/test_stack.py::test_two_arms_write_a_table_with_sane_figures",
    "the live page in Chromium": "tests/integration/test_live_page.py",
    "committed rows": "tests/sim/test_committed_rows.py",
    "the demo and the operator's journey end to end": "tests/integration/test_operator_journey.py",
}


def _collect(marks: str, *paths: str) -> list[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marks,
            *paths,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if "::" in line]


def _recipe(target: str) -> str:
    text = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert m, f"no {target} target in the Makefile"
    return m.group(1)


def test_make_test_lints_and_runs_what_is_not_system_and_test_system_the_rest() -> None:
    assert "lint" in re.search(r"^test:(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)  # type: ignore[union-attr]
    assert '-m "not system"' in _recipe("test")
    assert "-m system" in _recipe("test-system")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test PYTEST_ARGS=--durations=25" in ci
    assert "make test-system PYTEST_ARGS=--durations=25" in ci
    assert "export FLEETLOOP_TESTS_REQUIRE_TOOLS=1" in ci


def test_the_long_forms_the_readme_names_are_in_make_test_system_and_the_core_runs_on_both_brokers() -> None:
    development = (ROOT / "README.md").read_text().split("## Development", 1)[1]
    files = sorted({ids.split("::")[0] for ids in LONG_FORMS.values()})
    system = _collect("system", *files)
    core = _collect("not system", "tests/integration", *files)
    for words, path in LONG_FORMS.items():
        assert words in development, f"README, Development no longer names {words!r}"
        assert any(t.startswith(path) for t in system), path
        assert not [t for t in core if t.startswith(path)], f"{path} has tests in make test"
    # the integration core: on both brokers
    assert any(t.endswith("[tansu]") for t in core)
    assert any(t.endswith("[kafka]") for t in core)
    assert len(core) > 100, len(core)  # not the whole directory marked system
