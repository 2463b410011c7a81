"""Programs pip does not install: ``make test`` skips what needs them with one line naming the
Debian package; under .ci/run (which installs them) a missing one fails the test."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tests.support.tools import REQUIRE_ENV, require_tool


def test_a_missing_program_skips_with_one_line_naming_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_tool("chromium")
    assert str(skipped.value) == "chromium is not installed: apt-get install chromium (.ci/run installs it)"


def test_under_ci_a_missing_program_fails_instead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="apt-get install nodejs"):
        require_tool("node")


def test_a_present_program_is_found_under_any_of_its_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    browser = tmp_path / "chromium-browser"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(browser.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert require_tool("chromium") == os.fspath(browser)
