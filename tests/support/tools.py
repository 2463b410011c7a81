"""Programs some tests drive that pip does not install: HAProxy, Chromium, Node (Debian packages).

``make test`` on a machine without one skips those tests with one line naming the package to
install: a newcomer's first run should pass, not ask for root to install a browser. ``.ci/run``
installs them and sets ``FLEETLOOP_TESTS_REQUIRE_TOOLS=1``, under which a missing program fails the
test instead: CI never passes by skipping what it was meant to run.
"""

from __future__ import annotations

import os
import shutil
from typing import Final

import pytest

REQUIRE_ENV: Final = "FLEETLOOP_TESTS_REQUIRE_TOOLS"

# program names on PATH (any of them will do) -> the Debian package that provides them
TOOLS: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "haproxy": (("haproxy",), "haproxy"),
    "chromium": (("chromium", "chromium-browser", "google-chrome"), "chromium"),
    "node": (("node",), "nodejs"),
}


def require_tool(tool: str) -> str:
    """The path of ``tool``; skips the test with one line when it is absent (fails under .ci/run)."""
    names, package = TOOLS[tool]
    for name in names:
        if path := shutil.which(name):
            return path
    reason = f"{tool} is not installed: apt-get install {package} (.ci/run installs it)"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
