"""Run ``fleetloop`` with its stdout a pipe whose reader is already gone (``... | head -3`` at worst)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.service import FLEETLOOP

REPO = Path(__file__).resolve().parents[2]
SIGPIPE_EXIT = 141  # what a shell reports for a tool SIGPIPE ended


def closed_reader(*argv: str) -> tuple[int, str]:
    """``fleetloop argv``'s exit code and stderr, its stdout closed before the first line is written."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [FLEETLOOP, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()  # python takes far longer to start than this
    err = proc.stderr.read().decode()
    return proc.wait(120), err
