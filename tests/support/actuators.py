"""``fleetloop actuate ROUTER`` as the integration tests run it: a subprocess on the test's broker
and topic prefix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PERIOD_S = "0.25"  # reconcile four times a tick: a change shows within the tests' two-tick bounds


def actuate_argv(router: str, kafka_env: Any, *flags: str) -> list[str]:
    """The command line of ``fleetloop actuate ROUTER FLAGS`` on ``kafka_env``'s broker and prefix."""
    return [
        sys.executable,
        "-m",
        "fleetloop.cli.main",
        "actuate",
        router,
        *flags,
        "--bootstrap-servers",
        kafka_env.bootstrap_servers,
        "--topic-prefix",
        kafka_env.prefix,
    ]


def start_actuator(router: str, kafka_env: Any, log: Path, *flags: str) -> subprocess.Popen[bytes]:
    """``fleetloop actuate ROUTER FLAGS`` running, reconciling every 0.25 s; its log lines (stderr,
    unbuffered) go to ``log``."""
    with log.open("wb") as log_file:
        return subprocess.Popen(
            actuate_argv(router, kafka_env, "--period-s", PERIOD_S, *flags),
            stderr=log_file,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
