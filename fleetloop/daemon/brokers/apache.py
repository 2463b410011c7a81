"""Apache Kafka 4.x, single-node KRaft (combined broker + controller), from Maven Central jars.

``make kafka`` (``scripts/kafka-fetch.sh``) assembles ``.cache/kafka/<version>/{lib,config}``; the
version is ``kafka.version`` in ``scripts/kafka/pom.xml`` (``$KAFKA_VERSION`` overrides, as in the
script). ``$FLEETLOOP_KAFKA_HOME`` points at such a directory directly, for installs outside the
repository. Each start is a fresh cluster in a temp dir: ``server.properties``, ``data/`` and
``logs/server.log`` (log4j) plus ``logs/kafka.out`` (the JVM's console); ``format/`` holds the
storage tool's log. ``make kafka-up`` / ``make kafka-down`` (:mod:`.local`) run one such broker on
a fixed port in the background, for an operator, from this same configuration.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from fleetloop.daemon.brokers.base import (
    LOG_TAIL_LINES,
    BrokerCapabilities,
    BrokerStartError,
    ProcessBroker,
    free_ports,
    tail_lines,
)

KAFKA_CAPABILITIES: Final = BrokerCapabilities(idempotent_producer=True, offsets_for_times=True)
REPO_ROOT: Final = Path(__file__).resolve().parents[3]
POM_PATH: Final = REPO_ROOT / "scripts" / "kafka" / "pom.xml"
FETCH_HINT: Final = "run `make kafka` (scripts/kafka-fetch.sh) to fetch them from Maven Central"


def kafka_version(pom: Path = POM_PATH) -> str:
    """``$KAFKA_VERSION``, else ``kafka.version`` in the fetch script's pom (the one source of truth)."""
    if version := os.environ.get("KAFKA_VERSION"):
        return version
    try:
        text = pom.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise BrokerStartError(
            "kafka", f"cannot tell the Kafka version: {pom} is missing; set FLEETLOOP_KAFKA_HOME"
        ) from exc
    match = re.search(r"<kafka\.version>\s*([^<\s]+)\s*</kafka\.version>", text)
    if match is None:
        raise BrokerStartError("kafka", f"no <kafka.version> property in {pom}")
    return match.group(1)


def kafka_home(version: str | None = None) -> Path:
    """Where the fetched broker lives: ``$FLEETLOOP_KAFKA_HOME`` or ``<cache>/<version>``."""
    if home := os.environ.get("FLEETLOOP_KAFKA_HOME"):
        return Path(home)
    cache = Path(os.environ.get("FLEETLOOP_KAFKA_CACHE") or REPO_ROOT / ".cache" / "kafka")
    return cache / (version or kafka_version())


def new_cluster_id() -> str:
    """A KRaft cluster id as ``StorageTool random-uuid`` makes one (saves a JVM start)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):  # Kafka's Uuid.randomUuid() rejects these too
            return text


def kraft_settings(*, node_id: int, controller_port: int, data_dir: Path) -> dict[str, str | int]:
    """What every one-node KRaft cluster here shares (listeners aside): the controller quorum,
    internal topics with one replica, fast groups, no auto-created topics, small thread pools."""
    return {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.quorum.voters": f"{node_id}@127.0.0.1:{controller_port}",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(data_dir),
        # One node: every internal topic has one replica and needs one in sync.
        "offsets.topic.replication.factor": 1,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        "min.insync.replicas": 1,
        # Fewer internal partitions: the first consumer group or producer id comes up faster.
        "offsets.topic.num.partitions": 5,
        "transaction.state.log.num.partitions": 5,
        "share.coordinator.state.topic.num.partitions": 1,
        # Groups form at once (default 3000 ms), topics exist only when fleetloop creates them.
        "group.initial.rebalance.delay.ms": 0,
        "auto.create.topics.enable": "false",
        "num.partitions": 1,
        "default.replication.factor": 1,
        # Small on purpose: 2 cores, a 512 MiB heap, short-lived clusters.
        "num.network.threads": 2,
        "num.io.threads": 2,
        "background.threads": 2,
        "num.recovery.threads.per.data.dir": 1,
        "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
        "log.cleaner.threads": 1,
    }


def render_properties(settings: Mapping[str, str | int]) -> str:
    lines = ["# written by fleetloop.daemon.brokers.apache", *(f"{k}={v}" for k, v in settings.items())]
    return "\n".join(lines) + "\n"


def render_server_properties(*, port: int, controller_port: int, data_dir: Path, node_id: int = 1) -> str:
    """``server.properties`` for a one-node KRaft cluster on loopback, sized for tests on 2 cores.

    Static quorum (``controller.quorum.voters``), so storage is formatted without ``--standalone``.
    """
    return render_properties(
        {
            **kraft_settings(node_id=node_id, controller_port=controller_port, data_dir=data_dir),
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        }
    )


def format_storage(home: Path, java: str, workdir: Path, config: Path, extra: Sequence[str] = ()) -> None:
    """``kafka.tools.StorageTool format`` for ``config`` (``extra``: e.g. ``--add-scram`` users)."""
    args = ["format", "-t", new_cluster_id(), "-c", str(config), *extra]
    storage = java_command(  # its own log dir: its config dump would bury the broker's story
        home, "kafka.tools.StorageTool", args, logs_dir=workdir / "format", heap_mb=256, java=java
    )
    try:
        done = subprocess.run(storage, cwd=workdir, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BrokerStartError("kafka", "kafka.tools.StorageTool format took over 120 s") from exc
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).splitlines()[-LOG_TAIL_LINES:])
        raise BrokerStartError(
            "kafka", f"kafka.tools.StorageTool format exited with code {done.returncode}", output
        )


def check_install(home: Path) -> str:
    """The ``java`` to run the fetched broker in ``home`` with; BrokerStartError naming what is missing."""
    jars = sorted((home / "lib").glob("kafka_2.13-*.jar"))
    if not jars:
        raise BrokerStartError("kafka", f"Apache Kafka jars not found in {home / 'lib'}: {FETCH_HINT}")
    if not (home / "config" / "log4j2.properties").is_file():
        raise BrokerStartError("kafka", f"{home / 'config' / 'log4j2.properties'} is missing: {FETCH_HINT}")
    java = shutil.which("java")
    if java is None:
        raise BrokerStartError("kafka", "no `java` on PATH (Apache Kafka 4.x needs Java 17+)")
    return java


def java_command(
    home: Path, main_class: str, args: Sequence[str], *, logs_dir: Path, heap_mb: int, java: str = "java"
) -> list[str]:
    """``java ... <main_class> <args>`` on the fetched classpath, logging through its log4j2 config."""
    return [
        java,
        f"-Xmx{heap_mb}m",
        f"-Xms{min(heap_mb, 128)}m",
        "-XX:+UseSerialGC",  # 2 cores, short-lived test clusters: no concurrent GC threads
        "-XX:TieredStopAtLevel=1",  # C1 only: faster start, plenty for test traffic
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={home / 'config' / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={logs_dir}",
        "-cp",
        f"{home / 'lib'}/*",
        main_class,
        *args,
    ]


class ApacheKafka(ProcessBroker):
    """A fresh single-node KRaft Apache Kafka on two free loopback ports (client, controller)."""

    kind = "kafka"
    capabilities = KAFKA_CAPABILITIES

    def __init__(
        self,
        *,
        home: Path | None = None,
        heap_mb: int = 512,
        start_timeout_s: float = 90.0,
        stop_timeout_s: float = 20.0,
    ) -> None:
        super().__init__(start_timeout_s=start_timeout_s, stop_timeout_s=stop_timeout_s)
        self._home = home
        self.heap_mb = heap_mb

    @property
    def home(self) -> Path:
        return self._home if self._home is not None else kafka_home()

    def _check_install(self) -> tuple[Path, str]:
        return self.home, check_install(self.home)

    def _prepare(self, workdir: Path) -> tuple[int, Sequence[str]]:
        home, java = self._check_install()
        port, controller_port = free_ports(2, self._host)
        config = workdir / "server.properties"
        logs = workdir / "logs"
        logs.mkdir()
        config.write_text(
            render_server_properties(port=port, controller_port=controller_port, data_dir=workdir / "data"),
            encoding="utf-8",
        )
        format_storage(home, java, workdir, config)
        broker = java_command(
            home, "kafka.Kafka", [str(config)], logs_dir=logs, heap_mb=self.heap_mb, java=java
        )
        return port, broker

    def _console_path(self, workdir: Path) -> Path:
        return workdir / "logs" / "kafka.out"

    @property
    def log_path(self) -> Path:
        return self.workdir / "logs" / "server.log"

    def _log_tail(self) -> str:
        console = tail_lines(self._console_path(self.workdir))
        server = tail_lines(self.log_path)
        if console.strip():  # the JVM died before (or while) log4j was up: that is the story
            return f"{server}\n--- console ---\n{console}" if server.strip() else console
        return server
