"""Start-up noise is not logged as an error: the Kafka client's ``Group Coordinator Request failed:
[Error 15] GroupCoordinatorNotAvailableError`` (a cluster's first start, before the offsets topic
exists; the client retries) comes out at info while the process starts, and keeps its level after,
and every other client error keeps its level throughout."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    KafkaConnectionError,
    NotCoordinatorForGroupError,
)
from fleetloop.daemon.observability import START_GRACE_S, start_up_level

REPO = Path(__file__).resolve().parents[2]
COORDINATOR = "aiokafka.consumer.group_coordinator"
LOOKUP_FAILED = (
    "Group Coordinator Request failed: %s"  # aiokafka 0.14, GroupCoordinator.ensure_coordinator_known
)


def record(name: str, msg: str, *args: Any, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.getLogger(name).makeRecord(name, level, __file__, 1, msg, args, None)


def test_the_coordinator_not_yet_available_is_info_while_starting_and_error_after() -> None:
    r = record(COORDINATOR, LOOKUP_FAILED, GroupCoordinatorNotAvailableError())
    assert start_up_level(r, 0.5) == logging.INFO
    assert start_up_level(r, START_GRACE_S - 0.1) == logging.INFO
    assert start_up_level(r, START_GRACE_S) == logging.ERROR


def test_other_errors_keep_their_level_while_starting() -> None:
    other_error = record(COORDINATOR, LOOKUP_FAILED, NotCoordinatorForGroupError())
    other_logger = record("aiokafka.consumer.fetcher", LOOKUP_FAILED, GroupCoordinatorNotAvailableError())
    other_text = record("aiokafka.client", 'Unable connect to "%s:%s": %s', "h", 1, KafkaConnectionError())
    warning = record(COORDINATOR, LOOKUP_FAILED, GroupCoordinatorNotAvailableError(), level=logging.WARNING)
    for r in (other_error, other_logger, other_text):
        assert start_up_level(r, 0.0) == logging.ERROR
    assert start_up_level(warning, 0.0) == logging.WARNING


def test_the_daemon_s_log_pipeline_writes_it_at_info() -> None:
    """Through the pipeline ``fleetloop run`` configures (stdlib records into structlog, JSON)."""
    script = (
        "import logging\n"
        "from aiokafka.errors import GroupCoordinatorNotAvailableError, KafkaConnectionError\n"
        "from fleetloop.daemon import observability\n"
        "observability.configure(level='info', fmt='json')\n"
        f"log = logging.getLogger({COORDINATOR!r})\n"
        f"log.error({LOOKUP_FAILED!r}, GroupCoordinatorNotAvailableError())\n"
        "logging.getLogger('aiokafka.client').error('Unable connect to %s', KafkaConnectionError('x'))\n"
        "observability.shutdown()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(line["logger"], line["level"]) for line in lines] == [
        (COORDINATOR, "info"),
        ("aiokafka.client", "error"),
    ]
    assert "GroupCoordinatorNotAvailableError" in lines[0]["event"]
