"""A reader that closes the pipe early (``fleetloop ... | head -3``) ends any command quietly: no
``BrokenPipeError`` traceback, no ``Exception ignored`` at exit, and the exit code a shell gives a
tool that SIGPIPE ended (141). One rule in the entry point covers plain writes and rich's tables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.pipes import SIGPIPE_EXIT, closed_reader
from tests.support.policies import FOUNDATION_YAML

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["policy", "validate", str(FOUNDATION_YAML), str(FOUNDATION_YAML)],
        ["policy", "diff", str(FOUNDATION_YAML), "policies/default.yaml"],
        ["sim", "--scenario", "scenarios/stack/degraded-gpu-small.yaml"],  # a rich table, from a short run
    ],
    ids=["policy-validate", "policy-diff", "sim-table"],
)
def test_a_closed_pipe_ends_the_command_quietly(argv: list[str]) -> None:
    code, err = closed_reader(*argv)
    assert err == ""
    assert code == SIGPIPE_EXIT


def test_a_broken_pipe_that_is_not_stdout_s_is_not_hidden() -> None:
    """A socket's EPIPE (a broker or a router hung up) is a real error, though a BrokenPipeError too:
    with stdout still read, it is not turned into a quiet exit."""
    script = (
        "import sys\n"
        "import fleetloop.cli.commands as commands\n"
        "def hung_up(args):\n"
        "    raise BrokenPipeError(32, 'Broken pipe')\n"
        "commands.cmd_policy_validate = hung_up\n"
        "from fleetloop.cli.main import main\n"
        f"sys.exit(main(['policy', 'validate', {str(FOUNDATION_YAML)!r}]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", script]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=False)
    assert done.returncode == 1
    assert "BrokenPipeError" in done.stderr
